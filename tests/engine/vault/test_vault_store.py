"""Vault life cycle, round trips, search, delete, passphrase change and auto-lock."""

from __future__ import annotations

import hashlib
import json
import threading
import time

import nibabel as nib
import numpy as np
import pytest
from vault_testutil import FAST_KDF, PASSPHRASE

from engine.errors import InvalidRequest, OutputError, VaultError, VaultLocked
from engine.nifti.io import load_nifti, read_provenance, save_volume, sidecar_path
from engine.nifti.volume import Volume
from engine.vault import KdfParams, Vault, default_vault_path


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- life cycle -------------------------------------------------------------------------------------------
def test_create_then_reopen_and_unlock(tmp_path, vault):
    assert vault.is_unlocked
    assert Vault.exists(vault.path)
    again = Vault(vault.path)
    assert not again.is_unlocked
    assert again.vault_id == vault.vault_id
    again.unlock(PASSPHRASE)
    assert again.is_unlocked and again.items() == []
    again.lock()


def test_wrong_passphrase_is_a_clear_error_and_is_audited(vault):
    other = Vault(vault.path)
    with pytest.raises(VaultLocked, match="wrong passphrase"):
        other.unlock("not the passphrase at all")
    assert not other.is_unlocked
    other.unlock(PASSPHRASE)
    events = [e.event for e in other.audit_trail().entries]
    assert events == ["create", "unlock_failed", "unlock"]
    other.lock()


def test_locked_vault_refuses_everything(vault, make_nifti):
    path, _, _ = make_nifti()
    vault.lock()
    for call in (vault.items, lambda: vault.import_nifti(path), lambda: vault.verify()):
        with pytest.raises(VaultLocked, match="locked"):
            call()


def test_create_refuses_existing_vault_and_foreign_folder(tmp_path, vault):
    with pytest.raises(VaultError, match="already exists"):
        Vault.create(vault.path, PASSPHRASE, kdf=FAST_KDF)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("x")
    with pytest.raises(InvalidRequest, match="not empty"):
        Vault.create(busy, PASSPHRASE, kdf=FAST_KDF)
    with pytest.raises(InvalidRequest, match="too short"):
        Vault.create(tmp_path / "new", "short", kdf=FAST_KDF)
    with pytest.raises(VaultError, match="no vault"):
        Vault(tmp_path / "nothing-here")


def test_default_vault_path_honours_env(monkeypatch, tmp_path):
    monkeypatch.setenv("VOLSYNTH_VAULT", str(tmp_path / "v"))
    assert default_vault_path() == tmp_path / "v"
    monkeypatch.delenv("VOLSYNTH_VAULT")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert default_vault_path() == tmp_path / "data" / "volsynth" / "vault"


@pytest.mark.slow
def test_default_argon2_parameters_and_unlock_time(tmp_path, record_property):
    """The real default (RFC 9106 second recommendation: 64 MiB, t=3, p=4); reports the unlock time."""
    v = Vault.create(tmp_path / "real", PASSPHRASE)
    assert v.kdf_params == KdfParams() and v.kdf_params.meets_rfc9106
    header = json.loads((v.path / "vault.json").read_bytes().rsplit(b"sha256 ", 1)[0])
    assert (
        header["kdf"]["memory_kib"] == 65536
        and header["kdf"]["iterations"] == 3
        and header["kdf"]["lanes"] == 4
    )
    v.lock()
    times = []
    for _ in range(3):
        fresh = Vault(v.path)
        start = time.perf_counter()
        fresh.unlock(PASSPHRASE)
        times.append(time.perf_counter() - start)
        fresh.lock()
    record_property("unlock_s_default_argon2", round(min(times), 3))
    print(f"\nunlock with default Argon2id (64 MiB, t=3, p=4): best {min(times):.3f} s of {len(times)}")
    assert min(times) < 30


# -- round trips ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name, dtype, version, scale",
    [
        ("plain.nii", np.int16, 1, None),
        ("zipped.nii.gz", np.float64, 1, None),
        ("scaled.nii", np.int16, 1, (0.5, -3.0)),
        ("two.nii", np.float32, 2, None),
    ],
)
def test_nifti_round_trip_is_byte_exact(vault, make_nifti, tmp_path, name, dtype, version, scale):
    path, data, affine = make_nifti(name, dtype=dtype, version=version, scale=scale, descrip="Doe^John study")
    patient = {"name": "Doe^John", "id": "PID-77", "birth_date": "19700101", "sex": "M"}
    study = {"date": "20240102", "description": "Brain MRI", "modality": "MR", "series": [1, 2]}
    info = vault.import_nifti(path, patient=patient, study=study, label="brain")
    assert info.patient == patient and info.study == study and info.label == "brain"
    assert info.shape == data.shape and info.compressed == name.endswith(".gz")
    assert np.array_equal(np.array(info.affine), affine)

    original = nib.load(path)
    raw = vault.open_item(info.id, as_float32=False)
    assert np.array_equal(raw.data, np.asanyarray(original.dataobj))
    assert raw.data.dtype == np.asanyarray(original.dataobj).dtype
    assert np.array_equal(raw.affine, original.affine)
    opened = vault.open_item(info.id)
    assert opened.data.dtype == np.float32
    assert np.array_equal(opened.data, original.get_fdata(dtype=np.float32))
    assert opened.info == info

    result = vault.export(info.id, tmp_path / "out")
    assert _sha(result.files[0]) == _sha(path)
    reopened = Vault(vault.path)
    reopened.unlock(PASSPHRASE)
    assert reopened.get(info.id) == info  # metadata survives a fresh unlock exactly
    reopened.lock()


def test_synthetic_round_trip_and_always_marked(vault, tmp_path):
    rng = np.random.default_rng(1)
    volume = rng.normal(size=(9, 8, 7))  # float64 in, float32 stored
    affine = np.array([[1.5, 0, 0, -10.123456789], [0, 1.5, 0, 3.3], [0, 0, 2.0, 0.1], [0, 0, 0, 1]])
    provenance = {"model_id": "demo-ldm", "weights_sha256": "ab" * 32, "seed": 42, "steps": 50}
    info = vault.add_synthetic(Volume(volume, affine, provenance=provenance))
    assert info.kind == "synthetic" and info.is_synthetic and info.provenance == provenance
    opened = vault.open_item(info.id)
    assert np.array_equal(opened.data, volume.astype(np.float32))
    assert np.array_equal(opened.affine, affine)
    # the SYNTHETIC fields every other route writes (volsynth generate, the app's Save As)
    reference = nib.load(
        save_volume(Volume(volume, affine, provenance={}, synthetic=True), tmp_path / "ref.nii.gz")
    )
    fields = ("descrip", "intent_name", "aux_file")
    for deidentify in (False, True):
        out = tmp_path / f"out-{deidentify}"
        result = vault.export(info.id, out, deidentify=deidentify)
        assert result.files[0].name.endswith(".nii.gz") and result.files[0].read_bytes()[:2] == b"\x1f\x8b"
        img = nib.load(result.files[0])
        assert [img.header[f].item() for f in fields] == [reference.header[f].item() for f in fields]
        assert img.header.extensions[0].get_content() == reference.header.extensions[0].get_content()
        assert read_provenance(result.files[0].with_name("x.nii.gz"), img.header) == {
            **provenance,
            "synthetic": True,
        }
        assert np.array_equal(img.get_fdata(dtype=np.float32), volume.astype(np.float32))
        reopened = load_nifti(result.files[0])  # what File > Open shows: marked, with its provenance
        assert reopened.synthetic and reopened.provenance == {**provenance, "synthetic": True}
        assert result.files[-1] == sidecar_path(result.files[0])


def test_synthetic_nifti_without_mark_gets_marked_on_export(vault, make_nifti, tmp_path):
    path, data, _ = make_nifti("gen.nii.gz", dtype=np.float32, descrip="from the lab", extension=b"keep me")
    info = vault.import_nifti(path, kind="synthetic", provenance={"model_id": "external"})
    plain = nib.load(vault.export(info.id, tmp_path / "a").files[0])
    assert plain.header["descrip"].item() == b"SYNTHETIC (VolSynth Studio) from the lab"
    assert plain.header["intent_name"].item() == b"SYNTHETIC"
    assert [e.get_content() for e in plain.header.extensions][0] == b"keep me"
    assert b"SYNTHETIC" in [e.get_content() for e in plain.header.extensions][1]
    assert b"external" in [e.get_content() for e in plain.header.extensions][2]
    assert np.array_equal(plain.get_fdata(dtype=np.float32), data)
    deid = nib.load(vault.export(info.id, tmp_path / "b", deidentify=True).files[0])
    assert deid.header["descrip"].item().startswith(b"SYNTHETIC")
    assert [e.get_content() for e in deid.header.extensions][0] == (
        b"SYNTHETIC volume generated by VolSynth Studio; not a patient scan"
    )
    with pytest.raises(InvalidRequest, match="provenance"):
        vault.import_nifti(path, kind="synthetic")


def test_deidentified_nifti_export(vault, make_nifti, tmp_path):
    path, data, affine = make_nifti(
        "Doe_John_T1.nii", descrip="Doe^John 1970", extension=b"<dicom>Doe^John</dicom>"
    )
    info = vault.import_nifti(path, patient={"name": "Doe^John"}, label="Doe John T1")
    result = vault.export(info.id, tmp_path / "out", deidentify=True)
    (exported,) = result.files
    assert "doe" not in exported.name.lower() and "john" not in exported.name.lower()
    img = nib.load(exported)
    for field in ("descrip", "aux_file", "intent_name", "db_name", "data_type"):
        assert img.header[field].item() == b"", field
    assert len(img.header.extensions) == 0
    assert b"Doe" not in exported.read_bytes()
    assert np.array_equal(np.asanyarray(img.dataobj), data)
    assert np.allclose(img.affine, affine)


def test_export_refuses_to_overwrite_and_rejects_bad_input(vault, make_nifti, tmp_path):
    path, _, _ = make_nifti()
    info = vault.import_nifti(path)
    vault.export(info.id, tmp_path / "out")
    with pytest.raises(OutputError, match="already exists"):
        vault.export(info.id, tmp_path / "out")
    vault.export(info.id, tmp_path / "out", overwrite=True)
    not_nifti = tmp_path / "x.nii"
    not_nifti.write_bytes(b"hello")
    with pytest.raises(InvalidRequest, match="not a readable NIfTI"):
        vault.import_nifti(not_nifti)
    with pytest.raises(InvalidRequest, match="JSON"):
        vault.import_nifti(path, patient={"name": object()})
    with pytest.raises(InvalidRequest, match="3\\+ dimensions"):
        vault.add_synthetic(Volume(np.zeros((4, 4)), np.eye(4), provenance={}))


def test_progress_is_reported_and_a_raising_callback_aborts_cleanly(vault, make_nifti):
    path, _, _ = make_nifti(shape=(64, 64, 64))
    seen = []
    vault.import_nifti(path, progress=lambda done, total: seen.append((done, total)))
    assert seen[-1][0] == seen[-1][1] == path.stat().st_size

    class Stop(Exception):
        pass

    def stop(done, total):
        raise Stop

    before = sorted(p.name for p in (vault.path / "blobs").iterdir())
    with pytest.raises(Stop):
        vault.import_nifti(path, progress=stop)
    assert sorted(p.name for p in (vault.path / "blobs").iterdir()) == before
    assert len(vault.items()) == 1


# -- listing, search, delete ------------------------------------------------------------------------------
def test_search_get_and_delete(vault, make_nifti):
    p1, _, _ = make_nifti("a.nii", seed=1)
    p2, _, _ = make_nifti("b.nii", seed=2)
    a = vault.import_nifti(p1, patient={"name": "Smith^Anna", "id": "A1"}, study={"description": "Knee"})
    b = vault.import_nifti(p2, patient={"name": "Jones^Bob"}, study={"description": "Brain MRI"})
    s = vault.add_synthetic(
        Volume(np.zeros((4, 4, 4)), np.eye(4), provenance={"model_id": "brain-ldm", "seed": 7})
    )
    assert [i.id for i in vault.items()] == [a.id, b.id, s.id]
    assert [i.id for i in vault.search("smith")] == [a.id]
    assert [i.id for i in vault.search("BRAIN")] == [b.id, s.id]
    assert [i.id for i in vault.search("brain", kind="scan")] == [b.id]
    assert [i.id for i in vault.search("brain ldm")] == [s.id]
    assert vault.get(a.id[:6]) == a
    with pytest.raises(InvalidRequest, match="no item"):
        vault.get("ffffffffffff")
    blobs_before = set((vault.path / "blobs").iterdir())
    vault.delete(b.id)
    assert [i.id for i in vault.items()] == [a.id, s.id]
    assert {p.suffix for p in blobs_before - set((vault.path / "blobs").iterdir())} == {
        ".vsb",
        ".vsr",
        ".vsm",
    }
    with pytest.raises(InvalidRequest):
        vault.open_item(b.id)
    assert vault.audit_trail().entries[-1].event == "delete"
    assert vault.verify().ok


def test_two_vault_objects_see_each_others_changes(vault, make_nifti):
    other = Vault(vault.path)
    other.unlock(PASSPHRASE)
    path, _, _ = make_nifti()
    info = other.import_nifti(path)
    assert [i.id for i in vault.items()] == [info.id]
    vault.delete(info.id)
    assert other.items() == []
    other.lock()


# -- passphrase change ------------------------------------------------------------------------------------
def test_change_passphrase_rewraps_only(vault, make_nifti):
    path, data, _ = make_nifti()
    info = vault.import_nifti(path)
    files = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in (vault.path / "blobs").iterdir()}
    index = (vault.path / "index.vsi").read_bytes()
    header = (vault.path / "vault.json").read_bytes()
    with pytest.raises(VaultLocked, match="current passphrase is wrong"):
        vault.change_passphrase("wrong wrong wrong", "a brand new passphrase", kdf=FAST_KDF)
    vault.change_passphrase(PASSPHRASE, "a brand new passphrase", kdf=FAST_KDF)
    assert (vault.path / "vault.json").read_bytes() != header
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in (vault.path / "blobs").iterdir()} == files
    assert (vault.path / "index.vsi").read_bytes() != index  # it records the new header's hash
    fresh = Vault(vault.path)
    with pytest.raises(VaultLocked, match="wrong passphrase"):
        fresh.unlock(PASSPHRASE)
    fresh.unlock("a brand new passphrase")
    assert np.array_equal(fresh.open_item(info.id, as_float32=False).data, data)
    assert "passphrase_changed" in [e.event for e in fresh.audit_trail().entries]
    fresh.lock()


# -- auto-lock ----------------------------------------------------------------------------------------------
def test_auto_lock_after_idle_timeout(tmp_path):
    clock = [1000.0]
    v = Vault.create(tmp_path / "v", PASSPHRASE, kdf=FAST_KDF, idle_timeout_s=60, clock=lambda: clock[0])
    assert v.seconds_until_auto_lock() == 60
    clock[0] += 59
    assert not v.lock_if_idle()
    v.touch()  # user activity postpones it
    clock[0] += 59
    assert not v.lock_if_idle()
    v.items()  # so does any operation
    clock[0] += 60
    assert v.lock_if_idle()
    assert not v.is_unlocked and v.seconds_until_auto_lock() is None
    with pytest.raises(VaultLocked):
        v.items()
    v.unlock(PASSPHRASE)
    assert [e.detail.get("reason") for e in v.audit_trail().entries if e.event == "lock"] == ["idle"]
    v.idle_timeout_s = None
    clock[0] += 10**6
    assert not v.lock_if_idle()
    v.lock()


def test_lock_if_idle_never_interrupts_a_running_operation(vault, make_nifti):
    path, _, _ = make_nifti(shape=(32, 32, 32))
    results = []

    def progress(done, total):
        t = threading.Thread(target=lambda: results.append(vault.lock_if_idle(now=time.monotonic() + 10**6)))
        t.start()
        t.join()

    vault.import_nifti(path, progress=progress)
    assert results and not any(results)
    assert vault.is_unlocked
