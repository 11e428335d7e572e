"""De-identification of exported DICOM files: DICOM PS3.15 Annex E, Basic Application Level Confidentiality
Profile, no options retained, to the edition of Table E.1-1 in :mod:`engine.vault.annex_e` (generated from
the standard's table by packaging/annex_e_table.py).

How the standard's actions are resolved without a full table of each attribute's type in each IOD:

- ``U`` (and the UIDs inside ``X/Z/U*`` sequences): replaced by new UIDs derived from the old UID with a
  per-export secret (HMAC), so references between the files of one export stay consistent while nothing
  links them to the originals. ``X/Z/U*`` sequences are kept and cleaned recursively.
- ``X``: removed. ``Z``: a zero-length value (an empty sequence for a sequence).
- ``D``: a dummy value of the VR (a person name ``Anonymized^Anonymized``, PS3.5's family^given form,
  not the retired single-component form); a sequence under ``D`` (Person Identification Code Sequence,
  Verifying Observer Sequence, Flow Identifier Sequence, Graphic Annotation Sequence, Content Sequence)
  keeps its items with dummy content: the table's rows apply inside, and every other value (a code item's
  Code Value, Coding Scheme Designator and Code Meaning, any text) becomes its VR's dummy, its UIDs
  replaced, at every depth. Before, the codes inside such a kept sequence were kept as they came.
- ``X/Z``, ``X/D``, ``X/Z/D``: removed (their Type 3 reading), except the attributes listed in
  ``_NEEDED`` that are Type 1 or 2 in the IODs that carry them, which get the weaker action. So a Type 3
  sequence such as Referenced Study Sequence is removed, never left empty (an empty Type 3 sequence is
  invalid). "Enhanced" rows apply only to multi-frame images with functional groups, whose Enhanced
  modules make Content Date/Time, Acquisition DateTime and Device Serial Number Type 1.
- ``Z``: zero-length, except Study Date, Study Time and Study ID, which get dummies (Z allows one): a
  DICOMDIR's study record needs them.
- ``Z/D``: zero-length, except Patient ID, which gets a pseudonym that is the same for one patient
  within an export (``ANON-`` and 16 hex digits of an HMAC under the export's secret): DICOMDIR builders
  and PACS imports refuse an empty Patient ID.
- Beyond the table: every other date, time and datetime attribute (VR DA, TM, DT) is removed, at every
  depth (the table cannot list every date a vendor adds); private attributes, curve data (50xx groups)
  and overlay groups (60xx) are removed; other sequences (per-frame and shared functional groups
  included) are cleaned recursively; the file preamble is zeroed and identifying file-meta attributes
  (source/sending/receiving AE titles, private information) are removed.
- Recorded: Patient Identity Removed = YES, De-identification Method naming the profile and edition, its
  code sequence with CID 7050's code for the Basic Profile alone (113100: no option was applied), and
  Longitudinal Temporal Information Modified = REMOVED (every date and time is removed, emptied or
  replaced by a dummy).

Not done (warned about): pixel data with burned-in annotations (the Clean Pixel Data Option) and faces in
head volumes (defacing) are outside the basic profile; free text that the table keeps (SR Text Value,
Clean Structured Content Option) is kept, as the profile says.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import os

from engine.vault.annex_e import BASIC_PROFILE, EDITION

#: De-identification Method (0012,0063) is a LO: at most 64 characters.
METHOD = f"DICOM PS3.15 {EDITION} Basic Profile; other dates removed"
_TEXT_DUMMY = "ANONYMIZED"
_DUMMY = {
    "AE": _TEXT_DUMMY,
    "AS": "000D",
    "CS": _TEXT_DUMMY,
    "DA": "19000101",
    "DS": "0",
    "DT": "19000101000000",
    "IS": "0",
    "LO": _TEXT_DUMMY,
    "LT": _TEXT_DUMMY,
    "PN": "Anonymized^Anonymized",
    "SH": _TEXT_DUMMY,
    "ST": _TEXT_DUMMY,
    "TM": "000000",
    "UC": _TEXT_DUMMY,
    "UR": "urn:anonymized",
    "UT": _TEXT_DUMMY,
}
_NUMERIC = {"US", "SS", "UL", "SL", "UV", "SV", "FL", "FD", "AT"}
_FILE_META_REMOVE = (0x00020016, 0x00020017, 0x00020018, 0x00020100, 0x00020102)
_DATE_VRS = {"DA", "TM", "DT"}
_PATIENT_ID = 0x00100020
_PET_IMAGE = "1.2.840.10008.5.1.4.1.1.128"
#: Study Date, Study Time, Study ID: Type 2 in the IODs, Type 1 in a DICOMDIR's study record.
_DICOMDIR_KEYS = frozenset({0x00080020, 0x00080030, 0x00200010})

#: Attributes with a compound code that some IOD needs (Type 1 or 2), so the weaker action applies:
#: tag -> (the action, when: "always", "enhanced" for multi-frame images with functional groups, or a
#: SOP Class UID). Everything else with X/Z, X/D or X/Z/D is Type 3 where it occurs, and is removed.
_NEEDED: dict[int, tuple[str, str]] = {
    0x00400555: ("Z", "always"),  # Acquisition Context Sequence: Type 2 (Acquisition Context module)
    0x00102203: ("Z", "always"),  # Patient's Sex Neutered: Type 2C (present only for animals)
    0x22000002: ("Z", "always"),  # Label Text: Type 2 (Specimen Label)
    0x22000005: ("Z", "always"),  # Barcode Value: Type 2 (Specimen Label)
    0x300E0008: ("Z", "always"),  # Reviewer Name: Type 2C (Approval module, when reviewed)
    0x300A00B2: ("Z", "always"),  # Treatment Machine Name: Type 2 (RT Beams)
    0x300A0006: ("D", "always"),  # RT Plan Date: Type 2 (RT General Plan)
    0x300A0007: ("D", "always"),  # RT Plan Time: Type 2 (RT General Plan)
    0x30080250: ("D", "always"),  # Treatment Date: Type 2 (RT Treatment Summary / Record)
    0x30080251: ("D", "always"),  # Treatment Time: Type 2
    0x30080054: ("D", "always"),  # First Treatment Date: Type 2 (RT Treatment Summary Record)
    0x30080056: ("D", "always"),  # Most Recent Treatment Date: Type 2
    0x0040A032: ("D", "always"),  # Observation DateTime: Type 1C in SR content items
    0x00080022: ("Z", _PET_IMAGE),  # Acquisition Date: Type 2 in the PET Image module
    0x00080032: ("Z", _PET_IMAGE),  # Acquisition Time: Type 2 in the PET Image module
    0x00080021: ("D", _PET_IMAGE),  # Series Date: Type 1 in the PET Series module
    0x00080031: ("D", _PET_IMAGE),  # Series Time: Type 1 in the PET Series module
    0x0008002A: ("D", "enhanced"),  # Acquisition DateTime: Type 1C in the Enhanced MR/CT Image modules
    0x00181000: ("D", "enhanced"),  # Device Serial Number: Type 1 in Enhanced General Equipment
    0x00080023: ("D", "enhanced"),  # Content Date: Type 1 in the Multi-frame Functional Groups module
    0x00080033: ("D", "enhanced"),  # Content Time: Type 1 in the Multi-frame Functional Groups module
}


class UidMapper:
    """Replaces UIDs consistently within one export (same input UID -> same new UID).

    The new UID is ``2.25.<128-bit integer>`` (the UUID-derived root of PS3.5 B.2) computed as an HMAC of
    the old UID under a secret that exists only for this export, so new UIDs cannot be linked back.
    """

    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = secret or os.urandom(32)
        self._cache: dict[str, str] = {}

    def __call__(self, uid: str) -> str:
        uid = str(uid).strip().rstrip("\x00")
        if not uid:
            return uid
        new = self._cache.get(uid)
        if new is None:
            digest = hmac.new(self._secret, uid.encode("ascii", "replace"), hashlib.sha256).digest()
            new = f"2.25.{int.from_bytes(digest[:16], 'big')}"
            self._cache[uid] = new
        return new

    def pseudonym(self, value: str) -> str:
        """``ANON-`` and 16 hex digits: the same for the same value within this export, unlinkable to it."""
        text = str(value).strip()
        digest = hmac.new(self._secret, b"pseudonym\0" + text.encode("utf-8", "replace"), hashlib.sha256)
        return f"ANON-{digest.hexdigest()[:16].upper()}"


def _is_removed_group(group: int) -> bool:
    return group % 2 == 0 and (0x5000 <= group <= 0x50FF or 0x6000 <= group <= 0x60FF)


def _map_uids(elem, uids: UidMapper) -> None:
    value = elem.value
    if value is None or value == "":
        return
    if isinstance(value, str | bytes):
        elem.value = uids(value.decode("ascii", "replace") if isinstance(value, bytes) else value)
    else:  # MultiValue
        elem.value = [uids(v) for v in value]


def _dummy(elem, uids: UidMapper) -> None:
    vr = elem.VR
    if vr == "UI":
        _map_uids(elem, uids)
    elif vr in _DUMMY:
        elem.value = _DUMMY[vr]
    elif vr in _NUMERIC:
        elem.value = 0
    else:  # OB, OW, OF, OD, OL, OV, UN: opaque bytes
        elem.value = b"\x00\x00"


def resolve(code: str, tag: int, context: frozenset[str] = frozenset()) -> str:
    """The single action (``X``, ``Z``, ``D``, ``U`` or ``K`` for "keep and clean the items") that a table
    code resolves to for ``tag`` in a data set described by ``context`` (its SOP Class UID, and
    ``"enhanced"`` for a multi-frame image with functional groups)."""
    if "U" in code:
        return "U" if code == "U" else "K"  # X/Z/U*: keep the sequence, replace the UIDs inside
    if code == "Z" and tag in _DICOMDIR_KEYS:
        return "D"  # Z allows a dummy; a DICOMDIR's study record needs these three (Type 1 there)
    if code in ("X", "Z", "D"):
        return code
    if code == "Z/D":
        if tag == _PATIENT_ID:
            return "D"
        needed = _NEEDED.get(tag)
        return "D" if needed and needed[1] in context else "Z"
    needed = _NEEDED.get(tag)  # X/Z, X/D, X/Z/D: remove unless the IOD needs the attribute
    if needed and (needed[1] == "always" or needed[1] in context):
        return needed[0]
    return "X"


def _context(ds) -> frozenset[str]:
    found = {str(ds.get("SOPClassUID", "")).strip()}
    if "PerFrameFunctionalGroupsSequence" in ds or "SharedFunctionalGroupsSequence" in ds:
        found.add("enhanced")
    return frozenset(found)


def clean_dataset(ds, uids: UidMapper, context: frozenset[str] | None = None, *, dummy: bool = False) -> None:
    """Apply the basic profile to a data set in place, recursing into the sequences it keeps.

    ``dummy``: ``ds`` is an item of a sequence the profile gives a dummy value (``D``), such as Person
    Identification Code Sequence: a dummy sequence has dummy content, so every value in it that the table
    does not act on otherwise (the code value, scheme and meaning of a code item, any text) becomes its VR's
    dummy and its UIDs are replaced, at every depth. Rows of the table inside it still apply first.
    """
    if context is None:
        context = _context(ds)
    for elem in list(ds):
        tag = elem.tag
        if tag.is_private or _is_removed_group(tag.group):
            del ds[tag]
            continue
        code = BASIC_PROFILE.get(int(tag))
        if code is None:
            if elem.VR in _DATE_VRS:
                del ds[tag]  # a date or time the table does not list: removed, not trusted to be harmless
            elif elem.VR == "SQ":
                for item in elem.value or []:
                    clean_dataset(item, uids, context, dummy=dummy)
            elif dummy and elem.value not in (None, "", b""):
                _dummy(elem, uids)
            continue
        action = resolve(code, int(tag), context)
        if action == "X":
            del ds[tag]
        elif elem.VR == "SQ":
            if action == "Z":
                elem.value = []
            else:  # D, U, K: the items stay, cleaned by the same table (under D, with dummy content)
                for item in elem.value or []:
                    clean_dataset(item, uids, context, dummy=dummy or action == "D")
        elif action == "U" or (elem.VR == "UI" and action in ("D", "K")):
            _map_uids(elem, uids)
        elif action == "D":
            if int(tag) == _PATIENT_ID:
                elem.value = uids.pseudonym(elem.value or "")
            else:
                _dummy(elem, uids)
        else:  # Z
            elem.value = b"" if elem.VR in ("OB", "OW", "OF", "OD", "OL", "OV", "UN") else None


def deidentify_dicom(raw: bytes, uids: UidMapper) -> tuple[bytes, list[str]]:
    """De-identify one DICOM file.

    Args:
        raw: The original file's bytes.
        uids: The export's UID mapper (shared by all files of one series).

    Returns:
        (de-identified file bytes, warnings for things the basic profile cannot fix).
    """
    import pydicom
    from pydicom.dataset import Dataset
    from pydicom.sequence import Sequence

    ds = pydicom.dcmread(io.BytesIO(raw))
    warnings = []
    if str(ds.get("BurnedInAnnotation", "")).upper() == "YES":
        warnings.append(
            "the image has burned-in annotations (BurnedInAnnotation = YES): text in the pixels may "
            "identify the patient and is not removed"
        )
    clean_dataset(ds, uids)
    meta = getattr(ds, "file_meta", None)
    if meta is not None:
        for tag in _FILE_META_REMOVE:
            if tag in meta:
                del meta[tag]
        if "SOPInstanceUID" in ds:  # the file meta must name the same instance as the data set
            meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
        elif "MediaStorageSOPInstanceUID" in meta:
            meta.MediaStorageSOPInstanceUID = uids(str(meta.MediaStorageSOPInstanceUID))
    if getattr(ds, "preamble", None) is not None:
        ds.preamble = b"\x00" * 128
    ds.PatientIdentityRemoved = "YES"
    ds.DeidentificationMethod = METHOD
    code = Dataset()  # CID 7050: the Basic Profile alone; no option's code, as none was applied
    code.CodeValue = "113100"
    code.CodingSchemeDesignator = "DCM"
    code.CodeMeaning = "Basic Application Confidentiality Profile"
    ds.DeidentificationMethodCodeSequence = Sequence([code])
    ds.LongitudinalTemporalInformationModified = "REMOVED"
    out = io.BytesIO()
    ds.save_as(out)
    return out.getvalue(), warnings
