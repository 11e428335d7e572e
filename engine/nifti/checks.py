"""The checks every NIfTI file passes before VolSynth reads a voxel of it: one step for every reader.

``vault import``, the app's Open (``engine.nifti.io.load_nifti``) and opening a stored vault item all call
:func:`inspect_nifti` (or :func:`inspect_nifti_bytes`) first. A file is untrusted input, so the header is
checked on its own bytes, before nibabel parses it:

* a single-file NIfTI-1/NIfTI-2 header (magic ``n+1``/``n+2``), 3 or 4 dimensions, every axis > 0;
* a data type VolSynth can read (integers and reals, not complex or RGB);
* a finite, invertible voxel -> world affine (the one nibabel would choose: sform, qform or pixdim);
* a data offset after the header and below :data:`MAX_HEADER_BYTES`, header extensions that chain
  exactly up to it (nibabel would otherwise read whatever size an extension claims);
* a voxel count within :func:`voxel_limit` (``VOLSYNTH_MAX_VOXELS``) and, for reading, within the memory
  that is actually available: both refused with the numbers *before* any data is read;
* an uncompressed file at least as long as the header says; for a ``.nii.gz``, :func:`verify_nifti_data`
  decompresses the whole stream with a limit derived from the header (never inflating beyond it), so a
  truncated file or a gzip bomb is refused before an import reports success.

Only regular files are opened: a FIFO, device or socket named like a NIfTI file is refused before any
blocking read (:func:`open_regular_file` opens with ``O_NONBLOCK`` and checks ``fstat``).

Every refusal is an :class:`~engine.errors.InvalidRequest` (or :class:`~engine.errors.OutOfMemory` for the
memory check) with one line that names the file, what is wrong and what to do.
"""

from __future__ import annotations

import io
import os
import stat
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Literal

import numpy as np

from engine.errors import InvalidRequest, NonFiniteOutput, OutOfMemory
from engine.formatting import format_bytes

if TYPE_CHECKING:  # nibabel is imported where a header is parsed; here only its type is named
    import nibabel as nib

MAX_VOXELS_ENV = "VOLSYNTH_MAX_VOXELS"
#: Default voxel limit: 2**28 voxels is 1 GiB as float32 (a 512^3 volume is half of it).
DEFAULT_MAX_VOXELS = 1 << 28
#: A header plus extensions larger than this is refused (the vault refuses to buffer more, too).
MAX_HEADER_BYTES = 64 << 20
#: A ``.nii.gz`` may decompress to this much more than its header describes (padding some writers add).
GZIP_SLACK_BYTES = 1 << 20
_GZIP_MAGIC = b"\x1f\x8b"
_INFLATE_STEP = 1 << 20  # never ask zlib for more than this per call: a bomb's chunk stays small

# NIfTI datatype codes VolSynth reads, with their numpy types (little-endian; byte order from the header).
_DTYPES = {
    2: "u1",
    4: "i2",
    8: "i4",
    16: "f4",
    64: "f8",
    256: "i1",
    512: "u2",
    768: "u4",
    1024: "i8",
    1280: "u8",
}
_DTYPE_NAMES = {
    0: "unknown",
    1: "binary",
    32: "complex64",
    128: "RGB24",
    1536: "float128",
    1792: "complex128",
    2048: "complex256",
    2304: "RGBA32",
}


def voxel_limit() -> int:
    """The most voxels a volume may have (``VOLSYNTH_MAX_VOXELS``, default 2**28)."""
    text = os.environ.get(MAX_VOXELS_ENV, "").strip().replace("_", "")
    if not text:
        return DEFAULT_MAX_VOXELS
    try:
        value = int(float(text))
    except ValueError:
        raise InvalidRequest(
            f"{MAX_VOXELS_ENV}={text!r} is not a number; set it to a voxel count such as 500000000"
        ) from None
    if value <= 0:
        raise InvalidRequest(f"{MAX_VOXELS_ENV} must be a positive voxel count, got {text}")
    return value


def available_memory() -> int:
    """Bytes of memory this process can still get (psutil's ``available``)."""
    import psutil

    return int(psutil.virtual_memory().available)


def check_voxel_count(shape: tuple[int, ...], what: str) -> int:
    """Refuse a shape over the voxel limit, saying how to raise it. Returns the voxel count."""
    voxels = 1
    for n in shape:
        voxels *= int(n)
    limit = voxel_limit()
    if voxels > limit:
        dims = " x ".join(str(int(n)) for n in shape)
        raise InvalidRequest(
            f"{what} claims {dims} = {voxels:,} voxels, more than VolSynth's limit of {limit:,}; if it is "
            f"genuine and this machine has the memory, raise the limit with the environment variable "
            f"{MAX_VOXELS_ENV} (e.g. {MAX_VOXELS_ENV}={voxels})"
        )
    return voxels


def refuse_non_finite(volume, what: str) -> None:
    """NonFiniteOutput unless every voxel of a generated ``volume`` is finite: the last guard of the paths
    that write one (NIfTI + sidecar, the vault), behind the sampling loop's own check, for results that
    come from elsewhere (an engine server, a caller's own array)."""
    array = np.asarray(volume)
    if array.dtype.kind in "fc" and not np.isfinite(array).all():
        bad = int(array.size - np.count_nonzero(np.isfinite(array)))
        raise NonFiniteOutput(
            f"{what} has {bad:,} of {array.size:,} voxels NaN or infinite; refusing to write it (nothing was "
            "written). The model that made it is broken or a reduced-precision setting overflowed"
        )


def check_memory(need: int, what: str) -> None:
    """Refuse to allocate ``need`` bytes when less memory than that is available."""
    avail = available_memory()
    if need > avail:
        raise OutOfMemory(
            f"{what} needs about {format_bytes(need)} of memory, but only {format_bytes(avail)} is "
            "available; close other programs or use a machine with more memory"
        )


@dataclass(frozen=True)
class NiftiHeader:
    """A NIfTI header that passed every check, and what the readers need from it.

    Attributes:
        name: The file's name, for messages.
        version: 1 or 2.
        compressed: The file is gzip-compressed.
        shape: Array shape without trailing singleton axes past the third (3 or 4 entries).
        dtype: On-disk numpy dtype, with the file's byte order.
        vox_offset: Where the voxels start, in (decompressed) bytes.
        data_bytes: Bytes of voxel data the header describes.
        affine: Voxel -> world mm, the transform nibabel chooses (sform, else qform, else pixdim).
        header: The parsed nibabel header (without extensions).
        file_size: Bytes on disk (compressed size for .nii.gz).
    """

    name: str
    version: int
    compressed: bool
    shape: tuple[int, ...]
    dtype: np.dtype
    vox_offset: int
    data_bytes: int
    affine: np.ndarray
    header: nib.Nifti1Header  # a Nifti2Header for NIfTI-2 (its subclass)
    file_size: int

    @property
    def voxels(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def volume_voxels(self) -> int:
        """Voxels of one 3D volume (one time point of a 4D series)."""
        return int(np.prod(self.shape[:3], dtype=np.int64))

    @property
    def time_points(self) -> int:
        return int(self.shape[3]) if len(self.shape) > 3 else 1

    @property
    def expected_size(self) -> int:
        """Bytes the (decompressed) file needs: header, extensions and all the voxels."""
        return self.vox_offset + self.data_bytes

    @property
    def scaled(self) -> bool:
        """The stored values are scaled on reading (nibabel ignores a slope of 0 or NaN)."""
        slope = float(self.header["scl_slope"])
        inter = float(self.header["scl_inter"])
        return bool(np.isfinite(slope) and slope != 0 and (slope != 1 or inter != 0))

    def read_bytes_per_voxel(self) -> int:
        """Peak bytes per voxel read as float32: the stored values, the float32 copy, the reoriented copy."""
        return self.dtype.itemsize + 8 + (4 if self.scaled else 0)

    def check_read_memory(self, voxels: int | None = None) -> None:
        """Refuse to read ``voxels`` (default: all of them) when the memory for it is not available."""
        count = self.voxels if voxels is None else voxels
        check_memory(count * self.read_bytes_per_voxel(), f"reading {self.name}")


class _Prefix:
    """The first bytes of a (possibly gzip-compressed) stream, decompressing no more than asked for."""

    def __init__(self, fh: BinaryIO, compressed: bool) -> None:
        self._fh = fh
        self._inflate = zlib.decompressobj(16 + zlib.MAX_WBITS) if compressed else None
        self._buf = bytearray()
        self._pending = b""
        self._eof = False

    def get(self, n: int) -> bytes:
        """Up to ``n`` bytes from the start (fewer only if the stream ends first)."""
        while len(self._buf) < n and not self._eof:
            want = n - len(self._buf)
            if self._inflate is None:
                chunk = self._fh.read(max(want, 1 << 16))
                if not chunk:
                    self._eof = True
                self._buf += chunk
                continue
            if not self._pending:
                self._pending = self._fh.read(1 << 16)
                if not self._pending:
                    self._eof = True
                    break
            out = self._inflate.decompress(self._pending, min(want, _INFLATE_STEP))
            self._pending = self._inflate.unconsumed_tail
            self._buf += out
            if self._inflate.eof:
                # a following gzip member (concatenated .gz) is read by the full check, not here
                self._eof = not self._inflate.unused_data
                if not self._eof:
                    rest = self._inflate.unused_data + self._pending
                    self._inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
                    self._pending = rest
        return bytes(self._buf[:n])


ByteOrder = Literal["<", ">"]


def sniff_sizeof_hdr(head: bytes) -> tuple[int, ByteOrder] | None:
    """(header size 348 or 540, byte order ``"<"`` or ``">"``) from a stream's first four bytes; None if it is
    not a NIfTI-1/-2 header (or shorter than four bytes). The project's one header-size sniffer: the NIfTI
    checks, the vault's stream rewriter and its synthetic-mark finder all read the size here."""
    if len(head) < 4:
        return None
    orders: tuple[ByteOrder, ...] = ("<", ">")
    for endian in orders:
        (size,) = struct.unpack(endian + "i", head[:4])
        if size in (348, 540):
            return size, endian
    return None


def _sizeof_hdr(head: bytes, name: str) -> tuple[int, ByteOrder]:
    if len(head) < 4:
        raise InvalidRequest(
            f"{name} is not a readable NIfTI file: it has only {len(head)} bytes; check the file"
        )
    found = sniff_sizeof_hdr(head)
    if found is None:
        raise InvalidRequest(f"{name} is not a readable NIfTI file (it does not start with a NIfTI header)")
    return found


def _check_extensions(block: bytes, start: int, end: int, endian: str, name: str) -> None:
    """The extension chain must fill [start, end) exactly, each size a multiple of 16 (the NIfTI-1 rule).

    nibabel trusts each esize: one that is not a multiple of 16, or a chain that stops short of the data
    offset, leaves bytes that belong to no extension, and a reader that steps by 16 (the standard's readers
    do) lands inside one. Such a header is refused, not imported.
    """
    pos = start
    while pos < end:
        if end - pos < 16:
            raise InvalidRequest(
                f"{name} has a bogus header extension chain: {end - pos} bytes at byte {pos} belong to no "
                f"extension before the data at byte {end} (vox_offset); the file is damaged or not a NIfTI file"
            )
        esize, _ecode = struct.unpack(endian + "ii", block[pos : pos + 8])
        if esize < 16 or esize % 16 or pos + esize > end:
            raise InvalidRequest(
                f"{name} has a bogus header extension size (esize {esize} at byte {pos}; extensions are "
                f"multiples of 16 bytes ending exactly at the data, byte {end}); the file is damaged or not "
                "a NIfTI file"
            )
        pos += esize


def _affine(header, name: str) -> np.ndarray:
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            affine = np.asarray(header.get_best_affine(), dtype=np.float64)
    except Exception as exc:  # noqa: BLE001 - nibabel raises several types for broken quaternions
        raise InvalidRequest(
            f"{name} has a broken orientation (sform/qform): {str(exc).splitlines()[0] if str(exc) else exc!r}"
        ) from None
    if affine.shape != (4, 4) or not np.all(np.isfinite(affine)):
        raise InvalidRequest(
            f"{name} has a voxel-to-world transform with NaN or infinite values (sform/qform/pixdim); "
            "the file's geometry is broken, fix it with the tool that wrote it"
        )
    singular = np.linalg.svd(affine[:3, :3], compute_uv=False)
    if not singular[-1] > 1e-6 * max(singular[0], 1e-300) or singular[-1] < 1e-8:
        raise InvalidRequest(
            f"{name} has a singular voxel-to-world transform (a voxel size of 0 or collapsed axes); "
            "the file's geometry is broken, fix it with the tool that wrote it"
        )
    return affine


# Long on purpose: one linear list of checks in the order the header's fields are read; each one line or two.
def check_header(head: bytes, *, name: str, compressed: bool, file_size: int) -> NiftiHeader:
    """Check a NIfTI header from the file's first bytes (at least up to its data offset, when it has one).

    Args:
        head: The (decompressed) bytes from the start of the file: the header block, and everything up to
            the data offset if the file has header extensions.
        name: The file's name, for messages.
        compressed: The file is gzip-compressed (no size check against ``file_size`` then).
        file_size: The file's size on disk.
    """
    import nibabel as nib

    size, endian = _sizeof_hdr(head, name)
    if len(head) < size:
        raise InvalidRequest(f"{name} is truncated: it ends inside its {size}-byte header")
    klass = nib.Nifti2Header if size == 540 else nib.Nifti1Header
    try:
        header = klass(head[:size], endianness=endian, check=False)
    except Exception as exc:  # noqa: BLE001
        raise InvalidRequest(f"{name} has an unreadable NIfTI header ({exc})") from None
    magic = bytes(header["magic"].item()).rstrip(b"\x00")
    if magic in (b"ni1", b"ni2"):
        raise InvalidRequest(
            f"{name} is the header of a NIfTI pair (.hdr/.img); convert it to a single .nii file first"
        )
    if magic not in (b"n+1", b"n+2"):
        raise InvalidRequest(f"{name} has no NIfTI magic (found {magic!r}); it is not a NIfTI file")

    dim = [int(d) for d in header["dim"]]
    ndim = dim[0]
    if not 1 <= ndim <= 7:
        raise InvalidRequest(f"{name} claims {ndim} dimensions (dim[0]); the header is damaged")
    full = dim[1 : ndim + 1]
    if any(n <= 0 for n in full):
        kind = "a zero-length axis" if 0 in full else "a negative axis length"
        raise InvalidRequest(f"{name} has {kind} (shape {tuple(full)}); there are no voxels to read")
    shape = list(full)
    while len(shape) > 3 and shape[-1] == 1:
        shape.pop()
    if len(shape) < 3:
        raise InvalidRequest(f"{name} is a {len(shape)}D image {tuple(full)}; VolSynth reads 3D volumes")
    if len(shape) > 4:
        raise InvalidRequest(
            f"{name} has {len(shape)} non-trivial dimensions {tuple(full)}; VolSynth reads 3D volumes "
            "and 4D series"
        )

    code = int(header["datatype"])
    if code not in _DTYPES:
        raise InvalidRequest(
            f"{name} stores {_DTYPE_NAMES.get(code, f'datatype code {code}')} voxels; VolSynth reads "
            "integer and real-valued volumes"
        )
    dtype = np.dtype(_DTYPES[code]).newbyteorder(endian)

    voxels = check_voxel_count(tuple(shape), name)

    offset = float(header["vox_offset"])
    if not np.isfinite(offset) or offset != int(offset):
        raise InvalidRequest(
            f"{name} has an invalid data offset (vox_offset {offset}); the header is damaged"
        )
    vox_offset = int(offset)
    if vox_offset < size + 4:
        raise InvalidRequest(
            f"{name} puts its voxels at byte {vox_offset}, inside the {size}-byte header; the header is damaged"
        )
    if vox_offset > MAX_HEADER_BYTES:
        raise InvalidRequest(
            f"{name} puts its voxels at byte {vox_offset:,}, past any plausible header (at most "
            f"{format_bytes(MAX_HEADER_BYTES)} of header extensions are accepted); the header is damaged"
        )
    has_extensions = len(head) > size and head[size : size + 1] != b"\x00"
    if has_extensions:
        if len(head) < vox_offset:
            raise InvalidRequest(f"{name} is truncated: it ends inside its header extensions")
        _check_extensions(head, size + 4, vox_offset, endian, name)

    slope, inter = float(header["scl_slope"]), float(header["scl_inter"])
    if np.isfinite(slope) and slope != 0 and not np.isfinite(inter):
        raise InvalidRequest(
            f"{name} has an intensity scaling with a non-finite intercept (scl_inter {inter}); "
            "the header is damaged"
        )
    if np.isfinite(slope) and slope != 0 and dtype.kind in "iu":
        # The stored integers' whole range, scaled, must stay within float32 (what VolSynth reads into):
        # scl_slope 3e38 on int16 made 99.8 % of the voxels infinite.
        limits = np.iinfo(dtype)
        reach = max(abs(slope * float(limits.min) + inter), abs(slope * float(limits.max) + inter))
        if not reach <= float(np.finfo(np.float32).max):
            raise InvalidRequest(
                f"{name} has an intensity scaling (scl_slope {slope:g}, scl_inter {inter:g}) that takes its "
                f"{dtype.name} values beyond float32 (they would read as infinite); the header is damaged"
            )

    affine = _affine(header, name)
    data_bytes = voxels * dtype.itemsize
    if not compressed and file_size < vox_offset + data_bytes:
        raise InvalidRequest(
            f"{name} is truncated or its header is wrong: the header describes {format_bytes(data_bytes)} of "
            f"voxels from byte {vox_offset:,}, but the file has only {file_size:,} bytes"
        )
    return NiftiHeader(
        name=name,
        version=2 if size == 540 else 1,
        compressed=compressed,
        shape=tuple(shape),
        dtype=dtype,
        vox_offset=vox_offset,
        data_bytes=data_bytes,
        affine=affine,
        header=header,
        file_size=file_size,
    )


def _inspect(fh: BinaryIO, *, name: str, file_size: int) -> NiftiHeader:
    magic = fh.read(2)
    fh.seek(0)
    compressed = magic == _GZIP_MAGIC
    prefix = _Prefix(fh, compressed)
    try:
        head = prefix.get(544)
        size, endian = _sizeof_hdr(head, name)
        if len(head) >= size + 4 and head[size : size + 1] != b"\x00":
            # header extensions: read up to the data offset (bounded) so the chain can be checked
            if size == 348:
                (offset,) = struct.unpack(endian + "f", head[108:112])
            else:
                (offset,) = struct.unpack(endian + "q", head[168:176])
            if np.isfinite(offset) and size + 4 <= offset <= MAX_HEADER_BYTES:
                head = prefix.get(int(offset))
    except zlib.error as exc:
        raise InvalidRequest(
            f"{name} is not a valid .nii.gz file (gzip: {exc}); check the file is complete"
        ) from None
    if compressed and len(head) == 0:
        raise InvalidRequest(f"{name} is an empty or truncated gzip file")
    return check_header(head, name=name, compressed=compressed, file_size=file_size)


_KINDS = {
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a folder",
}


def open_regular_file(path: str | os.PathLike) -> BinaryIO:
    """Open ``path`` for reading only if it is a regular file; a FIFO or device is refused at once.

    ``open()`` on a FIFO blocks until a writer appears (forever, in the audit's case), so the file is
    opened with ``O_NONBLOCK`` (which makes that open return at once), checked with ``fstat`` on the open
    descriptor (no race with a rename), and only then switched back to blocking reads.

    Raises:
        InvalidRequest: Missing, not a regular file, or unreadable.
    """
    path = Path(path)
    flags = (
        os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    )
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise InvalidRequest(f"no file at {path}") from None
    except IsADirectoryError:
        raise InvalidRequest(f"{path} is a folder, not a file") from None
    except OSError as exc:
        raise InvalidRequest(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = _KINDS.get(stat.S_IFMT(mode), "not a regular file")
            raise InvalidRequest(f"{path} is {kind}, not a regular file; give the path of a file")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def inspect_nifti(path: str | os.PathLike) -> NiftiHeader:
    """Check a NIfTI file's header (and, uncompressed, its length) without reading any voxel.

    Raises:
        InvalidRequest: The file is missing, not a single-file NIfTI, or its header fails a check.
    """
    path = Path(path)
    try:
        with open_regular_file(path) as fh:
            return _inspect(fh, name=path.name, file_size=os.fstat(fh.fileno()).st_size)
    except FileNotFoundError:
        raise InvalidRequest(f"no file at {path}") from None
    except IsADirectoryError:
        raise InvalidRequest(f"{path} is a folder, not a NIfTI file") from None
    except OSError as exc:
        raise InvalidRequest(f"cannot read {path}: {exc.strerror or exc}") from None


def inspect_nifti_bytes(raw, *, name: str) -> NiftiHeader:
    """:func:`inspect_nifti` for a file held in memory (a decrypted vault item)."""
    import io

    view = memoryview(raw).cast("B")
    return _inspect(io.BytesIO(view), name=name, file_size=len(view))


def _inflate_bounded(chunks, limit: int, name: str):
    """Yield decompressed pieces of a gzip stream (members followed) and raise once more than ``limit``
    bytes come out, or if the stream is truncated or damaged. zlib is never asked for more than
    ``_INFLATE_STEP`` bytes at a time, so memory stays bounded whatever the compression ratio."""
    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
    total = 0
    started = False
    try:
        for chunk in chunks:
            data = chunk
            while data:
                if inflate.eof:  # after a member: zero padding is skipped, as gzip readers (and gzip -d) do
                    data = data.lstrip(b"\x00")
                    if not data:
                        break
                    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
                out = inflate.decompress(data, _INFLATE_STEP)
                data = inflate.unconsumed_tail
                started = True
                total += len(out)
                if total > limit:
                    raise InvalidRequest(
                        f"{name} decompresses to more than the {format_bytes(limit)} its header describes "
                        "(a damaged file or a gzip bomb); it was not read further"
                    )
                if out:
                    yield out
                if inflate.eof:
                    data = inflate.unused_data + data  # another member, or padding (see above)
        while not inflate.eof:  # output zlib still holds after the last input
            out = inflate.decompress(b"", _INFLATE_STEP)
            if not out:
                break
            total += len(out)
            if total > limit:
                raise InvalidRequest(
                    f"{name} decompresses to more than the {format_bytes(limit)} its header describes "
                    "(a damaged file or a gzip bomb); it was not read further"
                )
            yield out
    except zlib.error as exc:
        raise InvalidRequest(
            f"{name} is a damaged .nii.gz file (gzip: {exc}); check the file is complete"
        ) from None
    if not started or not inflate.eof:
        raise InvalidRequest(f"{name} is truncated: its gzip stream ends early; check the file is complete")


def verify_nifti_data(path: str | os.PathLike, info: NiftiHeader) -> None:
    """Prove the voxels are there, end to end, before a caller reports success (the vault's import).

    Uncompressed files were checked against their length already. A .nii.gz is decompressed to the end
    (CRC checked) with a limit of what its header describes plus :data:`GZIP_SLACK_BYTES`: a truncated
    stream or one that inflates beyond that (a gzip bomb) is refused without being held in memory.
    """
    if not info.compressed:
        return
    path = Path(path)

    def chunks():
        with open_regular_file(path) as fh:
            while block := fh.read(1 << 16):
                yield block

    total = 0
    try:
        for piece in _inflate_bounded(chunks(), info.expected_size + GZIP_SLACK_BYTES, info.name):
            total += len(piece)
    except OSError as exc:
        raise InvalidRequest(f"cannot read {path}: {exc.strerror or exc}") from None
    if total < info.expected_size:
        raise InvalidRequest(
            f"{info.name} is truncated: it holds {total:,} bytes once decompressed, its header needs "
            f"{info.expected_size:,}; check the file is complete"
        )


class MemoryReader(io.RawIOBase):
    """A read-only file over a buffer, so nibabel can parse decrypted bytes without copying them first."""

    def __init__(self, buf) -> None:
        super().__init__()
        self._buf = memoryview(buf).cast("B")
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._buf)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, b) -> int:
        n = max(0, min(len(b), len(self._buf) - self._pos))
        memoryview(b).cast("B")[:n] = self._buf[self._pos : self._pos + n]
        self._pos += n
        return n


def gunzip_file_bounded(path: str | os.PathLike, info: NiftiHeader) -> bytearray:
    """Decompress a .nii.gz file into memory in one pass, streaming from disk, refusing anything past
    what its header describes and any truncated or damaged stream (CRC checked at the end)."""
    path = Path(path)

    def chunks():
        with open_regular_file(path) as fh:
            while block := fh.read(1 << 20):
                yield block

    out = bytearray()
    try:
        for piece in _inflate_bounded(chunks(), info.expected_size + GZIP_SLACK_BYTES, info.name):
            if len(out) < info.expected_size:
                out += piece[: info.expected_size - len(out)]
    except OSError as exc:
        raise InvalidRequest(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(out) < info.expected_size:
        raise InvalidRequest(
            f"{info.name} is truncated: it holds {len(out):,} bytes once decompressed, its header needs "
            f"{info.expected_size:,}; check the file is complete"
        )
    return out


def gunzip_bounded(raw, info: NiftiHeader) -> bytearray:
    """Decompress an in-memory .nii.gz, refusing anything past what its header describes."""
    view = memoryview(raw).cast("B")
    out = bytearray()
    step = 1 << 20
    pieces = (view[i : i + step] for i in range(0, len(view), step))
    for piece in _inflate_bounded(pieces, info.expected_size + GZIP_SLACK_BYTES, info.name):
        out += piece
    if len(out) < info.expected_size:
        raise InvalidRequest(f"{info.name} is truncated: its voxels end early")
    return out
