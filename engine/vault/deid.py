"""De-identification of exported DICOM files: DICOM PS3.15 Annex E, Basic Application Level Confidentiality
Profile (no options retained).

How the standard's compound actions are resolved without knowing each attribute's type in each IOD:

- ``U`` (and ``X/Z/U*`` on sequences): UIDs are replaced by new ones derived from the old UID with a
  per-export secret (HMAC), so references between the files of one export stay consistent while nothing
  links them to the originals. ``X/Z/U*`` sequences are kept and cleaned recursively.
- ``X``: removed.
- ``Z``, ``X/Z``: emptied (a zero-length value is valid for type 2 and type 3 attributes and leaks nothing).
- ``D``, ``X/D``, ``Z/D``, ``X/Z/D``: replaced with a dummy value (valid even for type 1 attributes).
- Sequences under any action other than ``X`` or ``U``: emptied (no items), so no nested free text
  survives.
- Private attributes, curve data (50xx groups) and overlay groups (60xx) are removed; the file preamble is
  zeroed and identifying file-meta attributes (source/sending/receiving AE titles, private information)
  are removed.
- Patient Identity Removed = YES, De-identification Method (+ code sequence, DCM 113100) and Longitudinal
  Temporal Information Modified = REMOVED are added.

Not done (warned about): pixel data with burned-in annotations (the Clean Pixel Data Option) and faces in
head volumes (defacing) are outside the basic profile.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import os

from engine.vault.annex_e import BASIC_PROFILE

#: De-identification Method (0012,0063) is a LO: at most 64 characters.
METHOD = "DICOM PS3.15 Annex E Basic Profile (VolSynth)"
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
    "PN": "Anonymized",
    "SH": _TEXT_DUMMY,
    "ST": _TEXT_DUMMY,
    "TM": "000000",
    "UC": _TEXT_DUMMY,
    "UR": "urn:anonymized",
    "UT": _TEXT_DUMMY,
}
_NUMERIC = {"US", "SS", "UL", "SL", "UV", "SV", "FL", "FD", "AT"}
_FILE_META_REMOVE = (0x00020016, 0x00020017, 0x00020018, 0x00020100, 0x00020102)


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


def clean_dataset(ds, uids: UidMapper) -> None:
    """Apply the basic profile to a dataset in place, recursing into kept sequences."""
    for elem in list(ds):
        tag = elem.tag
        if tag.is_private or _is_removed_group(tag.group):
            del ds[tag]
            continue
        code = BASIC_PROFILE.get(int(tag))
        if elem.VR == "SQ":
            if code is None or "U" in code:
                for item in elem.value or []:
                    clean_dataset(item, uids)
            elif code == "X":
                del ds[tag]
            else:
                elem.value = []
            continue
        if code is None:
            continue
        if "U" in code:
            _map_uids(elem, uids)
        elif code == "X":
            del ds[tag]
        elif "D" in code:
            _dummy(elem, uids)
        else:  # Z, X/Z
            elem.value = None


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
    code = Dataset()
    code.CodeValue = "113100"
    code.CodingSchemeDesignator = "DCM"
    code.CodeMeaning = "Basic Application Confidentiality Profile"
    ds.DeidentificationMethodCodeSequence = Sequence([code])
    ds.LongitudinalTemporalInformationModified = "REMOVED"
    out = io.BytesIO()
    ds.save_as(out)
    return out.getvalue(), warnings
