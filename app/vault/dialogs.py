"""Dialogs of the vault: create/unlock, change passphrase, import details, export options, progress.

Every dialog here is opened with ``open()`` (window-modal, never a nested event loop) and reports through
signals; the controller does the work in the background and closes the dialog when it succeeded, or shows
the engine's message and leaves the dialog open to try again.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from PySide6.QtCore import QPointF, QRectF, QSize, Qt, Signal
from PySide6.QtGui import QColor, QIcon, QPainter, QPainterPath, QPen, QPixmap
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QProgressDialog,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

MIN_PASSPHRASE = 8  # the engine's minimum (engine.vault.crypto); checked here too for an immediate hint
ERROR_COLOUR = "#e06c75"
MUTED_COLOUR = "#8b93a1"
LOCKED_COLOUR = "#e5c07b"
UNLOCKED_COLOUR = "#98c379"

_DIALOG_QSS = f"""
QLineEdit {{ background: #14171b; border: 1px solid #363c46; border-radius: 4px; padding: 5px 7px; }}
QLineEdit:focus {{ border-color: #3d8fd6; }}
QLabel#dialogTitle {{ font-size: 13pt; font-weight: bold; color: #dfe3ea; }}
QLabel#dialogText {{ color: #aab2bf; }}
QLabel#dialogPath {{ color: {MUTED_COLOUR}; }}
QLabel#dialogError {{ color: {ERROR_COLOUR}; }}
"""


def lock_pixmap(size: int, colour: str = LOCKED_COLOUR, unlocked: bool = False) -> QPixmap:
    """A padlock drawn with QPainter (no icon files, no emoji font needed), closed or open."""
    ratio = 2.0
    pixmap = QPixmap(int(size * ratio), int(size * ratio))
    pixmap.setDevicePixelRatio(ratio)
    pixmap.fill(Qt.GlobalColor.transparent)
    painter = QPainter(pixmap)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    s = float(size)
    body = QRectF(s * 0.18, s * 0.44, s * 0.64, s * 0.48)
    pen = QPen(QColor(colour), max(1.4, s * 0.1))
    pen.setCapStyle(Qt.PenCapStyle.RoundCap)
    painter.setPen(pen)
    painter.setBrush(Qt.BrushStyle.NoBrush)
    shackle = QPainterPath()
    left, right, top = s * 0.32, s * 0.68, s * 0.1
    shackle.moveTo(QPointF(left, body.top()))
    shackle.lineTo(QPointF(left, s * 0.3))
    shackle.arcTo(QRectF(left, top, right - left, (right - left)), 180, -180)
    shackle.lineTo(QPointF(right, s * (0.3 if unlocked else 0.44)))
    if unlocked:  # the shackle lifted and swung open
        shackle.translate(s * 0.14, -s * 0.06)
    painter.drawPath(shackle)
    painter.setPen(Qt.PenStyle.NoPen)
    painter.setBrush(QColor(colour))
    painter.drawRoundedRect(body, s * 0.08, s * 0.08)
    painter.setBrush(QColor("#1b1e23"))
    painter.drawEllipse(QPointF(s * 0.5, body.center().y() - s * 0.03), s * 0.06, s * 0.06)
    painter.drawRect(QRectF(s * 0.47, body.center().y() - s * 0.02, s * 0.06, s * 0.13))
    painter.end()
    return pixmap


def lock_icon(colour: str = LOCKED_COLOUR, unlocked: bool = False) -> QIcon:
    icon = QIcon()
    for size in (16, 24, 32):
        icon.addPixmap(lock_pixmap(size, colour, unlocked))
    return icon


def _header(title: str, text: str, unlocked: bool = False) -> QWidget:
    header = QWidget()
    row = QHBoxLayout(header)
    row.setContentsMargins(0, 0, 0, 6)
    icon = QLabel()
    icon.setPixmap(lock_pixmap(40, UNLOCKED_COLOUR if unlocked else LOCKED_COLOUR, unlocked))
    icon.setFixedSize(QSize(48, 48))
    icon.setAlignment(Qt.AlignmentFlag.AlignCenter)
    column = QVBoxLayout()
    column.setSpacing(4)
    title_label = QLabel(title)
    title_label.setObjectName("dialogTitle")
    text_label = QLabel(text)
    text_label.setObjectName("dialogText")
    text_label.setWordWrap(True)
    column.addWidget(title_label)
    column.addWidget(text_label)
    row.addWidget(icon, 0, Qt.AlignmentFlag.AlignTop)
    row.addSpacing(6)
    row.addLayout(column, 1)
    return header


def _password_edit(placeholder: str) -> QLineEdit:
    edit = QLineEdit()
    edit.setEchoMode(QLineEdit.EchoMode.Password)
    edit.setPlaceholderText(placeholder)
    edit.setMinimumWidth(300)
    return edit


def _error_label() -> QLabel:
    label = QLabel("")
    label.setObjectName("dialogError")
    label.setWordWrap(True)
    label.hide()
    return label


def _lay_out(
    dialog: QDialog,
    header: QWidget,
    form: QFormLayout,
    error_label: QLabel | None = None,
    *,
    ok_text: str,
    on_ok,
    min_width: int,
) -> tuple[QDialogButtonBox, QPushButton]:
    """The vault dialogs' common frame: header, form, optional error line, Cancel + a primary button."""
    buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Cancel)
    ok_button = buttons.addButton(ok_text, QDialogButtonBox.ButtonRole.AcceptRole)
    ok_button.setObjectName("primary")
    # Enter means the primary button, always: no other button may become the default by having had the
    # focus (Qt's autoDefault), which made Enter cancel an unlock after a busy spell moved the focus there.
    buttons.button(QDialogButtonBox.StandardButton.Cancel).setAutoDefault(False)
    buttons.accepted.connect(on_ok)
    buttons.rejected.connect(dialog.reject)
    layout = QVBoxLayout(dialog)
    layout.setContentsMargins(18, 16, 18, 14)
    layout.setSpacing(10)
    layout.addWidget(header)
    layout.addLayout(form)
    if error_label is not None:
        layout.addWidget(error_label)
    layout.addWidget(buttons)
    for button in dialog.findChildren(QPushButton):
        if button is not ok_button:
            button.setAutoDefault(False)
    ok_button.setDefault(True)  # now that it is in the dialog (set before, Qt keeps no default)
    dialog.setMinimumWidth(min_width)
    return buttons, ok_button


class VaultUnlockDialog(QDialog):
    """Asks for the passphrase of the vault (``mode="unlock"``) or a new one twice (``mode="create"``).

    ``submitted(passphrase)`` is emitted once what was typed is acceptable; the dialog then stays open,
    busy, until the controller calls ``accept()`` (success) or ``retry()`` (wrong passphrase).
    """

    submitted = Signal(str)

    def __init__(self, mode: str, path: str | Path, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        if mode not in ("unlock", "create", "repair"):
            raise ValueError("mode must be 'unlock', 'create' or 'repair'")
        self.mode = mode
        self.busy = False
        self.setObjectName("vaultUnlockDialog")
        self.setWindowTitle({"create": "Create Vault", "repair": "Repair Vault"}.get(mode, "Unlock Vault"))
        self.setStyleSheet(_DIALOG_QSS)
        if mode == "create":
            header = _header(
                "Create an encrypted vault",
                "Patient scans and generated volumes are encrypted with a key that only this "
                "passphrase opens. Choose a long one: it cannot be recovered if it is lost.",
            )
        elif mode == "repair":
            header = _header(
                "Repair the vault",
                "Enter the vault's passphrase to see what a repair would do: which items it puts back and "
                "what it accepts. Nothing changes until you confirm, and nothing is deleted.",
            )
        else:
            header = _header(
                "Unlock the vault", "Enter the vault's passphrase to browse, open and import items."
            )
        path_label = QLabel(str(path))
        path_label.setObjectName("dialogPath")
        path_label.setToolTip(str(path))
        path_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.passphrase_edit = _password_edit(
            f"At least {MIN_PASSPHRASE} characters" if mode == "create" else "Passphrase"
        )
        self.confirm_edit = _password_edit("Type it again")
        self.error_label = _error_label()
        form = QFormLayout()
        form.setLabelAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        form.addRow("Vault", path_label)
        form.addRow("Passphrase", self.passphrase_edit)
        if mode == "create":
            form.addRow("Confirm", self.confirm_edit)
        else:
            self.confirm_edit.hide()
        self.buttons, self.ok_button = _lay_out(
            self,
            header,
            form,
            self.error_label,
            ok_text=self._ok_text(),
            on_ok=self._on_buttons_accepted,
            min_width=500,
        )

    def _on_buttons_accepted(self) -> None:
        text = self.passphrase_edit.text()
        if not text:
            self.show_problem("Enter the passphrase.")
            return
        if self.mode == "create":
            if len(text) < MIN_PASSPHRASE:
                self.show_problem(f"The passphrase needs at least {MIN_PASSPHRASE} characters.")
                return
            if text != self.confirm_edit.text():
                self.show_problem("The two passphrases differ; type the same one twice.")
                self.confirm_edit.clear()
                self.confirm_edit.setFocus()
                return
        self.set_busy(True)
        self.submitted.emit(text)

    def show_problem(self, text: str) -> None:
        self.error_label.setText(text)
        self.error_label.setVisible(bool(text))

    def set_busy(self, busy: bool) -> None:
        # Read-only rather than disabled: a disabled field would pass the focus on to Cancel.
        self.busy = busy
        for edit in (self.passphrase_edit, self.confirm_edit):
            edit.setReadOnly(busy)
        self.ok_button.setEnabled(not busy)
        if busy:
            self.show_problem("")
            self.ok_button.setText(
                {"create": "Creating...", "repair": "Checking..."}.get(self.mode, "Unlocking...")
            )
        else:
            self.ok_button.setText(self._ok_text())

    def keyPressEvent(self, event) -> None:  # noqa: N802 - Qt's name
        if self.busy and event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter):
            event.accept()  # a second Enter while checking: nothing to press (it must not reach Cancel)
            return
        super().keyPressEvent(event)

    def _ok_text(self) -> str:
        return {"create": "Create Vault", "repair": "Check"}.get(self.mode, "Unlock")

    def retry(self, hint: str) -> None:
        """After a wrong passphrase: clear it, say so, and wait for another try."""
        self.set_busy(False)
        self.passphrase_edit.clear()
        self.show_problem(hint)
        self.passphrase_edit.setFocus()

    def done(self, result: int) -> None:
        # Do not keep what was typed in widgets any longer than needed.
        self.passphrase_edit.clear()
        self.confirm_edit.clear()
        super().done(result)


class ChangePassphraseDialog(QDialog):
    """The current passphrase and a new one twice; ``submitted(old, new)`` when acceptable."""

    submitted = Signal(str, str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("changePassphraseDialog")
        self.setWindowTitle("Change Vault Passphrase")
        self.setStyleSheet(_DIALOG_QSS)
        header = _header(
            "Change the passphrase",
            "Without re-encrypting, the old passphrase still opens old copies (backups) of the vault and, "
            "with them, items added later. If it may have leaked, re-encrypt everything under a new key.",
            unlocked=True,
        )
        self.old_edit = _password_edit("Current passphrase")
        self.new_edit = _password_edit(f"At least {MIN_PASSPHRASE} characters")
        self.confirm_edit = _password_edit("Type it again")
        self.rekey_box = QCheckBox("Re-encrypt everything under a new key (after a leak; takes a while)")
        self.rekey_box.setObjectName("rekeyBox")
        self.error_label = _error_label()
        form = QFormLayout()
        form.addRow("Current", self.old_edit)
        form.addRow("New", self.new_edit)
        form.addRow("Confirm", self.confirm_edit)
        form.addRow("", self.rekey_box)
        self.buttons, self.ok_button = _lay_out(
            self,
            header,
            form,
            self.error_label,
            ok_text="Change",
            on_ok=self._on_buttons_accepted,
            min_width=480,
        )

    def _on_buttons_accepted(self) -> None:
        old, new = self.old_edit.text(), self.new_edit.text()
        if not old:
            self.show_problem("Enter the current passphrase.")
        elif len(new) < MIN_PASSPHRASE:
            self.show_problem(f"The new passphrase needs at least {MIN_PASSPHRASE} characters.")
        elif new != self.confirm_edit.text():
            self.show_problem("The two new passphrases differ; type the same one twice.")
        elif new == old:
            self.show_problem("The new passphrase is the same as the current one.")
        else:
            self.set_busy(True)
            self.submitted.emit(old, new)

    def show_problem(self, text: str) -> None:
        self.error_label.setText(text)
        self.error_label.setVisible(bool(text))

    def set_busy(self, busy: bool) -> None:
        for widget in (self.old_edit, self.new_edit, self.confirm_edit, self.ok_button):
            widget.setEnabled(not busy)
        if busy:
            self.show_problem("")

    def retry(self, hint: str) -> None:
        self.set_busy(False)
        self.old_edit.clear()
        self.show_problem(hint)
        self.old_edit.setFocus()

    def done(self, result: int) -> None:
        for edit in (self.old_edit, self.new_edit, self.confirm_edit):
            edit.clear()
        super().done(result)


def _display_date(value: str) -> str:
    """A stored date (``YYYYMMDD``) as typed in the dialogs (``YYYY-MM-DD``)."""
    text = str(value or "").strip()
    return f"{text[:4]}-{text[4:6]}-{text[6:]}" if len(text) == 8 and text.isdigit() else text


class _DetailsForm(QDialog):
    """The label, patient and study fields shared by the import and edit dialogs, with date checks."""

    def _build_fields(self, *, patient_allowed: bool) -> QFormLayout:
        self.label_edit = QLineEdit()
        self.patient_name_edit = QLineEdit()
        self.patient_name_edit.setPlaceholderText("Family, Given")
        self.patient_id_edit = QLineEdit()
        self.birth_date_edit = QLineEdit()
        self.birth_date_edit.setPlaceholderText("YYYY-MM-DD")
        self.study_edit = QLineEdit()
        self.study_edit.setPlaceholderText("e.g. MR brain T1 follow-up")
        self.study_date_edit = QLineEdit()
        self.study_date_edit.setPlaceholderText("YYYY-MM-DD")
        for edit in (self.patient_name_edit, self.patient_id_edit, self.birth_date_edit):
            edit.setEnabled(patient_allowed)
            if not patient_allowed:
                edit.setPlaceholderText("synthetic: no patient")
        self.error_label = _error_label()
        form = QFormLayout()
        form.addRow("Label", self.label_edit)
        form.addRow("Patient name", self.patient_name_edit)
        form.addRow("Patient ID", self.patient_id_edit)
        form.addRow("Birth date", self.birth_date_edit)
        form.addRow("Study", self.study_edit)
        form.addRow("Study date", self.study_date_edit)
        return form

    def _check_and_accept(self) -> None:
        """Accept only when the dates are real dates; otherwise say which and how to write it."""
        from app.core.vault_items import check_date
        from engine.errors import InvalidRequest

        for edit, what in ((self.birth_date_edit, "birth date"), (self.study_date_edit, "study date")):
            try:
                check_date(edit.text(), what)
            except InvalidRequest as exc:
                self.error_label.setText(str(exc)[0].upper() + str(exc)[1:] + ".")
                self.error_label.show()
                edit.setFocus()
                edit.selectAll()
                return
        self.error_label.hide()
        self.accept()

    def details(self) -> dict:
        """``label`` (None when empty), ``patient`` and ``study`` dicts (dates as ``YYYYMMDD``)."""
        from app.core.vault_items import check_date, clean_metadata

        name = self.patient_name_edit.text().strip()
        if "," in name:  # stored as a DICOM person name, the form the vault's DICOM imports use
            family, given = (part.strip() for part in name.split(",", 1))
            name = f"{family}^{given}"
        label = self.label_edit.text().strip() if self.label_edit.isEnabled() else ""
        return {
            "label": label or None,
            "patient": clean_metadata(
                {
                    "name": name,
                    "id": self.patient_id_edit.text(),
                    "birth_date": check_date(self.birth_date_edit.text(), "birth date"),
                }
            ),
            "study": clean_metadata(
                {
                    "description": self.study_edit.text(),
                    "date": check_date(self.study_date_edit.text(), "study date"),
                }
            ),
        }


class ImportDetailsDialog(_DetailsForm):
    """Patient and study details for NIfTI files (a NIfTI header carries none); all optional.

    Files VolSynth generated (any SYNTHETIC mark, ``synthetic`` names them) are stored as synthetic: the
    dialog says so, and when every file is synthetic the patient fields are disabled.
    """

    def __init__(
        self, paths: Sequence[str | Path], parent: QWidget | None = None, synthetic: list[str] | None = None
    ) -> None:
        super().__init__(parent)
        self.paths = [Path(p) for p in paths]
        self.synthetic = list(synthetic or [])
        self.setObjectName("importDetailsDialog")
        self.setWindowTitle("Import into the Vault")
        self.setStyleSheet(_DIALOG_QSS)
        names = ", ".join(p.name for p in self.paths[:3]) + (
            f" and {len(self.paths) - 3} more" if len(self.paths) > 3 else ""
        )
        count = "1 NIfTI file" if len(self.paths) == 1 else f"{len(self.paths)} NIfTI files"
        header = _header(
            f"Import {count}",
            f"{names}\n\nThe files are encrypted into the vault unchanged. "
            "Patient and study details are optional and encrypted too.",
            unlocked=True,
        )
        all_synthetic = bool(self.synthetic) and len(self.synthetic) == len(self.paths)
        form = self._build_fields(patient_allowed=not all_synthetic)
        if len(self.paths) == 1:
            name = self.paths[0].name
            self.label_edit.setText(
                name[:-7] if name.lower().endswith(".nii.gz") else name.removesuffix(".nii")
            )
        else:
            self.label_edit.setPlaceholderText("Each file's name")
            self.label_edit.setEnabled(False)
        self.synthetic_label = QLabel("")
        self.synthetic_label.setObjectName("dialogPath")
        self.synthetic_label.setWordWrap(True)
        if self.synthetic:
            which = "it is" if all_synthetic and len(self.paths) == 1 else f"{', '.join(self.synthetic)}:"
            self.synthetic_label.setText(
                f"SYNTHETIC \u2014 {which} generated by VolSynth, so stored as synthetic with its "
                "provenance, never as a patient scan"
                + ("." if all_synthetic else "; patient details apply to the other files only.")
            )
        self.synthetic_label.setVisible(bool(self.synthetic))
        form.addRow("", self.synthetic_label)
        self.buttons, self.ok_button = _lay_out(
            self,
            header,
            form,
            self.error_label,
            ok_text="Import",
            on_ok=self._check_and_accept,
            min_width=500,
        )


class ItemDetailsDialog(_DetailsForm):
    """Edit an item's label, patient and study details after import (``details()`` when accepted)."""

    def __init__(self, info, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.info = info
        self.setObjectName("itemDetailsDialog")
        self.setWindowTitle("Vault Item Details")
        self.setStyleSheet(_DIALOG_QSS)
        synthetic = info.kind == "synthetic"
        header = _header(
            f"Details of \u201c{info.label}\u201d",
            "Only the details change; the volume is not touched. A synthetic volume has no patient."
            if synthetic
            else "Only the details change; the volume is not touched. Everything here is encrypted.",
            unlocked=True,
        )
        form = self._build_fields(patient_allowed=not synthetic)
        self.label_edit.setText(info.label)
        patient, study = info.patient, info.study
        name = str(patient.get("name", ""))
        family, _, given = name.partition("^")
        self.patient_name_edit.setText(f"{family}, {given.replace('^', ' ').strip()}" if given else family)
        self._shown_name = self.patient_name_edit.text()
        self.patient_id_edit.setText(str(patient.get("id", "")))
        self.birth_date_edit.setText(_display_date(patient.get("birth_date", "")))
        self.study_edit.setText(str(study.get("description", "")))
        self.study_date_edit.setText(_display_date(study.get("date", "")))
        self.buttons, self.ok_button = _lay_out(
            self, header, form, self.error_label, ok_text="Save", on_ok=self._check_and_accept, min_width=500
        )

    def details(self) -> dict:
        """Like the import dialog's, with the item's other study and patient fields (modality, sex...) kept."""
        out = super().details()
        keep_patient = {k: v for k, v in self.info.patient.items() if k not in ("name", "id", "birth_date")}
        keep_study = {k: v for k, v in self.info.study.items() if k not in ("description", "date")}
        if self.patient_name_edit.text() == self._shown_name and self.info.patient.get("name"):
            out["patient"]["name"] = self.info.patient["name"]  # unchanged: keep it exactly as stored
        out["patient"] = {**keep_patient, **out["patient"]} if self.info.kind != "synthetic" else {}
        out["study"] = {**keep_study, **out["study"]}
        if out["label"] is None:
            out["label"] = self.info.label
        return out


class ExportDialog(QDialog):
    """Where to export an item, whether to de-identify it, and whether its tissue maps go with it.

    ``session_only`` names maps the shown item got in this session that the vault does not keep (they cannot
    leave with an export until kept: the vault browser's Compute Tissue Maps keeps them)."""

    def __init__(
        self, info, folder: str | Path, parent: QWidget | None = None, session_only: Sequence[str] = ()
    ) -> None:
        super().__init__(parent)
        self.info = info
        self.setObjectName("vaultExportDialog")
        self.setWindowTitle("Export from the Vault")
        self.setStyleSheet(_DIALOG_QSS)
        synthetic = info.kind == "synthetic"
        text = (
            "Writes the volume as NIfTI"
            + (", its original DICOM files" if info.dicom_files else "")
            + (", its tissue maps" if info.tissue_maps else "")
            + (" and its provenance. It stays marked SYNTHETIC." if synthetic else ".")
            + " File names never contain patient details."
        )
        header = _header(f"Export \u201c{info.label}\u201d", text, unlocked=True)
        self.folder_edit = QLineEdit(str(folder))
        browse = QPushButton("Browse...")
        browse.setAutoDefault(False)  # Enter in the folder field exports (the primary button)
        browse.clicked.connect(self._on_browse_clicked)
        folder_row = QHBoxLayout()
        folder_row.addWidget(self.folder_edit, 1)
        folder_row.addWidget(browse)
        self.deidentify_box = QCheckBox("De-identify")
        self.deidentify_box.setChecked(True)
        self.deidentify_box.setToolTip(
            "NIfTI: clear the description, aux_file, intent_name and db_name fields "
            "and header extensions. DICOM: the PS3.15 Annex E basic profile."
        )
        hint = QLabel(
            "Removes names, IDs, dates and free-text header fields (DICOM: PS3.15 Annex E basic "
            "profile). Leave it on unless the files stay inside your institution."
        )
        hint.setObjectName("dialogPath")
        hint.setWordWrap(True)
        self.dicom_box = QCheckBox(f"Include the {info.dicom_files} original DICOM files")
        self.dicom_box.setChecked(True)
        self.dicom_box.setVisible(bool(info.dicom_files))
        maps = ", ".join(info.tissue_maps)
        self.tissue_box = QCheckBox(f"Include its {len(info.tissue_maps)} tissue maps ({maps})")
        self.tissue_box.setChecked(True)
        self.tissue_box.setToolTip(
            "Written beside the volume as <name>_label-<map>_probseg.nii.gz (File > Open finds them), "
            "and named in the audit entry of the export"
        )
        self.tissue_box.setVisible(bool(info.tissue_maps))
        self.session_maps_label = QLabel(
            f"Not exported: {', '.join(session_only)} computed in this session only. The vault browser's "
            "Compute Tissue Maps keeps them with the item first."
        )
        self.session_maps_label.setObjectName("dialogPath")
        self.session_maps_label.setWordWrap(True)
        self.session_maps_label.setVisible(bool(session_only))
        self.overwrite_box = QCheckBox("Replace files that already exist")
        form = QFormLayout()
        form.addRow("Folder", folder_row)
        options = QVBoxLayout()
        options.setSpacing(4)
        options.addWidget(self.deidentify_box)
        options.addWidget(hint)
        options.addWidget(self.dicom_box)
        options.addWidget(self.tissue_box)
        options.addWidget(self.session_maps_label)
        options.addWidget(self.overwrite_box)
        form.addRow("Options", options)
        self.error_label = _error_label()
        self.buttons, self.ok_button = _lay_out(
            self,
            header,
            form,
            self.error_label,
            ok_text="Export",
            on_ok=self._on_buttons_accepted,
            min_width=540,
        )

    def _on_browse_clicked(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Export to folder", self.folder_edit.text())
        if folder:
            self.folder_edit.setText(folder)

    def _on_buttons_accepted(self) -> None:
        if not self.folder_edit.text().strip():
            self.error_label.setText("Choose a folder to export to.")
            self.error_label.show()
            return
        self.accept()

    def options(self) -> dict:
        return {
            "dest": Path(self.folder_edit.text().strip()).expanduser(),
            "deidentify": self.deidentify_box.isChecked(),
            "include_dicom": self.dicom_box.isChecked(),
            "include_tissue": self.tissue_box.isChecked(),
            "overwrite": self.overwrite_box.isChecked(),
        }


class TaskProgressDialog(QProgressDialog):
    """Progress of one background vault task; Cancel asks the task to stop at its next chunk."""

    def __init__(self, title: str, text: str, job, cancellable: bool, parent: QWidget | None = None) -> None:
        super().__init__(text, "Cancel", 0, 1000, parent)
        self.job = job
        self.setObjectName("vaultProgressDialog")
        self.setWindowTitle(title)
        self.setWindowModality(Qt.WindowModality.WindowModal)
        self.setMinimumDuration(400)  # quick tasks finish without a dialog flashing up
        self.setAutoClose(False)
        self.setAutoReset(False)
        self.setMinimumWidth(420)
        if cancellable:
            self.canceled.connect(self._on_canceled)
        else:
            self.setCancelButton(None)
        self.setValue(0)

    def _on_canceled(self) -> None:
        self.setLabelText("Cancelling...")
        self.job.cancel()

    def report(self, fraction: float | None, text: str) -> None:
        if self.wasCanceled():
            return
        if text:
            self.setLabelText(text)
        # Last: on a shown modal dialog setValue() processes events, which may end the task and close this.
        if fraction is None:
            self.setRange(0, 0)
        else:
            if self.maximum() == 0:
                self.setRange(0, 1000)
            self.setValue(int(round(max(0.0, min(1.0, fraction)) * 1000)))
