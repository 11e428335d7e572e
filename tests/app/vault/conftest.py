"""Fixtures of the vault's app tests: per-test vault state, and main windows pointed at an empty vault."""

from __future__ import annotations

import pytest

from tests.app.vault.helpers import point_at_new_vault


@pytest.fixture(autouse=True)
def private_vault_state(tmp_path, monkeypatch):
    """Per-test vault anchors, and core dumps recorded instead of turned off in the test process (that
    cannot be undone; test_core_dumps_are_off_while_the_vault_is_unlocked checks the real thing in a child)."""
    import engine.vault.core_dumps

    monkeypatch.setenv("VOLSYNTH_ANCHOR_DIR", str(tmp_path / "anchors"))
    calls = []

    def record():
        calls.append(True)
        return engine.vault.core_dumps.CoreDumpGuard(rlimit=True, not_dumpable=True)

    monkeypatch.setattr(engine.vault.core_dumps, "disable_core_dumps", record)
    return calls


@pytest.fixture
def window_3d(qtbot, themed_app, registry, qt_settings, error_dialogs):
    """A main window with its 3D view, like conftest's ``main_window_3d`` but not waiting to become the active
    window: under Xvfb (no window manager) a second 3D window in one process never does, and the screenshot
    needs no keyboard shortcuts."""
    from app.window.main_window import MainWindow

    window = MainWindow(registry=registry, settings=qt_settings, enable_3d=True, preload_torch=False)
    qtbot.addWidget(window)
    window.resize(1500, 920)
    window.show()
    qtbot.waitExposed(window)
    if not window.viewer.view3d.ready:
        with qtbot.waitSignal(window.view3d_ready, timeout=90_000):
            pass
    yield window
    window.close()


@pytest.fixture
def vault_window(main_window, tmp_path):
    """The main window with its vault pointed at an empty folder in tmp_path (fast Argon2 parameters)."""
    yield point_at_new_vault(main_window, tmp_path / "vault")
    assert not main_window.vault_controller.tasks.running
