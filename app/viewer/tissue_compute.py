"""Tissue maps on request for the shown volume (a NIfTI opened from disk, a vault scan, a MAISI or bundle
volume): *Compute Tissue Maps* in the tissue tool bar and the View menu (Ctrl+Shift+T), run in the app's one
worker with a progress bar and a Cancel that stops it at the next stage or fit iteration; the window stays
usable meanwhile. The tool bar then says where the shown volume's maps came from (the model's channels, or
the segmentation's method, version and contrast), or in one line why a volume was refused.
"""

from __future__ import annotations

from PySide6.QtCore import QObject
from PySide6.QtGui import QAction, QActionGroup
from PySide6.QtWidgets import QMenu

from app.core.anatomy_display import stored_check
from app.core.tissue_source import (
    AUTO,
    CONTRAST_CHOICE_TITLES,
    CONTRAST_CHOICES,
    contrast_for,
    maps_source_text,
    segment_and_check,
)
from app.core.vault_items import session_only_maps
from app.core.volumes import VolumeEntry
from app.services import AppServices
from app.services.job_view import JobStrip
from app.services.shortcuts import key_text, set_shortcut
from app.services.workers import Job, Worker
from app.viewer.tissue_toolbar import TissueToolbar
from app.widgets.eliding_label import ElidingLabel
from engine.anatomy.segment import CONTRAST_LABELS
from engine.errors import EngineError


class TissueMapsComputer(QObject):
    """Computes tissue maps of the shown volume on request and says where each volume's maps came from.

    ``toolbar`` (the tissue tool bar) gets the button, the job's progress bar and Cancel, and the source line.
    """

    def __init__(self, services: AppServices, toolbar: TissueToolbar, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.state = services.state
        self.runner = services.runner
        self.toolbar = toolbar
        self.show_status = services.show_status
        self.contrast_choice = AUTO
        self.job: Job | None = None
        self.target: VolumeEntry | None = None  # the volume being segmented (it may no longer be shown)
        self.refused: dict[int, str] = {}  # entry uid -> why its maps could not be made (one line)
        self.notes: dict[int, str] = {}  # entry uid -> how its contrast was chosen, when it was assumed
        self._pending_note = ""  # the running job's note, kept with its maps when they come

        self.compute_action = QAction("Compute Tissue Maps", self)
        self.compute_action.setObjectName("computeTissueMaps")
        self.compute_action.setIconText("Compute tissue maps")
        set_shortcut(self.compute_action, "view.compute_tissue_maps")
        self.compute_action.triggered.connect(self._on_compute_action_triggered)
        self.cancel_action = QAction("Cancel Tissue Maps", self)
        self.cancel_action.setObjectName("cancelTissueMaps")
        self.cancel_action.setIconText("Cancel")
        self.cancel_action.setToolTip("Stop computing the tissue maps")
        self.cancel_action.triggered.connect(self._on_cancel_action_triggered)  # the View menu's entry

        self.contrast_menu = QMenu("Tissue &Map Contrast")
        self.contrast_menu.setObjectName("tissueContrastMenu")
        self.contrast_group = QActionGroup(self)
        for choice in CONTRAST_CHOICES:
            action = self.contrast_menu.addAction(CONTRAST_CHOICE_TITLES[choice])
            action.setCheckable(True)
            action.setChecked(choice == AUTO)
            action.setData(choice)
            self.contrast_group.addAction(action)
        self.contrast_group.triggered.connect(self._on_contrast_group_triggered)

        # The job's progress (its stage in the bar) and Cancel, in the tool bar while it runs.
        self.strip = JobStrip(self, cancel_tip="Stop computing the tissue maps", line_in_bar=True)
        self.progress_bar = self.strip.progress_bar
        self.progress_bar.setObjectName("tissueProgress")
        self.progress_bar.setFixedWidth(220)
        self.source_label = ElidingLabel(max_width=360, min_chars=16)
        self.source_label.setObjectName("tissueSource")
        self.source_label.setContentsMargins(6, 0, 4, 0)

        toolbar.addSeparator()
        toolbar.addAction(self.compute_action)
        self.progress_item = toolbar.addWidget(self.progress_bar)
        self.cancel_item = toolbar.addWidget(self.strip.cancel_button)
        self.source_item = toolbar.addWidget(self.source_label)
        self._set_running(False)

        self.state.shown_changed.connect(self._on_state_shown_changed)
        self.state.volumes_changed.connect(self._on_state_volumes_changed)
        self.state.overlay_changed.connect(self._on_state_overlay_changed)
        self._update()

    # -- what is shown -------------------------------------------------------------------------------

    def source_text(self, entry: VolumeEntry | None) -> str:
        """The tool bar's line for a volume: where its maps came from, why none could be made, or nothing."""
        if entry is None or entry.kind == "preview":
            return ""
        if entry.tissue:
            text = "Maps " + maps_source_text(entry.provenance, entry.kind, entry.vault_item is not None)
            if session_only_maps(entry):  # said where the maps are named, not only in a passing message
                text += " \u00b7 this session only, not kept in the vault"
            check = stored_check(entry.provenance)
            if check is not None and check.get("status") == "not_brain_like":  # said where the maps are shown
                text += " \u00b7 anatomy check: not brain-like"
            note = self.notes.get(entry.uid)
            return f"{text} ({note})" if note else text
        if entry.uid in self.refused:
            return f"No tissue maps: {self.refused[entry.uid]}"
        return ""

    def _update(self) -> None:
        entry = self.state.shown
        running = self.job is not None
        usable = entry is not None and entry.kind != "preview"
        has_maps = entry is not None and usable and bool(entry.tissue)
        model_maps = (
            entry is not None
            and has_maps
            and maps_source_text(entry.provenance, entry.kind) == "from the model's channels"
        )
        self.compute_action.setEnabled(usable and not running and not model_maps)
        keys = key_text("view.compute_tissue_maps")
        if model_maps:
            tip = "This volume has its model's own tissue maps"
        elif has_maps:
            tip = f"Segment this volume again (the contrast from View \u203a Tissue Map Contrast) ({keys})"
        else:
            tip = (
                "Segment the shown brain volume into GM, WM and CSF maps (EM with MNI152 priors; T1w, T2w or "
                f"FLAIR) ({keys})"
            )
        self.compute_action.setToolTip(tip)
        text = self.source_text(entry)
        self.source_label.setText(text)
        self.source_label.setToolTip(text)
        visible = bool(text) and not running
        if visible != self.source_item.isVisible():
            self.source_item.setVisible(visible)
            self.toolbar.contents_changed.emit()

    def _set_running(self, running: bool) -> None:
        self.progress_item.setVisible(running)
        self.cancel_item.setVisible(running)
        self.cancel_action.setVisible(running)
        self.cancel_action.setEnabled(running)
        self.toolbar.contents_changed.emit()

    def _on_state_shown_changed(self, _entry) -> None:
        self._update()

    def _on_state_overlay_changed(self) -> None:
        self._update()

    def _on_state_volumes_changed(self) -> None:
        alive = {entry.uid for entry in self.state.volumes}
        for table in (self.refused, self.notes):
            for uid in [u for u in table if u not in alive]:
                del table[uid]
        self._update()

    # -- computing -----------------------------------------------------------------------------------

    def compute(self, entry: VolumeEntry | None = None) -> Job | None:
        """Start segmenting ``entry`` (default: the shown volume) in the background."""
        entry = entry or self.state.shown
        if entry is None or entry.kind == "preview" or self.job is not None:
            return None
        names = [str(entry.path)] if entry.path is not None else []
        info = entry.vault_item
        if info is not None:
            names += [info.original_name, info.label]
        names.append(entry.name)
        try:
            contrast, note = contrast_for(entry.provenance, names, self.contrast_choice)
        except EngineError as exc:
            self._refuse(entry, str(exc))
            return None
        self.target = entry
        self.notes.pop(entry.uid, None)
        self._pending_note = note
        self.refused.pop(entry.uid, None)
        worker = Worker.reporting_call(segment_and_check, entry.data, entry.affine, entry.space, contrast)
        self.job = self.runner.run(
            "tissue-maps",
            worker,
            what="Tissue maps",
            done=self._on_job_finished,
            strip=self.strip,
            failed=self._on_job_failed,  # said in the tool bar's line, where the maps would be named
            ended=self._on_job_ended,
        )
        self._set_running(True)
        self._update()
        self.show_status(
            f"Computing tissue maps of \u201c{entry.name}\u201d as {CONTRAST_LABELS[contrast]}\u2026"
        )
        return self.job

    def cancel(self) -> None:
        if self.job is not None:
            self.job.cancel()
            self.cancel_action.setEnabled(False)

    def _refuse(self, entry: VolumeEntry, reason: str) -> None:
        reason = " ".join(reason.split())  # one line, whatever the engine said
        # The engine's advice names the command line's option; here the contrast is set in the View menu.
        reason = reason.replace("check --contrast", "choose it in View \u203a Tissue Map Contrast")
        self.refused[entry.uid] = reason
        self._update()
        self.show_status(f"No tissue maps for \u201c{entry.name}\u201d: {reason}", 15000)

    def _on_compute_action_triggered(self) -> None:
        self.compute()

    def _on_cancel_action_triggered(self) -> None:
        self.cancel()

    def _on_contrast_group_triggered(self, action: QAction) -> None:
        self.contrast_choice = action.data()

    def _on_job_finished(self, value) -> None:
        maps, made, check = value
        entry = self.target
        if entry is None or entry not in self.state.volumes:
            return  # removed from the session meanwhile
        entry.tissue = dict(maps)
        entry.provenance = {**entry.provenance, "tissue_maps_made": made, "anatomy_check": check}
        if self._pending_note:
            self.notes[entry.uid] = self._pending_note
        self.state.volumes_changed.emit()  # the session list's description names the maps
        if self.state.shown is entry:
            self.state.shown_changed.emit(entry)
            self.state.set_show_tissue(True)  # asked for: shown at once
        source = maps_source_text(entry.provenance, entry.kind, entry.vault_item is not None)
        note = f" ({self._pending_note})" if self._pending_note else ""
        if (
            entry.vault_item is not None
        ):  # computed for this session; the vault keeps them only when asked there
            note += "; in this session only: the vault browser's Compute Tissue Maps keeps them with the item"
        self.show_status(f"Tissue maps of \u201c{entry.name}\u201d: {source}{note}", 10000)

    def _on_job_failed(self, message: str) -> None:
        if self.target is not None:
            self._refuse(self.target, message)

    def _on_job_ended(self, _outcome: str) -> None:
        self.job = None
        self.target = None
        self._set_running(False)
        self._update()


def install_tissue_maps(services: AppServices, toolbar: TissueToolbar) -> TissueMapsComputer:
    """Add Compute Tissue Maps to the tissue tool bar ``toolbar`` and the View menu (with Tissue Map
    Contrast), right after the overlay's own entry."""
    computer = TissueMapsComputer(services, toolbar, services.parent)
    menu = services.menus.view
    after = toolbar.tissue_action
    actions = menu.actions()
    before = (
        actions[actions.index(after) + 1]
        if after in actions and actions.index(after) + 1 < len(actions)
        else None
    )
    for action in (computer.compute_action, computer.cancel_action, computer.contrast_menu.menuAction()):
        if before is None:
            menu.addAction(action)
        else:
            menu.insertAction(before, action)
    return computer
