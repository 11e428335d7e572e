"""The vault's boundary holds on every path: a volume opened from the vault leaves it only through Export or an
asked, audited copy. Driven by keys and clicks in a real window, with a real vault in tmp_path.

Paths out, one test each: Save (Ctrl+S) and Save As (Ctrl+Shift+S) ask and write nothing silently; the copy
is audited and stays out of Open Recent; Export offers and writes the item's maps; a 3D screenshot is marked as
patient data (or refused) as chosen once; crash recovery never keeps a vault item; the maps computed in the
viewer are said to be session-only where they are named and are kept, not segmented again, by the vault
browser's Compute Tissue Maps.
"""

from __future__ import annotations

import json
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog

from engine.nifti.io import save_volume
from engine.nifti.volume import Volume
from tests.app.vault.helpers import PASSPHRASE, create_via_dialog, generated_entry, import_items, wait_task
from tests.engine.anatomy.phantoms import phantom, phantom_affine

render = pytest.mark.render


class SaveDialogs:
    """Stands in for QFileDialog.getSaveFileName: records what was proposed, answers with ``answer``."""

    def __init__(self) -> None:
        self.proposed: list[str] = []
        self.answer = ""

    def __call__(self, parent, title, proposed, *args, **kwargs):
        self.proposed.append(proposed)
        return self.answer, ""


@pytest.fixture
def save_dialogs(monkeypatch) -> SaveDialogs:
    dialogs = SaveDialogs()
    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(dialogs))
    return dialogs


def _scan_file(tmp_path: Path) -> Path:
    """A brain-like T1 phantom as a scanner would store it (LPS: left-right and front-back flipped), so that
    maps made on the viewer's RAS+ grid must be put back on the stored one."""
    flip = np.diag([-1.0, -1.0, 1.0, 1.0])
    stored_affine = phantom_affine() @ flip
    stored_affine[:3, 3] = phantom_affine()[:3, :3] @ (np.array([51, 59, 0]) * 1.0) + phantom_affine()[:3, 3]
    image = np.ascontiguousarray(phantom("t1w")[::-1, ::-1, :])
    (tmp_path / "patients").mkdir()
    return save_volume(Volume(image, stored_affine), tmp_path / "patients" / "Doe_Jane_t1.nii.gz")


def _open_scan_by_enter(qtbot, window, tmp_path):
    """Unlock a new vault, import the scan under the patient's name, select its row and press Enter."""
    controller = create_via_dialog(qtbot, window)
    import_items(
        qtbot, controller, [_scan_file(tmp_path)], rows=1, label="Doe Jane T1", patient={"name": "Doe^Jane"}
    )
    info = controller.listing.items[0]
    controller.browser.select_item(info.id)
    with qtbot.waitSignal(window.volume_opened, timeout=20_000) as opened:
        qtbot.keyClick(controller.browser.table, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: not controller.tasks.running, timeout=10_000)
    entry = opened.args[0]
    assert window.state.shown is entry and entry.vault_item.id == info.id
    return controller, entry


def _press(qtbot, window, key, modifiers) -> None:
    """A key pressed in the main window, after a click on it: under Xvfb no window manager gives the
    window back its activation when a dialog closes, and shortcuts fire only in the active window."""
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow, timeout=5_000)
    qtbot.keyClick(window, key, modifiers)


def _files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def _audit(vault_folder: Path, tmp_path: Path, capsys) -> str:
    """What ``volsynth vault audit`` prints for the vault."""
    from engine.cli import main

    secret = tmp_path / "passphrase.txt"
    secret.write_text(PASSPHRASE + "\n")
    capsys.readouterr()
    assert main(["vault", "audit", "--vault", str(vault_folder), "--passphrase-file", str(secret)]) == 0
    return capsys.readouterr().out


def test_ctrl_s_on_a_vault_scan_asks_and_a_confirmed_copy_is_audited_and_never_recent(
    qtbot, vault_window, tmp_path, save_dialogs, error_dialogs, capsys, screenshot
):
    window = vault_window
    controller, entry = _open_scan_by_enter(qtbot, window, tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()

    # Ctrl+S: a prompt, no save dialog, nothing written
    _press(qtbot, window, Qt.Key.Key_S, Qt.KeyboardModifier.ControlModifier)
    boundary = controller.boundary
    qtbot.waitUntil(lambda: boundary.prompt is not None and boundary.prompt.isVisible(), timeout=5_000)
    prompt = boundary.prompt
    assert "opened from the encrypted vault (a patient scan)" in prompt.text()
    assert "the image (" in prompt.informativeText() and "provenance sidecar" in prompt.informativeText()
    assert prompt.defaultButton() is prompt.export_button
    assert save_dialogs.proposed == []
    screenshot(prompt, "vault-save-a-copy-prompt")
    prompt.reject()  # Escape / Cancel
    qtbot.waitUntil(lambda: boundary.prompt is None, timeout=5_000)
    assert save_dialogs.proposed == [] and _files_under(outside) == [] and entry.saved_file is None

    # Ctrl+S again, Save a Copy Outside the Vault: the proposed name carries no patient detail
    save_dialogs.answer = str(outside / "copy.nii.gz")
    _press(qtbot, window, Qt.Key.Key_S, Qt.KeyboardModifier.ControlModifier)
    qtbot.waitUntil(lambda: boundary.prompt is not None and boundary.prompt.isVisible(), timeout=5_000)
    with qtbot.waitSignal(
        controller.task_ended, timeout=30_000, check_params_cb=lambda n, _: n == "copy"
    ) as done:
        boundary.prompt.copy_button.click()
    assert done.args[1] == "finished" and error_dialogs == []
    proposed = Path(save_dialogs.proposed[-1]).name
    assert proposed == f"scan-{entry.vault_item.id[:12]}.nii.gz" and "Doe" not in proposed
    assert _files_under(outside) == ["copy.json", "copy.nii.gz"]
    copy = nib.load(outside / "copy.nii.gz")
    assert np.array_equal(np.asarray(copy.dataobj, dtype=np.float32), entry.data)
    sidecar = json.loads((outside / "copy.json").read_text())
    assert sidecar["copied_from_vault_item"] == entry.vault_item.id[:12] and "Doe" not in json.dumps(sidecar)
    assert "recorded in the vault's audit trail" in window.statusBar().currentMessage()

    # nothing remembered: not saved (the next Ctrl+S asks again), not in Open Recent, no folder noted
    assert entry.saved_file is None and window.state.recent.paths() == []
    assert not window.files.recent_menu.isEnabled()
    window.settings.sync()
    assert str(outside) not in Path(window.settings.fileName()).read_text()

    # and `volsynth vault audit` lists the copy with its files
    vault_folder = controller.session.path
    controller.locking.lock()
    printed = _audit(vault_folder, tmp_path, capsys)
    line = next(line for line in printed.splitlines() if "copy_out" in line)
    assert entry.vault_item.id[:12] in line and str(outside / "copy.nii.gz") in line, line


def test_save_as_on_a_vault_item_offers_export_with_its_maps(
    qtbot, vault_window, tmp_path, save_dialogs, error_dialogs, capsys, screenshot
):
    window = vault_window
    controller, entry = _open_scan_by_enter(qtbot, window, tmp_path)
    item_id = entry.vault_item.id
    # maps kept with the item (as the vault browser's Compute Tissue Maps leaves them)
    rng = np.random.default_rng(4)
    shape = entry.vault_item.shape
    maps = {name: rng.random(shape).astype(np.float32) for name in ("GM", "WM", "CSF")}
    controller.session.vault.add_tissue_maps(
        item_id, maps, {"tissue_maps_source": "method", "method": "test"}
    )
    controller.listing.refresh()
    qtbot.waitUntil(lambda: controller.listing.item(item_id).tissue_maps != (), timeout=10_000)

    ctrl_shift = Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier
    _press(qtbot, window, Qt.Key.Key_S, ctrl_shift)  # Ctrl+Shift+S: Save As
    boundary = controller.boundary
    qtbot.waitUntil(lambda: boundary.prompt is not None and boundary.prompt.isVisible(), timeout=5_000)
    boundary.prompt.export_button.click()
    exporting = controller.exporting
    qtbot.waitUntil(
        lambda: exporting.export_dialog is not None and exporting.export_dialog.isVisible(), timeout=5_000
    )
    dialog = exporting.export_dialog
    assert dialog.tissue_box.isVisible() and dialog.tissue_box.isChecked()
    assert dialog.tissue_box.text() == "Include its 3 tissue maps (GM, WM, CSF)"
    assert save_dialogs.proposed == []
    screenshot(dialog, "vault-export-with-maps")
    out = tmp_path / "export"
    dialog.folder_edit.setText(str(out))
    with qtbot.waitSignal(controller.task_ended, timeout=30_000, check_params_cb=lambda n, _: n == "export"):
        qtbot.keyClick(dialog.folder_edit, Qt.Key.Key_Return)
    assert error_dialogs == []
    stem = f"scan-{item_id[:12]}"
    assert _files_under(out) == sorted(
        [f"{stem}.nii.gz", *(f"{stem}_label-{n}_probseg.nii.gz" for n in ("GM", "WM", "CSF"))]
    )
    for name, stored in maps.items():  # read back by nibabel, on the stored grid, as kept
        assert np.array_equal(
            np.asarray(nib.load(out / f"{stem}_label-{name}_probseg.nii.gz").dataobj), stored
        )
    # File > Open of the export brings the maps back with the scan
    with qtbot.waitSignal(window.volume_opened, timeout=20_000) as reopened:
        window.open_path(out / f"{stem}.nii.gz")
    assert set(reopened.args[0].tissue) == set(maps)

    vault_folder = controller.session.path
    controller.locking.lock()
    line = next(line for line in _audit(vault_folder, tmp_path, capsys).splitlines() if " export " in line)
    assert (
        '"tissue_maps": ["GM", "WM", "CSF"]' in line and str(out) in line and '"deidentified": true' in line
    )


@pytest.mark.slow
@render
def test_a_3d_screenshot_of_a_vault_item_is_marked_as_patient_data_or_refused(
    qtbot, window_3d, tmp_path, save_dialogs, error_dialogs, capsys
):
    from PySide6.QtGui import QImage

    from tests.app.vault.helpers import point_at_new_vault

    window = point_at_new_vault(window_3d, tmp_path / "vault")
    controller, entry = _open_scan_by_enter(qtbot, window, tmp_path)
    boundary = controller.boundary
    save_dialogs.answer = str(tmp_path / "shot.png")

    window.window_actions.screenshot.trigger()  # File > Save 3D Screenshot: asked once how
    qtbot.waitUntil(lambda: boundary.question is not None and boundary.question.isVisible(), timeout=5_000)
    with qtbot.waitSignal(
        controller.task_ended, timeout=30_000, check_params_cb=lambda n, _: n == "screenshot"
    ) as done:
        boundary.question.mark_button.click()
    assert done.args[1] == "finished" and error_dialogs == []
    assert Path(save_dialogs.proposed[-1]).name == f"scan-{entry.vault_item.id[:12]}-3d.png"
    shot = QImage(str(tmp_path / "shot.png"))
    assert not shot.isNull() and "PATIENT DATA" in shot.text("Description")
    banner = shot.pixelColor(3, 3)
    assert (banner.red(), banner.green(), banner.blue()) == (0xB0, 0x00, 0x20)  # the red band across the top
    assert controller.menu.screenshot_actions["mark"].isChecked()

    # Chosen once: the next screenshot asks nothing; switched to Refuse in the Vault menu, nothing is written
    controller.menu.screenshot_actions["refuse"].trigger()
    save_dialogs.answer = str(tmp_path / "refused.png")
    window.window_actions.screenshot.trigger()
    assert boundary.question is None and not (tmp_path / "refused.png").exists()
    assert "refused" in window.statusBar().currentMessage()

    vault_folder = controller.session.path
    controller.locking.lock()
    screenshots = [
        line for line in _audit(vault_folder, tmp_path, capsys).splitlines() if "screenshot" in line
    ]
    assert len(screenshots) == 1 and str(tmp_path / "shot.png") in screenshots[0]


def test_crash_recovery_never_keeps_and_no_drag_takes_a_volume_opened_from_the_vault(
    qtbot, vault_window, tmp_path
):
    window = vault_window
    controller = create_via_dialog(qtbot, window)
    made = generated_entry(window)  # a generated volume, kept for crash recovery, then stored in the vault
    qtbot.waitUntil(lambda: made.uid in window.recovery.store.kept(), timeout=10_000)
    controller.saving.save_entry(made)
    assert wait_task(qtbot, controller, "save") == "finished"
    qtbot.waitUntil(lambda: len(controller.listing.items) == 1, timeout=10_000)
    with qtbot.waitSignal(window.volume_opened, timeout=20_000) as opened:
        controller.opening.open_item(controller.listing.items[0].id)
    entry = opened.args[0]
    assert entry.synthetic and entry.vault_item is not None
    # The recovery store holds the generated volume only; the decrypted copy from the vault is never written.
    qtbot.waitUntil(lambda: not window.runner.running("recovery-keep"), timeout=10_000)
    assert window.recovery.store.kept() == [made.uid]
    images = [p for p in window.recovery.store.folder.rglob("*.nii.gz") if "_label-" not in p.name]
    assert len(images) == 1
    # Nor can it be dragged out to a file manager: neither list it is shown in starts a drag.
    assert not window.session_panel.list.dragEnabled() and not controller.browser.table.dragEnabled()


@pytest.mark.slow
def test_viewer_maps_of_a_vault_scan_are_said_session_only_and_kept_by_the_browser(
    qtbot, vault_window, tmp_path, error_dialogs, monkeypatch
):
    window = vault_window
    controller, entry = _open_scan_by_enter(qtbot, window, tmp_path)
    computer = window.tissue_maps
    ctrl_shift = Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier
    _press(qtbot, window, Qt.Key.Key_T, ctrl_shift)  # Ctrl+Shift+T: Compute Tissue Maps in the viewer
    qtbot.waitUntil(lambda: entry.tissue != {} and computer.job is None, timeout=60_000)
    label = computer.source_label.text()
    assert (
        label.startswith("Maps segmented: VolSynth EM")
        and "this session only, not kept in the vault" in label
    )
    session_maps = {name: array.copy() for name, array in entry.tissue.items()}

    # The vault browser's Compute Tissue Maps keeps those maps (no second segmentation)
    from engine.anatomy import segment as segmenting

    def refuse(*args, **kwargs):
        raise AssertionError("segmented again")

    monkeypatch.setattr(segmenting, "segment", refuse)
    with qtbot.waitSignal(
        controller.task_ended, timeout=60_000, check_params_cb=lambda n, _: n == "tissue"
    ) as done:
        controller.item_actions.compute_tissue_maps(entry.vault_item.id)
    assert done.args[1] == "finished" and error_dialogs == []
    qtbot.waitUntil(lambda: "not kept in the vault" not in computer.source_label.text(), timeout=10_000)
    stored = controller.session.vault.open_item(entry.vault_item.id, with_tissue=True)
    assert set(stored.tissue) == set(session_maps)
    # stored on the scan's own (LPS) grid: the viewer's RAS+ maps flipped back in x and y
    for name, array in session_maps.items():
        assert np.array_equal(stored.tissue[name], array[::-1, ::-1, :]), name
