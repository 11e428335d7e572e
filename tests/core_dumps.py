"""Core dumps recorded instead of turned off: the vault's commands and the app turn them off for good
(PR_SET_DUMPABLE and a hard RLIMIT_CORE of 0 cannot be undone), which a test process must not suffer; the tests
that check the real effect do so in a child process."""

from __future__ import annotations


def record_core_dumps(monkeypatch) -> list[bool]:
    """Replace ``engine.vault.core_dumps.disable_core_dumps`` with a recorder; the list gets one entry a call."""
    import engine.vault.core_dumps

    calls: list[bool] = []

    def record():
        calls.append(True)
        return engine.vault.core_dumps.CoreDumpGuard(rlimit=True, not_dumpable=True)

    monkeypatch.setattr(engine.vault.core_dumps, "disable_core_dumps", record)
    return calls
