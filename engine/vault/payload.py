"""Encrypted payload parts (``blobs/<random>.vsb``): streaming one in (hashing the plaintext) and reading
one back, authenticated, as a stream or into memory.

A part is one volume, one original DICOM file or one tissue map of an item, each under a key and an
encryption context unique to that item and part.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from engine.errors import VaultCorrupted
from engine.vault import crypto
from engine.vault.crypto import DecryptionFailed
from engine.vault.fsio import AtomicWriter
from engine.vault.layout import BLOB_SUFFIX, blob_path
from engine.vault.records import TISSUE_PART_PREFIX

if TYPE_CHECKING:
    from engine.vault.state import VaultState

Progress = Callable[[int, int], None]
"""Progress callback: (bytes done, bytes total). It may raise (e.g. ``Cancelled``) to abort cleanly."""


class PartWriter:
    """Streams one part (volume or DICOM file) into an encrypted blob, hashing the plaintext."""

    def __init__(self, folder: Path, key: bytes, ctx: bytes, name: str) -> None:
        self.name = name
        self.blob = secrets.token_hex(16)
        self.path = folder / f"{self.blob}{BLOB_SUFFIX}"
        self._writer = AtomicWriter(self.path)
        self._enc = crypto.StreamEncryptor(key, ctx)
        self._sha = hashlib.sha256()
        self.size = 0
        self.ct_size = 0
        self.extra: dict = {}

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._sha.update(data)
        self.size += len(data)
        out = self._enc.update(data)
        self.ct_size += len(out)
        self._writer.write(out)

    def close(self) -> dict:
        out = self._enc.finalize()
        self.ct_size += len(out)
        self._writer.write(out)
        self._writer.commit(sync_dir=False)  # the blob folder is fsync'ed once, before the index commit
        return {
            "name": self.name,
            "blob": self.blob,
            "size": self.size,
            "ct_size": self.ct_size,
            "sha256": self._sha.hexdigest(),
            **self.extra,
        }

    def discard(self) -> None:
        self._writer.abort()
        if self._writer.replaced:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()


def part_label(name: str) -> str:
    """How messages name a part: never by its file name."""
    if name.startswith("dicom/"):
        return f"DICOM file {int(name.split('/')[1])}"
    if name.startswith(TISSUE_PART_PREFIX):
        return f"tissue map {name[len(TISSUE_PART_PREFIX) :]}"
    return "volume data"


def corrupted(rec: dict, part: dict, why: str) -> VaultCorrupted:
    """The error that names a damaged part of an item (no data is returned with it)."""
    return VaultCorrupted(
        f"item {rec['id']} is corrupted: its {part_label(part['name'])} {why}; no data was returned"
    )


def open_part(state: VaultState, rec: dict, part: dict):
    """Open a part's blob after checking its exact length; returns (file, decryptor)."""
    assert state.keys is not None
    path = blob_path(state.path, part["blob"])
    try:
        fh = open(path, "rb")  # noqa: SIM115 - the callers close it
    except FileNotFoundError:
        raise VaultCorrupted(
            f"item {rec['id']} is damaged: its {part_label(part['name'])} file is missing"
        ) from None
    size = os.fstat(fh.fileno()).st_size
    if size != part["ct_size"]:
        fh.close()
        raise corrupted(rec, part, f"file was truncated or extended ({size} bytes, not {part['ct_size']})")
    ctx = crypto.context(state.keys.vault_id, rec["id"], part["name"])
    return fh, crypto.StreamDecryptor(state.keys.item(rec["id"]), ctx)


def iter_part(state: VaultState, rec: dict, part: dict, *, check_hash: bool = False) -> Iterator[bytes]:
    """Decrypt one part, yielding plaintext pieces; raises VaultCorrupted naming the item.

    Integrity comes from the AEAD: every chunk is authenticated under a key and context unique to this
    item and part, and ``finalize`` proves the stream complete. Pieces are therefore genuine as they
    come, but only a generator run to completion proves nothing was cut off: consumers act on the data
    (return it, rename a file into place) only after that. ``check_hash`` adds the SHA-256 recorded at
    import as a second, independent check (used by verify).
    """
    fh, dec = open_part(state, rec, part)
    sha = hashlib.sha256() if check_hash else None
    n = 0
    with fh:
        try:
            while chunk := fh.read(crypto.IO_CHUNK):
                out = dec.update(chunk)
                if out:
                    if sha is not None:
                        sha.update(out)
                    n += len(out)
                    yield out
            out = dec.finalize()
        except DecryptionFailed:
            raise corrupted(rec, part, "failed authentication (modified, damaged or swapped)") from None
    if out:
        if sha is not None:
            sha.update(out)
        n += len(out)
        yield out
    if n != part["size"] or (sha is not None and not hmac.compare_digest(sha.hexdigest(), part["sha256"])):
        raise corrupted(rec, part, "does not match the index")


def read_part(state: VaultState, rec: dict, part: dict) -> memoryview:
    """Decrypt one part into memory (never to disk), without intermediate copies."""
    size = int(part["size"])
    # Uninitialised memory: nothing is zeroed first, and on failure it is dropped unread.
    buf = np.empty(size + crypto.IO_CHUNK + crypto.StreamDecryptor.INTO_SLACK, dtype=np.uint8)
    fh, dec = open_part(state, rec, part)
    pos = 0
    with fh:
        try:
            while chunk := fh.read(crypto.IO_CHUNK):
                pos += dec.update_into(chunk, buf[pos:])
                if pos > size:
                    raise corrupted(rec, part, "is longer than recorded")
            tail = dec.finalize()
        except DecryptionFailed:
            raise corrupted(rec, part, "failed authentication (modified, damaged or swapped)") from None
    buf[pos : pos + len(tail)] = np.frombuffer(tail, dtype=np.uint8)
    pos += len(tail)
    if pos != size:
        raise corrupted(rec, part, "does not match the index")
    return buf.data[:size]


def counting(stream: Iterator[bytes], progress: Progress, start: int, total: int) -> Iterator[bytes]:
    """Report progress as the pieces of ``stream`` pass, counting from ``start``."""
    done = start
    for piece in stream:
        done += len(piece)
        progress(done, total)
        yield piece
