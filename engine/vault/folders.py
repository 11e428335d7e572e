"""The folders a re-key puts beside a vault, and what opening or unlocking a vault does about the ones a
crash left: finishing a swap killed between its two renames, deleting the copy under the old key.

They live here, below every operation, because the vault's constructor and its clean-up at unlock need them
as much as :mod:`engine.vault.rekey` (the operation that makes these folders) does.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from engine.vault.fsio import fsync_dir
from engine.vault.layout import HEADER_NAME

STAGING_SUFFIX = ".rekey"
RETIRED_SUFFIX = ".pre-rekey"
#: Written into the staging folder once its audit trail was replayed: from then on it is whole.
COMPLETE_MARK = "rekey-complete"


def staging_path(folder: Path) -> Path:
    """Where a re-key builds the new vault (``.<name>.rekey`` beside it)."""
    return folder.with_name(f".{folder.name}{STAGING_SUFFIX}")


def retired_path(folder: Path) -> Path:
    """Where a re-key moves the vault under its old key before deleting it (``.<name>.pre-rekey``)."""
    return folder.with_name(f".{folder.name}{RETIRED_SUFFIX}")


def finish_interrupted_swap(folder: Path) -> str | None:
    """Finish a re-key killed between its two renames (no folder at ``folder``, a complete staging one
    beside it). Needs no key. Returns a notice, or None when there was nothing to finish."""
    staging = staging_path(folder)
    if folder.exists() or not (staging / COMPLETE_MARK).is_file() or not (staging / HEADER_NAME).is_file():
        return None
    os.rename(staging, folder)
    with contextlib.suppress(FileNotFoundError):
        (folder / COMPLETE_MARK).unlink()
    fsync_dir(folder.parent)
    return "finished a re-key that was interrupted while the vault folder was being swapped"


def remove_retired(folder: Path) -> str | None:
    """Delete the pre-re-key folder a crash left behind (all of it is encrypted under the old key)."""
    retired = retired_path(folder)
    if not retired.exists():
        return None
    shutil.rmtree(retired)
    return f"deleted {retired.name}, the copy of the vault under its old key left by an interrupted re-key"
