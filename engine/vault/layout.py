"""The vault folder's file names and format constants (what every vault module agrees on).

See :mod:`engine.vault.store` for what each file holds and the order writes follow.
"""

from __future__ import annotations

from pathlib import Path

from engine.vault.audit import FAILED_NAME, HEAD_NAME, LOCK_NAME, LOG_NAME

HEADER_NAME = "vault.json"
INDEX_NAME = "index.vsi"
BLOB_DIR = "blobs"
BLOB_SUFFIX = ".vsb"
RECORD_SUFFIX = ".vsr"
#: A second copy of each record: one lost or damaged record file (with an index rolled back past its item)
#: no longer loses the item, ``repair`` re-indexes it from the other.
RECORD_COPY_SUFFIX = ".vsm"
PENDING_EXPORT_PREFIX = ".export-"
WRITE_LOCK_NAME = ".write.lock"
FORMAT = "volsynth-vault"
VERSION = 1
EXPORT_TMP_PREFIX = ".volsynth-export-"
STAGING_NAME = "staging"  # <dest>/.volsynth-export-<token>-staging: an export's files until all are written
OWN_NAMES = {HEADER_NAME, INDEX_NAME, BLOB_DIR, WRITE_LOCK_NAME, LOG_NAME, HEAD_NAME, LOCK_NAME}
#: Left by an interrupted ``create``: a folder holding only these may be initialised again.
LEFTOVER_PREFIXES = (FAILED_NAME, ".tmp-")
ROLLBACK_ADVICE = (
    "Nothing was deleted. Put the newer files back from a backup, or run `volsynth vault repair --dry-run` "
    "to see how the vault can be accepted as it is (it re-indexes the items whose encrypted files are still "
    "there), then `volsynth vault repair`."
)


def blob_dir(folder: Path) -> Path:
    """The folder of a vault's encrypted payload and record files."""
    return folder / BLOB_DIR


def blob_path(folder: Path, blob: str) -> Path:
    """The file of one encrypted payload (a part's ``"blob"`` name)."""
    return folder / BLOB_DIR / f"{blob}{BLOB_SUFFIX}"
