"""The session: models, volumes, what is shown, the running job, display settings (Qt-free).

Widgets subscribe to the ``Event`` attributes and call methods here instead of talking to each other,
so the logic is testable without a ``QApplication`` (see tests/app/core/test_state.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from app.core.display import modality_title
from app.core.events import Event
from app.core.generation_form import GenerationForm
from app.core.progress import ProgressTracker
from app.core.tissue import ALL_TISSUES, DEFAULT_OPACITY
from app.core.volumes import WINDOW_PRESETS, VolumeEntry, ras_to_voxel, voxel_to_ras, window_for_preset
from engine.api.optimization_config import OptimizationConfig
from engine.errors import InvalidRequest

CONVENTIONS = ("radiological", "neurological")

RENDER_PRESETS = ("MRI grey", "MIP", "Iso-surface", "Slices only")

MAX_RECENT = 10


class RecentFiles:
    """Most recent first, no duplicates, at most ``limit`` entries."""

    def __init__(self, paths: Iterable[str] = (), limit: int = MAX_RECENT) -> None:
        self.limit = limit
        self._paths: list[str] = []
        for path in reversed(list(paths)):
            self.add(path)

    def add(self, path: str | Path) -> None:
        text = str(Path(path).expanduser().resolve())
        if text in self._paths:
            self._paths.remove(text)
        self._paths.insert(0, text)
        del self._paths[self.limit :]

    def remove(self, path: str | Path) -> None:
        text = str(path)
        if text in self._paths:
            self._paths.remove(text)

    def paths(self) -> list[str]:
        return list(self._paths)


def settings_name(requested: dict) -> str:
    """The requested optimization settings as Compare and ``volsynth bench`` name their rows (``bf16+sdpa``,
    ``cache:k3-l1-f``), "" for plain fp32. Settings this engine does not know (a newer server's) are named by
    their values, joined with "+"."""
    try:
        summary = OptimizationConfig.from_dict(requested).summary()
    except (InvalidRequest, TypeError, ValueError):
        changed = [
            str(value) if not isinstance(value, bool) else name
            for name, value in requested.items()
            if value not in (None, False, "default") and name != "psnr_budget_db"
        ]
        return "+".join(changed)
    return "" if summary == "fp32" else summary


def default_result_name(provenance: dict, seed: int) -> str:
    """``brain-t1-demo seed 7 · bf16`` or ``brain-t1-demo seed 7 · 14:03:22``: the seed, then what set the
    run apart (its optimization settings by their Compare name when not plain fp32, else the time it
    finished)."""
    model = (provenance.get("model") or {}).get("id", "model")
    requested = (provenance.get("optimization") or {}).get("requested") or {}
    tag = settings_name(dict(requested)) or time.strftime("%H:%M:%S")
    # A model that makes several contrasts (NV-Generate-MR-Brain) says which, so a T1w and a T2w differ.
    modality = (provenance.get("output") or {}).get("modality")
    contrast = f" {modality_title(str(modality))}" if modality else ""
    return f"{model}{contrast} seed {seed} · {tag}"


class AppState:
    """The session: models, volumes, what is shown, the running job, display settings.

    Events (arguments in brackets):
        models_changed(), model_selected(source), volumes_changed(), shown_changed(entry | None),
        crosshair_changed(ras), window_changed(window, level), display_changed(), overlay_changed() (the
        tissue overlay), job_changed(running), progress_changed(tracker), status(text).
    """

    def __init__(self) -> None:
        self.models: list[Any] = []  # engine ModelSource
        self.form = GenerationForm()  # what the next generation will be; it holds the selected model
        self.volumes: list[VolumeEntry] = []
        self.shown: VolumeEntry | None = None
        self.crosshair_ras = np.zeros(3)
        self.window: tuple[float, float] = (1.0, 0.5)  # (window, level)
        self.window_preset = WINDOW_PRESETS[0]
        self.convention = "radiological"
        self.render_preset = RENDER_PRESETS[0]
        self.iso_fraction = 0.35  # iso-surface threshold as a fraction of the shown volume's range
        self.smooth_display = True  # smooth (bilinear) or nearest-neighbour slice display
        self.show_crosshair = True
        self.custom_window: tuple[float, float] | None = None  # the last window/level set by hand
        # Tissue overlay of the slice views (volumes with tissue maps): on/off, which map, how opaque.
        self.show_tissue = False
        self.tissue_choice = ALL_TISSUES  # a map's name, or ALL_TISSUES for the label map
        self.tissue_opacity = DEFAULT_OPACITY
        self.recent = RecentFiles()
        self.job_running = False
        self.follow_previews = True  # show a run's previews; off once the user picks a volume during it
        self.progress = ProgressTracker()

        self.models_changed = Event()
        self.model_selected = Event()
        self.volumes_changed = Event()
        self.shown_changed = Event()
        self.crosshair_changed = Event()
        self.window_changed = Event()
        self.display_changed = Event()
        self.overlay_changed = Event()
        self.job_changed = Event()
        self.progress_changed = Event()
        self.status = Event()
        self.form.changed.connect(self._on_form_changed)

    # -- models --------------------------------------------------------------------------------------

    def set_models(self, sources: list[Any], preferred: str | None = None) -> str:
        """Replace the model list and select ``preferred`` (or the first). Returns a note for the status bar."""
        self.models = list(sources)
        self.models_changed.emit()
        note = ""
        pick = next((s for s in self.models if s.id == preferred), None) if preferred else None
        if pick is None and self.models:
            pick = self.models[0]
            if preferred:
                note = f"Model {preferred!r} is not installed; using {pick.id!r} instead."
        if not self.models:
            note = "No models found. Use Generate > Open model folder... to add one."
        self.select_model(pick)
        return note

    def add_model(self, source: Any) -> None:
        self.models = [m for m in self.models if m.id != source.id] + [source]
        self.models_changed.emit()
        self.select_model(source)

    def add_models(self, sources: list[Any]) -> None:
        """Add models to the list without selecting any (e.g. an engine server's)."""
        known = {m.id for m in self.models}
        self.models = self.models + [s for s in sources if s.id not in known]
        self.models_changed.emit()

    def remove_models(self, sources: list[Any]) -> None:
        """Take models out of the list; if the selected one goes, the first that stays is selected."""
        self.models = [m for m in self.models if all(m is not s for s in sources)]
        self.models_changed.emit()
        if self.selected_model is not None and any(self.selected_model is s for s in sources):
            self.select_model(self.models[0] if self.models else None)

    @property
    def selected_model(self) -> Any | None:
        return self.form.model

    def select_model(self, source: Any | None) -> None:
        self.form.set_model(source)

    def _on_form_changed(self, name: str) -> None:
        if name == "model":
            self.model_selected.emit(self.form.model)
            if self.form.switch_note:  # what the switch reset or dropped: said, not done silently
                self.status.emit(self.form.switch_note)

    def model_by_id(self, model_id: str) -> Any | None:
        return next((m for m in self.models if m.id == model_id), None)

    # -- volumes -------------------------------------------------------------------------------------

    def add_volume(self, entry: VolumeEntry, show: bool = True) -> VolumeEntry:
        self.volumes.append(entry)
        self.volumes_changed.emit()
        if entry.path is not None:
            self.recent.add(entry.path)
        if show:
            self.show(entry)
        return entry

    def add_result(self, result: Any, label: str = "", show: bool = True) -> list[VolumeEntry]:
        """Add every volume of an engine ``SamplingResult`` to the session; shows the first if ``show``."""
        entries = []
        prov = result.provenance
        base = label or default_result_name(prov, result.request.seed)
        count = result.volumes.shape[0]
        for index in range(count):
            member = result.member(
                index
            )  # the engine's record: image, affine, tissue maps, provenance, space
            member.data = np.ascontiguousarray(member.data, dtype=np.float32)
            if member.data.ndim == 4:  # multi-channel: show channel 0
                member.data = member.data[0]
            member.affine = np.asarray(member.affine)
            # the tissue maps decoded with the image, {} for a model without
            member.tissue = {
                name: np.ascontiguousarray(a, dtype=np.float32) for name, a in member.tissue.items()
            }
            name = self.unique_name(base if count == 1 else f"{base} #{index + 1}")
            entries.append(VolumeEntry(name, volume=member, kind="generated"))
        for index, entry in enumerate(entries):
            self.add_volume(entry, show=show and index == 0)
        return entries

    def unique_name(self, name: str) -> str:
        """``name``, or ``name (2)``, ``name (3)``... if the session already has a volume called that."""
        taken = {entry.name for entry in self.volumes}
        candidate, number = name, 2
        while candidate in taken:
            candidate, number = f"{name} ({number})", number + 1
        return candidate

    def declare_space(self, entry: VolumeEntry, space: str) -> None:
        """Say that ``entry``'s millimetres are ``space``'s (a user's declaration, e.g. ``DECLARED_MNI`` for a
        header that says only "aligned to a template"); views of it and links to it follow."""
        entry.space = space
        if self.shown is entry:
            self.shown_changed.emit(entry)
        self.volumes_changed.emit()

    def rename_volume(self, entry: VolumeEntry, name: str) -> str:
        """Rename a volume (blank names are refused: the old name stays); returns the name it now has."""
        if entry not in self.volumes:
            return entry.name
        name = " ".join(str(name).split())
        if name and name != entry.name:
            entry.name = self.unique_name(name)
            if self.shown is entry:
                self.shown_changed.emit(entry)
        self.volumes_changed.emit()  # views redraw: a refused name shows the old one again
        return entry.name

    def mark_saved(self, entry: VolumeEntry, saved_to: str, file: Path | None = None) -> None:
        """Record that ``entry`` was written to ``saved_to`` (a file, or the vault); views redraw its mark."""
        entry.saved = True
        entry.saved_to = saved_to
        if file is not None:
            entry.saved_file = Path(file)
        self.volumes_changed.emit()
        if self.shown is entry:
            self.shown_changed.emit(entry)

    def remove_volume(self, entry: VolumeEntry) -> None:
        if entry in self.volumes:
            self.volumes.remove(entry)
            self.volumes_changed.emit()
            if self.shown is entry:
                self.show(self.volumes[-1] if self.volumes else None)

    def shown_volume(self) -> VolumeEntry:
        """The shown volume, for code that only runs while one is shown (a drag on the image, a readout)."""
        if self.shown is None:
            raise RuntimeError("no volume is shown")
        return self.shown

    def show(self, entry: VolumeEntry | None) -> None:
        """Show a volume (or a transient preview). Keeps the crosshair if it still lies inside."""
        previous = self.shown
        self.shown = entry
        if entry is not None:
            same_geometry = (
                previous is not None
                and previous.shape == entry.shape
                and np.allclose(previous.affine, entry.affine)
            )
            # Keep the crosshair between volumes of one geometry and between previews and their result
            # (same anatomy, different sampling); otherwise start at the centre of the new volume.
            related = previous is not None and (same_geometry or "preview" in (previous.kind, entry.kind))
            if not (related and entry.contains_ras(self.crosshair_ras)):
                self.crosshair_ras = entry.center_ras()
            keep_window = entry.kind == "preview" or (same_geometry and self.window_preset == "Custom")
            if not keep_window:
                self.window = window_for_preset(
                    entry, self.window_preset if self.window_preset != "Custom" else WINDOW_PRESETS[0]
                )
        self.shown_changed.emit(entry)
        if entry is not None:
            self.crosshair_changed.emit(self.crosshair_ras)
            self.window_changed.emit(*self.window)

    def show_preview(self, data: np.ndarray, affine: np.ndarray, step: int, total: int) -> VolumeEntry:
        entry = VolumeEntry(
            name=f"preview (step {step}/{total})",
            data=np.asarray(data, dtype=np.float32),
            affine=affine,
            kind="preview",
            synthetic=True,
            preview_step=(step, total),
        )
        first_preview = self.shown is None or self.shown.kind != "preview"
        self.show(entry)
        if first_preview:  # previews change range as noise clears: start from auto and let the user adjust
            self.set_window(*window_for_preset(entry, "Auto (1-99%)"), preset=self.window_preset)
        return entry

    # -- view ----------------------------------------------------------------------------------------

    def set_crosshair(self, ras: Iterable[float]) -> None:
        ras = np.asarray(list(ras), dtype=np.float64)
        if self.shown is not None:  # clamp to the volume so the crosshair never leaves it
            ijk = np.clip(np.round(ras_to_voxel(self.shown.affine, ras)), 0, np.asarray(self.shown.shape) - 1)
            ras = voxel_to_ras(self.shown.affine, ijk)
        if np.allclose(ras, self.crosshair_ras):
            return
        self.crosshair_ras = ras
        self.crosshair_changed.emit(ras)

    def crosshair_voxel(self) -> tuple[int, int, int] | None:
        if self.shown is None:
            return None
        ijk = np.clip(
            np.round(ras_to_voxel(self.shown.affine, self.crosshair_ras)), 0, np.asarray(self.shown.shape) - 1
        )
        return tuple(int(v) for v in ijk)  # type: ignore[return-value]

    def set_window(self, window: float, level: float, preset: str = "Custom") -> None:
        window = max(float(window), 1e-6)
        self.window = (window, float(level))
        self.window_preset = preset
        if preset == "Custom" and (self.shown is None or self.shown.kind != "preview"):
            self.custom_window = self.window
        self.window_changed.emit(*self.window)

    def apply_window_preset(self, preset: str) -> None:
        if preset == "Custom":  # back to the window/level last set by hand (or keep the current one)
            self.set_window(*(self.custom_window or self.window))
            return
        self.window_preset = preset
        if self.shown is not None:
            self.set_window(*window_for_preset(self.shown, preset), preset=preset)

    def set_convention(self, convention: str) -> None:
        if convention not in CONVENTIONS:
            raise ValueError(f"convention must be one of {CONVENTIONS}")
        if convention != self.convention:
            self.convention = convention
            self.display_changed.emit()

    def set_render_preset(self, preset: str) -> None:
        if preset not in RENDER_PRESETS:
            raise ValueError(f"render preset must be one of {RENDER_PRESETS}")
        self.render_preset = preset
        self.display_changed.emit()

    def set_iso_fraction(self, fraction: float) -> None:
        self.iso_fraction = float(min(max(fraction, 0.0), 1.0))
        self.display_changed.emit()

    def iso_range(self) -> tuple[float, float] | None:
        """The iso-surface threshold's range in the shown volume's intensities (1st to 99.9th percentile)."""
        if self.shown is None:
            return None
        low, high = self.shown.percentile(1.0), self.shown.percentile(99.9)
        return (low, high) if high > low else (low, low + 1.0)

    def iso_threshold(self) -> float | None:
        span = self.iso_range()
        return None if span is None else span[0] + self.iso_fraction * (span[1] - span[0])

    def set_iso_threshold(self, value: float) -> None:
        """Set the iso-surface threshold in intensity units of the shown volume."""
        span = self.iso_range()
        if span is not None:
            self.set_iso_fraction((float(value) - span[0]) / (span[1] - span[0]))

    def set_smooth_display(self, smooth: bool) -> None:
        if bool(smooth) != self.smooth_display:
            self.smooth_display = bool(smooth)
            self.display_changed.emit()

    def set_show_crosshair(self, show: bool) -> None:
        if bool(show) != self.show_crosshair:
            self.show_crosshair = bool(show)
            self.display_changed.emit()

    # -- tissue overlay ------------------------------------------------------------------------------

    def set_show_tissue(self, show: bool) -> None:
        if bool(show) != self.show_tissue:
            self.show_tissue = bool(show)
            self.overlay_changed.emit()

    def set_tissue_choice(self, choice: str) -> None:
        """Which map the overlay shows: a map's name, or ``ALL_TISSUES`` (the most likely class)."""
        if str(choice) != self.tissue_choice:
            self.tissue_choice = str(choice)
            self.overlay_changed.emit()

    def set_tissue_opacity(self, opacity: float) -> None:
        opacity = float(min(max(opacity, 0.0), 1.0))
        if opacity != self.tissue_opacity:
            self.tissue_opacity = opacity
            self.overlay_changed.emit()

    def tissue_shown(self) -> str | None:
        """What the slice views overlay on the shown volume now: a map's name, ``ALL_TISSUES``, or None
        (overlay off, or a volume without maps). A choice the volume lacks falls back to all tissues."""
        entry = self.shown
        if not self.show_tissue or entry is None or not entry.tissue:
            return None
        return self.tissue_choice if self.tissue_choice in entry.tissue else ALL_TISSUES

    def replace_volume(self, old: VolumeEntry, new: VolumeEntry) -> bool:
        """Put ``new`` where ``old`` is in the session (another time point of a 4D file) and show it.

        Returns False, changing nothing, when ``old`` has left the session meanwhile.
        """
        if old not in self.volumes:
            return False
        self.volumes[self.volumes.index(old)] = new
        self.volumes_changed.emit()
        if self.shown is old:
            self.show(new)
        return True

    # -- job -----------------------------------------------------------------------------------------

    def set_job_running(self, running: bool) -> None:
        if running:
            self.progress.reset()
        self.job_running = running
        self.job_changed.emit(running)

    def report_progress(self, stage: str, step: int, total: int, elapsed_s: float, message: str = "") -> None:
        self.progress.update(stage, step, total, elapsed_s, message)
        self.progress_changed.emit(self.progress)
