"""Generate > Get Models...: the catalogue's real models, their licences, and a download that resumes.

The list shows each model's download size, licence and what it needs on this machine (free disk, memory
per output size from the engine's estimator); the licence is shown in full and must be accepted before the
download starts. The download runs in a worker thread (``engine.models.download.get_model``), with a
progress bar and Cancel; what was fetched stays staged, so Get again resumes. A finished model is opened
into the model picker.

An installed model can be checked again (Verify: its weights against the networks its config describes, its
files' SHA-256 against the catalogue's, the hub's when it can be reached, or the one recorded at its download)
and removed (Remove: the folder and its recorded hashes; it leaves the model picker). What the engine says
for a terminal is worded here for the person at the workstation (``app.core.model_words``).
"""

from __future__ import annotations

import html
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QMessageBox,
    QPushButton,
    QSplitter,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from app.core.model_words import (
    check_words,
    copy_incomplete,
    copy_refusal,
    hub_file_url,
    hub_unreachable,
)
from app.services.job_view import JobStrip
from app.services.workers import Job, JobRunner, Worker

GET, ADD, VERIFY, REMOVE = "get", "add", "verify", "remove"  # the dialog's jobs
JOB_WORDS = {
    GET: "Model download",
    ADD: "Adding the model",
    VERIFY: "Verifying the model",
    REMOVE: "Removing the model",
}


# A failure the dialog words for its user is raised from the engine's own error, whose words (for whoever runs
# the network or the workstation) the status line keeps in its tooltip.


def _download(entry, models_dir: Path | None, worker: Worker) -> Path:
    """Runs in the worker thread: fetch ``entry``; ``worker.report`` raises Cancelled after Cancel."""
    from engine.errors import BackendUnavailable
    from engine.models.download import HubUnreachable, get_model

    def progress(done: int, total: int, text: str) -> None:
        worker.report(done / total if total else None, text)

    try:
        return get_model(
            entry,
            models_dir=models_dir,
            accept_licence=True,
            progress=progress,
            should_stop=lambda: worker.cancel_requested,
        )
    except HubUnreachable as exc:
        raise BackendUnavailable(hub_unreachable(exc, entry.title)) from exc


def _add(folder: str, entry, models_dir: Path | None, worker: Worker) -> Path:
    from engine.errors import ModelInvalid
    from engine.models.copy_check import CopyMismatch
    from engine.models.download import CopyIncomplete, add_folder

    worker.report(None, f"checking and copying {folder}")
    try:
        return add_folder(Path(folder), entry, models_dir=models_dir, accept_licence=True)
    except CopyMismatch as exc:
        raise ModelInvalid(copy_refusal(exc, entry.title)) from exc
    except CopyIncomplete as exc:
        raise ModelInvalid(copy_incomplete(exc.missing, entry.title)) from exc


def _verify(entry, models_dir: Path, worker: Worker):
    from engine.models.installed import check_installed

    worker.report(None, f"checking {entry.title}: every tensor's shape, then each file's SHA-256")
    return check_installed(entry, models_dir, ask_hub=True)


def _remove(entry, models_dir: Path, worker: Worker) -> Path | None:
    from engine.models.installed import remove_installed

    worker.report(None, f"removing {entry.title}")
    return remove_installed(entry, models_dir)[0]


class GetModelsDialog(QDialog):
    """The catalogue, one model's licence and needs, and its download."""

    job_ended = Signal(str)  # GET, ADD, VERIFY or REMOVE: that job has ended (finished, failed or cancelled)

    def __init__(
        self,
        parent: QWidget | None,
        runner: JobRunner,
        on_installed: Callable[[Path], object],  # its answer is not read
        models_dir: Path | None = None,
        on_removed: Callable[[Path], None] | None = None,
    ) -> None:
        """``on_installed(folder)`` opens an installed model into the picker; ``on_removed(folder)`` takes a
        removed one out of it."""
        super().__init__(parent)
        from engine.models.catalogue import load_catalogue
        from engine.models.download import default_models_dir

        self.setWindowTitle("Get Models")
        self.setObjectName("get_models_dialog")
        self.runner = runner
        self.on_installed = on_installed
        self.on_removed = on_removed
        self.worker: Worker | None = None  # the running (or last) job's worker: its error after a failure
        self.models_dir = Path(models_dir) if models_dir else default_models_dir()
        self.entries = load_catalogue()
        self.job: Job | None = None
        self._kind = ""  # the running job's (GET, ADD, VERIFY or REMOVE)
        self._ended = ""  # the job that has just ended, until the dialog shows it
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
        # The running job's progress, its line and Cancel (only a download stops part-way).
        self.strip = JobStrip(self, cancel_text="&Cancel Download")
        self.progress = self.strip.progress_bar
        self.progress.setObjectName("download_progress")
        self.status = self.strip.progress_label
        self.status.setObjectName("download_status")
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.get_button = QPushButton("&Get")
        self.get_button.setObjectName("get_button")
        self.add_button = QPushButton("Add from &Folder...")
        self.add_button.setObjectName("add_from_folder")
        self.verify_button = QPushButton("&Verify")
        self.verify_button.setObjectName("verify_model")
        self.verify_button.setToolTip(
            "Check the installed copy again: its weights against the networks its configuration describes, and "
            "each file's SHA-256 against its publisher's (the model hub is asked when it can be reached)"
        )
        self.remove_button = QPushButton("Re&move...")
        self.remove_button.setObjectName("remove_model")
        self.remove_button.setToolTip(
            "Delete the installed copy and forget its recorded SHA-256; it leaves the model picker"
        )
        # Why a button is greyed, said where it can be read (a greyed button's tooltip is easy to miss).
        self.hint = QLabel("")
        self.hint.setObjectName("hint")
        self.hint.setWordWrap(True)
        self.cancel_button = self.strip.cancel_button
        self.cancel_button.setObjectName("cancel_download")
        self.close_button = QPushButton("Close")

        splitter = QSplitter()
        splitter.addWidget(self.list)
        splitter.addWidget(self.details)
        splitter.setStretchFactor(1, 2)
        splitter.setSizes([360, 620])
        self.list.setWordWrap(True)
        buttons = QHBoxLayout()
        for button in (
            self.get_button,
            self.add_button,
            self.verify_button,
            self.remove_button,
            self.cancel_button,
        ):
            buttons.addWidget(button)
        buttons.addStretch(1)
        buttons.addWidget(self.close_button)
        layout = QVBoxLayout(self)
        layout.addWidget(splitter, 1)
        layout.addWidget(self.accept_box)
        layout.addWidget(self.hint)
        layout.addWidget(self.progress)
        layout.addWidget(self.status)
        layout.addLayout(buttons)
        self.resize(980, 640)

        self.list.currentRowChanged.connect(self._on_list_row_changed)
        self.accept_box.toggled.connect(self._on_accept_box_toggled)
        self.get_button.clicked.connect(self._on_get_button_clicked)
        self.add_button.clicked.connect(self._on_add_button_clicked)
        self.verify_button.clicked.connect(self._on_verify_button_clicked)
        self.remove_button.clicked.connect(self._on_remove_button_clicked)
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
        files = "".join(f"<li>{self._file_html(entry, f)}</li>" for f in entry.files)
        parts = [
            f"<h3>{esc(entry.title)} {esc(entry.version)}</h3>",
            f"<p>{esc(entry.summary)}</p>",
            f"<p><b>Makes:</b> {', '.join(modalities)}</p>",
            f"<p><b>Guidance scale:</b> {esc(guidance)}</p>" if guidance else "",
            f"<p><b>Download:</b> about {format_bytes(size)} into {esc(str(self.models_dir))}; "
            f"{format_bytes(free)} free there ({disk_ok}). Status: {esc(self._state_text(entry))}.</p>",
            f"<p><b>Memory per volume</b> (the engine's estimate):</p><ul>{''.join(rows)}</ul>",
            f"<p><a name='files'></a><b>Files:</b></p><ul>{files}</ul>",
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

    def _file_html(self, entry, file) -> str:
        """One file: where it comes from (a link a browser can download), and what its SHA-256 is checked
        against, or that it is kept on trust."""
        from engine.models.download import ON_TRUST, RecordedHashes, is_installed

        esc = html.escape
        if not file.from_hub:
            return f"{esc(file.path)}: {esc(file.source_text)}, SHA-256 {esc(file.sha256[:16])}…"
        url = hub_file_url(file)
        text = f"{esc(file.path)}: <a href='{esc(url)}'>{esc(file.source_text)}</a>"
        hashes = RecordedHashes()
        if file.sha256:
            return text + f", SHA-256 {esc(file.sha256[:16])}…"
        if is_installed(entry, self.models_dir) and hashes.origin(entry, file.path) == ON_TRUST:
            return text + (
                ", <b>SHA-256 kept on trust</b>: this copy was added by hand and nothing checked it against its "
                "publisher (Verify asks the model hub)"
            )
        if hashes.get(entry, file.path):
            return text + ", SHA-256 checked against the hub's when it was fetched"
        return text + ", SHA-256 checked against the hub's, recorded at first download (trust on first use)"

    def _update_buttons(self) -> None:
        from engine.models.download import is_installed, staged_bytes

        entry = self.entry
        running = self.job is not None
        installed = entry is not None and is_installed(entry, self.models_dir) is not None
        accepted = self.accept_box.isChecked()
        self.get_button.setText(
            "&Resume" if entry is not None and staged_bytes(entry, self.models_dir) else "&Get"
        )
        self.get_button.setEnabled(bool(entry) and not running and not installed and accepted)
        self.add_button.setEnabled(bool(entry) and not running and not installed and accepted)
        self.verify_button.setEnabled(bool(entry) and not running and installed)
        self.remove_button.setEnabled(bool(entry) and not running and installed)
        self.progress.setTextVisible(running)  # "0%" under a refusal read as a download that had started
        self.list.setEnabled(not running)
        self.accept_box.setEnabled(not running and not installed)
        if running or entry is None:
            why = ""
        elif installed:
            why = (
                "Installed: Verify checks this copy; Remove deletes it, after which Get or Add from Folder can "
                "install another."
            )
        elif not accepted:
            why = "Get and Add from Folder are greyed until the licence above is accepted (the box above)."
        else:
            why = (
                "Get fetches the files from the model hub; Add from Folder installs a copy brought by hand "
                "(a USB stick), checked the same way."
            )
        self.hint.setText(why)
        add_tip = "Install a copy brought by hand (a USB stick): checked the same way"
        if not running and entry is not None and not self.add_button.isEnabled():
            add_tip = (
                "Greyed: this model is installed (Remove it first)"
                if installed
                else "Greyed until the licence above is accepted"
            ) + f". {add_tip}"
        self.add_button.setToolTip(add_tip)

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
        self._start(Worker(lambda worker: _download(entry, self.models_dir, worker),
                           what="model download", cancelled_by=(self._cancelled_type(),)),
                    f"Fetching {entry.title}…", GET)  # fmt: skip

    def _on_add_button_clicked(self) -> None:
        entry = self.entry
        if entry is None or not self.accept_box.isChecked():
            return
        folder = QFileDialog.getExistingDirectory(self, f"Folder holding the files of {entry.title}")
        if folder:
            self._start(Worker(lambda worker: _add(folder, entry, self.models_dir, worker),
                               what="model copy", cancelled_by=(self._cancelled_type(),)),
                        f"Adding {folder}…", ADD)  # fmt: skip

    def _on_verify_button_clicked(self) -> None:
        entry = self.entry
        if entry is not None:
            worker = Worker(lambda worker: _verify(entry, self.models_dir, worker), what="model check")
            self._start(worker, f"Verifying {entry.title}…", VERIFY)

    def _on_remove_button_clicked(self) -> None:
        from engine.formatting import format_bytes
        from engine.models.download import is_installed

        entry = self.entry
        folder = is_installed(entry, self.models_dir) if entry is not None else None
        if entry is None or folder is None:
            return
        size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
        answer = QMessageBox.question(
            self,
            "Remove Model",
            f"Remove {entry.title} {entry.version}?\n\nThis deletes {folder} ({format_bytes(size)}) and forgets the "
            "SHA-256 recorded for its files. Volumes already generated with it are kept. The accepted licence "
            "stays accepted.",
            QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No,
            QMessageBox.StandardButton.No,
        )
        if answer == QMessageBox.StandardButton.Yes:
            worker = Worker(lambda worker: _remove(entry, self.models_dir, worker), what="model removal")
            self._start(worker, f"Removing {entry.title}…", REMOVE)

    def _on_job_finished(self, value) -> None:
        kind, entry = self._kind, self.entry
        self._end()
        if kind == VERIFY:
            self.status.setText(check_words(value, entry.title if entry else "the model"))
            self.status.setToolTip("\n".join(f.words() for f in value.files))
        elif kind == REMOVE:
            self.status.setText(
                f"Removed {entry.title if entry else 'the model'} and forgot its recorded SHA-256; it has left the "
                "model picker. Get or Add from Folder can install it again."
            )
            if value is not None and self.on_removed is not None:
                self.on_removed(Path(value))
        else:
            text = f"Installed in {value}; it is now in the model picker."
            if kind == ADD and entry is not None and entry.hub_files:
                text += (
                    " Its files' SHA-256 are kept on trust: this copy was added by hand and not checked against "
                    "its publisher's files. Verify checks them against the model hub when it can be reached."
                )
            self.status.setText(text)
            self.on_installed(Path(value))
        self._refresh()

    def _on_job_failed(self, message: str) -> None:
        self._end()
        self.status.setText(message)
        from engine.models.download import HubUnreachable

        error = self.worker.error if self.worker is not None else None
        cause = error.__cause__ if error is not None else None
        self.status.setToolTip(str(cause) if cause is not None else "")  # the engine's own words
        self._refresh()
        if isinstance(cause, HubUnreachable):  # the message points at the files to fetch by hand: show them
            self.details.scrollToAnchor("files")

    def _on_job_ended(self, outcome: str) -> None:
        if outcome == "cancelled":
            self._end()
            self.status.setText("Cancelled. What was fetched is kept: Resume continues from there.")
            self._refresh()

    # -- helpers ---------------------------------------------------------------------------------------

    @staticmethod
    def _cancelled_type():
        from engine.errors import Cancelled

        return Cancelled

    def _start(self, worker: Worker, text: str, kind: str) -> None:
        self._kind, self.worker = kind, worker
        self.status.setToolTip("")
        self.job = self.runner.run(
            "get-models",
            worker,
            what=JOB_WORDS[kind],
            done=self._on_job_finished,
            strip=self.strip,
            text=text,
            failed=self._on_job_failed,  # said in the dialog, with the engine's words in the tooltip
            ended=self._on_job_ended,
            cancellable=kind == GET,
        )
        self.progress.setRange(0, 0)  # busy until the first report: asking the hub, checking the folder
        self._update_buttons()
        if kind == GET:
            self.cancel_button.setFocus()

    def _end(self) -> None:
        self.job = None
        self._ended = self._kind

    def _refresh(self) -> None:
        self._fill_list()
        self._on_list_row_changed(self.list.currentRow())
        self._update_buttons()
        if self._ended:  # the end of a job, said once everything shows it
            ended, self._ended = self._ended, ""
            self.job_ended.emit(ended)

    def showEvent(self, event) -> None:  # noqa: N802 - Qt's name
        # Opened again: a model installed or removed meanwhile (by `volsynth models`, a file manager) shows so.
        if self.job is None and not event.spontaneous():
            self._refresh()
        super().showEvent(event)

    def closeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        if self.job is not None:
            self.job.cancel()  # what was fetched stays staged for the next Get
        super().closeEvent(event)
