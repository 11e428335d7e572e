"""The open vault of one main window: its folder, the ``engine.vault.Vault`` object, whether it is unlocked, and
what new passphrases and the idle clock use.

Every piece of ``app/vault`` reads it; only ``app.vault.locking`` changes it (``set_unlocked``, ``set_locked``,
``set_path``), so whether the vault is open has one writer, and the lock that forgets the keys is the one place
that says so (tests/app/vault/test_vault_session.py holds the code to that). It imports nothing of the app: the
pieces are given it.

``engine.vault`` is imported on first use, not at start-up (it pulls in cryptography, nibabel, pydicom).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.vault import KdfParams, Vault

DEFAULT_AUTO_LOCK_MIN = 15  # engine.vault.DEFAULT_IDLE_TIMEOUT_S, without importing the vault at start-up
PATH_KEY = "vault/path"
AUTO_LOCK_KEY = "vault/auto_lock_minutes"


class VaultSession:
    """The state of the vault a main window uses (see the module's docstring).

    Args:
        settings: The app's QSettings (``vault/path``, ``vault/auto_lock_minutes``).
        clock: Monotonic clock in seconds, read through the vault for idle time (replaceable in tests).

    Attributes:
        kdf: Argon2id parameters for new passphrases; None is the engine's default (RFC 9106). Tests set
            small ones.
        clock: As above; ``now()`` reads it at each call, so a test may replace it while the vault is open.
    """

    def __init__(self, settings: Any, clock: Callable[[], float] | None = None) -> None:
        self._settings = settings
        self.clock: Callable[[], float] = clock or time.monotonic
        self.kdf: KdfParams | None = None
        self._path: Path | None = None
        self._vault: Vault | None = None
        self._unlocked = False

    # -- read by every piece ---------------------------------------------------------------------------

    @property
    def path(self) -> Path:
        """The vault folder: the ``vault/path`` setting, else ``engine.vault.default_vault_path()``."""
        if self._path is None:
            saved = self._settings.value(PATH_KEY, "", type=str)
            if saved:
                self._path = Path(saved).expanduser()
            else:
                from engine.vault import default_vault_path

                self._path = default_vault_path()
        return self._path

    @property
    def exists(self) -> bool:
        from engine.vault import Vault

        return Vault.exists(self.path)

    @property
    def vault(self) -> Vault | None:
        """The last ``Vault`` opened in ``path`` (still there, locked, after a lock); None before the first."""
        return self._vault

    @property
    def is_unlocked(self) -> bool:
        return self._unlocked

    @property
    def auto_lock_minutes(self) -> int:
        """Minutes without activity before the vault locks itself; 0 never."""
        return max(0, self._settings.value(AUTO_LOCK_KEY, DEFAULT_AUTO_LOCK_MIN, type=int))

    def idle_timeout_s(self) -> float | None:
        minutes = self.auto_lock_minutes
        return minutes * 60.0 if minutes else None

    def now(self) -> float:
        """The vault's idle clock: ``clock``, read at each call (tests replace it)."""
        return self.clock()

    # -- changed by app.vault.locking only -------------------------------------------------------------

    def set_unlocked(self, vault: Vault) -> None:
        """``vault`` is open (created, unlocked or repaired)."""
        self._vault = vault
        self._unlocked = True

    def set_locked(self) -> None:
        """The vault locked (here, after idle time, or by code outside the app): nothing may use it."""
        self._unlocked = False

    def set_path(self, path: Path) -> None:
        """The vault in ``path`` is used from now on (the old one is locked first); remembered in the settings."""
        self._path = path
        self._vault = None
        self._settings.setValue(PATH_KEY, str(path))
