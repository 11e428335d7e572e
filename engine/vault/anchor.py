"""The vault's anchor outside its folder: what this computer last saw of each vault.

A vault folder can be copied, restored from a backup or edited file by file. Inside the folder, the index
is bound to the audit chain (see ``engine.vault.store``), but a consistent older copy of *both* looks
valid from inside. The anchor is the memory that does not travel with the folder: one small JSON file per
vault, named by the vault's id, in ``vault-anchors`` under the user's config folder
(``engine.files.user_folders.user_config_dir``: ``~/.config/volsynth`` on Linux, ``~/Library/Application
Support/volsynth`` on macOS, ``%LOCALAPPDATA%\\volsynth`` on Windows); ``$VOLSYNTH_ANCHOR_DIR`` overrides
it. It holds:

- ``generation``: the highest index generation seen (the index counts its commits);
- ``audit_seq`` / ``audit_mac``: the last audit entry seen and its chain MAC.

Nothing in it identifies a patient, and it holds no key: it only remembers numbers and a MAC. A missing
anchor (first use of the vault on this computer) is accepted and created. Updates merge (the highest
generation, the furthest audit entry), under a lock, so processes writing in any order leave the
furthest state. Writes are not fsync'ed: after a power cut the anchor may lag behind the vault, which
weakens a check but never raises a false alarm (a lagging anchor is accepted as long as the vault's
chain extends it).
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from engine.errors import VaultError
from engine.vault.fsio import FileLock

ANCHOR_DIR_ENV = "VOLSYNTH_ANCHOR_DIR"


def anchor_dir() -> Path:
    """Where anchors live: ``$VOLSYNTH_ANCHOR_DIR``, else ``vault-anchors`` in the per-user config folder."""
    env = os.environ.get(ANCHOR_DIR_ENV)
    if env:
        return Path(env).expanduser()
    from engine.files.user_folders import user_config_dir

    return user_config_dir() / "vault-anchors"


@dataclass(frozen=True)
class AnchorState:
    """What this computer last saw of one vault."""

    generation: int = 0
    audit_seq: int = 0
    audit_mac: str = ""
    updated: str = ""


class Anchor:
    """The anchor file of one vault.

    Args:
        vault_id: The vault's id (hex).
        folder: Anchor folder (default :func:`anchor_dir`).
    """

    def __init__(self, vault_id: str, folder: Path | None = None) -> None:
        self.folder = folder if folder is not None else anchor_dir()
        self.path = self.folder / f"{vault_id}.json"
        self.problem: str | None = None  # set when the anchor could not be read or written

    def read(self) -> AnchorState | None:
        """The saved state, or None if there is none (or it is unreadable: see ``problem``)."""
        try:
            data = json.loads(self.path.read_text("utf-8"))
            return AnchorState(
                generation=int(data["generation"]),
                audit_seq=int(data["audit_seq"]),
                audit_mac=str(data["audit_mac"]),
                updated=str(data.get("updated", "")),
            )
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            self.problem = f"the vault's anchor {self.path} is unreadable ({exc}); it will be rewritten"
            return None

    def update(self, *, generation: int | None = None, audit: tuple[int, bytes] | None = None) -> None:
        """Merge what was just committed into the anchor (never moves it backwards). Never raises: a
        read-only config folder weakens rollback detection, it must not stop the vault."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            lock = FileLock(self.folder / f".{self.path.stem}.lock", "anchor busy (pid {pid})")
            with lock.hold(wait_s=10.0):
                old = self.read() or AnchorState()
                new_gen = max(old.generation, generation if generation is not None else 0)
                seq, mac = old.audit_seq, old.audit_mac
                if audit is not None and audit[0] >= seq:
                    seq, mac = audit[0], audit[1].hex()
                if (new_gen, seq, mac) == (old.generation, old.audit_seq, old.audit_mac):
                    return
                self._write(AnchorState(new_gen, seq, mac, datetime.now(UTC).isoformat(timespec="seconds")))
        except (OSError, VaultError) as exc:
            self.problem = (
                f"cannot update the vault's anchor {self.path}: {getattr(exc, 'strerror', None) or exc}"
            )

    def reset(self, state: AnchorState) -> None:
        """Replace the anchor (only ``vault repair`` does this: the user accepted the vault as it is)."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            lock = FileLock(self.folder / f".{self.path.stem}.lock", "anchor busy (pid {pid})")
            with lock.hold(wait_s=10.0):
                self._write(state)
        except (OSError, VaultError) as exc:
            self.problem = (
                f"cannot update the vault's anchor {self.path}: {getattr(exc, 'strerror', None) or exc}"
            )

    def _write(self, state: AnchorState) -> None:
        text = json.dumps(
            {
                "generation": state.generation,
                "audit_seq": state.audit_seq,
                "audit_mac": state.audit_mac,
                "updated": state.updated or datetime.now(UTC).isoformat(timespec="seconds"),
            },
            indent=1,
        )
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text + "\n")
            os.replace(tmp, self.path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
