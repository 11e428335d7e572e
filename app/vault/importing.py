"""Importing scans into the vault: the NIfTI and DICOM file dialogs, files dropped on the browser, the
patient and study details asked once per batch, and the batch's report.

Files VolSynth generated are recognised (``app.core.vault_items.synthetic_names``), named in the details
dialog and stored as synthetic, without patient details.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from PySide6.QtWidgets import QFileDialog, QWidget

from app.core import vault_items as model
from app.vault.dialogs import ImportDetailsDialog
from app.vault.listing import VaultListing
from app.vault.locking import VaultLocking
from app.vault.messages import VaultMessages
from app.vault.privacy import last_dir, remember_dir
from app.vault.session import VaultSession
from app.vault.tasks import ERROR_TITLES, VaultTasks
from engine.nifti.io import is_nifti

NIFTI_FILTER = "NIfTI volumes (*.nii *.nii.gz);;All files (*)"


class VaultImport:
    """Imports into the vault ``session`` holds.

    Args:
        session: The open vault (``VaultSession``).
        tasks: Encrypts in the background (``VaultTasks``).
        locking: Unlocks first when the vault is locked (``VaultLocking``).
        listing: Listed again after an import (``VaultListing``).
        messages: Asks whether to import a copy of what the vault already holds (``VaultMessages``).
        settings: The app's QSettings (the folder the import dialogs start in).
        show_status: ``(text, timeout_ms)``, the window's status line.
        show_error: ``(title, message)``, the app's error dialog.
        parent: Parent of the file and details dialogs (window-modal).
    """

    def __init__(
        self,
        session: VaultSession,
        tasks: VaultTasks,
        locking: VaultLocking,
        listing: VaultListing,
        messages: VaultMessages,
        settings: Any,
        show_status: Callable[..., None],
        show_error: Callable[[str, str], None],
        parent: QWidget | None,
    ) -> None:
        self._session = session
        self._tasks = tasks
        self._locking = locking
        self._listing = listing
        self._messages = messages
        self._settings = settings
        self._show_status = show_status
        self._show_error = show_error
        self._parent = parent
        self.import_dialog: ImportDetailsDialog | None = None
        self._pending_import: list[model.ImportJob] = []

    def import_nifti_dialog(self) -> None:
        if not self._locking.ensure_unlocked(self.import_nifti_dialog):
            return
        paths, _ = QFileDialog.getOpenFileNames(
            self._parent,
            "Import NIfTI files into the vault",
            last_dir(self._settings, "vault/last_import_dir"),
            NIFTI_FILTER,
        )
        if paths:
            remember_dir(self._settings, "vault/last_import_dir", Path(paths[0]).parent)
            self.ask_import_details(paths)

    def import_dicom_dialog(self) -> None:
        if not self._locking.ensure_unlocked(self.import_dicom_dialog):
            return
        folder = QFileDialog.getExistingDirectory(
            self._parent,
            "Import a DICOM series folder into the vault",
            last_dir(self._settings, "vault/last_import_dir"),
        )
        if folder:
            remember_dir(self._settings, "vault/last_import_dir", Path(folder).parent)
            self.import_sources([model.ImportJob(folder, "dicom")])

    def import_dropped(self, paths: Sequence[str | Path]) -> None:
        """Files dropped on the browser: NIfTI files (details asked once), DICOM folders or files."""
        dropped = [Path(p) for p in paths]
        if not dropped:
            return
        if not self._locking.ensure_unlocked(partial(self.import_dropped, dropped)):
            return
        nifti = [p for p in dropped if is_nifti(p)]
        jobs = [model.ImportJob(p, "dicom") for p in dropped if p.is_dir()]
        loose = [p for p in dropped if p.is_file() and not is_nifti(p)]
        if loose:
            jobs.append(model.ImportJob(loose, "dicom"))
        if nifti:
            self.ask_import_details(nifti, jobs)
        elif jobs:
            self.import_sources(jobs)

    def ask_import_details(
        self, paths: Sequence[str | Path], extra: list[model.ImportJob] | None = None
    ) -> None:
        """Ask for patient and study details (non-blocking); files VolSynth generated are named in the dialog
        and stored as synthetic, without patient details."""
        dialog = ImportDetailsDialog(paths, self._parent, synthetic=model.synthetic_names(paths))
        self._pending_import = list(extra or [])
        dialog.accepted.connect(self._on_import_dialog_accepted)
        dialog.rejected.connect(self._on_import_dialog_rejected)
        self.import_dialog = dialog
        dialog.open()

    def _on_import_dialog_accepted(self) -> None:
        dialog, self.import_dialog = self.import_dialog, None
        if dialog is None:
            return
        details = dialog.details()
        jobs = [
            model.ImportJob(
                p,
                "nifti",
                label=details["label"],
                # a generated volume has no patient: the details apply to the scans among the files
                patient={} if p.name in dialog.synthetic else details["patient"],
                study=details["study"],
            )
            for p in dialog.paths
        ]
        extra, self._pending_import = self._pending_import, []
        self.import_sources(jobs + extra)

    def _on_import_dialog_rejected(self) -> None:
        self.import_dialog = None
        self._pending_import = []

    def import_nifti(
        self,
        paths: list[str | Path],
        *,
        label: str | None = None,
        patient: dict | None = None,
        study: dict | None = None,
    ) -> None:
        """Import NIfTI files without asking (scripts and tests); details apply to every file."""
        self.import_sources(
            [
                model.ImportJob(p, "nifti", label=label, patient=dict(patient or {}), study=dict(study or {}))
                for p in paths
            ]
        )

    def import_sources(self, jobs: list[model.ImportJob]) -> None:
        if not jobs or not self._locking.ensure_unlocked(partial(self.import_sources, jobs)):
            return
        self._tasks.start(
            "import",
            model.import_batch,
            self._session.vault,
            jobs,
            finished=self._on_imported,
            progress="Importing into the Vault",
            text="Encrypting...",
        )

    def _on_imported(self, report: model.ImportReport) -> None:
        self._listing.refresh()
        done = len(report.imported)
        if report.cancelled:
            self._show_status(f"Import cancelled: {done} of {report.total} imported", 8000)
        elif done:
            what = f"\u201c{report.imported[0].label}\u201d" if done == 1 else f"{done} items"
            self._show_status(f"Imported {what} into the vault", 8000)
        if report.duplicates:
            names = "\n\n".join(message for _job, message in report.duplicates)
            jobs = [job for job, _message in report.duplicates]
            for job in jobs:
                job.allow_duplicate = True
            self._messages.ask_duplicate(
                f"{names}\n\nImport another copy?", "Import a Copy", partial(self.import_sources, jobs)
            )
        if report.errors:
            if report.total == 1:
                self._show_error(ERROR_TITLES["import"], report.errors[0])
            else:
                self._show_error(
                    "Some items were not imported",
                    f"{len(report.errors)} of {report.total} could not be imported:\n\n"
                    + "\n\n".join(report.errors),
                )

    def forget(self) -> None:
        """The vault locked: drop the batch being asked about, and its dialog."""
        self._pending_import = []
        if self.import_dialog is not None:
            self.import_dialog.reject()
        self.import_dialog = None
