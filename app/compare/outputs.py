"""Where a finished comparison goes from the Compare window: into the session list (A and B with their
provenance), a CSV file of its numbers table, or a folder of its volumes and ``compare.json``."""

from __future__ import annotations

import csv
from pathlib import Path

from PySide6.QtWidgets import QFileDialog

CSV_DIR_KEY = "compare/csv_dir"  # QSettings: the folder of the last exported table


class ComparisonOutputs:
    """The Compare window's Add to Session, Export Table as CSV and Save actions, as a mixin of
    ``CompareWindow``: it uses the window's ``app`` (CompareServices), ``comparison``, ``table_rows``,
    ``progress_label``, ``save_button`` and ``csv_written`` signal, and keeps the open CSV dialog in
    ``csv_dialog``."""

    def add_to_session(self) -> None:
        if self.comparison is None:
            return
        seed = self.comparison.a.result.request.seed
        for side in (self.comparison.a, self.comparison.b):
            self.app.state.add_result(side.result, label=f"seed {seed} \u00b7 {side.label}")
        self.app.show_status("Added A and B to the session", 5000)

    def _on_export_clicked(self) -> None:
        """Ask for a file name (Qt's own dialog, so it behaves the same everywhere) and write the CSV."""
        dialog = QFileDialog(self, "Export Comparison Table as CSV")
        dialog.setObjectName("compareCsvDialog")
        dialog.setAcceptMode(QFileDialog.AcceptMode.AcceptSave)
        dialog.setFileMode(QFileDialog.FileMode.AnyFile)
        dialog.setOption(QFileDialog.Option.DontUseNativeDialog, True)
        dialog.setNameFilter("CSV files (*.csv)")
        dialog.setDefaultSuffix("csv")
        folder = self.app.settings.value(CSV_DIR_KEY, "", type=str)
        if folder and Path(folder).is_dir():
            dialog.setDirectory(folder)
        dialog.selectFile("comparison.csv")
        dialog.fileSelected.connect(self.export_csv)
        dialog.finished.connect(dialog.deleteLater)
        self.csv_dialog = dialog
        dialog.open()

    def export_csv(self, path) -> Path | None:
        """Write the numbers table to ``path`` (header row, then one row per line of the table)."""
        if not self.table_rows or not path:
            return None
        path = Path(path)
        try:
            with path.open("w", newline="", encoding="utf-8") as handle:
                csv.writer(handle).writerows(self.table_rows)
        except OSError as exc:
            self.app.show_error("Could not export the table", f"{path}: {exc.strerror or exc}")
            return None
        self.app.settings.setValue(CSV_DIR_KEY, str(path.parent))
        self.progress_label.setText(f"Table written to {path}")
        self.app.show_status(f"Comparison table written to {path}", 10000)
        self.csv_written.emit(str(path))
        return path

    def _on_save_clicked(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Save Comparison To Folder")
        if folder:
            self.save_to(folder)

    def save_to(self, folder) -> None:
        """Write the comparison's files in a worker thread (``engine.compare.save_comparison``)."""
        if self.comparison is None:
            return
        from engine.compare import save_comparison

        self.save_button.setEnabled(False)
        self.app.runner.run_task(
            "save-compare",
            save_comparison,
            self.comparison,
            folder,
            finished=self._on_saved,
            failed=self._on_save_failed,
        )

    def _on_saved(self, paths) -> None:
        self.save_button.setEnabled(self.comparison is not None)
        folder = paths[0].parent if paths else ""
        self.progress_label.setText(f"Saved {len(paths)} files to {folder}")
        self.app.show_status(f"Comparison saved to {folder}", 10000)

    def _on_save_failed(self, message: str) -> None:
        self.save_button.setEnabled(self.comparison is not None)
        self.app.show_error("Could not save the comparison", message)
