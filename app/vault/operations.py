"""The vault operations that run in the worker thread (``app.services.workers.Worker.reporting_call``), one small function each.

Each takes the vault (or what opens one) and ends with ``report``, the worker's progress-and-cancel
callback. ``engine.vault`` is imported inside them, on first use, not at the app's start-up.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def create_vault(path: Path, passphrase: str, kdf, idle_timeout_s, clock, report) -> Any:
    from engine.vault import Vault

    report(None, "Creating the vault")
    return Vault.create(path, passphrase, kdf=kdf, idle_timeout_s=idle_timeout_s, clock=clock)


def unlock(vault, passphrase: str, report) -> Any:
    report(None, "Unlocking")
    vault.unlock(passphrase)
    return vault


def list_items(vault, query: str, kind: str | None, report) -> list:
    return vault.search(query, kind=kind)


def delete(vault, item_id: str, report) -> str:
    vault.delete(item_id)
    return item_id


def change_passphrase(vault, old: str, new: str, kdf, report) -> None:
    report(None, "Changing the passphrase")
    vault.change_passphrase(old, new, kdf=kdf)


def rekey(vault, old: str, new: str, kdf, report):
    """Re-encrypt the whole vault under a new key (engine.vault.rekey), with progress."""
    report(None, "Re-encrypting the vault")

    def progress(done: int, total: int) -> None:
        report(done / total if total else 1.0, "Re-encrypting the vault")

    return vault.rekey(old, new, kdf=kdf, progress=progress)  # engine.vault.rekey.RekeyReport


def lock(vault, report) -> None:
    vault.lock()


def repair_check(path: Path, passphrase: str, idle_timeout_s, clock, report) -> tuple:
    """Unlock a rolled-back vault for repair only and plan the repair (nothing is changed)."""
    from engine.vault import Vault

    report(None, "Checking the vault")
    vault = Vault(path, idle_timeout_s=idle_timeout_s, clock=clock)
    vault.unlock(passphrase, allow_rollback=True)
    try:
        return vault, vault.repair(dry_run=True)
    except BaseException:
        vault.lock()
        raise


def repair_now(vault, report) -> tuple:
    report(None, "Repairing the vault")
    return vault, vault.repair()
