"""Durable file writes and inter-process locks for the vault.

Every write goes to a temporary file in the destination folder, is fsync'ed, renamed over the target with
``os.replace`` (atomic on POSIX and on NTFS), and then the folder itself is fsync'ed so that the rename
survives a power cut. An interrupted write therefore leaves the old version; a failed fsync is reported as
an error and never retried, because after a failed fsync the kernel may already have dropped the dirty
pages and a retry could "succeed" without the data being on disk.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from engine.errors import OutputError, VaultError, VaultLocked
from engine.files import durable as fsutil
from engine.files.durable import try_lock, unlock

#: Temporary files written while holding the vault's write lock (index, payloads, header).
TMP_WRITE_PREFIX = ".tmp-w-"
#: Temporary files written while holding the audit lock (audit head).
TMP_AUDIT_PREFIX = ".tmp-a-"
TMP_SUFFIX = ".part"


def io_error(exc: OSError, what: str, *, output: bool = False) -> Exception:
    """Turn an OSError into the engine error a user can act on."""
    if exc.errno == errno.ENOSPC:
        msg = f"the disk is full while writing {what}; free some space and try again"
    elif exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        msg = f"no permission to write {what} ({exc.strerror})"
    else:
        msg = f"could not write {what}: {exc.strerror or exc}"
    return OutputError(msg) if output else VaultError(msg)


def fsync_file(fd: int, what: str) -> None:
    """fsync, turning a failure into an error (never a retry: see the module docstring)."""
    try:
        os.fsync(fd)
    except OSError as exc:
        raise VaultError(f"could not make {what} durable on disk (fsync failed: {exc.strerror})") from exc


def fsync_dir(folder: Path) -> None:
    """fsync a folder so that renames and new files in it are durable (a failure is a VaultError)."""
    try:
        fsutil.fsync_dir(folder)
    except OSError as exc:
        raise VaultError(
            f"could not make the folder {folder} durable on disk (fsync failed: {exc.strerror})"
        ) from exc


class AtomicWriter:
    """A file written in pieces and put in place atomically.

    Data goes to a temporary file next to ``target``; :meth:`commit` fsyncs it, renames it over ``target``
    and fsyncs the folder; :meth:`abort` deletes it. As a context manager it commits on a clean exit and
    aborts on an exception.

    Args:
        target: Final path.
        prefix: Name prefix of the temporary file (which lock domain cleans up leftovers).
        output: Raise :class:`OutputError` (a user-chosen destination) instead of :class:`VaultError`.
    """

    def __init__(self, target: Path, *, prefix: str = TMP_WRITE_PREFIX, output: bool = False) -> None:
        self.target = target
        self._output = output
        try:
            fd, tmp = _mkstemp(target.parent, prefix)
        except OSError as exc:
            raise io_error(exc, str(target), output=output) from exc
        self.tmp = Path(tmp)
        self._fh: BinaryIO | None = os.fdopen(fd, "wb")
        self.replaced = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        assert self._fh is not None, "write after commit/abort"
        try:
            self._fh.write(data)
        except OSError as exc:
            self.abort()
            raise io_error(exc, str(self.target), output=self._output) from exc

    def commit(self, *, sync_dir: bool = True) -> None:
        """Make the data durable and visible under ``target``.

        Args:
            sync_dir: fsync the folder after the rename. Callers writing many files may pass False and
                call :func:`fsync_dir` once at the end.
        """
        assert self._fh is not None, "commit after commit/abort"
        fh, self._fh = self._fh, None
        try:
            fh.flush()
            fsync_file(fh.fileno(), str(self.target))
            fh.close()
            os.replace(self.tmp, self.target)
        except BaseException as exc:
            fh.close()
            with contextlib.suppress(OSError):
                self.tmp.unlink()
            if isinstance(exc, OSError) and not isinstance(exc, OutputError):
                raise io_error(exc, str(self.target), output=self._output) from exc
            raise
        self.replaced = True
        if sync_dir:
            fsync_dir(self.target.parent)

    def abort(self) -> None:
        """Discard the temporary file (no effect after :meth:`commit`)."""
        if self._fh is None:
            return
        fh, self._fh = self._fh, None
        with contextlib.suppress(OSError):
            fh.close()
        with contextlib.suppress(OSError):
            self.tmp.unlink()

    def __enter__(self) -> AtomicWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()


def write_atomic(target: Path, data: bytes, *, sync_dir: bool = True, **kwargs) -> None:
    """Atomically replace ``target`` with ``data`` (see :class:`AtomicWriter`)."""
    writer = AtomicWriter(target, **kwargs)
    writer.write(data)
    writer.commit(sync_dir=sync_dir)


def _mkstemp(folder: Path, prefix: str) -> tuple[int, str]:
    # tempfile.mkstemp would do, but we want the suffix fixed and mode 0600 spelled out.
    for _ in range(100):
        name = folder / f"{prefix}{os.urandom(8).hex()}{TMP_SUFFIX}"
        try:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o600)
        except FileExistsError:  # pragma: no cover - 64 random bits
            continue
        return fd, str(name)
    raise FileExistsError(errno.EEXIST, "could not create a temporary file", str(folder))  # pragma: no cover


def remove_leftovers(folder: Path, prefix: str) -> int:
    """Delete temporary files left by an interrupted writer. Call only while holding that domain's lock."""
    removed = 0
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(folder):
            if entry.name.startswith(prefix) and entry.name.endswith(TMP_SUFFIX):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
                    removed += 1
    return removed


class FileLock:
    """An exclusive inter-process lock on a lock file (``flock`` on POSIX, ``msvcrt.locking`` on Windows).

    The holder writes its pid into the file so that a process that fails to get the lock can say who has
    it. The operating system releases the lock when the holder exits or is killed, so a crash never leaves
    a vault locked. The lock is per open file description: two ``Vault`` objects in one process exclude
    each other too.

    Args:
        path: The lock file.
        busy_message: Format string for :class:`VaultLocked`, with ``{pid}``.
    """

    def __init__(self, path: Path, busy_message: str) -> None:
        self.path = path
        self._busy_message = busy_message
        self._fd: int | None = None
        self._depth = 0

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, wait_s: float = 0.0, *, poll_s: float = 0.02) -> None:
        """Take the lock, waiting up to ``wait_s`` seconds; raises :class:`VaultLocked` if still busy.

        Re-entrant within one ``FileLock`` object.
        """
        if self._fd is not None:
            self._depth += 1
            return
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise io_error(exc, f"the lock file {self.path}") from exc
        deadline = time.monotonic() + wait_s
        while True:
            if try_lock(fd):
                break
            if time.monotonic() >= deadline:
                pid = _read_pid(fd)
                os.close(fd)
                raise VaultLocked(self._busy_message.format(pid=pid if pid else "unknown"))
            time.sleep(poll_s)
        with contextlib.suppress(OSError):  # the pid is only informative
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
            os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        self._depth = 1

    def release(self) -> None:
        if self._fd is None:
            return
        self._depth -= 1
        if self._depth > 0:
            return
        fd, self._fd = self._fd, None
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        unlock(fd)
        os.close(fd)

    @contextlib.contextmanager
    def hold(self, wait_s: float = 0.0) -> Iterator[None]:
        self.acquire(wait_s)
        try:
            yield
        finally:
            self.release()


def _read_pid(fd: int) -> int | None:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        text = os.read(fd, 32).decode("ascii", "replace").strip()
        return int(text) if text.isdigit() else None
    except OSError:
        return None


def read_chunks(path: Path, chunk: int, on_open: Callable[[BinaryIO], None] | None = None) -> Iterator[bytes]:
    """Yield a file's bytes in pieces of at most ``chunk`` bytes."""
    with open(path, "rb") as fh:
        if on_open is not None:
            on_open(fh)
        while True:
            piece = fh.read(chunk)
            if not piece:
                return
            yield piece
