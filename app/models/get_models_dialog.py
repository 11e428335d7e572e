"""Generate > Get Models...: the catalogue's real models, their licences, and a download that resumes.

The list shows each model's download size, licence and what it needs on this machine (free disk, memory
per output size from the engine's estimator); the licence is shown in full and must be accepted before the
download starts. The download runs in a worker thread (``engine.models.download.get_model``), with a
progress bar and Cancel; what was fetched stays staged, so Get again resumes. A finished model is opened
into the model picker.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QProgressBar,
    QPushButton,
    QSplitter,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from app.services.workers import JobRunner, Worker


def _download(entry, models_dir: Path | None, worker: Worker) -> Path:
    """Runs in the worker thread: fetch ``entry``; ``worker.report`` raises Cancelled after Cancel."""
    from engine.models.download import get_model

    def progress(done: int, total: int, text: str) -> None:
        worker.report(done / total if total else None, text)

    return get_model(
        entry,
        models_dir=models_dir,
        accept_licence=True,
        progress=progress,
        should_stop=lambda: worker.cancel_requested,
    )


def _add(folder: str, entry, models_dir: Path | None, worker: Worker) -> Path:
    from engine.models.download import add_folder

    worker.report(None, f"checking and copying {folder}")
    return add_folder(Path(folder), entry, models_dir=models_dir, accept_licence=True)


class GetModelsDialog(QDialog):
    """The catalogue, one model's licence and needs, and its download."""

    def __init__(
        self,
        parent: QWidget | None,
        runner: JobRunner,
        on_installed: Callable[[Path], None],
        models_dir: Path | None = None,
    ) -> None:
        super().__init__(parent)
        from engine.models.catalogue import load_catalogue
        from engine.models.download import default_models_dir

        self.setWindowTitle("Get Models")
        self.setObjectName("get_models_dialog")
        self.runner = runner
        self.on_installed = on_installed
        self.models_dir = Path(models_dir) if models_dir else default_models_dir()
        self.entries = load_catalogue()
        self.job = None
        self._needs_cache: dict[str, list[dict]] = {}

        self.list = QListWidget()
        self.list.setObjectName("catalogue_list")
        self.list.setAccessibleName("Models that can be fetched")
        self.details = QTextBrowser()
        self.details.setObjectName("licence_text")
        self.details.setOpenExternalLinks(True)
        self.details.setAccessibleName("The model, what it needs here, and its licence")
        self.accept_box = QCheckBox("I have read the licence above and &accept it")
        self.accept_box.setObjectName("accept_licence")
        self.progress = QProgressBar()
        self.progress.setObjectName("download_progress")
        self.progress.setRange(0, 1000)
        self.progress.setValue(0)
        self.status = QLabel("")
        self.status.setObjectName("download_status")
        self.status.setWordWrap(True)
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.get_button = QPushButton("&Get")
        self.get_button.setObjectName("get_button")
        self.add_button = QPushButton("Add from &Folder...")
        self.add_button.setToolTip("Install a copy brought by hand (a USB stick): checked the same way")
        self.cancel_button = QPushButton("&Cancel Download")
        self.cancel_button.setObjectName("cancel_download")
        self.cancel_button.setEnabled(False)
        self.close_button = QPushButton("Close")

        splitter = QSplitter()
        splitter.addWidget(self.list)
        splitter.addWidget(self.details)
        splitter.setStretchFactor(1, 2)
        splitter.setSizes([360, 620])
        self.list.setWordWrap(True)
        buttons = QHBoxLayout()
        for button in (self.get_button, self.add_button, self.cancel_button):
            buttons.addWidget(button)
        buttons.addStretch(1)
        buttons.addWidget(self.close_button)
        layout = QVBoxLayout(self)
        layout.addWidget(splitter, 1)
        layout.addWidget(self.accept_box)
        layout.addWidget(self.progress)
        layout.addWidget(self.status)
        layout.addLayout(buttons)
        self.resize(980, 640)

        self.list.currentRowChanged.connect(self._on_list_row_changed)
        self.accept_box.toggled.connect(self._on_accept_box_toggled)
        self.get_button.clicked.connect(self._on_get_button_clicked)
        self.add_button.clicked.connect(self._on_add_button_clicked)
        self.cancel_button.clicked.connect(self._on_cancel_button_clicked)
        self.close_button.clicked.connect(self.close)
        self._fill_list()
        self.list.setCurrentRow(0)
        self.list.setFocus()

    # -- what is shown ---------------------------------------------------------------------------------

    @property
    def entry(self):
        row = self.list.currentRow()
        return self.entries[row] if 0 <= row < len(self.entries) else None

    def _needs(self, entry) -> list[dict]:
        if entry.name not in self._needs_cache:
            try:
                self._needs_cache[entry.name] = entry.memory_needs()
            except Exception:  # noqa: BLE001 - a malformed catalogue entry shows no estimate, never a crash
                self._needs_cache[entry.name] = []
        return self._needs_cache[entry.name]

    def _state_text(self, entry) -> str:
        from engine.formatting import format_bytes
        from engine.models.download import is_installed, staged_bytes

        if is_installed(entry, self.models_dir):
            return "installed"
        staged = staged_bytes(entry, self.models_dir)
        return f"{format_bytes(staged)} fetched, Get resumes" if staged else "not installed"

    def _fill_list(self) -> None:
        from engine.formatting import format_bytes

        current = self.list.currentRow()
        self.list.clear()
        for entry in self.entries:
            size = format_bytes(entry.weight_bytes_estimate())
            text = f"{entry.title} {entry.version}\n  about {size} · {entry.licence.name} · {self._state_text(entry)}"
            item = QListWidgetItem(text)
            item.setToolTip(entry.summary)
            self.list.addItem(item)
        if current >= 0:
            self.list.setCurrentRow(current)

    def _details_html(self, entry) -> str:
        from engine.formatting import format_bytes
        from engine.models.download import LicenceAcceptances, free_disk_bytes
        from engine.nifti.checks import available_memory

        esc = html.escape
        licence = entry.licence
        free = free_disk_bytes(self.models_dir)
        size = entry.weight_bytes_estimate()
        disk_ok = "enough" if free > size else "NOT enough"
        memory = available_memory()
        rows = []
        for need in self._needs(entry):
            verdict = "fits" if need["total"] <= memory else "does not fit"
            shape = "x".join(str(n) for n in need["size"])
            spacing = "x".join(f"{s:g}" for s in need["spacing_mm"])
            rows.append(
                f"<li>{esc(need['label'])} {shape} at {spacing} mm: about {format_bytes(need['total'])} "
                f"({verdict} in the {format_bytes(memory)} free here)</li>"
            )
        modalities = []
        for modality in entry.makes.get("modalities", []):
            caveat = modality.get("not_guaranteed")
            mark = f" <b>(quality not guaranteed: {esc(caveat)})</b>" if caveat else ""
            offered = "" if modality.get("offered_by_volsynth", True) else " (not offered by VolSynth yet)"
            modalities.append(f"{esc(modality['label'])}{mark}{offered}")
        accepted = LicenceAcceptances().accepted(entry)
        guidance = entry.makes.get("guidance_note")
        parts = [
            f"<h3>{esc(entry.title)} {esc(entry.version)}</h3>",
            f"<p>{esc(entry.summary)}</p>",
            f"<p><b>Makes:</b> {', '.join(modalities)}</p>",
            f"<p><b>Guidance scale:</b> {esc(guidance)}</p>" if guidance else "",
            f"<p><b>Download:</b> about {format_bytes(size)} into {esc(str(self.models_dir))}; "
            f"{format_bytes(free)} free there ({disk_ok}). Status: {esc(self._state_text(entry))}.</p>",
            f"<p><b>Memory per volume</b> (the engine's estimate):</p><ul>{''.join(rows)}</ul>",
            "<p><b>Files:</b></p><ul>"
            + "".join(
                f"<li>{esc(f.path)}: {esc(f.source_text)}"
                + (f", SHA-256 {f.sha256[:16]}…" if f.sha256 else ", SHA-256 checked against the hub's, "
                   "recorded at first download (trust on first use)")
                + "</li>"
                for f in entry.files
            )
            + "</ul>",
            f"<h3>Licence: {esc(licence.name)}</h3>",
            f"<p><a href='{esc(licence.url)}'>{esc(licence.url)}</a></p>",
            f"<p>Applies to: {esc(licence.applies_to)}</p>" if licence.applies_to else "",
            f"<p>{esc(licence.summary)}</p>",
            f"<p><b>Note:</b> {esc(entry.pinning_note())}.</p>" if entry.pinning_note() else "",
            f"<pre>{esc(licence.text)}</pre>" if licence.text else
            "<p>The full text is at the address above; read it there before accepting.</p>",
            "<p><i>Accepted on this computer.</i></p>" if accepted else "",
        ]  # fmt: skip
        return "".join(parts)

    def _update_buttons(self) -> None:
        from engine.models.download import is_installed, staged_bytes

        entry = self.entry
        running = self.job is not None
        installed = entry is not None and is_installed(entry, self.models_dir) is not None
        self.get_button.setText(
            "&Resume" if entry is not None and staged_bytes(entry, self.models_dir) else "&Get"
        )
        self.get_button.setEnabled(
            bool(entry) and not running and not installed and self.accept_box.isChecked()
        )
        self.add_button.setEnabled(
            bool(entry) and not running and not installed and self.accept_box.isChecked()
        )
        self.cancel_button.setEnabled(running)
        self.list.setEnabled(not running)
        self.accept_box.setEnabled(not running and not installed)

    # -- slots -----------------------------------------------------------------------------------------

    def _on_list_row_changed(self, _row: int) -> None:
        from engine.models.download import LicenceAcceptances

        entry = self.entry
        if entry is None:
            return
        self.details.setHtml(self._details_html(entry))
        self.accept_box.blockSignals(True)
        self.accept_box.setChecked(LicenceAcceptances().accepted(entry))
        self.accept_box.blockSignals(False)
        self._update_buttons()

    def _on_accept_box_toggled(self, _checked: bool) -> None:
        self._update_buttons()

    def _on_get_button_clicked(self) -> None:
        entry = self.entry
        if entry is None or not self.accept_box.isChecked():
            return
        self._start(Worker(lambda worker: _download(entry, self.models_dir, worker), what="model download",
                           cancelled_by=(self._cancelled_type(),)), f"Fetching {entry.title}…")  # fmt: skip

    def _on_add_button_clicked(self) -> None:
        entry = self.entry
        if entry is None or not self.accept_box.isChecked():
            return
        folder = QFileDialog.getExistingDirectory(self, f"Folder holding the files of {entry.title}")
        if folder:
            self._start(Worker(lambda worker: _add(folder, entry, self.models_dir, worker), what="model copy",
                               cancelled_by=(self._cancelled_type(),)), f"Adding {folder}…")  # fmt: skip

    def _on_cancel_button_clicked(self) -> None:
        if self.job is not None:
            self.status.setText("Cancelling…")
            self.job.cancel()

    def _on_job_progressed(self, value) -> None:
        fraction, text = value
        if fraction is None:
            self.progress.setRange(0, 0)  # busy: asking the hub, checking the folder
        else:
            self.progress.setRange(0, 1000)
            self.progress.setValue(int(1000 * fraction))
        self.status.setText(text)

    def _on_job_finished(self, folder) -> None:
        self._end()
        self.progress.setRange(0, 1000)
        self.progress.setValue(1000)
        self.status.setText(f"Installed in {folder}; it is now in the model picker.")
        self.on_installed(Path(folder))
        self._refresh()

    def _on_job_failed(self, message: str) -> None:
        self._end()
        self.progress.setRange(0, 1000)
        if "volsynth models add" in message:  # the engine's words for the CLI; here it is a button
            message += " (here: Add from Folder)"
        self.status.setText(message)
        self._refresh()

    def _on_job_cancelled(self) -> None:
        self._end()
        self.progress.setRange(0, 1000)
        self.status.setText("Cancelled. What was fetched is kept: Resume continues from there.")
        self._refresh()

    # -- helpers ---------------------------------------------------------------------------------------

    @staticmethod
    def _cancelled_type():
        from engine.errors import Cancelled

        return Cancelled

    def _start(self, worker: Worker, text: str) -> None:
        self.status.setText(text)
        self.progress.setRange(0, 0)
        self.job = self.runner.start(
            "get-models",
            worker,
            progressed=self._on_job_progressed,
            finished=self._on_job_finished,
            failed=self._on_job_failed,
            cancelled=self._on_job_cancelled,
        )
        self._update_buttons()
        self.cancel_button.setFocus()

    def _end(self) -> None:
        self.job = None

    def _refresh(self) -> None:
        self._fill_list()
        self._on_list_row_changed(self.list.currentRow())
        self._update_buttons()

    def closeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        if self.job is not None:
            self.job.cancel()  # what was fetched stays staged for the next Get
        super().closeEvent(event)
