"""De-identified DICOM exports checked by dciodvfy (dicom3tools), a validator of DICOM files against the
IODs of the standard that the product's own code does not use."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from pydicom.dataset import Dataset
from pydicom.uid import generate_uid

DCIODVFY = shutil.which("dciodvfy")
pytestmark = pytest.mark.skipif(
    DCIODVFY is None, reason="dciodvfy is not installed (Debian package dicom3tools, in packaging/setup.sh)"
)


def _report(path) -> tuple[set[str], set[str]]:
    """(error lines, warning lines) dciodvfy prints for one file."""
    run = subprocess.run([DCIODVFY, str(path)], capture_output=True, text=True, timeout=120, check=False)
    lines = [line.strip() for line in (run.stdout + run.stderr).splitlines()]
    return {x for x in lines if x.startswith("Error")}, {x for x in lines if x.startswith("Warning")}


def _scanner_attributes(ds, k):
    """What a scanner writes and the basic profile must deal with: creation dates, the station, the
    study and procedure-step references (Type 3 sequences), device and institution identity."""
    ds.InstanceCreationDate = "20240611"
    ds.InstanceCreationTime = "101500"
    ds.StationAETitle = "MRSCANNER7"
    ds.StationName = "ZEBULON_MR1"
    ds.InstitutionName = "Zebulon General"
    ds.DeviceSerialNumber = "SN12345"
    ds.ProtocolName = "t1_mprage_zebulon"
    ds.AcquisitionDate = "20240611"
    ds.AcquisitionTime = "101000"
    study = Dataset()
    study.ReferencedSOPClassUID = "1.2.840.10008.3.1.2.3.1"  # Detached Study Management (retired)
    study.ReferencedSOPInstanceUID = "1.2.826.0.1.3680043.10.77.1"
    ds.ReferencedStudySequence = [study]
    step = Dataset()
    step.ReferencedSOPClassUID = "1.2.840.10008.3.1.2.3.3"  # Modality Performed Procedure Step
    step.ReferencedSOPInstanceUID = generate_uid()
    ds.ReferencedPerformedProcedureStepSequence = [step]


def test_deidentified_export_adds_no_dciodvfy_error(vault, make_series, tmp_path):
    folder, files = make_series(n=3, patient_name="Quux^Zebulon", edit=_scanner_attributes)
    info = vault.import_dicom(folder, label="scanner series")
    result = vault.export(info.id, tmp_path / "out", deidentify=True)
    exported = [p for p in result.files if p.suffix == ".dcm"]
    assert len(exported) == 3
    errors_in, warnings_in = set(), set()
    for path in files:
        errors, warnings = _report(path)
        errors_in |= errors
        warnings_in |= warnings
    for path in exported:
        errors, warnings = _report(path)
        assert errors - errors_in == set(), path.name
        new_warnings = warnings - warnings_in
        # the dummies are valid and a DICOMDIR can be built from the export
        assert not [w for w in new_warnings if "Retired Person Name" in w or "DICOMDIR" in w], new_warnings


def test_dciodvfy_reports_the_errors_it_is_relied_on_for(make_series, tmp_path):
    """Guard against a vacuous check: dciodvfy does flag an empty Type 3 sequence and the retired name
    form, the two faults of the old export."""
    import pydicom

    folder, files = make_series(n=1)
    ds = pydicom.dcmread(files[0])
    ds.ReferencedStudySequence = []
    ds.OperatorsName = "Anonymized"
    bad = tmp_path / "bad.dcm"
    ds.save_as(bad)
    errors, warnings = _report(bad)
    assert any("ReferencedStudySequence" in e for e in errors)
    assert any("Retired Person Name" in w for w in warnings)
