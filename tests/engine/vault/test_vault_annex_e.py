"""The de-identification table against the current edition of PS3.15 Table E.1-1, and an export of files
with a unique value planted in every attribute of that table (and in private tags, nested sequences,
per-frame functional groups and dates the table does not list) that must leave none of them."""

from __future__ import annotations

import copy
import importlib.util
import io
import warnings
from pathlib import Path

import pydicom
import pytest
from pydicom.data import get_testdata_file
from pydicom.datadict import dictionary_has_tag, dictionary_VR
from pydicom.dataset import Dataset

from engine.vault.annex_e import BASIC_PROFILE, EDITION, PATTERNS, TABLE
from engine.vault.deid import UidMapper, deidentify_dicom

_SCRIPT = Path(__file__).resolve().parents[3] / "packaging" / "annex_e_table.py"


def _converter():
    spec = importlib.util.spec_from_file_location("annex_e_table", _SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_table_is_the_converted_current_edition_attribute_by_attribute():
    converter = _converter()
    try:
        source = converter.source_file(EDITION)
    except SystemExit as exc:
        pytest.skip(f"the standard's table is not installed here: {exc}")
    rows, patterns = converter.read_source(source)
    assert EDITION == converter.EDITION
    missing = sorted(f"{t:08X} {rows[t][1]}" for t in rows.keys() - TABLE.keys())
    extra = sorted(f"{t:08X} {TABLE[t][1]}" for t in TABLE.keys() - rows.keys())
    assert not missing and not extra, (missing[:10], extra[:10])
    changed = [f"{t:08X} {rows[t][1]}: {TABLE[t][0]} != {rows[t][0]}" for t in rows if TABLE[t] != rows[t]]
    assert changed == []
    assert sorted(patterns) == sorted(PATTERNS)


def test_table_spot_checks():
    """Rows the older transcription lacked, as the 2026c edition of Table E.1-1 gives them."""
    assert len(BASIC_PROFILE) == 652 and len(PATTERNS) == 3
    expected = {
        0x00080012: ("X/D", "Instance Creation Date"),
        0x00080013: ("X/Z/D", "Instance Creation Time"),
        0x00080055: ("X", "Station AE Title"),
        0x00181012: ("X", "Date of Secondary Capture"),
        0x00181014: ("X", "Time of Secondary Capture"),
        0x00203403: ("X", "Modified Image Date"),
        0x00189074: ("D", "Frame Acquisition DateTime"),
        0x00189151: ("D", "Frame Reference DateTime"),
        0x00181203: ("Z", "Calibration DateTime"),
        0x0040A032: ("X/D", "Observation DateTime"),
        0x00100011: ("X", "Person Names to Use Sequence"),
        0x00100012: ("X", "Name to Use"),
        0x00100014: ("X", "Third Person Pronouns Sequence"),
        0x00100015: ("X", "Pronoun Code Sequence"),
        0x00100016: ("X", "Pronoun Comment"),
        0x00100020: ("Z/D", "Patient ID"),
        0x00081110: ("X/Z", "Referenced Study Sequence"),
        0x00100010: ("Z", "Patient's Name"),
        0x0020000D: ("U", "Study Instance UID"),
        0x00081140: ("X/Z/U*", "Referenced Image Sequence"),
    }
    assert {tag: TABLE[tag] for tag in expected} == expected
    # names agree with pydicom's data dictionary wherever it knows the tag (an independent spelling)
    from pydicom.datadict import dictionary_description

    known = [t for t in expected if dictionary_has_tag(t)]
    assert all(dictionary_description(t).lower() == TABLE[t][1].lower() for t in known)


# ---- a unique value planted in every attribute of the table -------------------------------------------

_NUMERIC = {"US": 7, "SS": -7, "UL": 77, "SL": -77, "UV": 777, "SV": -777, "FL": 7.5, "FD": 7.25}


def _vr(tag: int) -> str:
    """pydicom's VR; for the newest attributes that pydicom 3.0 does not know yet, the VR their name
    implies (each one checked against PS3.6 by hand: sequences, datetimes, a URI, else LO text)."""
    if dictionary_has_tag(tag):
        return dictionary_VR(tag).split(" or ")[0]
    name = TABLE[tag][1]
    if name.endswith("Sequence"):
        return "SQ"
    if name.endswith("DateTime"):
        return "DT"
    if name.endswith("URI"):
        return "UR"
    return "LO" if "Comment" not in name and "Description" not in name else "LT"


class Planter:
    """Makes unique values that survive encoding as themselves, so a byte search finds any copy."""

    def __init__(self) -> None:
        self.n = 0
        self.values: list[bytes] = []  # searched for in every exported file

    def value(self, vr: str):
        self.n += 1
        n = self.n
        if vr in _NUMERIC:
            return _NUMERIC[vr]
        if vr == "AT":
            return 0x00100010
        text = {
            "DA": f"18{n // 365 % 100:02d}{n % 12 + 1:02d}{n % 28 + 1:02d}",
            "TM": f"11{n % 60:02d}{n % 60:02d}.{n:06d}",
            "DT": f"17{n % 100:02d}0101111111.{n:06d}",
            "DS": f"7.{n:05d}3",
            "IS": f"7{n:05d}3",
            "UI": f"1.2.826.0.1.3680043.10.{n}.7",
            "PN": f"Plant{n:04d}^Given{n:04d}",
            "AS": "077Y",  # 4 characters cannot be unique enough to search: checked by value
            "AE": f"PLANT{n:04d}AE",
            "CS": f"PLANT{n:04d}CS",
            "UR": f"https://plant{n:04d}.invalid/x",
        }.get(vr, f"Plant{n:04d}text")
        if vr in ("OB", "OW", "OF", "OD", "OL", "OV", "UN"):
            data = f"PlantBytes{n:04d}".encode()
            self.values.append(data)
            return data
        if vr != "AS":
            self.values.append(text.encode())
        return text


def _item(planter: Planter, depth: int) -> Dataset:
    """A sequence item with identifying content of its own: a name, an ID, a UID reference, a private tag,
    a date the table does not list, and (above the last level) a nested sequence."""
    item = Dataset()
    item.PatientName = planter.value("PN")
    item.PersonName = planter.value("PN")
    item.ReferencedSOPInstanceUID = planter.value("UI")
    item.add_new(0x00400244, "DA", planter.value("DA"))  # Performed Procedure Step Start Date (X)
    item.add_new(0x00189804, "DT", planter.value("DT"))  # Exclusion Start DateTime (D)
    item.add_new(0x00143076, "DA", planter.value("DA"))  # Date of Gain Calibration: not in the table
    item.add_new(0x00290010, "LO", "PLANTER CREATOR")
    item.add_new(0x00291001, "LO", planter.value("LO"))
    if depth > 0:
        item.add_new(0x00081115, "SQ", [_item(planter, depth - 1)])  # Referenced Series Sequence: kept
    return item


# Identity the importer needs to see one series: planted below, the same in every slice.
_SET_BELOW = {0x00080018, 0x00100020, 0x0020000D, 0x0020000E, 0x00200052}


def _planted(k: int, planter: Planter, source) -> Dataset:
    ds = copy.deepcopy(source)
    for tag in sorted(TABLE):
        group = tag >> 16
        if group in (0x0002, 0xFFFA, 0xFFFC) or group == 0x0000 or tag in _SET_BELOW:
            continue  # file meta, signatures, padding and command fields: planted separately below
        vr = _vr(tag)
        if vr == "SQ":
            ds.add_new(tag, "SQ", [_item(planter, 1)])
        else:
            ds.add_new(tag, vr, planter.value(vr))
    # per-frame and shared functional groups, each frame with its own dates
    frames = []
    for _ in range(2):
        frame = Dataset()
        content = Dataset()
        content.FrameAcquisitionDateTime = planter.value("DT")
        content.FrameReferenceDateTime = planter.value("DT")
        content.add_new(0x00189155, "DT", planter.value("DT"))  # a DT no dictionary knows yet
        frame.FrameContentSequence = [content]
        frame.add_new(0x00431001, "LO", planter.value("LO"))
        frames.append(frame)
    ds.PerFrameFunctionalGroupsSequence = frames
    ds.SharedFunctionalGroupsSequence = [_item(planter, 1)]
    # unknown date, time and datetime attributes and private data at the top level
    ds.add_new(0x0008041F, "DT", planter.value("DT"))  # Study Update DateTime: not in the table
    ds.add_new(0x00140102, "DA", planter.value("DA"))  # Secondary Review Date: not in the table
    ds.add_new(0x00140103, "TM", planter.value("TM"))  # Secondary Review Time: not in the table
    ds.add_new(0x00090010, "LO", "PLANTER CREATOR")
    ds.add_new(0x00091001, "LO", planter.value("LO"))
    ds.add_new(0x00091002, "SQ", [_item(planter, 0)])
    ds.add_new(0x60003000, "OW", planter.value("OW"))  # overlay data
    ds.add_new(0x60004000, "LT", planter.value("LT"))  # overlay comments
    # identity and geometry the importer needs, unique per slice
    ds.SOPInstanceUID = planter.value("UI")
    ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
    ds.file_meta.SourceApplicationEntityTitle = planter.value("AE")
    ds.PatientID = "PLANTPATIENTID55"
    ds.StudyInstanceUID = "1.2.826.0.1.3680043.10.55.1"
    ds.SeriesInstanceUID = "1.2.826.0.1.3680043.10.55.2"
    ds.FrameOfReferenceUID = "1.2.826.0.1.3680043.10.55.3"
    planter.values += [
        b"PLANTPATIENTID55",
        ds.StudyInstanceUID.encode(),
        ds.SeriesInstanceUID.encode(),
        b"10.55.3",
    ]
    ds.ImagePositionPatient = [0.0, 0.0, 2.5 * k]
    ds.InstanceNumber = k + 1
    return ds


@pytest.fixture
def planted_series(tmp_path):
    source = pydicom.dcmread(get_testdata_file("MR_small.dcm"))
    planter = Planter()
    folder = tmp_path / "planted"
    folder.mkdir()
    files = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # planted values are unique, not always valid for their VR
        for k in range(2):
            path = folder / f"slice{k}.dcm"
            _planted(k, planter, source).save_as(path, enforce_file_format=True)
            files.append(path)
    return folder, files, planter


def _searchable(data: bytes) -> bytes:
    """The export's bytes with its own new UIDs blanked: each is ``2.25.`` and 39 HMAC digits, which can
    contain a short planted digit string by chance."""
    ds = pydicom.dcmread(io.BytesIO(data))
    for elem in [*ds.file_meta.iterall(), *ds.iterall()]:
        if elem.VR == "UI" and elem.value:
            for uid in elem.value if isinstance(elem.value, pydicom.multival.MultiValue) else [elem.value]:
                if str(uid).startswith("2.25."):
                    data = data.replace(str(uid).encode(), b"")
    return data


def test_planted_values_are_in_the_files_before_export(planted_series):
    """The fixture is not vacuous: every planted value is in the files, every table attribute is planted."""
    _, files, planter = planted_series
    blob = b"".join(p.read_bytes() for p in files)
    assert len(planter.values) > 1300
    assert [v for v in planter.values if v not in blob] == []
    ds = pydicom.dcmread(files[0])
    planted = {int(e.tag) for e in ds.iterall()} | {int(e.tag) for e in ds.file_meta}
    assert {t for t in TABLE if t >> 16 not in (0x0000, 0xFFFA, 0xFFFC)} - planted - {0x00020003} == set()


def test_export_of_a_planted_series_leaves_no_planted_value(vault, planted_series, tmp_path):
    folder, files, planter = planted_series
    info = vault.import_dicom(folder, label="planted")
    result = vault.export(info.id, tmp_path / "out", deidentify=True)
    dicoms = [p for p in result.files if p.suffix == ".dcm"]
    assert len(dicoms) == 2 and len(result.files) == 3
    leaks = {}
    for path in result.files:
        data = path.read_bytes()
        searched = _searchable(data) if path.suffix == ".dcm" else data
        leaks[path.name] = [v for v in planter.values if v in searched]
    assert leaks == {p.name: [] for p in result.files}
    for path in dicoms:
        ds = pydicom.dcmread(path)
        assert str(ds.PatientID).startswith("ANON-")
        assert "PatientAge" not in ds or ds.PatientAge != "077Y"  # Patient's Age is X
        assert not any(e.VR in _NUMERIC and e.value == _NUMERIC[e.VR] for e in ds.iterall())
        frame = ds.PerFrameFunctionalGroupsSequence[0].FrameContentSequence[0]
        assert frame.FrameAcquisitionDateTime == "19000101000000"
        assert "ReferencedStudySequence" not in ds  # Type 3: removed, not left empty
    assert len({str(pydicom.dcmread(p).PatientID) for p in dicoms}) == 1  # one patient, one pseudonym


def test_each_export_gets_its_own_patient_pseudonym(planted_series):
    _, files, _ = planted_series
    raw = files[0].read_bytes()
    first = pydicom.dcmread(io.BytesIO(deidentify_dicom(raw, UidMapper())[0]))
    second = pydicom.dcmread(io.BytesIO(deidentify_dicom(raw, UidMapper())[0]))
    assert first.PatientID != second.PatientID
    assert first.PatientName == "" and first.DeidentificationMethod.startswith(f"DICOM PS3.15 {EDITION}")
    assert [c.CodeValue for c in first.DeidentificationMethodCodeSequence] == ["113100"]
