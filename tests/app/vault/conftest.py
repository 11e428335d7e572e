"""Fixtures of the vault's app tests: per-test vault state, and main windows pointed at an empty vault."""

from __future__ import annotations

import pytest

from tests.app.vault.helpers import point_at_new_vault
from tests.core_dumps import record_core_dumps


@pytest.fixture(autouse=True)
def private_vault_state(tmp_path, monkeypatch):
    """Per-test vault anchors, and core dumps recorded instead of turned off in the test process (that
    cannot be undone; test_core_dumps_are_off_while_the_vault_is_unlocked checks the real thing in a child)."""
    monkeypatch.setenv("VOLSYNTH_ANCHOR_DIR", str(tmp_path / "anchors"))
    return record_core_dumps(monkeypatch)


@pytest.fixture
def vault_window(main_window, tmp_path):
    """The main window with its vault pointed at an empty folder in tmp_path (fast Argon2 parameters)."""
    yield point_at_new_vault(main_window, tmp_path / "vault")
    assert not main_window.vault_controller.tasks.running
