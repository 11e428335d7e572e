"""Generate > Get Models... driven by keys: pick, read the licence, accept, progress, cancel, resume, picker.

The hub is tests/engine/models/hub_server.py on 127.0.0.1 serving the real catalogue's files with tiny seeded
weights (tests/engine/models/hub_fixtures.py); the real huggingface_hub client fetches them in the worker thread.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication

from engine.models import download
from engine.models.download import staging_dir

SHOTS = Path(os.environ.get("VOLSYNTH_MODELS_SHOTS", "")) if os.environ.get("VOLSYNTH_MODELS_SHOTS") else None


def _alt(qtbot, widget, key) -> None:
    qtbot.keyClick(widget, key, Qt.KeyboardModifier.AltModifier)


def _shot(widget, name: str, screenshot) -> None:
    path = screenshot(widget, f"get-models-{name}")
    if SHOTS is not None:  # a person who wants to look at them names a folder
        SHOTS.mkdir(parents=True, exist_ok=True)
        widget.grab().save(str(SHOTS / f"{name}.png"))
    assert path.is_file()


@pytest.mark.slow
def test_get_models_by_keys_cancel_resume_then_in_the_picker(generating, qtbot, hub, screenshot, monkeypatch):
    from app.models import install_get_models

    # The fixture weights are about 1 MB where the real ones are GB: the client's write size scales with
    # them, so progress and Cancel land mid-file as they do on a real download.
    monkeypatch.setattr(download, "WRITE_CHUNK_BYTES", 16 << 10)
    services = generating.services
    get_models = install_get_models(services)  # Generate > Get Models..., as the main window installs it
    assert get_models.action in services.menus.generate.actions()
    get_models.action.trigger()
    dialog = get_models.dialog
    qtbot.waitExposed(dialog)
    dialog.activateWindow()
    qtbot.waitUntil(dialog.isActiveWindow, timeout=5_000)

    # Pick: the list has the focus; Down then Up lands on NV-Generate-MR-Brain (the first row).
    assert QApplication.focusWidget() is dialog.list
    qtbot.keyClick(dialog.list, Qt.Key.Key_Down)
    assert "brain_image_synthesis" in dialog.details.toPlainText() or "MONAI" in dialog.details.toPlainText()
    qtbot.keyClick(dialog.list, Qt.Key.Key_Up)
    text = dialog.details.toPlainText()
    assert "NVIDIA Open Model License" in text and "nvidia-open-model-license" in text
    assert "MR angiography (quality not guaranteed: all planes)" in text
    assert "SWI (quality not guaranteed: sagittal and coronal)" in text
    assert "Memory per volume" in text and "256x256x128" in text and "free there" in text
    assert "follows the config" in text  # guidance 2 from the config, its docs' 10 said
    # Read the licence: Tab moves to it, and the keys scroll it.
    qtbot.keyClick(dialog.list, Qt.Key.Key_Tab)
    assert QApplication.focusWidget() is dialog.details
    qtbot.keyClick(dialog.details, Qt.Key.Key_End)
    _shot(dialog, "1-licence", screenshot)

    # Nothing can start before the licence is accepted, and nothing was asked of the hub.
    assert not dialog.get_button.isEnabled() and hub.state.requests == []
    _alt(qtbot, dialog, Qt.Key.Key_A)  # a mnemonic clicks after a short animation: wait for the toggle
    qtbot.waitUntil(dialog.accept_box.isChecked, timeout=5_000)
    assert dialog.get_button.isEnabled()

    # Get, slowly enough to see the progress and cancel mid-file.
    hub.state.chunk = 8 << 10
    hub.state.delay_per_chunk_s = 0.02
    entry = dialog.entry
    part = staging_dir(dialog.models_dir, entry) / f"{entry.hub_files[0].path}.part"
    _alt(qtbot, dialog, Qt.Key.Key_G)
    qtbot.waitUntil(lambda: part.is_file() and part.stat().st_size >= 64 << 10, timeout=30_000)
    qtbot.waitUntil(lambda: 0 < dialog.progress.value() < 1000, timeout=30_000)
    assert "fetching models/" in dialog.status.text()
    _shot(dialog, "2-progress", screenshot)
    with qtbot.waitSignal(dialog.job_ended, timeout=30_000):  # Alt+C: Cancel Download, from the keyboard
        _alt(qtbot, dialog, Qt.Key.Key_C)
    assert dialog.status.text().startswith("Cancelled")
    assert dialog.get_button.text() == "&Resume" and "fetched, Get resumes" in dialog.list.item(0).text()
    assert not any(m.id == "nv-generate-mr-brain" for m in services.state.models)
    _shot(dialog, "3-cancelled", screenshot)

    # Resume: the half-fetched file continues where it stopped (a Range request), then it is installed.
    hub.state.delay_per_chunk_s = 0.0
    seen = len(hub.state.requests)
    _alt(qtbot, dialog, Qt.Key.Key_R)
    qtbot.waitUntil(lambda: "Installed" in dialog.status.text(), timeout=60_000)
    ranges = [r for _, _, r in hub.state.requests[seen:] if r]
    assert len(ranges) == 1 and ranges[0].startswith("bytes=") and not ranges[0].startswith("bytes=0-")
    _shot(dialog, "4-installed", screenshot)

    # The model is in the picker, selected.
    box = generating.sampling_panel.model_box
    assert box.findData("nv-generate-mr-brain") >= 0
    assert box.currentData() == "nv-generate-mr-brain"
    assert "installed" in dialog.list.item(0).text()
    dialog.close()
    _shot(services.parent, "5-picker", screenshot)


@pytest.mark.slow
def test_offline_says_so_in_one_line_then_add_from_folder_installs_the_copy(
    main_window, qtbot, hub_content, no_hub, monkeypatch, screenshot
):
    """In the main window, end to end: the hub out of reach, then the copy on a stick added from its folder
    joins the picker, and the window's status line says where it came from and what the switch reset."""
    content = hub_content
    window = main_window
    window.get_models.action.trigger()
    dialog = window.get_models.dialog
    qtbot.waitExposed(dialog)
    dialog.activateWindow()
    qtbot.waitUntil(dialog.isActiveWindow, timeout=5_000)
    qtbot.keyClick(dialog.list, Qt.Key.Key_Down)  # MONAI's brain LDM
    assert "brain_image_synthesis" in dialog.details.toPlainText()
    _alt(qtbot, dialog, Qt.Key.Key_A)
    qtbot.waitUntil(dialog.accept_box.isChecked, timeout=5_000)
    _alt(qtbot, dialog, Qt.Key.Key_G)
    qtbot.waitUntil(lambda: "cannot be reached" in dialog.status.text(), timeout=30_000)
    message = dialog.status.text()
    assert "\n" not in message and "press Add from Folder" in message
    assert "HTTPS_PROXY" in dialog.status.toolTip()  # the engine's own words, for whoever runs the network
    _shot(dialog, "6-offline", screenshot)

    # The files brought on a stick: Add from Folder checks and copies them; the model joins the picker.
    from PySide6.QtWidgets import QFileDialog

    chosen = []
    monkeypatch.setattr(
        QFileDialog, "getExistingDirectory", lambda *args: chosen.append(args) or str(content["brain-ldm"])
    )
    _alt(qtbot, dialog, Qt.Key.Key_F)
    qtbot.waitUntil(lambda: "Installed" in dialog.status.text(), timeout=30_000)
    assert (
        chosen
        and window.sampling_panel.model_box.currentData() == "brain_image_synthesis_latent_diffusion_model"
    )
    # What the switch of model reset is still said after the window's word on where the model came from.
    message = window.statusBar().currentMessage()
    assert message.startswith(f"Model {window.state.selected_model.spec.name} opened from "), message
    assert message.endswith(f". {window.state.form.switch_note}") and "\u2192" in message, message
    _shot(dialog, "7-added", screenshot)
