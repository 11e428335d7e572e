"""Crash recovery for generated volumes: nothing generated is lost when the app dies before the user saves.

Each running app keeps a session folder under ``$XDG_DATA_HOME/volsynth/recovery/`` (``~/.local/share/...``)
and holds an exclusive lock (``engine.files.durable.try_lock``) on its ``lock`` file for as long as it lives. Every generated volume of the
session is written there (NIfTI + provenance sidecar, and its tissue maps beside it as
``engine.nifti.io.save_volume`` writes them: all files atomically, from a worker thread) as soon as it
is made, and deleted when the user removes it from the session. A clean exit deletes the folder, unless some
volumes were never saved to a file or the vault: those stay, marked as left at a clean exit. After a crash
the kernel releases the lock, so at the next start a folder whose lock can be taken is a session that ended
(unexpectedly, or with unsaved volumes), and the app offers its volumes back.

A restored volume comes back with its tissue maps and template space; folders written before the maps were
kept (no maps beside the image) restore as they always did.

Only generated (synthetic) volumes are kept: scans opened from disk are still on disk, and volumes opened
from the encrypted vault must never be written in plaintext.

Qt-free (the main window wires it to the session and shows the offer).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from engine.files.durable import try_lock
from engine.formatting import count_of

if TYPE_CHECKING:
    from engine.nifti.volume import Volume

log = logging.getLogger(__name__)
LOCK_NAME = "lock"
NAME_KEY = "recovery_name"  # the session-list name, kept in the sidecar
SPACE_KEY = "recovery_space"  # the volume's space, when its provenance names another (or none)
# When the volume was made (ISO 8601, UTC), kept in its provenance: a restored volume kept again by the next
# session keeps it, where the file's time would be the time of the restore.
MADE_KEY = "made_at"


def made_time(image: Path) -> float | None:
    """When the volume kept as ``image`` was made (its sidecar's ``made_at``), seconds since the epoch."""
    from datetime import datetime

    from engine.nifti.io import sidecar_path

    try:
        made = json.loads(sidecar_path(image).read_text()).get(MADE_KEY)
        return datetime.fromisoformat(made).timestamp() if isinstance(made, str) else None
    except (OSError, ValueError, AttributeError):
        return None


#: A tissue map written beside a kept image (``engine.nifti.io.tissue_path``): not a volume of its own.
_TISSUE_FILE = re.compile(r"_label-[^_/]+_probseg\.nii\.gz$")


def default_recovery_dir() -> Path:
    from engine.files.user_folders import user_data_dir

    return user_data_dir() / "recovery"


DISCARDED_SUFFIX = ".discarded"  # a session folder the user discarded; deleted at the next purge


@dataclass
class OrphanSession:
    """A session folder left by an app that did not exit cleanly."""

    folder: Path
    started: float  # seconds since the epoch
    volumes: list[Path]  # the images in it (their tissue maps beside them are not counted), oldest first
    clean_exit: bool = False  # the app was closed with these volumes unsaved, rather than dying

    @property
    def made(self) -> list[float]:
        """When each volume was made (kept at the end of its run), oldest first; seconds since the epoch."""
        times = []
        for path in self.volumes:
            made = made_time(path)
            if made is not None:
                times.append(made)
                continue
            try:  # kept before volumes said when they were made: the file's time
                times.append(path.stat().st_mtime)
            except OSError:
                times.append(self.started)
        return sorted(times)

    def describe(self) -> str:
        """'3 generated volumes made 30 Nov 02:10-02:25, from a session that ended unexpectedly'."""
        count = len(self.volumes)
        what = count_of(count, f"{'unsaved ' if self.clean_exit else ''}generated volume")
        how = "your last session" if self.clean_exit else "a session that ended unexpectedly"
        made = self.made
        first = time.strftime("%d %b %H:%M", time.localtime(made[0])) if made else ""
        last = time.strftime("%H:%M", time.localtime(made[-1])) if made else ""
        when = (
            f" made {first}" + (f"\u2013{last}" if last and not first.endswith(last) else "") if made else ""
        )
        return f"{what}{when}, from {how}"


class RecoveryStore:
    """One app session's recovery folder, and the orphans of earlier sessions."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root) if root is not None else default_recovery_dir()
        self.folder: Path | None = None
        self._lock_fd: int | None = None
        self._files: dict[int, list[Path]] = {}  # VolumeEntry.uid -> its files (NIfTI first)
        self._dropped: set[int] = set()  # removed by the user while their write was still running
        self._lock = threading.Lock()  # keep() runs in worker threads, forget() in the GUI thread

    # -- this session --------------------------------------------------------------------------------

    def open(self) -> None:
        """Create and lock this session's folder (idempotent). An unwritable place logs and disables recovery."""
        if self.folder is not None:
            return
        folder = self.root / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{id(self):x}"
        try:
            folder.mkdir(parents=True, exist_ok=False)
            fd = os.open(folder / LOCK_NAME, os.O_CREAT | os.O_RDWR, 0o600)
            if not try_lock(fd):
                os.close(fd)
                raise OSError(f"{folder / LOCK_NAME} is locked by another process")
        except OSError:
            log.warning("crash recovery is off: cannot use %s", folder, exc_info=True)
            return
        os.write(fd, json.dumps({"pid": os.getpid(), "started": time.time()}).encode())
        self.folder, self._lock_fd = folder, fd

    def keep(self, uid: int, name: str, volume: Volume) -> Path | None:
        """Write one generated volume (worker thread): the session entry's record (``VolumeEntry.volume``), with
        its tissue maps beside it and its space (the sform code says so, and the sidecar when the provenance
        does not). All its files appear together or none does. Returns the image's file, or None when recovery
        is off."""
        from dataclasses import replace

        from engine.nifti.io import image_files, save_volume

        if self.folder is None:
            return None
        path = self.folder / f"{time.time_ns()}-{uid}.nii.gz"
        provenance = volume.provenance
        record = {**provenance, NAME_KEY: name}
        if not isinstance(record.get(MADE_KEY), str):
            from datetime import UTC, datetime

            record[MADE_KEY] = datetime.now(UTC).isoformat(timespec="seconds")
        if volume.space and volume.space != provenance.get("space"):
            record[SPACE_KEY] = volume.space
        volume = replace(volume, provenance=record, synthetic=True, space=volume.space or None)
        save_volume(volume, path)
        files = image_files(path, volume)
        with self._lock:
            self._files[uid] = files
            dropped = uid in self._dropped
            self._dropped.discard(uid)
        if dropped:
            self.forget(uid)
        return path

    def forget(self, uid: int) -> None:
        """The user removed the volume from the session: it is not to come back."""
        with self._lock:
            files = self._files.pop(uid, None)
            if files is None:
                self._dropped.add(uid)
        for file in files or ():
            with contextlib.suppress(FileNotFoundError):
                file.unlink()

    def kept(self) -> list[int]:
        return list(self._files)

    def close(self, keep: bool = False) -> None:
        """The app exits. ``keep``: some volumes were never saved, so they stay to be offered at the next start
        (marked as left at a clean exit); otherwise the folder goes."""
        if self.folder is None:
            return
        if keep and self._files and self._lock_fd is not None:
            record = json.dumps({"pid": os.getpid(), "started": _started(self.folder), "ended": time.time()})
            os.ftruncate(self._lock_fd, 0)
            os.pwrite(self._lock_fd, record.encode(), 0)
        else:
            shutil.rmtree(self.folder, ignore_errors=True)
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the lock
        self.folder, self._lock_fd, self._files = None, None, {}

    # -- earlier sessions ----------------------------------------------------------------------------

    def orphans(self) -> list[OrphanSession]:
        """Sessions of apps that are gone (their lock is free), newest first; empty ones are removed."""
        if not self.root.is_dir():
            return []
        found = []
        for folder in sorted(self.root.iterdir(), reverse=True):
            if folder.name.endswith(DISCARDED_SUFFIX):
                continue
            if folder == self.folder or not folder.is_dir() or not _abandoned(folder):
                continue
            volumes = _images(folder)
            if not volumes:
                shutil.rmtree(folder, ignore_errors=True)
                continue
            found.append(OrphanSession(folder, _started(folder), volumes, clean_exit=_ended_cleanly(folder)))
        return found

    @staticmethod
    def restore(session: OrphanSession) -> list[tuple[str, Volume]]:
        """Read an orphan's volumes back (worker thread): ``(name, engine.nifti.volume.Volume)`` each, the
        image with its tissue maps (``.tissue``, empty when none were kept) and space.

        The folder stays until :meth:`discard`, so a failed restore loses nothing.
        """
        from app.core.nifti_files import open_volume

        restored = []
        for path in session.volumes:
            opened = open_volume(path)
            provenance = opened.provenance
            name = str(provenance.pop(NAME_KEY, "") or path.name)
            space = provenance.pop(SPACE_KEY, None)
            if isinstance(space, str) and space:
                opened.space = space
            provenance.pop("tissue_maps", None)  # the recovery folder's file names: gone once restored
            opened.path = None  # not a file the user chose: saving asks where
            restored.append((name, opened))
        return restored

    @staticmethod
    def discard(session: OrphanSession) -> None:
        shutil.rmtree(session.folder, ignore_errors=True)

    @staticmethod
    def set_aside(session: OrphanSession) -> OrphanSession:
        """Discard with an undo: the folder is renamed out of the orphans' way and deleted by ``purge``
        (at this session's clean exit, or the next start), so ``take_back`` can undo it until then."""
        aside = session.folder.with_name(session.folder.name + DISCARDED_SUFFIX)
        os.replace(session.folder, aside)
        return OrphanSession(
            aside, session.started, [aside / p.name for p in session.volumes], session.clean_exit
        )

    @staticmethod
    def take_back(session: OrphanSession) -> OrphanSession:
        """Undo ``set_aside``: the session is an orphan again, offered as before."""
        back = session.folder.with_name(session.folder.name.removesuffix(DISCARDED_SUFFIX))
        os.replace(session.folder, back)
        return OrphanSession(
            back, session.started, [back / p.name for p in session.volumes], session.clean_exit
        )

    def purge(self) -> None:
        """Delete the sessions set aside (Discard's undo time is over)."""
        if self.root.is_dir():
            for folder in self.root.glob("*" + DISCARDED_SUFFIX):
                shutil.rmtree(folder, ignore_errors=True)


def _images(folder: Path) -> list[Path]:
    """The kept images of a session folder, oldest first: not their tissue maps, nor a write's temporary."""
    return sorted(
        p
        for p in folder.glob("*.nii.gz")
        if not p.name.startswith(".") and not _TISSUE_FILE.search(p.name) and p.is_file()
    )


def _abandoned(folder: Path) -> bool:
    """True if no live process holds the folder's lock (taking it briefly proves it)."""
    try:
        fd = os.open(folder / LOCK_NAME, os.O_RDWR)
    except FileNotFoundError:
        return True  # a folder without a lock file was never a live session's, or was half cleaned
    except OSError:
        return False
    try:
        return try_lock(fd)
    except OSError:
        return False
    finally:
        os.close(fd)  # closing drops the lock again


def _ended_cleanly(folder: Path) -> bool:
    try:
        return "ended" in json.loads((folder / LOCK_NAME).read_text())
    except (OSError, ValueError, TypeError):
        return False


def _started(folder: Path) -> float:
    try:
        return float(json.loads((folder / LOCK_NAME).read_text())["started"])
    except (OSError, ValueError, KeyError, TypeError):
        return folder.stat().st_mtime
