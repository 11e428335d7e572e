"""The encrypted vault for patient scans and generated volumes (Qt-free public API).

Typical use::

    from engine.vault import Vault, default_vault_path

    vault = Vault(default_vault_path())          # or Vault.create(path, passphrase)
    vault.unlock(passphrase)                       # VaultLocked on a wrong passphrase
    info = vault.import_dicom("/media/cd/DICOM")   # or import_nifti(...), add_synthetic(...)
    for item in vault.search("smith"):
        print(item.id, item.label, item.patient.get("name"))
    opened = vault.open_item(info.id)              # float32 array + RAS affine, in memory only
    maps = vault.open_tissue(info.id)              # a generated volume's tissue maps (add_synthetic(Volume(..., tissue=maps)))
    vault.export(info.id, "exports", deidentify=True)
    report = vault.verify()                        # every byte authenticated, audit chain checked
    vault.lock_if_idle()                           # from a timer; idle_timeout_s sets the delay

Errors are :mod:`engine.errors` types: ``VaultLocked`` (locked, wrong passphrase, another process is
writing), ``VaultCorrupted`` (tampering or damage; no data returned), ``InvalidRequest``, ``OutputError``.
See :mod:`engine.vault.store` for the on-disk layout and crash-safety rules.
"""

from engine.vault.audit import AuditEntry
from engine.vault.crypto import KdfParams
from engine.vault.records import AuditTrail, ExportResult, ItemInfo, OpenedVolume, RepairReport, VerifyReport
from engine.vault.store import DEFAULT_IDLE_TIMEOUT_S, Progress, Vault, default_vault_path

__all__ = [
    "DEFAULT_IDLE_TIMEOUT_S",
    "AuditEntry",
    "AuditTrail",
    "ExportResult",
    "ItemInfo",
    "KdfParams",
    "OpenedVolume",
    "Progress",
    "RepairReport",
    "Vault",
    "VerifyReport",
    "default_vault_path",
]
