"""The Get Models dialog alone, driven by keys: a copy that is not the model refused in words, an installed copy
verified and removed, hashes kept on trust said so and checked when the hub can be asked, and the hub out of reach
worded for the person at the workstation.

The hub is tests/engine/models/hub_server.py on 127.0.0.1 (tests/app/models/conftest.py); the weights are tiny
seeded networks of the real architectures (tests/engine/models/hub_fixtures.py).
"""

from __future__ import annotations

import re
import shutil
import warnings

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication, QFileDialog, QMessageBox

from app.models.get_models_dialog import GetModelsDialog
from engine.models.download import ON_TRUST, RecordedHashes
from tests.app.modal import answer_modal
from tests.engine.models.hub_fixtures import copy_on_a_stick, widen_one_tensor

# What a radiologist should never have to read in this dialog: a tensor's name or shape, an errno, an
# environment variable, a command line, a path inside a hub repository.
ENGINE_WORDS = re.compile(r"tensor|\[\d+, \d+|Errno|HTTPS_PROXY|HF_ENDPOINT|volsynth |/resolve/")


@pytest.fixture
def dialog(qtbot, app_services, catalogue, tmp_path, monkeypatch):
    installed, removed = [], []
    dialog = GetModelsDialog(None, app_services.runner, installed.append, tmp_path / "models", removed.append)
    dialog.installed, dialog.removed = installed, removed
    qtbot.addWidget(dialog)
    _show(qtbot, dialog)
    return dialog


def _show(qtbot, dialog) -> None:
    dialog.show()
    qtbot.waitExposed(dialog)
    _activate(qtbot, dialog)


def _activate(qtbot, dialog) -> None:
    """Give the dialog the keyboard: under Xvfb no window manager does (a window shown again, or one whose
    activation a window of an earlier test took, stays inactive and its mnemonics do nothing)."""
    if dialog.isActiveWindow():
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        QApplication.setActiveWindow(dialog)
    qtbot.waitUntil(dialog.isActiveWindow, timeout=5_000)


def _alt(qtbot, dialog, key) -> None:
    qtbot.keyClick(dialog, key, Qt.KeyboardModifier.AltModifier)


def _choose_folder(monkeypatch, folder) -> None:
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", lambda *args: str(folder))


def _press(qtbot, dialog, key) -> None:
    """Alt+``key``, then wait until the job that button started has ended and the dialog shows it."""
    _activate(qtbot, dialog)
    with qtbot.waitSignal(dialog.job_ended, timeout=60_000):
        _alt(qtbot, dialog, key)


@pytest.mark.slow
def test_a_wrong_copy_is_refused_in_words_and_an_installed_one_verified_removed_and_replaced(
    dialog, qtbot, hub, hub_content, tmp_path, monkeypatch, screenshot
):
    """Before: a wrong copy was installed as NV-Generate-MR-Brain, generating failed with torch's size mismatch,
    and the dialog offered no way to check or remove it, so the right copy was refused ("already exists")."""
    entry = dialog.entry
    assert entry.name == "nv-generate-mr-brain"
    # Greyed, and why, in words on the dialog (not only in a tooltip).
    assert not dialog.add_button.isEnabled() and "until the licence above is accepted" in dialog.hint.text()
    assert "Greyed until the licence" in dialog.add_button.toolTip()
    _alt(qtbot, dialog, Qt.Key.Key_A)
    qtbot.waitUntil(dialog.accept_box.isChecked, timeout=5_000)
    assert dialog.add_button.isEnabled() and not dialog.verify_button.isEnabled()

    # A copy whose autoencoder was made for another network: refused in a sentence, nothing installed.
    wrong = copy_on_a_stick(tmp_path / "wrong-stick", hub_content, widen_one_tensor)
    _choose_folder(monkeypatch, wrong)
    _press(qtbot, dialog, Qt.Key.Key_F)
    said = dialog.status.text()
    assert said.startswith(f"This copy is not {entry.title}: its image decoder (its autoencoder) file")
    assert "another design" in said and "Nothing was installed" in said and not ENGINE_WORDS.search(said)
    assert "needs [" in dialog.status.toolTip()  # the engine's exact finding, for whoever looks further
    assert not (dialog.models_dir / entry.folder).exists() and dialog.installed == []
    assert "not installed" in dialog.list.item(0).text()
    screenshot(dialog, "get-models-refused-copy")

    # The same wrong copy installed by an earlier version (no shape check then): Verify says it cannot work.
    dialog.hide()
    shutil.copytree(hub_content["nv-generate-mr-brain"], dialog.models_dir / entry.folder)
    shutil.copyfile(
        wrong / "models" / "autoencoder_v1.pt",
        dialog.models_dir / entry.folder / "models" / "autoencoder_v1.pt",
    )
    _show(qtbot, dialog)
    assert "installed" in dialog.list.item(0).text() and not dialog.add_button.isEnabled()
    assert "Remove deletes it" in dialog.hint.text() and "Remove it first" in dialog.add_button.toolTip()
    _press(qtbot, dialog, Qt.Key.Key_V)
    said = dialog.status.text()
    assert said.startswith(f"{entry.title} as installed cannot generate.") and "Remove it" in said
    assert "image decoder" in said and not ENGINE_WORDS.search(said)

    # Remove (asked first): the folder goes, the picker is told, and the way is clear for the right copy.
    errors = []
    answer_modal(lambda box: box.button(QMessageBox.StandardButton.Yes).click(), errors)
    _press(qtbot, dialog, Qt.Key.Key_M)
    assert errors == [] and dialog.status.text().startswith("Removed")
    assert dialog.removed == [dialog.models_dir / entry.folder] and not dialog.removed[0].exists()
    assert "not installed" in dialog.list.item(0).text() and dialog.add_button.isEnabled()

    # The right copy: installed, its hashes said to be kept on trust, then checked by Verify against the hub.
    _choose_folder(monkeypatch, copy_on_a_stick(tmp_path / "stick", hub_content))
    _press(qtbot, dialog, Qt.Key.Key_F)
    assert dialog.status.text().startswith("Installed") and "kept on trust" in dialog.status.text()
    assert dialog.installed == [dialog.models_dir / entry.folder]
    assert "SHA-256 kept on trust" in dialog.details.toPlainText()
    _press(qtbot, dialog, Qt.Key.Key_V)
    said = dialog.status.text()
    assert said.startswith(f"Verified {entry.title}: its weights fit")
    assert (
        "diff_unet_3d_rflow-mr-brain_v1.pt matches its publisher's SHA-256 on the model hub (it was kept on trust; now checked)"
        in said
    )
    hashes = RecordedHashes()
    assert hashes.origin(entry, "models/autoencoder_v1.pt") != ON_TRUST
    assert "SHA-256 kept on trust" not in dialog.details.toPlainText()


@pytest.mark.slow
def test_the_hub_out_of_reach_is_worded_for_the_app_and_verify_says_what_stays_on_trust(
    dialog, qtbot, no_hub, hub_content, tmp_path, monkeypatch, screenshot
):
    entry = dialog.entry
    _alt(qtbot, dialog, Qt.Key.Key_A)
    qtbot.waitUntil(dialog.accept_box.isChecked, timeout=5_000)
    _press(qtbot, dialog, Qt.Key.Key_G)
    said = dialog.status.text()
    assert said.startswith(
        "The model hub (127.0.0.1) cannot be reached from this computer: the connection was refused."
    )
    assert "press Add from Folder" in said and "listed under Files" in said and not ENGINE_WORDS.search(said)
    assert "Errno" in dialog.status.toolTip() or "refused" in dialog.status.toolTip()
    # The files to fetch by hand are links a browser can follow.
    links = dialog.details.toHtml()
    assert (
        "https://huggingface.co/nvidia/NV-Generate-MR-Brain/resolve/main/models/diff_unet_3d_rflow-mr-brain_v1.pt"
        in links
    )
    screenshot(dialog, "get-models-offline")

    _choose_folder(monkeypatch, copy_on_a_stick(tmp_path / "stick", hub_content))
    _press(qtbot, dialog, Qt.Key.Key_F)
    assert dialog.status.text().startswith("Installed")
    _press(qtbot, dialog, Qt.Key.Key_V)
    said = dialog.status.text()
    assert (
        said.startswith(f"Verified {entry.title}")
        and "could not be asked: the connection was refused" in said
    )
    assert "autoencoder_v1.pt: its SHA-256 is kept on trust (added by hand" in said
    assert RecordedHashes().origin(entry, "models/autoencoder_v1.pt") == ON_TRUST
