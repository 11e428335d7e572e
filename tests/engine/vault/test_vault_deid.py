"""DICOM de-identification (PS3.15 Annex E basic profile) on pydicom's bundled files with patient data."""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import nibabel as nib
import pydicom
import pytest
from pydicom.data import get_testdata_file

from engine.vault.annex_e import BASIC_PROFILE
from engine.vault.deid import _DUMMY, UidMapper, _context, deidentify_dicom, resolve

# Some bundled files have deliberately invalid values (e.g. an over-long UID); pydicom warns on reading them.
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning:pydicom.*")

# Bundled files that carry patient or institution data (names, ids, birth dates, UIDs, private tags,
# overlays), in several transfer syntaxes.
BUNDLED = [
    "CT_small.dcm",
    "MR_small.dcm",
    "examples_overlay.dcm",
    "waveform_ecg.dcm",
    "JPEG2000.dcm",
    "JPEG-lossy.dcm",
    "liver_1frame.dcm",
    "SC_rgb_small_odd.dcm",
    "rtdose.dcm",
    "rtplan.dcm",
    "test-SR.dcm",
    "reportsi.dcm",
    "MR_small_bigendian.dcm",
    "MR_small_implicit.dcm",
    "image_dfl.dcm",
]
IDENTIFYING = [
    "PatientName",
    "PatientID",
    "PatientBirthDate",
    "OtherPatientIDs",
    "InstitutionName",
    "InstitutionAddress",
    "ReferringPhysicianName",
    "PerformingPhysicianName",
    "OperatorsName",
    "StationName",
    "AccessionNumber",
    "StudyID",
    "StudyInstanceUID",
    "SeriesInstanceUID",
    "SOPInstanceUID",
    "FrameOfReferenceUID",
]


NUMERIC_VRS = ("US", "SS", "UL", "SL", "UV", "SV", "FL", "FD", "AT")


def _read(data: bytes):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # some bundled files have deliberately odd values
        return pydicom.dcmread(io.BytesIO(data))


def _bundled(name: str) -> bytes:
    return Path(get_testdata_file(name)).read_bytes()


def _identifying_values(ds) -> set[bytes]:
    """Identifying values of ``ds`` that the profile must remove. A value that also sits in an attribute
    the profile keeps (e.g. InstitutionName "TOSHIBA" inside Manufacturer "TOSHIBA_MEC") is left out."""
    kept = {
        str(e.value).strip()
        for e in ds.iterall()
        if int(e.tag) not in BASIC_PROFILE and not e.tag.is_private and e.VR not in ("SQ", "OB", "OW", "UN")
    }
    values = set()
    for keyword in IDENTIFYING:
        value = str(ds.get(keyword, "") or "").strip()
        if len(value.replace("^", "")) >= 4 and not any(value in k for k in kept):
            values.add(value.encode())
    return values


def _without_new_uids(out: bytes, after) -> bytes:
    """``out`` with the export's new UIDs blanked. Each is ``2.25.`` and 39 HMAC digits, so a short numeric
    identifier (liver_1frame's PatientID "99000") turns up inside one by chance: about 1 export in 300."""
    for elem in [*after.file_meta.iterall(), *after.iterall()]:
        if elem.VR != "UI" or not elem.value:
            continue
        values = elem.value if isinstance(elem.value, pydicom.multival.MultiValue) else [elem.value]
        for uid in values:
            if str(uid).startswith("2.25."):
                out = out.replace(str(uid).encode(), b"")
    return out


def _check_profile(ds, context=None) -> None:
    """Every element left complies with the basic profile as resolved for this data set, at every depth;
    no date, time or datetime is left that is not the dummy."""
    context = _context(ds) if context is None else context
    for elem in ds:
        tag = elem.tag
        assert not tag.is_private, f"private {tag} left"
        assert not (tag.group % 2 == 0 and (0x5000 <= tag.group <= 0x50FF or 0x6000 <= tag.group <= 0x60FF))
        code = BASIC_PROFILE.get(int(tag))
        value = elem.value
        if code is None:
            assert elem.VR not in ("DA", "TM", "DT"), f"{elem.keyword} {tag}: a date not in the table is left"
            if elem.VR == "SQ":
                for item in value:
                    _check_profile(item, context)
            continue
        action = resolve(code, int(tag), context)
        assert action != "X", f"{elem.keyword} {tag} should be removed ({code})"
        if elem.VR == "SQ":
            assert action != "Z" or len(value) == 0, f"{elem.keyword} should be emptied"
            assert len(value) > 0 or action == "Z", f"{elem.keyword}: an empty sequence is left ({code})"
            for item in value:
                _check_profile(item, context)
        elif action == "U" or elem.VR == "UI":
            assert value in (None, "") or all(
                str(v).startswith("2.25.")
                for v in (value if isinstance(value, list | pydicom.multival.MultiValue) else [value])
            )
        elif action == "D":
            if int(tag) == 0x00100020:
                assert str(value).startswith("ANON-") and len(str(value)) == 21
            else:
                assert str(value) == _DUMMY.get(elem.VR, str(value)) or elem.VR in NUMERIC_VRS
        else:
            assert value in (None, "", b"") or len(str(value)) == 0, f"{elem.keyword} should be empty"


@pytest.mark.parametrize("name", BUNDLED)
def test_bundled_file_is_deidentified(name):
    raw = _bundled(name)
    before = _read(raw)
    secrets_in = _identifying_values(before)
    out, warnings_found = deidentify_dicom(raw, UidMapper())
    after = _read(out)
    searched = _without_new_uids(out, after)
    for value in secrets_in:
        assert value not in searched, f"{value!r} left in {name}"
    _check_profile(after)
    assert after.PatientIdentityRemoved == "YES"
    assert after.DeidentificationMethodCodeSequence[0].CodeValue == "113100"
    assert len(after.DeidentificationMethod) <= 64
    assert after.file_meta.MediaStorageSOPInstanceUID == after.SOPInstanceUID != before.SOPInstanceUID
    assert len(after.SOPInstanceUID) <= 64
    if getattr(after, "preamble", None) is not None:
        assert after.preamble == b"\x00" * 128
    if "PixelData" in before:
        assert after.PixelData == before.PixelData  # pixels untouched
    assert warnings_found == []


def test_patient_data_really_was_there_to_remove():
    """Guard against a vacuous test: the bundled files do carry identifiers, private tags and overlays."""
    overlay = _read(_bundled("examples_overlay.dcm"))
    assert str(overlay.PatientName) and overlay.PatientBirthDate and overlay.InstitutionName
    assert any(e.tag.is_private for e in overlay) and any(e.tag.group == 0x6000 for e in overlay)
    ct = _read(_bundled("CT_small.dcm"))
    assert str(ct.PatientName) == "CompressedSamples^CT1" and ct.InstitutionName


def test_uids_stay_consistent_within_an_export_and_differ_between_exports(make_series):
    def reference_first(ds, k):
        ref = pydicom.Dataset()
        ref.ReferencedSOPClassUID = ds.SOPClassUID
        ref.ReferencedSOPInstanceUID = "1.2.3.999.1"
        ds.ReferencedImageSequence = [ref]
        ds.FrameOfReferenceUID = "1.2.3.999.2"
        if k == 0:
            ds.SOPInstanceUID = "1.2.3.999.1"
            ds.file_meta.MediaStorageSOPInstanceUID = "1.2.3.999.1"

    _, files = make_series(n=3, edit=reference_first, shuffle=False)
    uids = UidMapper()
    outs = [_read(deidentify_dicom(p.read_bytes(), uids)[0]) for p in files]
    assert len({str(d.StudyInstanceUID) for d in outs}) == 1
    assert len({str(d.SeriesInstanceUID) for d in outs}) == 1
    assert len({str(d.FrameOfReferenceUID) for d in outs}) == 1
    assert len({str(d.SOPInstanceUID) for d in outs}) == 3
    # a reference inside a kept sequence still points at the (renamed) instance it referenced
    assert all(d.ReferencedImageSequence[0].ReferencedSOPInstanceUID == outs[0].SOPInstanceUID for d in outs)
    again = _read(deidentify_dicom(files[0].read_bytes(), UidMapper())[0])
    assert again.SOPInstanceUID != outs[0].SOPInstanceUID


def test_burned_in_annotation_is_warned_about(make_series):
    def burned(ds, k):
        ds.BurnedInAnnotation = "YES"

    _, files = make_series(n=1, edit=burned)
    _, found = deidentify_dicom(files[0].read_bytes(), UidMapper())
    assert found and "burned-in" in found[0]


def test_deidentified_vault_export_of_a_series(vault, make_series, tmp_path):
    def identify(ds, k):
        ds.InstitutionName = "Zebulon General Hospital"
        ds.ReferringPhysicianName = "House^Gregory"
        ds.PatientBirthDate = "19610203"
        ds.add_new(0x00291010, "LO", "private Zebulon note")

    folder, files = make_series(n=3, patient_name="Quux^Zebulon", edit=identify)
    info = vault.import_dicom(folder, label="Quux Zebulon knee")
    result = vault.export(info.id, tmp_path / "out", deidentify=True)
    assert result.deidentified and len(result.files) == 4
    originals = [p.read_bytes() for p in files]
    secrets_in = set().union(*(_identifying_values(_read(r)) for r in originals)) | {b"Zebulon", b"Gregory"}
    for path in result.files:
        assert "zebulon" not in str(path).lower() and "quux" not in str(path).lower()
        data = path.read_bytes()
        for value in secrets_in:
            assert value not in data, (path.name, value)
    img = nib.load(result.files[0])
    assert img.header["descrip"].item() == b"" and len(img.header.extensions) == 0
    for path in result.files[1:]:
        _check_profile(_read(path.read_bytes()))


def _code_item(value: str, scheme: str, meaning: str):
    from pydicom.dataset import Dataset

    item = Dataset()
    item.CodeValue, item.CodingSchemeDesignator, item.CodeMeaning = value, scheme, meaning
    return item


def test_codes_inside_sequences_kept_with_dummy_content_are_replaced(make_series):
    """Person Identification Code Sequence and the other sequences the profile gives a dummy value (D) keep
    their items, but not the codes in them. Before: "EMP-004711", the scheme and the meaning were exported."""
    from pydicom.dataset import Dataset
    from pydicom.sequence import Sequence

    _, files = make_series(n=1)
    ds = _read(files[0].read_bytes())
    planted = {
        "EMP-004711": ("HOSPITAL-HR", "Employee Jane Roe"),
        "BADGE-9917": ("SECURITY", "Badge of John Smith"),
        "FLOW-31337": ("FLOWREG", "Flow of Ward 7B"),
        "GRAPH-5150": ("ANNOT", "Marked by Dr Who"),
    }
    codes = list(planted.items())
    ds.PersonIdentificationCodeSequence = Sequence([_code_item(codes[0][0], *codes[0][1])])
    observer = Dataset()
    observer.VerifyingObserverName = "Roe^Jane"
    observer.PersonIdentificationCodeSequence = Sequence([_code_item(codes[1][0], *codes[1][1])])
    ds.VerifyingObserverSequence = Sequence([observer])
    ds.FlowIdentifierSequence = Sequence([_code_item(codes[2][0], *codes[2][1])])
    graphic = Dataset()
    graphic.GraphicLayer = "LAYER"
    graphic.ConceptNameCodeSequence = Sequence([_code_item(codes[3][0], *codes[3][1])])
    ds.GraphicAnnotationSequence = Sequence([graphic])
    # a code in a sequence the profile does not act on stays: only D sequences get dummy content
    ds.AnatomicRegionSequence = Sequence([_code_item("T-A0100", "SRT", "Brain")])
    raw = io.BytesIO()
    ds.save_as(raw)
    out, _ = deidentify_dicom(raw.getvalue(), UidMapper())
    for value, (scheme, meaning) in planted.items():
        for text in (value, scheme, meaning):
            assert text.encode() not in out, f"{text!r} was exported"
    after = _read(out)
    assert len(after.PersonIdentificationCodeSequence) == 1  # kept (D), with dummy content
    assert after.PersonIdentificationCodeSequence[0].CodeValue == _DUMMY["SH"]
    nested = after.VerifyingObserverSequence[0].PersonIdentificationCodeSequence[0]
    assert nested.CodeMeaning == _DUMMY["LO"]
    assert after.AnatomicRegionSequence[0].CodeValue == "T-A0100"
    _check_profile(after)
