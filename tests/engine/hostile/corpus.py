"""The hostile-input corpus, built at test time (nothing binary is checked in).

Every builder writes into a folder and returns ``{case name: path}``. The cases are the failures of the
2026-11-30 adversarial pass (issue 18 points 3 and 4) and their neighbours: NIfTI files whose headers lie
(shapes, offsets, affines, types), truncated files, gzip bombs, broken DICOM slices, and model folders
with absurd or malformed specs and links out of the folder.

The gzip bombs are written without ever holding their decompressed contents: a 1 MiB block of zeros is
deflated once with a full flush (which resets the compressor, so every further copy compresses to the
same 1,037 bytes) and that compressed block is written over and over. Their gzip CRC is left 0: a correct
reader stops at the header-derived limit long before the trailer.
"""

from __future__ import annotations

import copy
import gzip
import json
import os
import struct
import zlib
from pathlib import Path

import nibabel as nib
import numpy as np

MIB = 1 << 20


# -- NIfTI ---------------------------------------------------------------------------------------------


def _header(shape=(16, 16, 16), dtype=np.int16, version: int = 1):
    klass = nib.Nifti2Header if version == 2 else nib.Nifti1Header
    hdr = klass()
    hdr.set_data_shape(shape)
    hdr.set_data_dtype(dtype)
    affine = np.diag([1.2, 1.2, 1.5, 1.0])
    hdr.set_sform(affine, code=1)
    hdr.set_qform(affine, code=1)
    hdr["vox_offset"] = len(hdr.binaryblock) + 4
    return hdr


def _raw(hdr, data: bytes = b"", extension: bytes = b"\x00\x00\x00\x00") -> bytes:
    return hdr.binaryblock + extension + data


def _voxels(shape, dtype=np.int16, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    return (rng.random(shape) * 1000).astype(dtype).tobytes(order="F")


def _write(path: Path, raw: bytes, *, gz: bool = False) -> Path:
    path.write_bytes(gzip.compress(raw, mtime=0) if gz else raw)
    return path


def _gzip_bomb(path: Path, head: bytes, zero_bytes: int, *, crc: bool = False) -> Path:
    """A .nii.gz: ``head`` then ``zero_bytes`` zeros (a multiple of 1 MiB), written block by block.

    With ``crc`` the trailer's CRC-32 is computed (a fully valid file, for readers that get to the end).
    """
    assert zero_bytes % MIB == 0
    comp = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    first = comp.compress(head) + comp.flush(zlib.Z_FULL_FLUSH)
    block = comp.compress(bytes(MIB)) + comp.flush(zlib.Z_FULL_FLUSH)
    again = comp.compress(bytes(MIB)) + comp.flush(zlib.Z_FULL_FLUSH)
    assert block == again  # a full flush resets the compressor: every copy compresses the same
    check = zlib.crc32(head)
    zeros = bytes(MIB)
    with open(path, "wb") as fh:
        fh.write(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff")  # gzip header, no name, mtime 0
        fh.write(first)
        for _ in range(zero_bytes // MIB):
            fh.write(block)
            if crc:
                check = zlib.crc32(zeros, check)
        fh.write(comp.flush())
        fh.write(struct.pack("<II", check if crc else 0, (len(head) + zero_bytes) & 0xFFFFFFFF))
    return path


def build_nifti_corpus(folder: Path) -> dict[str, Path]:
    """NIfTI files every reader must refuse with one line (and without reading their claimed voxels)."""
    folder.mkdir(parents=True, exist_ok=True)
    out: dict[str, Path] = {}

    def add(name: str, path: Path) -> None:
        out[name] = path

    good = _raw(_header(), _voxels((16, 16, 16)))
    add("truncated-nii", _write(folder / "truncated.nii", good[: 352 + 4000]))
    add("header-only-nii", _write(folder / "header-only.nii", good[:352]))
    gz = gzip.compress(good, mtime=0)
    add("truncated-nii-gz", _write(folder / "truncated.nii.gz", gz[: len(gz) * 2 // 3]))
    add("empty-nii", _write(folder / "empty.nii", b""))
    add("not-nifti-gz", _write(folder / "text.nii.gz", b"hello, not an image\n" * 50, gz=True))

    hdr = _header(version=2)
    hdr["dim"][:4] = [3, 100_000, 100_000, 100_000]
    add("claims-100000-cubed-nifti2", _write(folder / "claims-100000.nii", _raw(hdr, _voxels((16, 16, 16)))))
    hdr = _header(dtype=np.float32)
    hdr["dim"][:4] = [3, 32_767, 32_767, 32_767]
    add("claims-32767-cubed-gz", _write(folder / "claims-32767.nii.gz", _raw(hdr, bytes(4096)), gz=True))

    for name, dims in (
        ("zero-length-axis", [3, 16, 0, 16]),
        ("negative-axis", [3, 16, -4, 16]),
        ("zero-time-points", [4, 16, 16, 16, 0]),
        ("dim0-zero", [0, 16, 16, 16]),
        ("dim0-nine", [9, 16, 16, 16]),
    ):
        hdr = _header()
        hdr["dim"][: len(dims)] = dims
        add(name, _write(folder / f"{name}.nii", _raw(hdr, _voxels((16, 16, 16)))))

    hdr = _header()
    hdr["srow_x"] = [np.nan, 0, 0, 0]
    add("nan-affine", _write(folder / "nan-affine.nii", _raw(hdr, _voxels((16, 16, 16)))))
    hdr = _header()
    for row in ("srow_x", "srow_y", "srow_z"):
        hdr[row] = [0, 0, 0, 0]
    add("singular-sform", _write(folder / "singular.nii", _raw(hdr, _voxels((16, 16, 16)))))
    hdr = _header()
    hdr["sform_code"] = 0
    hdr["qform_code"] = 0
    hdr["pixdim"][1:4] = [0, 0, 0]
    add("zero-pixdim", _write(folder / "zero-pixdim.nii", _raw(hdr, _voxels((16, 16, 16)))))
    hdr = _header()
    hdr["sform_code"] = 0
    hdr["quatern_b"] = np.inf
    add("inf-quaternion", _write(folder / "inf-quaternion.nii", _raw(hdr, _voxels((16, 16, 16)))))

    hdr = _header()
    hdr["vox_offset"] = 1e15
    add("huge-offset", _write(folder / "huge-offset.nii", _raw(hdr, _voxels((16, 16, 16)))))
    hdr = _header()
    hdr["vox_offset"] = 0  # nibabel would read the header itself as voxels
    add("offset-zero", _write(folder / "offset-zero.nii", _raw(hdr, _voxels((16, 16, 16)))))
    hdr = _header()
    hdr["vox_offset"] = 8 * MIB
    add("offset-past-end", _write(folder / "offset-past-end.nii", _raw(hdr, _voxels((16, 16, 16)))))
    hdr = _header()
    hdr["vox_offset"] = 352 + 16
    ext = b"\x01\x00\x00\x00" + struct.pack("<ii", 1 << 30, 6) + bytes(8)
    add(
        "extension-claims-1gib",
        _write(folder / "bad-extension.nii.gz", _raw(hdr, _voxels((16, 16, 16)), ext), gz=True),
    )
    hdr = _header(dtype=np.complex64)
    add("complex-voxels", _write(folder / "complex.nii", _raw(hdr, bytes(16**3 * 8))))
    hdr = _header()
    hdr["magic"] = b"ni1"
    add("pair-header", _write(folder / "pair-header.nii", _raw(hdr, _voxels((16, 16, 16)))))
    hdr = _header()
    hdr["scl_slope"] = 2.0
    hdr["scl_inter"] = np.nan
    add("nan-intercept", _write(folder / "nan-intercept.nii", _raw(hdr, _voxels((16, 16, 16)))))

    # gzip bombs: ~4 MiB files that inflate to 4 GiB
    hdr = _header(dtype=np.float32)
    hdr["dim"][:4] = [3, 1024, 1024, 1024]
    add("gzip-bomb-claims-4gib", _gzip_bomb(folder / "bomb-claims.nii.gz", _raw(hdr), 4096 * MIB))
    hdr = _header(shape=(32, 32, 32), dtype=np.float32)
    add("gzip-bomb-trailing-4gib", _gzip_bomb(folder / "bomb-trailing.nii.gz", _raw(hdr), 4096 * MIB))
    return out


def good_niftis(folder: Path) -> dict[str, Path]:
    """Files that must keep working: a 3D .nii, a 4D .nii.gz, a big-endian NIfTI-2, a scaled int16."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(3)
    affine = np.diag([1.0, 1.1, 1.2, 1.0])
    out = {}
    img = nib.Nifti1Image((rng.random((10, 11, 12)) * 100).astype(np.int16), affine)
    img.header.set_slope_inter(0.5, 10)
    out["scaled-3d"] = folder / "scaled.nii"
    nib.save(img, out["scaled-3d"])
    out["4d-gz"] = folder / "series.nii.gz"
    nib.save(nib.Nifti1Image(rng.random((8, 9, 10, 3)).astype(np.float32), affine), out["4d-gz"])
    img2 = nib.Nifti2Image(rng.random((6, 7, 8)).astype(">f4"), affine)
    out["nifti2-big-endian"] = folder / "n2.nii"
    nib.save(img2, out["nifti2-big-endian"])
    return out


# -- DICOM ---------------------------------------------------------------------------------------------


def build_dicom_corpus(folder: Path) -> dict[str, Path]:
    """One folder per case, each a 2-slice series from pydicom's MR_small.dcm with one thing broken."""
    import pydicom
    from pydicom.data import get_testdata_file
    from pydicom.uid import generate_uid

    source = pydicom.dcmread(get_testdata_file("MR_small.dcm"))

    def set_raw(ds, tag, vr, value):
        ds[tag] = pydicom.DataElement(tag, vr, value)

    edits = {
        "dicom-65535-square": lambda ds, k: (setattr(ds, "Rows", 65535), setattr(ds, "Columns", 65535)),
        "dicom-ipp-not-numbers": lambda ds, k: set_raw(ds, 0x00200032, "LO", "left\\back\\up"),
        "dicom-pixel-spacing-zero": lambda ds, k: set_raw(ds, 0x00280030, "DS", "0\\0"),
        "dicom-iop-three-values": lambda ds, k: set_raw(ds, 0x00200037, "DS", "1\\0\\0"),
        "dicom-ipp-nan": lambda ds, k: set_raw(ds, 0x00200032, "LO", "nan\\0\\0"),
        "dicom-rows-text": lambda ds, k: set_raw(ds, 0x00280010, "LO", "many"),
        "dicom-pixels-truncated": lambda ds, k: setattr(
            ds, "PixelData", ds.PixelData[: len(ds.PixelData) // 3]
        ),
        "dicom-slope-text": lambda ds, k: set_raw(ds, 0x00281053, "LO", "steep"),
    }
    out = {}
    for name, edit in edits.items():
        case = folder / name
        case.mkdir(parents=True, exist_ok=True)
        uid = generate_uid()
        for k in range(2):
            ds = copy.deepcopy(source)
            ds.SeriesInstanceUID = uid
            ds.SOPInstanceUID = generate_uid()
            ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
            ds.ImagePositionPatient = [0.0, 0.0, 5.0 * k]
            edit(ds, k)
            ds.save_as(case / f"im{k}.dcm", enforce_file_format=True)
        out[name] = case
    return out


# -- model folders -------------------------------------------------------------------------------------


def build_model_corpus(folder: Path, template: Path, outside: Path) -> dict[str, Path]:
    """Model folders made from a working tiny model (``template``) with one thing broken each.

    ``outside`` is a file outside every model folder (a stand-in for /etc/passwd) that links point at.
    """
    import shutil

    folder.mkdir(parents=True, exist_ok=True)
    spec = json.loads((template / "spec.json").read_text())
    out: dict[str, Path] = {}

    def case(name: str, mutate=None, raw: str | None = None) -> Path:
        target = folder / name
        shutil.copytree(template, target)
        if raw is not None:
            (target / "spec.json").write_text(raw)
        elif mutate is not None:
            data = copy.deepcopy(spec)
            data["id"] = name
            mutate(data)
            (target / "spec.json").write_text(json.dumps(data))
        out[name] = target
        return target

    def huge_channels(d):
        d["networks"]["unet"]["channels"] = [8192, 16384]
        d["networks"]["unet"]["num_head_channels"] = [0, 64]
        d["networks"]["unet"]["norm_num_groups"] = 64

    case(
        "huge-output-shape",
        lambda d: d.update(output_shape=[1, 4096, 4096, 4096], latent_shape=[3, 1024, 1024, 1024]),
    )
    case("huge-channels", huge_channels)
    case("huge-timesteps", lambda d: d["schedule"].update(num_train_timesteps=10**10))
    case("negative-beta-start", lambda d: d["schedule"].update(beta_start=-0.5))
    case("beta-end-one", lambda d: d["schedule"].update(beta_end=1.0))
    case("many-latent-channels", lambda d: d.update(latent_shape=[100000, 4, 4, 4]))
    nested = "[" * 100_000 + "]" * 100_000
    case(
        "deeply-nested",
        raw=json.dumps({**spec, "id": "deeply-nested"})[:-1] + f', "extra": {{"x": {nested}}}}}',
    )
    case("networks-is-a-list", lambda d: d.update(networks=[1, 2]))
    case("network-is-a-string", lambda d: d["networks"].update(unet="DiffusionModelUNet"))
    case("guidance-is-a-list", lambda d: d.update(guidance=[1, 2]))
    case("conditioning-is-a-string", lambda d: d.update(conditioning="age"))
    case("conditioning-entry-is-a-number", lambda d: d.update(conditioning=[3]))
    case("output-shape-words", lambda d: d.update(output_shape=["one", "two"]))
    case("spacing-nan", lambda d: d.update(voxel_spacing_mm=["nan", 1, 1]))
    case("condition-range-1e308", lambda d: d["conditioning"][0].update(min=-1e308, max=1e308, default=0))
    case("samplers-is-a-dict", lambda d: d.update(samplers={"ddim": 1}))
    case("spec-not-json", raw="{ this is not json")
    case("spec-is-a-list", raw="[1, 2, 3]")
    case("spec-too-big", raw=json.dumps({**spec, "id": "spec-too-big", "description": "x" * (5 * MIB)}))
    target = case("card-links-outside")
    (target / "MODEL_CARD.md").unlink()
    os.symlink(outside, target / "MODEL_CARD.md")
    target = case("weights-link-outside")
    (target / "weights.safetensors").unlink()
    os.symlink(outside, target / "weights.safetensors")
    target = case("spec-links-outside")
    (target / "spec.json").unlink()
    os.symlink(outside, target / "spec.json")
    return out
