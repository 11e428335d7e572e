"""Opening and saving NIfTI volumes from the main window: File > Open, Save, Save As, Open Recent, drops.

The reads and writes run in the background (``JobRunner.run_task``); a read volume joins the session and is
shown, a written one is marked saved. The recent-files list lives in the settings (``files/recent``).

A volume decrypted from the vault is never written here: Save and Save As hand it to the vault's boundary
(``app.vault.boundary``), which offers the audited ways out, and so it never reaches Open Recent.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtWidgets import QFileDialog, QMenu, QWidget

from app.core.nifti_files import open_volume
from app.core.volumes import VolumeEntry, file_stem, saved_volume
from app.vault.privacy import remember_recent
from engine.nifti.io import is_nifti, save_volume
from engine.nifti.volume import Volume

if TYPE_CHECKING:
    from app.vault.boundary import VaultBoundary

log = logging.getLogger(__name__)

NIFTI_FILTER = "NIfTI volumes (*.nii *.nii.gz);;All files (*)"
RECENT_KEY = "files/recent"


class VolumeFiles:
    """The window's file commands. ``volume_opened(entry)`` is told of each volume read from a file;
    ``parent`` is the widget the file dialogs belong to."""

    def __init__(
        self,
        state,
        runner,
        settings,
        *,
        show_status: Callable[..., None],
        show_error: Callable[[str, str], None],
        volume_opened: Callable[[VolumeEntry], None],
        parent: QWidget,
    ) -> None:
        self.state, self.runner, self.settings = state, runner, settings
        self.show_status, self.show_error, self.volume_opened = show_status, show_error, volume_opened
        self.dialog_parent = parent  # the widget the file dialogs belong to
        self.recent_menu = QMenu("Open &Recent", parent)
        # Where a vault item's Save goes instead (the window sets it once the vault is installed).
        self.vault_boundary: VaultBoundary | None = None

    # -- opening -------------------------------------------------------------------------------------

    def open_file_dialog(self) -> None:
        start = self.settings.value("files/last_dir", str(Path.home()), type=str)
        paths, _ = QFileDialog.getOpenFileNames(self.dialog_parent, "Open NIfTI volume", start, NIFTI_FILTER)
        for path in paths:
            self.open_path(path)

    def open_path(self, path: str | Path) -> None:
        """Load a NIfTI file (and the tissue maps beside it) in the background; it joins the session and is
        shown when read."""
        path = Path(path)
        if remember_recent(self.settings):  # (Vault > Remember Recent Files and Folders)
            self.settings.setValue("files/last_dir", str(path.parent))
        self.show_status(f"Opening {path.name}...")
        self.runner.run_task(
            "open",
            open_volume,
            path,
            finished=self._on_file_loaded,
            failed=partial(self._on_file_failed, path),
        )

    def _on_file_loaded(self, opened: Volume) -> None:
        name = opened.path.name if opened.path else "volume"
        entry = VolumeEntry(name, volume=opened, kind="opened")
        self.state.add_volume(entry)
        self.rebuild_recent_menu()
        self.save_recent()
        message = f"Opened {name}"
        if entry.tissue:
            message += f" with tissue maps {', '.join(entry.tissue_names)}"
        for note in opened.notes:
            log.warning("%s: %s", name, note)
        if opened.notes:  # said, never fatal: the image and the other maps are there
            more = f" (and {len(opened.notes) - 1} more; see the log)" if len(opened.notes) > 1 else ""
            message += f"; {opened.notes[0]}{more}"
        self.show_status(message, 15000 if opened.notes else 5000)
        self.volume_opened(entry)

    def _on_file_failed(self, path: Path, message: str) -> None:
        self.show_status(f"Could not open {path.name}", 5000)
        self.show_error("Cannot open file", message)

    # -- saving --------------------------------------------------------------------------------------

    def save_shown(self) -> None:
        """File > Save (Ctrl+S): write the shown volume to the file it was saved to, or ask where first."""
        entry = self.state.shown
        if entry is None or entry.kind == "preview" or self._leaves_vault(entry):
            return
        if entry.saved_file is not None:
            self.save_entry(entry, entry.saved_file)
        else:
            self.save_file_dialog()

    def save_file_dialog(self) -> None:
        entry = self.state.shown
        if entry is None or entry.kind == "preview" or self._leaves_vault(entry):
            return
        start_dir = self.settings.value("files/last_save_dir", str(Path.home()), type=str)
        stem = file_stem(entry.name)
        path, _ = QFileDialog.getSaveFileName(
            self.dialog_parent, "Save volume as NIfTI", str(Path(start_dir) / f"{stem}.nii.gz"), NIFTI_FILTER
        )
        if path:
            if not is_nifti(path):
                path += ".nii.gz"
            self.save_entry(entry, path)

    def save_entry(self, entry: VolumeEntry, path: str | Path) -> None:
        """Write a session volume as NIfTI + JSON provenance sidecar, and its tissue maps beside it (all or
        none), in the background. A vault item is not written: the vault's boundary asks how it leaves."""
        if self._leaves_vault(entry):
            return
        path = Path(path)
        if remember_recent(self.settings):
            self.settings.setValue("files/last_save_dir", str(path.parent))
        self.show_status(f"Saving {path.name}...")
        volume = saved_volume(entry)
        write = partial(save_volume, volume, path)
        self.runner.run_task(
            "save",
            write,
            finished=partial(self._on_file_saved, entry),
            failed=partial(self._on_save_failed, path),
        )

    def _leaves_vault(self, entry: VolumeEntry) -> bool:
        """For a volume from the vault, hand Save to the vault's boundary (it asks, then exports or writes an
        audited copy) and say True: nothing is written here."""
        if entry.vault_item is None:
            return False
        if self.vault_boundary is not None:
            self.vault_boundary.save(entry)
        else:  # no vault in this window: refuse rather than write patient data unaudited
            self.show_error(
                "Cannot save", f"\u201c{entry.name}\u201d is from the vault; export it from the vault."
            )
        return True

    def _on_file_saved(self, entry: VolumeEntry, path) -> None:
        self.state.mark_saved(entry, str(path), file=path)
        self.state.recent.add(path)
        self.rebuild_recent_menu()
        self.save_recent()
        maps = f" and {len(entry.tissue)} tissue maps" if entry.tissue else ""
        self.show_status(f"Saved {path} (+ provenance sidecar{maps})", 8000)

    def _on_save_failed(self, path: Path, message: str) -> None:
        self.show_error("Cannot save", message)

    # -- recent files and drops ----------------------------------------------------------------------

    def restore_recent(self) -> None:
        try:
            recent = json.loads(self.settings.value(RECENT_KEY, "[]", type=str))
        except (TypeError, ValueError):
            recent = []
        for path in reversed(recent):
            if isinstance(path, str):
                self.state.recent.add(path)
        self.rebuild_recent_menu()

    def rebuild_recent_menu(self) -> None:
        self.recent_menu.clear()
        paths = self.state.recent.paths()
        for path in paths:
            action = self.recent_menu.addAction(Path(path).name)
            action.setToolTip(path)
            action.setStatusTip(path)
            action.triggered.connect(partial(self.open_path, path))
        self.recent_menu.setEnabled(bool(paths))

    def save_recent(self) -> None:
        self.settings.setValue(RECENT_KEY, json.dumps(self.state.recent.paths()))

    @staticmethod
    def dropped_niftis(event) -> list[str]:
        """The NIfTI files among a drag's URLs."""
        urls = event.mimeData().urls() if event.mimeData().hasUrls() else []
        return [url.toLocalFile() for url in urls if is_nifti(url.toLocalFile())]
