"""An installed catalogue model, checked again or removed: what ``volsynth models verify`` / ``remove`` and the
app's Get Models (Verify, Remove) do.

Checking a model folder that is already installed asks three things, and says which it could answer:

1. do its weights fit the networks its own config describes (``engine.models.copy_check``: every tensor's
   shape, and the size the parameters imply)?
2. does each file's SHA-256 match what its publisher says: the catalogue's, else the hub's (asked only when
   ``ask_hub``; an unreachable hub is said, never an error), else the one recorded at a download that was
   checked against the hub?
3. which hashes are kept on trust (recorded when a copy was added by hand, checked against nothing)? A hub
   that confirms such a file makes its hash a checked one; one that disagrees makes the file "not as
   published".
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from engine.errors import EngineError, ModelNotFound
from engine.models.catalogue import CatalogueEntry
from engine.models.download import (
    DOWNLOADED,
    ON_TRUST,
    HubUnreachable,
    RecordedHashes,
    default_models_dir,
    hub_endpoint,
    hub_file_metadata,
    is_sha256,
    require_hub_client,
    verify_folder,
)
from engine.models.source import sha256_file

# What a file's check found (``FileCheck.state``).
MATCHES = "matches"  # the publisher's hash (catalogue or hub) or a checked download's
DIFFERS = "differs"
ON_TRUST_ONLY = "on trust"  # only a hash recorded on trust: nothing published to check against
UNCHECKED = "unchecked"  # no hash at all
MISSING = "missing"


@dataclass(frozen=True)
class FileCheck:
    path: str  # inside the model folder
    state: str  # MATCHES, DIFFERS, ON_TRUST_ONLY, UNCHECKED or MISSING
    against: str  # what it was checked against, in words: "the catalogue", "the hub's SHA-256"...
    sha256: str = ""

    def words(self) -> str:
        if self.state == MISSING:
            return f"{self.path} is missing"
        digest = f"sha256 {self.sha256[:16]}..."
        return {
            MATCHES: f"{self.path}  {digest}  matches {self.against}",
            DIFFERS: f"{self.path}  {digest}  DIFFERS from {self.against}",
            ON_TRUST_ONLY: f"{self.path}  {digest}  recorded on trust when added by hand: not checked against "
            "the publisher",
            UNCHECKED: f"{self.path}  {digest}  no hash to check against",
        }[self.state]


@dataclass
class InstalledCheck:
    """What checking an installed model found. ``problem`` is the networks check's error, if it failed."""

    entry: CatalogueEntry
    folder: Path
    problem: EngineError | None = None
    files: list[FileCheck] = field(default_factory=list)
    hub: str = ""  # "" when not asked; else "asked" or why it could not be reached
    hub_error: HubUnreachable | None = None
    confirmed: list[str] = field(default_factory=list)  # on-trust hashes the hub confirmed (now checked ones)

    @property
    def fits_networks(self) -> bool:
        return self.problem is None

    @property
    def wrong(self) -> list[FileCheck]:
        return [f for f in self.files if f.state in (DIFFERS, MISSING)]

    @property
    def on_trust(self) -> list[FileCheck]:
        return [f for f in self.files if f.state == ON_TRUST_ONLY]

    @property
    def ok(self) -> bool:
        return self.fits_networks and not self.wrong


def check_installed(
    entry: CatalogueEntry,
    models_dir: Path | None = None,
    *,
    ask_hub: bool = True,
    hashes: RecordedHashes | None = None,
) -> InstalledCheck:
    """Check ``entry``'s installed folder (module docstring); raises ModelNotFound when it is not installed."""
    models_dir = Path(models_dir) if models_dir else default_models_dir()
    folder = models_dir / entry.folder
    if not folder.is_dir():
        raise ModelNotFound(f"{entry.name} is not installed in {models_dir}")
    hashes = hashes or RecordedHashes()
    check = InstalledCheck(entry, folder)
    try:
        verify_folder(folder)
    except EngineError as exc:
        check.problem = exc
    hub_sha: dict[str, str] = {}
    if ask_hub and entry.hub_files:
        endpoint = hub_endpoint()
        try:
            require_hub_client(entry)
            for file in entry.hub_files:
                if not file.sha256:  # the catalogue's own hash outranks the hub's: no need to ask
                    etag = hub_file_metadata(entry, file, endpoint).etag
                    if is_sha256(etag):
                        hub_sha[file.path] = etag
            check.hub = "asked"
        except HubUnreachable as exc:
            check.hub, check.hub_error = exc.reason or str(exc), exc
        except EngineError as exc:
            check.hub = str(exc)
    confirmed: dict[str, str] = {}
    for file in entry.files:
        path = folder / file.path
        if not path.is_file():
            check.files.append(FileCheck(file.path, MISSING, ""))
            continue
        digest = sha256_file(path)
        recorded, origin = hashes.get(entry, file.path), hashes.origin(entry, file.path)
        expected, against = None, ""
        if file.sha256:
            expected, against = file.sha256, "the catalogue"
        elif file.path in hub_sha:
            expected, against = hub_sha[file.path], "the hub's SHA-256"
        elif recorded and origin == DOWNLOADED:
            expected, against = recorded, "the hash recorded at download"
        if expected is not None:
            state = MATCHES if digest == expected else DIFFERS
            if state == MATCHES and against == "the hub's SHA-256" and origin == ON_TRUST:
                confirmed[file.path] = digest
        else:
            state = ON_TRUST_ONLY if recorded and origin == ON_TRUST else UNCHECKED
        check.files.append(FileCheck(file.path, state, against, digest))
    if confirmed:
        hashes.record(entry, confirmed, DOWNLOADED)  # checked against the publisher now: no longer on trust
        check.confirmed = sorted(confirmed)
    return check


def remove_installed(
    entry: CatalogueEntry, models_dir: Path | None = None, *, hashes: RecordedHashes | None = None
) -> tuple[Path | None, list[str]]:
    """Delete ``entry``'s installed folder and forget its recorded hashes; returns (the folder removed or None
    when it was not there, the paths whose hashes were forgotten). Raises ModelNotFound when neither existed."""
    models_dir = Path(models_dir) if models_dir else default_models_dir()
    target = models_dir / entry.folder
    forgotten = (hashes or RecordedHashes()).forget(entry)
    if not target.is_dir():
        if forgotten:
            return None, forgotten
        raise ModelNotFound(f"{entry.name} is not installed in {models_dir}")
    shutil.rmtree(target)
    return target, forgotten


__all__ = [
    "DIFFERS",
    "MATCHES",
    "MISSING",
    "ON_TRUST",
    "ON_TRUST_ONLY",
    "UNCHECKED",
    "FileCheck",
    "InstalledCheck",
    "check_installed",
    "remove_installed",
]
