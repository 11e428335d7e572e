"""``volsynth vault``: every sub-command, prompts, exit codes and one-line errors."""

from __future__ import annotations

import getpass
import json

import pytest
from vault_testutil import FAST_KDF, PASSPHRASE

from engine.cli import main
from engine.vault import Vault


@pytest.fixture
def cli(tmp_path, capsys):
    """Run ``volsynth vault ...`` against a fast test vault; returns (rc, stdout, stderr)."""
    vault_path = tmp_path / "vault"
    Vault.create(vault_path, PASSPHRASE, kdf=FAST_KDF).lock()
    pw = tmp_path / "pw.txt"
    pw.write_text(PASSPHRASE + "\n")

    def run(*args, passphrase_file=pw, vault=vault_path):
        argv = ["vault", *args]
        if vault is not None:
            argv += ["--vault", str(vault)]
        if passphrase_file is not None:
            argv += ["--passphrase-file", str(passphrase_file)]
        rc = main(argv)
        out, err = capsys.readouterr()
        assert "Traceback" not in err
        return rc, out, err

    run.vault_path = vault_path
    return run


def test_init_with_prompt_and_default_argon2(tmp_path, monkeypatch, capsys):
    answers = iter(["a new vault passphrase", "a new vault passphrase"])
    monkeypatch.setattr(getpass, "getpass", lambda prompt="": next(answers))
    path = tmp_path / "v"
    assert main(["vault", "init", "--vault", str(path)]) == 0
    assert "Argon2id 64 MiB, t=3, p=4" in capsys.readouterr().out
    v = Vault(path)
    assert v.kdf_params.meets_rfc9106
    v.unlock("a new vault passphrase")
    v.lock()
    rc = main(["vault", "init", "--vault", str(path)])
    assert rc == 2 and "already exists" in capsys.readouterr().err


def test_init_rejects_mismatched_confirmation(tmp_path, monkeypatch, capsys):
    answers = iter(["first passphrase!", "second passphrase"])
    monkeypatch.setattr(getpass, "getpass", lambda prompt="": next(answers))
    assert main(["vault", "init", "--vault", str(tmp_path / "v")]) == 2
    assert capsys.readouterr().err == "volsynth: error: the passphrases do not match; nothing was changed\n"
    assert not Vault.exists(tmp_path / "v")


def test_import_ls_export_rm(cli, make_nifti, make_series, tmp_path):
    path, _, _ = make_nifti("t1.nii.gz", descrip="secret")
    folder, _ = make_series(n=3, patient_name="Quux^Zebulon")
    rc, out, _ = cli(
        "import", str(path), "--patient-name", "Roe^Jane", "--patient-id", "J-5", "--study-date", "20240101"
    )
    assert rc == 0 and out.startswith(f"imported {path} as scan ")
    nifti_id = out.split()[4]
    rc, out, _ = cli("import", str(folder))
    assert rc == 0 and "3 DICOM files" in out
    dicom_id = out.split()[4]

    rc, out, _ = cli("ls")
    assert rc == 0
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["ID", "KIND", "LABEL"]
    assert nifti_id[:12] in out and "Roe^Jane (J-5)" in out and "Quux^Zebulon" in out and "20240101" in out
    rc, out, _ = cli("ls", "zebulon")
    assert rc == 0 and dicom_id[:12] in out and nifti_id[:12] not in out
    rc, out, _ = cli("ls", "--json", "--kind", "scan")
    assert {i["id"] for i in json.loads(out)} == {nifti_id, dicom_id}

    rc, out, err = cli("export", dicom_id[:8], str(tmp_path / "out"), "--deidentify")
    assert rc == 0 and out.startswith("exported de-identified 4 file(s):")
    assert all("zebulon" not in line.lower() for line in out.splitlines())
    rc, _, err = cli("export", dicom_id[:8], str(tmp_path / "out"), "--deidentify")
    assert rc == 7 and "already exists" in err

    rc, out, _ = cli("rm", nifti_id[:10])
    assert rc == 0 and out == f"deleted scan {nifti_id}\n"
    rc, out, _ = cli("ls", "--json")
    assert [i["id"] for i in json.loads(out)] == [dicom_id]


def test_synthetic_import_needs_provenance(cli, make_nifti, tmp_path):
    path, _, _ = make_nifti("gen.nii")
    rc, _, err = cli("import", str(path), "--synthetic")
    assert rc == 2 and "--provenance" in err
    prov = tmp_path / "prov.json"
    prov.write_text(json.dumps({"model_id": "demo", "seed": 3}))
    rc, out, _ = cli("import", str(path), "--synthetic", "--provenance", str(prov))
    assert rc == 0 and "as synthetic" in out


def test_verify_ok_then_tampered(cli, make_nifti):
    path, _, _ = make_nifti()
    rc, out, _ = cli("import", str(path))
    item = out.split()[4]
    rc, out, _ = cli("verify")
    assert rc == 0 and out.startswith("vault OK: 1 item(s)")
    blob = next((cli.vault_path / "blobs").glob("*.vsb"))
    data = bytearray(blob.read_bytes())
    data[100] ^= 0xFF
    blob.write_bytes(bytes(data))
    rc, out, _ = cli("verify")
    assert rc == 12 and "vault PROBLEMS (1):" in out and item in out


def test_wrong_passphrase_and_missing_vault_are_one_line_errors(cli, tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("not the passphrase\n")
    rc, _, err = cli("ls", passphrase_file=bad)
    assert rc == 11 and err == f"volsynth: error: wrong passphrase for the vault at {cli.vault_path}\n"
    rc, _, err = cli("ls", vault=tmp_path / "nowhere")
    assert rc == 10 and err.startswith("volsynth: error: there is no vault at") and err.count("\n") == 1
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    rc, _, err = cli("ls", passphrase_file=empty)
    assert rc == 2 and "is empty" in err


@pytest.mark.slow
def test_passwd_and_audit(cli, tmp_path):
    new = tmp_path / "new.txt"
    new.write_text("a different passphrase\n")
    rc, out, _ = cli("passwd", "--new-passphrase-file", str(new))
    assert rc == 0 and "vault rekey" in out
    rc, _, _ = cli("ls")
    assert rc == 11
    rc, out, _ = cli("audit", passphrase_file=new)
    assert rc == 0 and "passphrase_changed" in out and "unlock_failed" in out
    assert out.strip().endswith("entries")
    rc, out, _ = cli("audit", "--json", passphrase_file=new)
    trail = json.loads(out)
    assert trail["problems"] == [] and trail["entries"][0]["event"] == "create"


def test_default_location_from_environment(cli, monkeypatch):
    monkeypatch.setenv("VOLSYNTH_VAULT", str(cli.vault_path))
    rc, out, _ = cli("ls", vault=None)
    assert rc == 0 and out == "no items\n"


def test_bare_vault_command_prints_help(capsys):
    assert main(["vault"]) == 2
    assert "SUBCOMMAND" in capsys.readouterr().out
