"""PHI hygiene (issue 18, failure 6) and item details (issue 13): patient fields from a file or a prompt
instead of the command line, core dumps off in CLI vault commands (checked in a child process), dates
validated, details editable after import, duplicates refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from vault_testutil import PASSPHRASE

from engine.cli import main
from engine.errors import DuplicateItem, InvalidRequest
from engine.nifti.volume import Volume
from engine.vault import Vault

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def run(vault, tmp_path, capsys):
    pw = tmp_path / "pw.txt"
    pw.write_text(PASSPHRASE + "\n")
    vault.lock()

    def run(*args):
        rc = main(["vault", *args, "--vault", str(vault.path), "--passphrase-file", str(pw)])
        out, err = capsys.readouterr()
        assert "Traceback" not in err
        return rc, out, err

    return run


@pytest.mark.parametrize(
    "text",
    [
        json.dumps({"name": "Doe^Jane", "id": "P-0042", "birth_date": "1970-01-31"}),
        "# exported from the RIS\npatient_name = Doe^Jane\npatient-id=P-0042\nbirth_date=19700131\n",
    ],
)
def test_patient_fields_come_from_a_file_not_the_command_line(run, vault, make_nifti, tmp_path, text):
    patient_file = tmp_path / "patient.txt"
    patient_file.write_text(text)
    path, _, _ = make_nifti()
    rc, out, _ = run("import", str(path), "--patient-file", str(patient_file), "--study-date", "2024-01-31")
    assert rc == 0
    v = Vault(vault.path)
    v.unlock(PASSPHRASE)
    (info,) = v.items()
    assert info.patient == {"name": "Doe^Jane", "id": "P-0042", "birth_date": "19700131"}
    assert info.study == {"date": "20240131"}
    v.lock()


def test_patient_fields_from_a_prompt(run, vault, make_nifti, monkeypatch):
    answers = iter(["Roe^Richard", "P-7", ""])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(answers))
    rc, _, _ = run("import", str(make_nifti()[0]), "--ask-patient")
    assert rc == 0
    v = Vault(vault.path)
    v.unlock(PASSPHRASE)
    assert v.items()[0].patient == {"name": "Roe^Richard", "id": "P-7"}
    v.lock()


def test_help_says_where_patient_fields_can_come_from(capsys):
    with pytest.raises(SystemExit):
        main(["vault", "import", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--patient-file" in text and "--ask-patient" in text and "process list" in text


def test_bad_patient_file_is_one_line(run, make_nifti, tmp_path):
    bad = tmp_path / "p.txt"
    bad.write_text("surname=Doe\n")
    rc, _, err = run("import", str(make_nifti()[0]), "--patient-file", str(bad))
    assert rc == 2 and "unknown key 'surname'" in err and err.count("\n") == 1


def test_cli_vault_commands_turn_core_dumps_off(vault, tmp_path):
    """In a child process: while `vault ls` has the vault unlocked, RLIMIT_CORE is (0, 0) and the process
    is not dumpable (prctl PR_GET_DUMPABLE), so a crash cannot write patient data to a core file."""
    if not sys.platform.startswith("linux"):
        pytest.skip("prctl(PR_SET_DUMPABLE) is Linux only")
    pw = tmp_path / "pw.txt"
    pw.write_text(PASSPHRASE + "\n")
    vault.lock()
    child = Path(__file__).with_name("child_vault_ls_core_dumps.py")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, str(child), str(vault.path), str(pw)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert "CORE (0, 0) DUMPABLE 0" in proc.stdout


def test_dates_are_validated(vault, make_nifti):
    path, _, _ = make_nifti()
    for bad, what in (
        ("2024-13-01", "study date"),
        ("31/01/2024", "study date"),
        ("2999-01-01", "study date"),
    ):
        with pytest.raises(InvalidRequest, match=what):
            vault.import_nifti(path, study={"date": bad})
    with pytest.raises(InvalidRequest, match="birth date '1970-02-30' is not a valid date"):
        vault.import_nifti(path, patient={"birth_date": "1970-02-30"})
    info = vault.import_nifti(path, study={"date": "2024-02-29"})
    assert info.study["date"] == "20240229"


def test_details_can_be_edited_after_import(vault, make_nifti, run):
    v = Vault(vault.path)
    v.unlock(PASSPHRASE)
    info = v.import_nifti(make_nifti()[0], label="first")
    edited = v.update_item(
        info.id, label="T1 follow-up", patient={"name": "Doe^Jane"}, study={"date": "2024-01-31"}
    )
    assert (edited.label, edited.patient, edited.study) == (
        "T1 follow-up",
        {"name": "Doe^Jane"},
        {"date": "20240131"},
    )
    with pytest.raises(InvalidRequest, match="not a valid date"):
        v.update_item(info.id, study={"date": "yesterday"})
    synthetic = v.add_synthetic(
        Volume(np.random.default_rng(5).random((4, 4, 4)), np.eye(4), provenance={"seed": 1})
    )
    with pytest.raises(InvalidRequest, match="has no patient"):
        v.update_item(synthetic.id, patient={"name": "Doe^Jane"})
    assert [e.event for e in v.audit_trail().entries].count("edit") == 1
    v.lock()
    rc, out, _ = run("edit", info.id[:8], "--label", "renamed", "--study-date", "2024-02-01")
    assert rc == 0 and "updated scan" in out
    again = Vault(vault.path)
    again.unlock(PASSPHRASE)
    got = again.get(info.id)
    assert (
        got.label == "renamed" and got.study == {"date": "20240201"} and got.patient == {"name": "Doe^Jane"}
    )
    again.lock()


def test_the_same_volume_twice_is_refused_unless_asked(vault, make_nifti, run):
    v = Vault(vault.path)
    v.unlock(PASSPHRASE)
    path, _, _ = make_nifti()
    first = v.import_nifti(path, label="scan")
    blobs = set((v.path / "blobs").iterdir())
    with pytest.raises(DuplicateItem, match="already in the vault as \u201cscan\u201d") as caught:
        v.import_nifti(path)
    assert caught.value.existing == first.id and set((v.path / "blobs").iterdir()) == blobs
    data = np.random.default_rng(1).random((4, 4, 4))
    v.add_synthetic(Volume(data, np.eye(4), provenance={"seed": 1}))
    with pytest.raises(DuplicateItem):
        v.add_synthetic(Volume(data, np.eye(4), provenance={"seed": 1}))
    v.add_synthetic(Volume(data, np.eye(4), provenance={"seed": 1}), allow_duplicate=True)
    assert len(v.items()) == 3
    v.lock()
    rc, _, err = run("import", str(path))
    assert rc == 2 and "already in the vault" in err
    assert run("import", str(path), "--allow-duplicate")[0] == 0


def test_one_volume_saved_to_two_files_is_one_volume_to_the_vault(vault, tmp_path):
    """The duplicate check compares voxels, affine and provenance, not file bytes: two .nii.gz files of the
    same generated volume (different names, so different gzip headers) are the same item; a different seed
    or different voxels are not."""
    from engine.nifti.io import save_volume
    from engine.nifti.volume import Volume

    data = np.random.default_rng(2).random((6, 7, 5)).astype(np.float32)
    affine = np.diag([2.0, 2.0, 2.0, 1.0])
    provenance = {"model": {"id": "tiny"}, "seed": 7, "synthetic": True}
    one, two = tmp_path / "one.nii.gz", tmp_path / "other-name.nii"
    for path in (one, two):
        save_volume(Volume(data, affine, provenance=provenance, synthetic=True), path)
    assert one.read_bytes() != two.read_bytes()
    v = Vault(vault.path)
    v.unlock(PASSPHRASE)
    first = v.import_nifti(one)
    with pytest.raises(DuplicateItem) as caught:
        v.import_nifti(two)
    assert caught.value.existing == first.id
    # The app's own "Save to Vault" of that volume is the same volume too.
    with pytest.raises(DuplicateItem):
        v.add_synthetic(Volume(data, affine, provenance=provenance))
    # Other voxels, or the same voxels from another seed, are another volume.
    changed = data.copy()
    changed[0, 0, 0] += 1
    save_volume(Volume(changed, affine, provenance=provenance, synthetic=True), tmp_path / "changed.nii.gz")
    save_volume(
        Volume(data, affine, provenance={**provenance, "seed": 8}, synthetic=True), tmp_path / "seed8.nii.gz"
    )
    v.import_nifti(tmp_path / "changed.nii.gz")
    v.import_nifti(tmp_path / "seed8.nii.gz")
    assert len(v.items()) == 3
    v.lock()
