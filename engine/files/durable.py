"""File-system primitives shared by the vault, NIfTI writing and the app's crash recovery.

``fsync_dir`` makes renames and new files in a folder durable (a failure is an error, never a retry).
``try_lock``/``unlock`` take and drop an exclusive advisory lock on an open file without waiting: ``flock``
on POSIX, ``msvcrt.locking`` of the first byte on Windows. The kernel drops the lock when its holder dies,
which is how a crashed session's folder is told from a live one.
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path

try:  # POSIX
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]
    import msvcrt


def fsync_dir(folder: Path) -> None:
    """fsync a folder; raises OSError when the disk refuses. A no-op on Windows, where NTFS journals
    metadata and a folder cannot be opened for fsync."""
    if os.name == "nt":  # pragma: no cover
        return
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def try_lock(fd: int) -> bool:
    """Take an exclusive lock on an open file without waiting; False if another process holds it."""
    if fcntl is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                return False
            raise
        return True
    try:  # pragma: no cover - Windows
        os.lseek(fd, 0, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        return True
    except OSError:  # pragma: no cover
        return False


def unlock(fd: int) -> None:
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return
    with contextlib.suppress(OSError):  # pragma: no cover - Windows
        os.lseek(fd, 0, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
