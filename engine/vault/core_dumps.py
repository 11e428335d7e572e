"""Keep patient data out of core dumps while a vault is unlocked.

A core dump of a process with a vault unlocked holds decrypted volumes, patient metadata and key material
(and, in the app, the passphrase as typed). :func:`disable_core_dumps` turns dumps off for the rest of the
process's life, the moment before a passphrase is read:

- every POSIX system: ``RLIMIT_CORE`` set to 0, soft and hard (a process cannot raise it again, so
  nothing it loads later can turn dumps back on);
- Linux: also ``prctl(PR_SET_DUMPABLE, 0)``, which covers what the rlimit does not: a ``core_pattern``
  that pipes to a crash collector (systemd-coredump, apport) ignores ``RLIMIT_CORE`` but honours the
  dumpable flag, and the flag also stops other processes of the same user from attaching a debugger or
  reading ``/proc/<pid>/mem``.

It is not undone when the vault locks: Python does not zero freed memory, so decrypted data may outlive
the lock. Elsewhere (Windows) it does nothing and says why in :attr:`CoreDumpGuard.reason`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

PR_SET_DUMPABLE = 4
PR_GET_DUMPABLE = 3


@dataclass(frozen=True)
class CoreDumpGuard:
    """What :func:`disable_core_dumps` achieved.

    Attributes:
        rlimit: ``RLIMIT_CORE`` is (0, 0).
        not_dumpable: Linux only: the process is marked not dumpable.
        reason: Why something could not be done (empty when all applied).
    """

    rlimit: bool
    not_dumpable: bool
    reason: str = ""

    @property
    def applied(self) -> bool:
        return self.rlimit and (self.not_dumpable or not sys.platform.startswith("linux"))


def _libc():
    import ctypes
    import ctypes.util

    return ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


def dumpable() -> int | None:
    """Linux: the process's dumpable flag (0 = no core dumps, no ptrace by peers); None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return int(_libc().prctl(PR_GET_DUMPABLE, 0, 0, 0, 0))
    except (OSError, AttributeError):
        return None


def disable_core_dumps() -> CoreDumpGuard:
    """Turn core dumps off for this process (idempotent; never raises). See the module docstring."""
    reasons = []
    rlimit = False
    try:
        import resource
    except ImportError:
        reasons.append(f"core dumps cannot be limited on {sys.platform} (no resource module)")
    else:
        try:
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            rlimit = True
        except (OSError, ValueError) as exc:
            reasons.append(f"setrlimit(RLIMIT_CORE, 0) failed: {exc}")
    not_dumpable = False
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = _libc()
            if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
                reasons.append(f"prctl(PR_SET_DUMPABLE, 0) failed (errno {ctypes.get_errno()})")
            else:
                not_dumpable = True
        except (OSError, AttributeError) as exc:
            reasons.append(f"prctl is not available: {exc}")
    return CoreDumpGuard(rlimit=rlimit, not_dumpable=not_dumpable, reason="; ".join(reasons))
