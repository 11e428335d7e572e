"""One family of errors for everything the engine can refuse or fail at.

Every message is written for the person at the keyboard: it says what was wrong and what to do. The CLI
prints ``str(error)`` on one line; the app shows it in a dialog. Nothing here configures logging or shows UI.
"""

from __future__ import annotations


class EngineError(Exception):
    """Base class. ``exit_code`` is what the CLI exits with when this error ends a command."""

    exit_code = 1


class InvalidRequest(EngineError, ValueError):
    """A request, a condition, a setting or an argument is out of range or malformed."""

    exit_code = 2


class ModelNotFound(EngineError, LookupError):
    """No model with that id in the registry, or no model folder at that path."""

    exit_code = 3


class ModelInvalid(EngineError):
    """A model folder or MONAI bundle exists but cannot be trusted or understood (bad spec, unsafe file)."""

    exit_code = 4


class BackendUnavailable(EngineError):
    """The requested device or backend is not available on this machine (or the server is unreachable)."""

    exit_code = 5


class OutOfMemory(EngineError, MemoryError):
    """The device ran out of memory; the message carries advice (smaller batch, streamed decode, ...)."""

    exit_code = 6


class OutputError(EngineError, OSError):
    """A result could not be written: folder missing, not writable, disk full. Nothing partial is left."""

    exit_code = 7


class NonFiniteOutput(EngineError):
    """The model produced NaN or infinite values (broken weights or schedule, or a reduced-precision
    setting that overflowed). Nothing is written: no NIfTI, no sidecar, no vault item, no cohort file."""

    exit_code = 8


class Cancelled(EngineError):
    """The user cancelled; raised only where a caller needs to tell cancel from success."""

    exit_code = 130


class VaultError(EngineError):
    """Base class for the encrypted vault."""

    exit_code = 10


class VaultLocked(VaultError):
    """The vault is locked, the passphrase was wrong, or another process holds the write lock."""

    exit_code = 11


class VaultCorrupted(VaultError):
    """Authentication failed for an item, the index, the header or the audit log. Data was not returned."""

    exit_code = 12


class VaultRolledBack(VaultCorrupted):
    """A vault file was put back to an older version (index, audit trail, or the header after a passphrase
    change). The message names what was rolled back; nothing is deleted because of it."""

    exit_code = 13


class DuplicateItem(InvalidRequest):
    """The volume is already in the vault; ``existing`` is that item's id."""

    def __init__(self, message: str, existing: str = "") -> None:
        super().__init__(message)
        self.existing = existing
