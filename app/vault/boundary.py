"""The vault's boundary in the app: a volume decrypted from the vault leaves it only through the vault's Export
or an explicit copy that says what leaves, asks, and is written to the audit trail.

Every path by which a shown item's pixels could reach a plain file asks here (``VaultBoundary``), whatever the
entry is (a scan or a synthetic item; the session entry's ``vault_item`` says where it came from):

- File > Save, Save As and the session list's Save...: ``save`` asks first (``LeaveVaultPrompt``). Export from
  the Vault (the default) opens the Export dialog for the item; Save a Copy Outside the Vault asks where,
  proposing a name that carries no patient details (``scan-<id>.nii.gz``, as Export names files), records the
  copy (``copy_out``: the files, the maps) before writing it, and leaves Open Recent, the remembered folders
  and the entry's "saved" state as they were: the next Save asks again.
- File > Save 3D Screenshot: ``screenshot``, by the choice made once (Vault > Screenshots of Vault Items):
  marked as patient data (a banner across the picture, a PNG text field, an audit entry ``screenshot``) or
  refused.

Open Recent never holds an item (it has no path, and ``VolumeFiles`` records no vault entry), and crash
recovery never keeps one (``app.recovery``). docs/vault.md lists every way out.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from PySide6.QtCore import QBuffer, QIODevice, Qt
from PySide6.QtGui import QColor, QFont, QImage, QPainter
from PySide6.QtWidgets import QFileDialog, QMessageBox, QPushButton, QWidget

from app.core import vault_items as model
from app.core.volumes import VolumeEntry
from app.vault.exporting import VaultExport
from app.vault.privacy import last_dir
from app.vault.session import VaultSession
from app.vault.tasks import VaultTask, VaultTasks

SCREENSHOTS_KEY = "vault/screenshots"
SCREENSHOT_MARK = "mark"  # written with a banner and a text field saying it is patient data, and audited
SCREENSHOT_REFUSE = "refuse"  # not written
#: The banner across a screenshot of a vault item, and its PNG text field.
PATIENT_DATA_TEXT = "PATIENT DATA from the VolSynth vault \u2014 do not share outside your institution"


def copy_stem(entry: VolumeEntry) -> str:
    """The file name a copy is offered under: kind and id prefix, as the vault's Export names files (an item's
    label can name the patient)."""
    info = entry.vault_item
    return f"{info.kind}-{info.id[:12]}" if info is not None else "volume"


def what_leaves(entry: VolumeEntry) -> str:
    """What a copy of the shown entry writes, for the prompt: the image, its maps (saying which are in this
    session only) and the sidecar."""
    shape = " x ".join(str(s) for s in entry.shape)
    lines = [f"\u2022 the image ({shape} voxels, as shown: reoriented to RAS, 32-bit float)"]
    if entry.tissue:
        session_only = model.session_only_maps(entry)
        maps = f"\u2022 {len(entry.tissue)} tissue maps ({', '.join(entry.tissue_names)})"
        if session_only:
            maps += f"; {', '.join(session_only)} computed in this session, not kept in the vault"
        lines.append(maps)
    lines.append("\u2022 a provenance sidecar (.json) naming how it was made, with no patient details")
    return "\n".join(lines)


class LeaveVaultPrompt(QMessageBox):
    """Asked before a vault item is written outside the vault: Export from the Vault (default), Save a Copy
    Outside the Vault, or Cancel. ``choice`` is ``"export"``, ``"copy"`` or ``""`` once answered."""

    def __init__(self, entry: VolumeEntry, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        info = entry.vault_item
        assert info is not None
        self.setObjectName("leaveVaultPrompt")
        self.setIcon(QMessageBox.Icon.Warning)
        self.setWindowTitle("This volume is in the vault")
        what = "a patient scan" if info.kind == "scan" else "a synthetic volume"
        self.setText(
            f"\u201c{entry.name}\u201d was opened from the encrypted vault ({what}). It leaves the vault only "
            "by an export or a copy recorded in the vault's audit trail."
        )
        stored_maps = f" with its {len(info.tissue_maps)} tissue maps" if info.tissue_maps else ""
        self.setInformativeText(
            f"Export from the Vault writes the stored item{stored_maps}, de-identified if you choose.\n\n"
            "Save a Copy Outside the Vault writes, unencrypted, into a folder you choose:\n"
            f"{what_leaves(entry)}\n\nEither is recorded in the audit trail with where it went."
        )
        self.export_button = self.addButton("Export from the Vault...", QMessageBox.ButtonRole.AcceptRole)
        self.copy_button: QPushButton = self.addButton(
            "Save a Copy Outside the Vault...", QMessageBox.ButtonRole.ActionRole
        )
        self.addButton(QMessageBox.StandardButton.Cancel)
        self.setDefaultButton(self.export_button)
        self.setEscapeButton(QMessageBox.StandardButton.Cancel)

    @property
    def choice(self) -> str:
        clicked = self.clickedButton()
        return "export" if clicked is self.export_button else "copy" if clicked is self.copy_button else ""


class ScreenshotChoice(QMessageBox):
    """Asked once, at the first screenshot of a vault item: mark such screenshots as patient data, or refuse
    them. Remembered (``vault/screenshots``); Vault > Screenshots of Vault Items changes it."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("vaultScreenshotChoice")
        self.setIcon(QMessageBox.Icon.Question)
        self.setWindowTitle("Screenshots of vault items")
        self.setText(
            "The 3D view shows a volume from the vault. How should screenshots of vault items be taken?"
        )
        self.setInformativeText(
            "Mark as patient data: the picture gets a banner and a text field saying it is patient data from the "
            "vault, and each one is recorded in the audit trail.\n\nRefuse: no screenshot of a vault item is "
            "written.\n\nThis is asked once; Vault > Screenshots of Vault Items changes it."
        )
        self.mark_button = self.addButton("Mark as Patient Data", QMessageBox.ButtonRole.AcceptRole)
        self.refuse_button = self.addButton("Refuse Them", QMessageBox.ButtonRole.RejectRole)
        self.addButton(QMessageBox.StandardButton.Cancel)
        self.setDefaultButton(self.mark_button)
        self.setEscapeButton(QMessageBox.StandardButton.Cancel)

    @property
    def choice(self) -> str:
        clicked = self.clickedButton()
        if clicked is self.mark_button:
            return SCREENSHOT_MARK
        return SCREENSHOT_REFUSE if clicked is self.refuse_button else ""


def marked_png(image: QImage) -> bytes:
    """The screenshot with a red banner across its top saying it is patient data, and the same words in the
    PNG's ``Description`` and ``Warning`` text fields, as PNG bytes."""
    image = image.convertToFormat(QImage.Format.Format_RGB32)
    height = max(22, image.height() // 24)
    painter = QPainter(image)
    painter.fillRect(0, 0, image.width(), height, QColor("#b00020"))
    font = QFont()
    font.setPixelSize(max(11, int(height * 0.6)))
    font.setBold(True)
    painter.setFont(font)
    painter.setPen(QColor("white"))
    painter.drawText(0, 0, image.width(), height, int(Qt.AlignmentFlag.AlignCenter), PATIENT_DATA_TEXT)
    painter.end()
    image.setText("Description", PATIENT_DATA_TEXT)
    image.setText("Warning", "Patient data: contains pixels of a scan kept in an encrypted vault")
    buffer = QBuffer()
    buffer.open(QIODevice.OpenModeFlag.WriteOnly)
    image.save(buffer, "PNG")  # type: ignore[call-overload]  # the stubs want bytes; the binding refuses them
    return bytes(buffer.data().data())


class VaultBoundary:
    """The ways a shown vault item could leave the vault (see the module's docstring).

    Args:
        session: The open vault (``VaultSession``).
        tasks: Records and writes a copy in the background (``VaultTasks``).
        exporting: Export from the Vault, the default way out (``VaultExport``).
        settings: The app's QSettings (the screenshot choice, the folder the export dialog starts in).
        show_status: ``(text, timeout_ms)``, the window's status line.
        show_error: ``(title, message)``, the app's error dialog.
        parent: Parent of the prompts and file dialogs (window-modal).
    """

    def __init__(
        self,
        session: VaultSession,
        tasks: VaultTasks,
        exporting: VaultExport,
        settings: Any,
        show_status: Callable[..., None],
        show_error: Callable[[str, str], None],
        parent: QWidget | None,
        *,
        changed: Callable[[], None],
    ) -> None:
        self._session = session
        self._tasks = tasks
        self._exporting = exporting
        self._changed = changed
        self._settings = settings
        self._show_status = show_status
        self._show_error = show_error
        self._parent = parent
        self.prompt: LeaveVaultPrompt | None = None  # while asked (tests answer it)
        self.question: ScreenshotChoice | None = None  # the screenshot choice, while asked

    @staticmethod
    def holds(entry: VolumeEntry | None) -> bool:
        """Whether ``entry`` came from the vault (so its pixels may leave only through here)."""
        return entry is not None and entry.vault_item is not None

    # -- Save, Save As -------------------------------------------------------------------------------

    def save(self, entry: VolumeEntry) -> None:
        """Save or Save As on a vault item: ask (``LeaveVaultPrompt``), then Export or copy as chosen."""
        prompt = LeaveVaultPrompt(entry, self._parent)
        prompt.finished.connect(partial(self._on_prompt_finished, entry, prompt))
        self.prompt = prompt
        prompt.open()

    def _on_prompt_finished(self, entry: VolumeEntry, prompt: LeaveVaultPrompt, _result: int) -> None:
        self.prompt = None
        choice = prompt.choice
        prompt.deleteLater()
        info = entry.vault_item
        if info is None or not self._session.is_unlocked:
            return  # locked meanwhile: the entry has left the session
        if choice == "export":
            self._exporting.export_dialog_for(info.id, session_only=model.session_only_maps(entry))
        elif choice == "copy":
            self._ask_copy_path(entry)

    def _ask_copy_path(self, entry: VolumeEntry) -> None:
        start = Path(last_dir(self._settings, "vault/last_export_dir"))
        path, _ = QFileDialog.getSaveFileName(
            self._parent,
            "Save a copy outside the vault",
            str(start / f"{copy_stem(entry)}.nii.gz"),
            "NIfTI volumes (*.nii *.nii.gz)",
        )
        if path:
            self.save_copy(entry, path)

    def save_copy(self, entry: VolumeEntry, path: str | Path) -> None:
        """Write the shown item outside the vault at ``path`` (image, its maps, a sidecar; all or none), the
        copy recorded in the audit trail before the files are written. Nothing is remembered of the path."""
        info = entry.vault_item
        if info is None:
            raise ValueError(f"{entry.name} is not from the vault")
        path = Path(path).expanduser()
        if not path.name.endswith((".nii", ".nii.gz")):
            path = path.with_name(path.name + ".nii.gz")
        self._tasks.start(
            "copy",
            model.save_copy_outside,
            self._session.vault,
            info.id,
            model.copy_volume(entry),
            path,
            finished=partial(self._on_copy_saved, entry),
            failed=self._on_copy_failed,
            progress="Saving a copy outside the vault",
            text="Recording the copy in the audit trail...",
            cancellable=False,
        )

    def _on_copy_saved(self, entry: VolumeEntry, path: Path) -> None:
        maps = f" with {len(entry.tissue)} tissue maps" if entry.tissue else ""
        self._show_status(
            f"Wrote a copy of \u201c{entry.name}\u201d{maps} outside the vault to {path} "
            "(recorded in the vault's audit trail)",
            10000,
        )

    def _on_copy_failed(self, _task: VaultTask, message: str) -> None:
        self._show_error("Cannot save a copy outside the vault", message)

    # -- screenshots ---------------------------------------------------------------------------------

    def set_screenshot_choice(self, choice: str) -> None:
        if choice not in (SCREENSHOT_MARK, SCREENSHOT_REFUSE):
            raise ValueError(f"unknown screenshot choice {choice!r}")
        self._settings.setValue(SCREENSHOTS_KEY, choice)
        self._changed()  # the Vault menu shows the choice

    def screenshot_setting(self) -> str:
        """``mark`` or ``refuse`` as chosen, ``""`` while never chosen (then the first screenshot asks)."""
        choice = self._settings.value(SCREENSHOTS_KEY, "", type=str)
        return choice if choice in (SCREENSHOT_MARK, SCREENSHOT_REFUSE) else ""

    def screenshot(self, entry: VolumeEntry, grab: Callable[[], QImage]) -> None:
        """File > Save 3D Screenshot while a vault item is shown: by the choice made once (asked now if never
        made), refused, or asked where and written marked as patient data (``marked_png``), with an audit entry
        first. ``grab`` renders the picture (GUI thread)."""
        choice = self.screenshot_setting()
        if choice:
            self._screenshot_as(choice, entry, grab)
            return
        question = ScreenshotChoice(self._parent)
        question.finished.connect(partial(self._on_question_finished, entry, grab, question))
        self.question = question
        question.open()

    def _on_question_finished(
        self, entry: VolumeEntry, grab: Callable[[], QImage], question: ScreenshotChoice, _result: int
    ) -> None:
        self.question = None
        choice = question.choice
        question.deleteLater()
        if choice:
            self.set_screenshot_choice(choice)
            self._screenshot_as(choice, entry, grab)

    def _screenshot_as(self, choice: str, entry: VolumeEntry, grab: Callable[[], QImage]) -> None:
        info = entry.vault_item
        if info is None or not self._session.is_unlocked:
            return  # locked meanwhile: the entry has left the session
        if choice == SCREENSHOT_REFUSE:
            self._show_status(
                "Screenshots of vault items are refused (Vault > Screenshots of Vault Items changes it)",
                10000,
            )
            return
        start = Path(last_dir(self._settings, "vault/last_export_dir"))
        path, _ = QFileDialog.getSaveFileName(
            self._parent,
            "Save 3D screenshot of patient data",
            str(start / f"{copy_stem(entry)}-3d.png"),
            "PNG images (*.png)",
        )
        if not path:
            return
        try:
            png = marked_png(grab())
        except (RuntimeError, OSError, ValueError) as exc:
            self._show_error("Cannot save screenshot", str(exc))
            return
        self._tasks.start(
            "screenshot",
            model.save_screenshot_outside,
            self._session.vault,
            info.id,
            png,
            Path(path),
            finished=self._on_screenshot_saved,
            failed=self._on_screenshot_failed,
            cancellable=False,
        )

    def _on_screenshot_saved(self, path: Path) -> None:
        self._show_status(f"Saved {path}, marked as patient data (recorded in the vault's audit trail)", 8000)

    def _on_screenshot_failed(self, _task: VaultTask, message: str) -> None:
        self._show_error("Cannot save screenshot", message)
