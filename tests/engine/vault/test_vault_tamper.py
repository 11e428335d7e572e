"""Tampering is always caught, never returns wrong data, and the message names the item."""

from __future__ import annotations

import json
import random
import shutil
import time

import numpy as np
import pytest
from vault_testutil import FAST_KDF, PASSPHRASE

from engine.errors import VaultCorrupted, VaultError, VaultLocked
from engine.nifti.volume import Volume
from engine.vault import Vault, crypto

HEADER = len(crypto.MAGIC) + 56
CHUNK_CT = 16384 + 16


def _blob(vault: Vault, item_id: str, part: str = "volume"):
    rec = vault.state.index["items"][item_id]  # test-only peek: which file holds the part
    blob = next(p["blob"] for p in rec["parts"] if p["name"] == part)
    return vault.path / "blobs" / f"{blob}.vsb"


def _flip(path, pos: int, mask: int = 0x01) -> None:
    with open(path, "r+b") as fh:
        fh.seek(pos)
        byte = fh.read(1)[0]
        fh.seek(pos)
        fh.write(bytes([byte ^ mask]))


def _assert_caught(vault: Vault, item_id: str, dest=None, *, verify: bool = True) -> None:
    """Every read path refuses the item, naming it; export leaves nothing behind."""
    with pytest.raises(VaultCorrupted, match=item_id):
        vault.open_item(item_id)
    if verify:
        report = vault.verify([item_id], check_audit=False)
        assert not report.ok and any(item_id in p for p in report.problems)
    if dest is not None:
        with pytest.raises(VaultCorrupted, match=item_id):
            vault.export(item_id, dest)
        assert not dest.exists() or not any(dest.rglob("*"))


@pytest.mark.slow
def test_every_single_byte_flip_in_a_small_item_is_caught(vault, record_property):
    volume = np.arange(4 * 4 * 4, dtype=np.float32).reshape(4, 4, 4)
    info = vault.add_synthetic(Volume(volume, np.eye(4), provenance={"seed": 1}))
    other = vault.add_synthetic(Volume(volume + 1, np.eye(4), provenance={"seed": 2}))
    path = _blob(vault, info.id)
    original = path.read_bytes()
    flips = 0
    for pos in range(len(original)):
        _flip(path, pos, mask=1 << (pos % 8))
        _assert_caught(vault, info.id, verify=pos % 8 == 0)  # open on every flip, verify on every 8th
        path.write_bytes(original)
        flips += 1
    record_property("single_byte_flips", flips)
    print(f"\nsingle-byte flips caught: {flips}/{flips} (item of {len(original)} bytes on disk)")
    assert np.array_equal(vault.open_item(info.id).data, volume)
    assert vault.verify().ok  # the neighbour was never affected
    assert np.array_equal(vault.open_item(other.id).data, volume + 1)


def test_truncation_at_and_between_chunk_boundaries_is_caught(vault, tmp_path):
    volume = np.random.default_rng(0).random((32, 32, 20), dtype=np.float32)  # ~5 chunks
    info = vault.add_synthetic(Volume(volume, np.eye(4), provenance={"seed": 3}))
    path = _blob(vault, info.id)
    original = path.read_bytes()
    boundaries = [0, len(crypto.MAGIC), HEADER] + [HEADER + k * CHUNK_CT for k in range(1, 6)]
    cuts = sorted(
        {c for b in boundaries for c in (b - 1, b, b + 1, b + CHUNK_CT // 2) if 0 <= c < len(original)}
    )
    for cut in cuts:
        path.write_bytes(original[:cut])
        _assert_caught(vault, info.id, tmp_path / f"cut{cut}")
    path.write_bytes(original)
    assert vault.verify().ok and len(cuts) >= 20


@pytest.mark.parametrize("extra", [b"\x00", b"x" * 16, bytes(CHUNK_CT)])
def test_appended_bytes_are_caught(vault, extra, tmp_path):
    info = vault.add_synthetic(Volume(np.ones((8, 8, 8)), np.eye(4), provenance={"seed": 4}))
    path = _blob(vault, info.id)
    with open(path, "ab") as fh:
        fh.write(extra)
    _assert_caught(vault, info.id, tmp_path / "out")


def test_two_items_files_swapped_are_caught(vault):
    # Same size, so only cryptography (per-item key and context) can tell them apart.
    a = vault.add_synthetic(Volume(np.zeros((8, 8, 8)), np.eye(4), provenance={"seed": 5}))
    b = vault.add_synthetic(Volume(np.ones((8, 8, 8)), np.eye(4), provenance={"seed": 6}))
    pa, pb = _blob(vault, a.id), _blob(vault, b.id)
    assert pa.stat().st_size == pb.stat().st_size
    tmp = pa.with_suffix(".swap")
    pa.rename(tmp)
    pb.rename(pa)
    tmp.rename(pb)
    _assert_caught(vault, a.id)
    _assert_caught(vault, b.id)
    report = vault.verify()
    assert len(report.problems) == 2


def test_parts_swapped_within_a_dicom_item_and_missing_files_are_caught(vault, make_series):
    folder, _ = make_series(n=3)
    info = vault.import_dicom(folder)
    p1, p2 = _blob(vault, info.id, "dicom/00001"), _blob(vault, info.id, "dicom/00002")
    tmp = p1.with_suffix(".swap")
    p1.rename(tmp)
    p2.rename(p1)
    tmp.rename(p2)
    report = vault.verify([info.id])
    assert not report.ok and "DICOM file" in report.problems[0] and info.id in report.problems[0]
    p1.rename(tmp)  # swap back, then lose one
    p2.rename(p1)
    tmp.rename(p2)
    assert vault.verify([info.id]).ok
    p2.unlink()
    with pytest.raises(VaultCorrupted, match="missing"):
        vault.export(info.id, vault.path.parent / "out")


def test_every_byte_of_the_vault_header_is_protected(vault):
    path = vault.path / "vault.json"
    original = path.read_bytes()
    for pos in range(len(original)):
        damaged = bytearray(original)
        damaged[pos] ^= 0x01
        path.write_bytes(bytes(damaged))
        with pytest.raises(VaultCorrupted, match="header"):
            Vault(vault.path)
    path.write_bytes(original)
    Vault(vault.path).unlock(PASSPHRASE)


def test_header_edited_with_a_fixed_checksum_gives_no_access(vault, make_nifti):
    import hashlib

    path, _, _ = make_nifti()
    vault.import_nifti(path)
    header = vault.path / "vault.json"
    body = json.loads(header.read_bytes().rsplit(b"sha256 ", 1)[0])
    for edit in (
        lambda b: b["kdf"].update(iterations=b["kdf"]["iterations"] + 1),  # a downgrade/upgrade attempt
        lambda b: b.update(vault_id="00" * 16),
        lambda b: b.update(created="2000-01-01T00:00:00+00:00"),
    ):
        changed = json.loads(json.dumps(body))
        edit(changed)
        text = (json.dumps(changed, sort_keys=True, indent=1) + "\n").encode()
        header.write_bytes(text + b"sha256 " + hashlib.sha256(text).hexdigest().encode() + b"\n")
        with pytest.raises(VaultLocked, match="wrong passphrase"):
            Vault(vault.path).unlock(PASSPHRASE)


def test_index_damage_and_foreign_index_are_caught(tmp_path, vault, make_nifti):
    path, _, _ = make_nifti()
    vault.import_nifti(path, patient={"name": "Doe^Jane"})
    index = vault.path / "index.vsi"
    original = index.read_bytes()
    for pos in range(0, len(original), 3):
        damaged = bytearray(original)
        damaged[pos] ^= 0x80
        index.write_bytes(bytes(damaged))
        fresh = Vault(vault.path)
        with pytest.raises(VaultCorrupted, match="index"):
            fresh.unlock(PASSPHRASE)
        assert not fresh.is_unlocked
    index.write_bytes(original[:-1])
    with pytest.raises(VaultCorrupted, match="index"):
        Vault(vault.path).unlock(PASSPHRASE)
    other = Vault.create(tmp_path / "other", PASSPHRASE, kdf=FAST_KDF)
    other.lock()
    shutil.copy(vault.path / "index.vsi", other.path / "index.vsi")
    index.write_bytes(original)
    with pytest.raises(VaultCorrupted, match="index"):
        Vault(other.path).unlock(PASSPHRASE)


def test_files_copied_from_another_vault_do_not_decrypt(tmp_path, vault):
    info = vault.add_synthetic(Volume(np.ones((8, 8, 8)), np.eye(4), provenance={"seed": 7}))
    twin = Vault.create(tmp_path / "twin", PASSPHRASE, kdf=FAST_KDF)
    twin_info = twin.add_synthetic(Volume(np.zeros((8, 8, 8)), np.eye(4), provenance={"seed": 8}))
    shutil.copy(_blob(vault, info.id), _blob(twin, twin_info.id))
    with pytest.raises(VaultCorrupted, match=twin_info.id):
        twin.open_item(twin_info.id)
    twin.lock()


def test_missing_header_is_a_clear_error(vault):
    (vault.path / "vault.json").unlink()
    with pytest.raises(VaultError, match="no vault"):
        Vault(vault.path)


@pytest.mark.slow
def test_1000_random_flips_in_a_16mb_item_are_caught(vault, record_property):
    # About 1,000 chunks, so the flips land all over the item (one open decrypts up to the flipped chunk:
    # a 100 MB item cost 30 s for the same 1,000 flips and pinned nothing more).
    volume = np.ones((256, 256, 64), dtype=np.float32)  # 16.8 MB of voxels
    info = vault.add_synthetic(Volume(volume, np.eye(4), provenance={"seed": 9}))
    del volume
    path = _blob(vault, info.id)
    size = path.stat().st_size
    rng = random.Random(2024)
    start = time.perf_counter()
    caught = 0
    with open(path, "r+b") as fh:
        for _ in range(1000):
            pos = rng.randrange(size)
            mask = 1 << rng.randrange(8)
            fh.seek(pos)
            byte = fh.read(1)[0]
            fh.seek(pos)
            fh.write(bytes([byte ^ mask]))
            fh.flush()
            with pytest.raises(VaultCorrupted, match=info.id):
                vault.open_item(info.id)
            caught += 1
            fh.seek(pos)
            fh.write(bytes([byte]))
            fh.flush()
    elapsed = time.perf_counter() - start
    record_property("random_flips_16mb_caught", caught)
    print(f"\n1000 random flips in a {size / 1e6:.1f} MB item: {caught} caught in {elapsed:.1f} s")
    assert caught == 1000
    assert vault.verify([info.id]).ok  # restored byte for byte


def _rewrite_header(path, edit) -> None:
    import hashlib

    body = json.loads(path.read_bytes().rsplit(b"sha256 ", 1)[0])
    edit(body)
    text = (json.dumps(body, sort_keys=True, indent=1) + "\n").encode()
    path.write_bytes(text + b"sha256 " + hashlib.sha256(text).hexdigest().encode() + b"\n")


@pytest.mark.parametrize(
    "kdf",
    [
        {"iterations": 1_000_000_000},
        {"iterations": 65},
        {"memory_kib": 1 << 40},
        {"memory_kib": 2 * 1024 * 1024, "iterations": 3},  # 6 GiB-passes: each bound alone holds
        {"lanes": 1 << 20},
        {"iterations": True},
        {"iterations": 3.0},
        {"memory_kib": "65536"},
    ],
)
def test_kdf_parameters_in_an_edited_header_are_bounded_before_deriving(vault, monkeypatch, kdf):
    """An edited header with a checksum that matches must not make unlock run Argon2id for minutes: every
    parameter is bounded when the header is read, before the passphrase is tried."""
    vault.lock()
    _rewrite_header(vault.path / "vault.json", lambda b: b["kdf"].update(kdf))
    derived = []
    monkeypatch.setattr(crypto, "derive_kek", lambda *a: derived.append(a) or b"\0" * 32)
    with pytest.raises(VaultCorrupted, match="key derivation|header") as caught:
        Vault(vault.path).unlock(PASSPHRASE)
    assert derived == []
    assert "\n" not in str(caught.value) and "backup" in str(caught.value)


def test_an_oversized_header_is_not_read_whole(vault):
    vault.lock()
    path = vault.path / "vault.json"
    path.write_bytes(path.read_bytes() + b" " * (1 << 20))
    with pytest.raises(VaultCorrupted, match="header"):
        Vault(vault.path)


def test_kdf_bounds_admit_rfc9106_options_and_refuse_more():
    assert crypto.KdfParams().meets_rfc9106
    crypto.KdfParams(memory_kib=2 * 1024 * 1024, iterations=1, lanes=4)  # RFC 9106 first option
    crypto.KdfParams(memory_kib=64 * 1024, iterations=64, lanes=4)
    with pytest.raises(ValueError, match="iterations"):
        crypto.KdfParams(iterations=crypto.MAX_ITERATIONS + 1)
