"""Where a finished comparison goes from the Compare window: into the session list (A and B with their
provenance), a CSV file of its numbers table, or a folder of its volumes and ``compare.json``."""

from __future__ import annotations

import csv
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QFileDialog, QWidget

from app.services import AppServices

CSV_DIR_KEY = "compare/csv_dir"  # QSettings: the folder of the last exported table


class ComparisonOutputs(QObject):
    """The Compare window's Add to Session, Export Table as CSV and Save.

    ``window`` is the parent of the file dialogs; ``say(text)`` writes the window's progress line; each call
    is given the comparison (and the table's rows) it writes.
    """

    csv_written = Signal(str)  # the path of an exported table
    saved = Signal()  # a save ended (written or not): Save may be offered again

    def __init__(self, services: AppServices, window: QWidget, say: Callable[[str], None]) -> None:
        super().__init__(window)
        self.services, self.window, self.say = services, window, say
        self.csv_dialog: QFileDialog | None = None

    def add_to_session(self, comparison: Any) -> None:
        seed = comparison.a.result.request.seed
        for side in (comparison.a, comparison.b):
            self.services.state.add_result(side.result, label=f"seed {seed} \u00b7 {side.label}")
        self.services.show_status("Added A and B to the session", 5000)

    def ask_csv_path(self, rows: Sequence[Sequence[str]]) -> None:
        """Ask for a file name (Qt's own dialog, so it behaves the same everywhere) and write ``rows`` there."""
        dialog = QFileDialog(self.window, "Export Comparison Table as CSV")
        dialog.setObjectName("compareCsvDialog")
        dialog.setAcceptMode(QFileDialog.AcceptMode.AcceptSave)
        dialog.setFileMode(QFileDialog.FileMode.AnyFile)
        dialog.setOption(QFileDialog.Option.DontUseNativeDialog, True)
        dialog.setNameFilter("CSV files (*.csv)")
        dialog.setDefaultSuffix("csv")
        folder = self.services.settings.value(CSV_DIR_KEY, "", type=str)
        if folder and Path(str(folder)).is_dir():
            dialog.setDirectory(str(folder))
        dialog.selectFile("comparison.csv")
        dialog.fileSelected.connect(lambda path: self.export_csv(path, rows))
        dialog.finished.connect(dialog.deleteLater)
        self.csv_dialog = dialog
        dialog.open()

    def export_csv(self, path: str | Path, rows: Sequence[Sequence[str]]) -> Path | None:
        """Write the numbers table to ``path`` (header row, then one row per line of the table)."""
        if not rows or not path:
            return None
        path = Path(path)
        try:
            with path.open("w", newline="", encoding="utf-8") as handle:
                csv.writer(handle).writerows(rows)
        except OSError as exc:
            self.services.show_error("Could not export the table", f"{path}: {exc.strerror or exc}")
            return None
        self.services.settings.setValue(CSV_DIR_KEY, str(path.parent))
        self.say(f"Table written to {path}")
        self.services.show_status(f"Comparison table written to {path}", 10000)
        self.csv_written.emit(str(path))
        return path

    def ask_folder(self, comparison: Any) -> None:
        folder = QFileDialog.getExistingDirectory(self.window, "Save Comparison To Folder")
        if folder:
            self.save_to(comparison, folder)

    def save_to(self, comparison: Any, folder: str | Path) -> None:
        """Write the comparison's files in a worker thread (``engine.compare.save_comparison``)."""
        from engine.compare import save_comparison

        self.services.runner.run_task(
            "save-compare",
            save_comparison,
            comparison,
            folder,
            finished=self._on_saved,
            failed=self._on_save_failed,
        )

    def _on_saved(self, paths: list[Path]) -> None:
        folder = paths[0].parent if paths else ""
        self.say(f"Saved {len(paths)} files to {folder}")
        self.services.show_status(f"Comparison saved to {folder}", 10000)
        self.saved.emit()

    def _on_save_failed(self, message: str) -> None:
        self.services.show_error("Could not save the comparison", message)
        self.saved.emit()
