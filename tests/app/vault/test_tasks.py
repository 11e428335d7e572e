"""The vault's background tasks (app/vault/tasks.py): a long one shows its progress, and Cancel, pressed from the
keyboard, stops it leaving nothing behind (a real vault in tmp_path, no main window)."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QPushButton

from tests.app.vault.helpers import create_via_dialog, import_items, wait_task

render = pytest.mark.render


@render
def test_cancel_a_long_import_leaves_nothing_behind(qtbot, vault_app, nibabel_data, monkeypatch):
    import threading

    from app.core import vault_items as model

    app, controller = vault_app, vault_app.controller
    create_via_dialog(qtbot, controller)
    started, release = threading.Event(), threading.Event()
    probe = model.synthetic_marks

    def slow_probe(path):  # holds the import in the worker until the test has pressed Cancel
        if threading.current_thread() is not threading.main_thread():
            started.set()
            release.wait(10)
        return probe(path)

    monkeypatch.setattr(model, "synthetic_marks", slow_probe)
    controller.importing.import_nifti([nibabel_data / "anatomical.nii", nibabel_data / "example4d.nii.gz"])
    progress = controller.tasks.running[-1].progress
    assert progress is not None and started.wait(10)
    qtbot.waitUntil(progress.isVisible, timeout=10_000)  # shown once the import has taken a moment
    cancel = progress.findChild(QPushButton)  # the progress dialog's Cancel, pressed from the keyboard
    cancel.setFocus()
    qtbot.keyClick(cancel, Qt.Key.Key_Space)
    assert progress.labelText() == "Cancelling..."
    release.set()
    assert wait_task(qtbot, controller, "import") == "finished"
    assert "Import cancelled: 0 of 2 imported" in app.status()
    qtbot.waitUntil(lambda: not controller.tasks.running, timeout=10_000)
    assert controller.listing.items == [] and not list((controller.session.path / "blobs").glob("*.vsb"))
    assert controller.session.is_unlocked  # and the vault goes on working
    import_items(qtbot, controller, [nibabel_data / "anatomical.nii"], rows=1)
