"""What the vault's app tests share: a passphrase, fast Argon2 parameters, the vault installed on the app's
services (``VaultApp``), and the steps a user takes (create, import, drop, open, right-click) driven through the
vault controller's pieces, each waiting for its background task to end."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import nibabel as nib
import numpy as np
from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QAction, QDropEvent

from engine.vault import KdfParams

PASSPHRASE = "correct horse battery staple"
#: Test-only Argon2 parameters (1 MiB, t=1, p=1); the default (64 MiB, t=3, p=4) takes ~0.3 s per unlock.
FAST_KDF = KdfParams(memory_kib=1024, iterations=1, lanes=1)


@dataclasses.dataclass
class VaultApp:
    """The vault on the app's services: what ``install_vault`` made (``controller``, with its browser, menu
    and padlock), the Session panel whose list it adds to, and the file commands (``files``)."""

    services: object
    controller: object
    session_panel: object
    files: object

    @property
    def state(self):
        return self.services.state

    @property
    def host(self):
        """The window the app's services live in (the parent of the vault's dialogs)."""
        return self.services.parent

    @property
    def settings(self):
        return self.services.settings

    @property
    def volume_opened(self):
        """The app's signal for a volume that came into the session (from a file or the vault)."""
        return self.services.volume_opened

    @property
    def dock(self):
        from PySide6.QtWidgets import QDockWidget

        return self.host.findChild(QDockWidget, "vaultDock")

    def status(self) -> str:
        """What the status line says now."""
        return self.host.statusBar().currentMessage()

    def settings_text(self) -> str:
        """The settings file as it is on disk."""
        self.settings.sync()
        return Path(self.settings.fileName()).read_text()


def use_new_vault(controller, folder: Path):
    controller.session.kdf = FAST_KDF
    controller.locking.set_vault_path(folder)
    return controller


def point_at_new_vault(window, folder: Path):
    use_new_vault(window.vault_controller, folder)
    return window


def wait_task(qtbot, controller, name: str, timeout: int = 30_000) -> str:
    """Wait for the named background task to end; its outcome (finished, failed, cancelled)."""
    with qtbot.waitSignal(
        controller.task_ended, timeout=timeout, check_params_cb=lambda task, outcome: task == name
    ) as blocker:
        pass
    return blocker.args[1]


def create_via_dialog(qtbot, controller, dialog=None):
    """Create the vault as a user does: the passphrase twice in the create dialog (``dialog``, already open from
    the Vault menu, or the one the padlock opens), then OK."""
    dialog = dialog or controller.locking.request_unlock()
    assert dialog is not None and dialog.mode == "create"
    dialog.passphrase_edit.setText(PASSPHRASE)
    dialog.confirm_edit.setText(PASSPHRASE)
    dialog.ok_button.click()
    assert wait_task(qtbot, controller, "create") == "finished"
    qtbot.waitUntil(lambda: controller.session.is_unlocked and not controller.tasks.running, timeout=10_000)
    return controller


def unlock_via_dialog(qtbot, controller, passphrase: str = PASSPHRASE) -> str:
    """Type the passphrase in the unlock dialog and press OK; the unlock's outcome."""
    dialog = controller.locking.request_unlock()
    assert dialog is not None and dialog.mode == "unlock"
    dialog.passphrase_edit.setText(passphrase)
    dialog.ok_button.click()
    return wait_task(qtbot, controller, "unlock")


def import_items(qtbot, controller, paths, rows: int, **details):
    controller.importing.import_nifti([Path(p) for p in paths], **details)
    assert wait_task(qtbot, controller, "import") == "finished"
    qtbot.waitUntil(lambda: controller.browser.table.rowCount() == rows, timeout=10_000)


def open_item(qtbot, controller, item_id: str):
    """Open an item into the session; the ``VolumeEntry`` it became."""
    with qtbot.waitSignal(controller.volume_opened, timeout=20_000) as blocker:
        controller.opening.open_item(item_id)
    qtbot.waitUntil(lambda: not controller.tasks.running, timeout=10_000)
    return blocker.args[0]


def save_to_vault(qtbot, controller, rows: int):
    """Vault > Save Shown Volume to Vault; waits for the browser to list ``rows`` items."""
    controller.menu.save_action.trigger()
    assert wait_task(qtbot, controller, "save") == "finished"
    qtbot.waitUntil(lambda: controller.browser.table.rowCount() == rows, timeout=10_000)


def generated_entry(state, seed: int = 11, tissue=None, space=None):
    """A generated volume in the session (as the Generate button leaves it), without running a model; with
    ``tissue`` maps and a template ``space`` as a model that makes paired maps leaves it."""
    from app.core.volumes import VolumeEntry

    data = np.random.default_rng(seed).random((10, 12, 8)).astype(np.float32)
    provenance = {"model": {"id": "tiny-latent"}, "seed": seed, "synthetic": True}
    if space is not None:
        provenance["space"] = space
    entry = VolumeEntry(
        name=f"tiny-latent seed {seed}",
        data=data,
        affine=np.eye(4),
        kind="generated",
        provenance=provenance,
        synthetic=True,
        tissue=tissue,
        space=space,
    )
    state.add_volume(entry)
    return entry


def generated_file(tmp_path: Path, name: str = "generated.nii.gz", seed: int = 3) -> Path:
    """A volume exactly as VolSynth writes it: SYNTHETIC header fields and a provenance sidecar."""
    from engine.nifti.io import save_volume
    from engine.nifti.volume import Volume

    data = np.random.default_rng(seed).random((8, 9, 7))
    provenance = {"model": {"id": "tiny-latent"}, "seed": seed, "synthetic": True}
    return save_volume(Volume(data, np.eye(4), provenance=provenance, synthetic=True), tmp_path / name)


def nifti_with_descrip(tmp_path: Path, source: Path, descrip: bytes) -> Path:
    """A real NIfTI file with identifying free text in its header (as scanners and tools leave them)."""
    img = nib.load(str(source))
    out = nib.Nifti1Image(np.asanyarray(img.dataobj), img.affine, img.header.copy())
    out.header["descrip"] = descrip
    out.header["aux_file"] = b"Doe-Jane-aux"
    path = tmp_path / "doe_jane_t1.nii"
    nib.save(out, str(path))
    return path


def drop(widget, paths, at: QPointF | None = None) -> None:
    """Drop ``paths`` on ``widget`` as a file manager does (the mime data lives until the drop is handled)."""
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(p)) for p in paths])
    event = QDropEvent(
        at or QPointF(40, 40),
        Qt.DropAction.CopyAction,
        mime,
        Qt.MouseButton.LeftButton,
        Qt.KeyboardModifier.NoModifier,
    )
    widget.dropEvent(event)


def right_click_row(qtbot, browser, item_id: str) -> None:
    """What a right click on a row sends: a context-menu event at that row."""
    from PySide6.QtGui import QContextMenuEvent
    from PySide6.QtWidgets import QApplication

    browser.select_item(item_id)
    row = browser.table.currentRow()
    rect = browser.table.visualItemRect(browser.table.item(row, 0))
    viewport = browser.table.viewport()
    QApplication.sendEvent(
        viewport,
        QContextMenuEvent(QContextMenuEvent.Reason.Mouse, rect.center(), viewport.mapToGlobal(rect.center())),
    )
    qtbot.waitUntil(lambda: browser.table_menu is not None and browser.table_menu.isVisible(), timeout=5_000)


def mnemonics(actions) -> list[str]:
    """The letters after ``&`` in the actions' texts (Alt+letter), in order."""
    return [a.text().split("&")[1][0].lower() for a in actions if "&" in a.text()]


def menu_action(menu, text: str):
    return next(a for a in menu.actions() if a.text().replace("&", "") == text)


def install_viewer(services):
    """The slice viewer with its tool bars (the tissue overlay's, Compute Tissue Maps) on the app's services,
    as the main window builds them (no 3D view); ``(viewer, bars)``."""
    from app.viewer.viewer_area import ViewerArea
    from app.window.menus import build_viewer_bars

    viewer = ViewerArea(services.state)
    host = services.parent
    host.setCentralWidget(viewer)
    reset_camera = QAction("Reset 3D Camera", host)
    services.menus.view.addAction(reset_camera)
    return viewer, build_viewer_bars(viewer, services, reset_camera)


def press(qtbot, window, key, modifiers=Qt.KeyboardModifier.NoModifier) -> None:
    """A key pressed in ``window``, after a click on it: under Xvfb no window manager gives the window back its
    activation when a dialog closes, and shortcuts fire only in the active window."""
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow, timeout=5_000)
    qtbot.keyClick(window, key, modifiers)


class SaveDialogs:
    """Stands in for QFileDialog.getSaveFileName: records what was proposed, answers with ``answer``."""

    def __init__(self) -> None:
        self.proposed: list[str] = []
        self.answer = ""

    def __call__(self, parent, title, proposed, *args, **kwargs):
        self.proposed.append(proposed)
        return self.answer, ""


def scan_file(tmp_path: Path) -> Path:
    """A brain-like T1 phantom as a scanner would store it (LPS: left-right and front-back flipped), so that
    maps made on the viewer's RAS+ grid must be put back on the stored one."""
    from engine.nifti.io import save_volume
    from engine.nifti.volume import Volume
    from tests.engine.anatomy.phantoms import phantom, phantom_affine

    flip = np.diag([-1.0, -1.0, 1.0, 1.0])
    stored_affine = phantom_affine() @ flip
    stored_affine[:3, 3] = phantom_affine()[:3, :3] @ (np.array([51, 59, 0]) * 1.0) + phantom_affine()[:3, 3]
    image = np.ascontiguousarray(phantom("t1w")[::-1, ::-1, :])
    (tmp_path / "patients").mkdir()
    return save_volume(Volume(image, stored_affine), tmp_path / "patients" / "Doe_Jane_t1.nii.gz")


def patient_file(tmp_path: Path, source: Path) -> Path:
    """A copy of the scan ``source`` under a patient's name, in a folder named for patients."""
    import shutil

    folder = tmp_path / "patients"
    folder.mkdir(exist_ok=True)
    return Path(shutil.copy(source, folder / f"Doe_Jane_t1{''.join(source.suffixes)}"))


def open_scan_by_enter(qtbot, controller, state, scan: Path):
    """Unlock a new vault, import ``scan`` under the patient's name, select its row and press Enter; the
    opened ``VolumeEntry``."""
    create_via_dialog(qtbot, controller)
    import_items(qtbot, controller, [scan], rows=1, label="Doe Jane T1", patient={"name": "Doe^Jane"})
    info = controller.listing.items[0]
    controller.browser.select_item(info.id)
    with qtbot.waitSignal(controller.volume_opened, timeout=20_000) as opened:
        qtbot.keyClick(controller.browser.table, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: not controller.tasks.running, timeout=10_000)
    entry = opened.args[0]
    assert state.shown is entry and entry.vault_item.id == info.id
    return entry


def files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def audit(vault_folder: Path, tmp_path: Path, capsys) -> str:
    """What ``volsynth vault audit`` prints for the vault."""
    from engine.cli import main

    secret = tmp_path / "passphrase.txt"
    secret.write_text(PASSPHRASE + "\n")
    capsys.readouterr()
    assert main(["vault", "audit", "--vault", str(vault_folder), "--passphrase-file", str(secret)]) == 0
    return capsys.readouterr().out
