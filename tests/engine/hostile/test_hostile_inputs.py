"""Hostile and broken NIfTI/DICOM inputs (issue 18 point 3), through every route that reads them.

Each case of the corpus goes through ``vault import`` (API and CLI), ``load_nifti`` (what the app's Open
runs in its worker) and opening a stored item: every one must end in one line of EngineError, and
nothing already in the vault may be lost. The corpus is built by ``corpus.py`` at test time.
"""

from __future__ import annotations

import json

import nibabel as nib
import numpy as np
import pytest

from engine.cli import main
from engine.errors import EngineError, InvalidRequest, OutOfMemory
from engine.nifti.io import load_nifti, read_provenance, save_volume
from engine.nifti.volume import Volume
from engine.vault import KdfParams, Vault
from tests.engine.hostile.corpus import (
    MIB,
    _gzip_bomb,
    _header,
    build_dicom_corpus,
    build_nifti_corpus,
    good_niftis,
)

PASSPHRASE = "hostile corpus passphrase"
FAST_KDF = KdfParams(memory_kib=1024, iterations=1, lanes=1)

NIFTI_CASES = [
    "truncated-nii",
    "header-only-nii",
    "truncated-nii-gz",
    "empty-nii",
    "not-nifti-gz",
    "claims-100000-cubed-nifti2",
    "claims-32767-cubed-gz",
    "zero-length-axis",
    "negative-axis",
    "zero-time-points",
    "dim0-zero",
    "dim0-nine",
    "nan-affine",
    "singular-sform",
    "zero-pixdim",
    "inf-quaternion",
    "huge-offset",
    "offset-zero",
    "offset-past-end",
    "extension-claims-1gib",
    "complex-voxels",
    "pair-header",
    "nan-intercept",
    "gzip-bomb-claims-4gib",
    "gzip-bomb-trailing-4gib",
]
DICOM_CASES = [
    "dicom-65535-square",
    "dicom-ipp-not-numbers",
    "dicom-pixel-spacing-zero",
    "dicom-iop-three-values",
    "dicom-ipp-nan",
    "dicom-rows-text",
    "dicom-pixels-truncated",
    "dicom-slope-text",
]


def assert_one_line(exc: BaseException) -> str:
    text = str(exc)
    assert text and "\n" not in text and "Traceback" not in text, repr(text)
    return text


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    cases = build_nifti_corpus(root / "nifti")
    assert set(cases) == set(NIFTI_CASES)
    dicom = build_dicom_corpus(root / "dicom")
    assert set(dicom) == set(DICOM_CASES)
    return {**cases, **dicom, "good": good_niftis(root / "good")}


@pytest.fixture(scope="module")
def stocked_vault(tmp_path_factory, corpus):
    """A vault holding good items (a scaled 3D scan, a 4D series), and their voxels to compare with."""
    folder = tmp_path_factory.mktemp("vault")
    vault = Vault.create(folder / "vault", PASSPHRASE, kdf=FAST_KDF)
    kept = {}
    for name in ("scaled-3d", "4d-gz"):
        info = vault.import_nifti(corpus["good"][name])
        kept[info.id] = vault.open_item(info.id).data.copy()
    yield vault, kept
    vault.lock()


def assert_nothing_lost(vault, kept) -> None:
    assert {item.id for item in vault.items()} == set(kept)
    for item_id, data in kept.items():
        assert np.array_equal(vault.open_item(item_id).data, data)
    assert vault.verify().ok


@pytest.mark.parametrize("case", NIFTI_CASES)
def test_hostile_nifti_is_refused_by_open_and_import(case, corpus, stocked_vault):
    vault, kept = stocked_vault
    path = corpus[case]
    with pytest.raises(EngineError) as opened:
        load_nifti(path)  # the app's File > Open runs exactly this in its worker
    assert path.name in assert_one_line(opened.value)
    with pytest.raises(EngineError) as imported:
        vault.import_nifti(path)
    assert path.name in assert_one_line(imported.value)
    assert_nothing_lost(vault, kept)


@pytest.mark.parametrize("case", DICOM_CASES)
def test_hostile_dicom_is_refused_by_import(case, corpus, stocked_vault):
    vault, kept = stocked_vault
    with pytest.raises(InvalidRequest) as imported:
        vault.import_dicom(corpus[case])
    assert_one_line(imported.value)
    assert_nothing_lost(vault, kept)


def test_dicom_messages_name_the_problem(corpus, stocked_vault):
    vault, _ = stocked_vault
    expected = {
        "dicom-65535-square": "65535 x 65535 x 2 = 8,589,672,450 voxels.*VOLSYNTH_MAX_VOXELS",
        "dicom-ipp-not-numbers": "unreadable ImagePositionPatient",
        "dicom-pixel-spacing-zero": r"PixelSpacing \[0.0, 0.0\]; spacings must be positive",
        "dicom-iop-three-values": "invalid ImageOrientationPatient.*expected 6 finite numbers",
    }
    for case, pattern in expected.items():
        with pytest.raises(InvalidRequest, match=pattern):
            vault.import_dicom(corpus[case])


def test_messages_say_what_is_wrong_and_what_to_do(corpus):
    expected = {
        "claims-100000-cubed-nifti2": "100000 x 100000 x 100000 = 1,000,000,000,000,000 voxels.*limit of "
        "268,435,456.*raise the limit with the environment variable VOLSYNTH_MAX_VOXELS",
        "truncated-nii": "truncated.*8.0 KiB of voxels from byte 352, but the file has only 4,352 bytes",
        "truncated-nii-gz": "truncated",
        "zero-length-axis": r"zero-length axis \(shape \(16, 0, 16\)\)",
        "nan-affine": "NaN or infinite",
        "singular-sform": "singular",
        "huge-offset": "past any plausible header",
        "gzip-bomb-trailing-4gib": "decompresses to more than.*gzip bomb",
    }
    for case, pattern in expected.items():
        with pytest.raises(InvalidRequest, match=pattern):
            load_nifti(corpus[case])


def test_voxel_limit_can_be_raised_and_is_checked_before_reading(corpus, monkeypatch):
    """The limit is a budget, not a ban: raised for a genuine large file, the same file then opens."""
    path = corpus["good"]["scaled-3d"]  # 10 x 11 x 12 = 1,320 voxels
    monkeypatch.setenv("VOLSYNTH_MAX_VOXELS", "1000")
    with pytest.raises(InvalidRequest, match="1,320 voxels, more than VolSynth's limit of 1,000"):
        load_nifti(path)
    monkeypatch.setenv("VOLSYNTH_MAX_VOXELS", "2000")
    assert load_nifti(path).data.shape == (10, 11, 12)
    monkeypatch.setenv("VOLSYNTH_MAX_VOXELS", "lots")
    with pytest.raises(InvalidRequest, match="VOLSYNTH_MAX_VOXELS='lots' is not a number"):
        load_nifti(path)


def test_memory_budget_refuses_with_the_numbers(corpus, monkeypatch):
    import engine.nifti.checks as checks

    monkeypatch.setattr(checks, "available_memory", lambda: 1000)
    with pytest.raises(OutOfMemory, match=r"reading scaled.nii needs about .* but only 1000 B is available"):
        load_nifti(corpus["good"]["scaled-3d"])


def test_good_files_still_open_and_import(corpus, stocked_vault):
    vault, kept = stocked_vault
    for name, path in corpus["good"].items():
        loaded = load_nifti(path)
        reference = nib.load(path)
        data = np.asanyarray(reference.dataobj, dtype=np.float32)
        if data.ndim == 4:
            data = data[..., 0]
        assert nib.aff2axcodes(loaded.affine) == ("R", "A", "S")
        assert np.allclose(np.sort(loaded.data.ravel()), np.sort(data.ravel())), name
    series = load_nifti(corpus["good"]["4d-gz"], time_index=2)
    assert series.time_points == 3 and series.time_index == 2
    assert np.allclose(series.data, np.asanyarray(nib.load(corpus["good"]["4d-gz"]).dataobj)[..., 2])
    with pytest.raises(InvalidRequest, match="has 3 time points; choose one from 0 to 2, not 3"):
        load_nifti(corpus["good"]["4d-gz"], time_index=3)
    info = vault.import_nifti(corpus["good"]["nifti2-big-endian"])
    try:
        assert info.shape == (6, 7, 8)
    finally:
        vault.delete(info.id)
    assert_nothing_lost(vault, kept)


def test_cli_import_prints_one_line_and_fails(corpus, tmp_path, capsys):
    vault_path = tmp_path / "v"
    Vault.create(vault_path, PASSPHRASE, kdf=FAST_KDF).lock()
    pw = tmp_path / "pw"
    pw.write_text(PASSPHRASE + "\n")
    for case in ("truncated-nii-gz", "gzip-bomb-claims-4gib", "zero-length-axis"):
        argv = [
            "vault",
            "import",
            str(corpus[case]),
            "--vault",
            str(vault_path),
            "--passphrase-file",
            str(pw),
        ]
        rc = main(argv)
        out, err = capsys.readouterr()
        assert rc != 0, (case, out)
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1 and corpus[case].name in lines[0] and "Traceback" not in err, err
    with Vault(vault_path) as vault:
        vault.unlock(PASSPHRASE)
        assert vault.items() == []


@pytest.mark.slow
def test_vault_item_over_the_budget_is_refused_on_open(tmp_path, monkeypatch):
    """An item stored under a raised limit (or before these checks) is opened with the same checks: the
    voxel budget before anything is decompressed, not an unbounded gzip.decompress."""
    hdr = _header(shape=(1024, 1024, 300), dtype=np.uint8)  # 300 MiB of zeros in a 0.3 MiB file
    path = _gzip_bomb(tmp_path / "big.nii.gz", hdr.binaryblock + bytes(4), 300 * MIB, crc=True)
    vault = Vault.create(tmp_path / "v", PASSPHRASE, kdf=FAST_KDF)
    monkeypatch.setenv("VOLSYNTH_MAX_VOXELS", str(1 << 29))
    info = vault.import_nifti(path)
    monkeypatch.delenv("VOLSYNTH_MAX_VOXELS")
    with pytest.raises(InvalidRequest, match="314,572,800 voxels.*VOLSYNTH_MAX_VOXELS"):
        vault.open_item(info.id)
    vault.lock()


# -- provenance read back (issue 13): one sidecar format, and the header extension ------------------------


def test_synthetic_volume_keeps_provenance_through_the_vault(tmp_path):
    """Written by the engine, imported, exported from the vault and reopened: the provenance comes back,
    from the sidecar beside the export, or from the header extension when the file travels alone."""
    volume = np.random.default_rng(0).random((6, 7, 8), dtype=np.float32)
    provenance = {"synthetic": True, "seed": 11, "model": {"id": "tiny-latent"}}
    written = save_volume(
        Volume(volume, np.eye(4), provenance=provenance, synthetic=True), tmp_path / "gen.nii.gz"
    )
    assert json.loads((tmp_path / "gen.json").read_text()) == provenance
    vault = Vault.create(tmp_path / "v", PASSPHRASE, kdf=FAST_KDF)
    info = vault.import_nifti(written, kind="synthetic", provenance=provenance)
    exported = vault.export(info.id, tmp_path / "out")
    nii = next(p for p in exported.files if p.name.endswith((".nii", ".nii.gz")))
    reopened = load_nifti(nii)
    assert reopened.synthetic and reopened.provenance["seed"] == 11
    assert reopened.provenance["model"] == {"id": "tiny-latent"}
    for side in exported.files:
        if side != nii:
            side.unlink()
    alone = load_nifti(nii)  # no sidecar: the VolSynth header extension carries the record
    assert alone.synthetic and alone.provenance == provenance
    assert read_provenance(nii) == provenance
    vault.lock()


def test_old_vault_export_sidecar_is_read(tmp_path):
    volume = np.zeros((4, 4, 4), np.float32)
    save_volume(Volume(volume, np.eye(4), synthetic=False), tmp_path / "synthetic-abc.nii")
    (tmp_path / "synthetic-abc.provenance.json").write_text(
        json.dumps({"synthetic": True, "note": "SYNTHETIC", "provenance": {"seed": 5}})
    )
    loaded = load_nifti(tmp_path / "synthetic-abc.nii")
    assert loaded.synthetic and loaded.provenance == {"seed": 5, "synthetic": True}


def test_scan_saved_from_the_app_carries_no_provenance_inside_the_file(tmp_path):
    """Only synthetic volumes embed their record: an opened scan's record names the patient's file."""
    save_volume(
        Volume(np.zeros((4, 4, 4), np.float32), np.eye(4), provenance={"source": "/data/Doe_John/t1.nii.gz"}),
        tmp_path / "scan.nii.gz",
    )
    (tmp_path / "scan.json").unlink()
    assert load_nifti(tmp_path / "scan.nii.gz").provenance == {}
    assert b"Doe_John" not in nib.load(tmp_path / "scan.nii.gz").header.extensions.__repr__().encode()


def test_one_header_sniffer_reads_both_sizes_and_byte_orders():
    """engine.nifti.checks.sniff_sizeof_hdr is the one header-size sniffer (the vault's readers use it)."""
    import struct

    from engine.nifti.checks import sniff_sizeof_hdr

    assert sniff_sizeof_hdr(struct.pack("<i", 348)) == (348, "<")
    assert sniff_sizeof_hdr(struct.pack(">i", 540) + b"rest") == (540, ">")
    assert sniff_sizeof_hdr(struct.pack("<i", 352)) is None
    assert sniff_sizeof_hdr(b"\x5c\x01") is None
