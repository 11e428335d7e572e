"""Qt-free application state: what is selected, running and shown.

Widgets subscribe to the ``Event`` attributes and call methods here instead of talking to each other,
so the logic below is testable without a ``QApplication`` (see tests/app/test_state.py). Nothing in this
module imports Qt, pyvista or torch.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engine.peak_memory import format_bytes  # noqa: F401 - re-exported for the app's panels

CONVENTIONS = ("radiological", "neurological")
WINDOW_PRESETS = ("Auto (1-99%)", "Full range", "Soft (0.5-99.5%)", "High contrast (10-90%)")
RENDER_PRESETS = ("MRI grey", "MIP", "Iso-surface", "Slices only")
MAX_RECENT = 10
REMOTE_PREFIX = "remote:"  # device ids of engine servers: "remote:http://host:port" (app/remote)


class Event:
    """A minimal observer list: ``event.connect(callback)``; ``event.emit(*args)`` calls them in order."""

    def __init__(self) -> None:
        self._callbacks: list[Callable[..., Any]] = []

    def connect(self, callback: Callable[..., Any]) -> None:
        if callback not in self._callbacks:
            self._callbacks.append(callback)

    def disconnect(self, callback: Callable[..., Any]) -> None:
        if callback in self._callbacks:
            self._callbacks.remove(callback)

    def emit(self, *args: Any) -> None:
        for callback in list(self._callbacks):
            callback(*args)


_uids = itertools.count(1)


@dataclass(eq=False)
class VolumeEntry:
    """A volume in this session: generated, opened from disk, or a transient denoising preview."""

    name: str
    data: np.ndarray  # float32 (x, y, z), RAS+
    affine: np.ndarray  # voxel -> RAS mm
    kind: str = "opened"  # "generated", "opened" or "preview"
    path: Path | None = None
    provenance: dict[str, Any] = field(default_factory=dict)
    synthetic: bool = False
    uid: int = field(default_factory=lambda: next(_uids))
    saved: bool = (
        False  # the user wrote it to a file or the vault in this session (crash recovery lets it go)
    )
    _percentiles: dict[float, float] = field(default_factory=dict, repr=False)

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(int(s) for s in self.data.shape[:3])  # type: ignore[return-value]

    @property
    def spacing(self) -> tuple[float, float, float]:
        return tuple(float(v) for v in np.sqrt((np.asarray(self.affine)[:3, :3] ** 2).sum(axis=0)))  # type: ignore[return-value]

    def percentile(self, q: float) -> float:
        """Intensity percentile, cached (the volume never changes once in the session)."""
        if q not in self._percentiles:
            sample = (
                self.data
                if self.data.size <= 2_000_000
                else self.data.ravel()[:: self.data.size // 2_000_000]
            )
            self._percentiles[q] = float(np.percentile(sample, q))
        return self._percentiles[q]

    def center_ras(self) -> np.ndarray:
        centre = (np.asarray(self.shape, dtype=np.float64) - 1) / 2.0
        return voxel_to_ras(self.affine, centre)

    def contains_ras(self, ras: np.ndarray) -> bool:
        ijk = ras_to_voxel(self.affine, ras)
        return bool(np.all(ijk >= -0.5) and np.all(ijk <= np.asarray(self.shape) - 0.5))

    def describe(self) -> str:
        """A few lines for the session panel."""
        sx, sy, sz = self.spacing
        lines = [
            f"{self.shape[0]} x {self.shape[1]} x {self.shape[2]} voxels, {sx:.2g} x {sy:.2g} x {sz:.2g} mm",
            f"range {float(self.data.min()):.3g} .. {float(self.data.max()):.3g}",
        ]
        if self.synthetic:
            lines.append("SYNTHETIC")
        prov = self.provenance
        if prov.get("model"):
            lines.append(f"model {prov['model'].get('id', '?')}, seed {prov.get('seed', '?')}")
            req = prov.get("request") or {}
            if req:
                lines.append(
                    f"{req.get('sampler', '?')} x {req.get('steps', '?')} steps, "
                    f"guidance {req.get('guidance_scale', 1.0):g}"
                )
            for name, value in (prov.get("conditioning") or {}).items():
                lines.append(f"  {name} = {value:g}")
            timings = prov.get("timings") or {}
            if "total_s" in timings:
                lines.append(f"took {timings['total_s']:.1f} s on {prov.get('device', '?')}")
            if isinstance(prov.get("telemetry"), Mapping):
                lines.extend(run_summary_lines(prov["telemetry"]))
            optimization = prov.get("optimization") or {}
            if isinstance(optimization.get("report"), Mapping):
                lines.extend(optimization_lines(optimization["report"]))
        if self.path is not None:
            lines.append(str(self.path))
        return "\n".join(lines)


# Names of the OptimizationConfig settings for people, in the order the panel and the details list them.
OPTIMIZATION_LABELS = {
    "tf32": "TF32",
    "channels_last_3d": "Channels-last 3D",
    "autocast": "Autocast",
    "attention": "Attention",
    "compile_mode": "Compile",
    "cuda_graphs": "CUDA graphs",
    "quantization": "Quantization",
    "streamed_decode": "Streamed decode",
}
APPLIED_MARK, NOT_APPLIED_MARK = "\u2713", "\u2013"  # check mark, en dash


def setting_requested(value: Any) -> bool:
    """Whether a setting's requested value asks for a change from plain fp32 (False, None and "default" do not)."""
    return value not in (None, False, "default")


def setting_text(name: str, value: Any) -> str:
    """``TF32``, ``Autocast bf16``, ``Quantization mixed``: a requested setting in a few words."""
    label = OPTIMIZATION_LABELS.get(name, name)
    return label if isinstance(value, bool) else f"{label} {value}"


def optimization_lines(report: Mapping[str, Any]) -> list[str]:
    """What a run's optimization report says (provenance["optimization"]["report"]), for the details pane.

    One line per requested setting: a check mark if it applied, then a dash and the engine's reason if not.
    """
    requested = sorted(
        (
            (name, entry)
            for name, entry in report.items()
            if isinstance(entry, Mapping) and setting_requested(entry.get("requested"))
        ),
        key=lambda item: not item[1].get("applied"),
    )
    if not requested:
        return ["optimization: none (exact fp32)"]
    lines = ["optimization:"]
    for name, entry in requested:
        text = setting_text(name, entry["requested"])
        if entry.get("applied"):
            lines.append(f"  {APPLIED_MARK} {text}")
        else:
            reason = entry.get("reason") or "not applied"
            lines.append(f"  {NOT_APPLIED_MARK} {text}: {reason}")
    return lines


def run_summary_lines(summary: Mapping[str, Any]) -> list[str]:
    """Two short lines describing a run's telemetry summary (``engine.telemetry`` ``mark_run_end``).

    Duration and mean GPU utilisation (or "no GPU"), then peak memory and energy. Without a GPU the peak
    memory is this process's resident set and energy is not measured.
    """
    duration = summary.get("duration_s")
    first = [f"{duration:.1f} s" if isinstance(duration, int | float) else "duration n/a"]
    if summary.get("gpu_available"):
        util = summary.get("mean_gpu_util_pct")
        first.append(f"GPU {util:.0f}% mean" if util is not None else "GPU utilisation n/a")
        energy = summary.get("energy_j")
        second = [
            f"peak GPU memory {format_bytes(summary.get('peak_gpu_memory_bytes'))}",
            f"{energy:,.0f} J"
            if energy is not None and energy >= 100
            else f"{energy:.1f} J"
            if energy is not None
            else "energy n/a",
        ]
    else:
        first.append("no GPU")
        cpu = summary.get("cpu") or {}
        if cpu.get("mean_cpu_pct") is not None:
            first.append(f"CPU {cpu['mean_cpu_pct']:.0f}% mean")
        second = [f"peak RSS {format_bytes(cpu.get('peak_process_rss_bytes'))}", "energy n/a"]
    return ["telemetry: " + ", ".join(first), ", ".join(second)]


def voxel_to_ras(affine: np.ndarray, ijk: Iterable[float]) -> np.ndarray:
    ijk = np.asarray(list(ijk), dtype=np.float64)
    return (np.asarray(affine, dtype=np.float64) @ np.append(ijk, 1.0))[:3]


def ras_to_voxel(affine: np.ndarray, ras: Iterable[float]) -> np.ndarray:
    ras = np.asarray(list(ras), dtype=np.float64)
    return (np.linalg.inv(np.asarray(affine, dtype=np.float64)) @ np.append(ras, 1.0))[:3]


def window_for_preset(entry: VolumeEntry, preset: str) -> tuple[float, float]:
    """(window, level) for a named preset; percentiles make the presets work for any intensity scale."""
    low_q, high_q = {
        "Auto (1-99%)": (1.0, 99.0),
        "Full range": (0.0, 100.0),
        "Soft (0.5-99.5%)": (0.5, 99.5),
        "High contrast (10-90%)": (10.0, 90.0),
    }.get(preset, (1.0, 99.0))
    low, high = entry.percentile(low_q), entry.percentile(high_q)
    if not high > low:
        high = low + 1.0
    return high - low, (high + low) / 2.0


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


class ProgressTracker:
    """Step i/N, steps per second and ETA from the engine's ``Progress`` reports.

    The rate is measured over the denoising steps only (loading and compiling are one-off), from the
    first denoise report to the latest one.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.stage = ""
        self.step = 0
        self.total = 0
        self.elapsed_s = 0.0
        self.message = ""
        self._first: tuple[int, float] | None = None

    def update(self, stage: str, step: int, total: int, elapsed_s: float, message: str = "") -> None:
        self.stage, self.step, self.total, self.elapsed_s, self.message = (
            stage,
            step,
            total,
            elapsed_s,
            message,
        )
        if stage == "denoise" and self._first is None:
            self._first = (step, elapsed_s)

    @property
    def steps_per_second(self) -> float | None:
        if self._first is None or self.stage != "denoise":
            return None
        steps = self.step - self._first[0]
        seconds = self.elapsed_s - self._first[1]
        if steps <= 0 or seconds <= 0:
            return None
        return steps / seconds

    @property
    def eta_s(self) -> float | None:
        rate = self.steps_per_second
        if rate is None:
            return None
        return max(0.0, (self.total - self.step) / rate)

    @property
    def percent(self) -> int:
        if self.stage == "decode":
            return 100
        return int(round(100 * self.step / self.total)) if self.total else 0

    def text(self) -> str:
        """One line for the progress label: 'denoise 12/50 - 3.4 it/s - ETA 0:11'."""
        if not self.stage:
            return "Ready"
        if self.stage == "load":
            return "Loading model..."
        if self.stage == "compile":
            return "Compiling..."
        if self.stage == "decode":
            return f"Decoding volume... ({format_duration(self.elapsed_s)} so far)"
        parts = [f"Step {self.step}/{self.total}"]
        rate = self.steps_per_second
        if rate is not None:
            parts.append(f"{rate:.2f} it/s" if rate < 10 else f"{rate:.0f} it/s")
            parts.append(f"ETA {format_duration(self.eta_s or 0.0)}")
        return "  \u00b7  ".join(parts)


def format_duration(seconds: float) -> str:
    seconds = max(0, int(math.ceil(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def random_seed() -> int:
    return random.SystemRandom().randrange(0, 2**31 - 1)


def auto_preview_interval(steps: int) -> int:
    """About ten previews per run: each preview of a latent model costs a decode."""
    return max(1, steps // 10)


@dataclass
class GenerationSettings:
    """What the sampling panel holds; ``to_request`` turns it into the engine's ``SamplingRequest``."""

    model: str = ""
    sampler: str = ""
    steps: int = 0
    seed: int = 0
    conditioning: dict[str, float] = field(default_factory=dict)
    guidance_scale: float | None = None  # None = the model's default
    batch_size: int = 1
    device: str = "auto"
    preview_interval: int = -1  # -1 = automatic
    optimization: Mapping[str, Any] | None = None

    def to_request(self):
        """Build the request (the engine validates it and raises InvalidRequest with a readable message)."""
        from engine.api import SamplingRequest
        from engine.optimization import OptimizationConfig

        interval = auto_preview_interval(self.steps) if self.preview_interval < 0 else self.preview_interval
        optimization = (
            OptimizationConfig.from_dict(self.optimization) if self.optimization else OptimizationConfig()
        )
        return SamplingRequest(
            model=self.model,
            sampler=self.sampler,
            steps=int(self.steps),
            seed=int(self.seed),
            conditioning=dict(self.conditioning),
            guidance_scale=self.guidance_scale,
            batch_size=int(self.batch_size),
            optimization=optimization,
            preview_interval=int(interval),
        )


def preview_affine(
    model_affine: np.ndarray, output_xyz: tuple[int, int, int], preview_shape: tuple[int, ...]
) -> np.ndarray:
    """The affine of a strided preview (the engine keeps every n-th voxel of the output volume)."""
    strides = [max(1, math.ceil(o / p)) for o, p in zip(output_xyz, preview_shape[:3], strict=True)]
    affine = np.array(model_affine, dtype=np.float64, copy=True)
    affine[:3, :3] = affine[:3, :3] @ np.diag(strides)
    return affine


class AppState:
    """The session: models, volumes, what is shown, the running job, display settings.

    Events (arguments in brackets):
        models_changed(), model_selected(source), volumes_changed(), shown_changed(entry | None),
        crosshair_changed(ras), window_changed(window, level), display_changed(), job_changed(running),
        progress_changed(tracker), status(text).
    """

    def __init__(self) -> None:
        self.models: list[Any] = []  # engine ModelSource
        self.selected_model: Any | None = None
        self.volumes: list[VolumeEntry] = []
        self.shown: VolumeEntry | None = None
        self.crosshair_ras = np.zeros(3)
        self.window: tuple[float, float] = (1.0, 0.5)  # (window, level)
        self.window_preset = WINDOW_PRESETS[0]
        self.convention = "radiological"
        self.render_preset = RENDER_PRESETS[0]
        self.iso_fraction = 0.35  # iso-surface threshold as a fraction of the shown volume's range
        self.smooth_display = True
        self.recent = RecentFiles()
        self.job_running = False
        self.progress = ProgressTracker()

        self.models_changed = Event()
        self.model_selected = Event()
        self.volumes_changed = Event()
        self.shown_changed = Event()
        self.crosshair_changed = Event()
        self.window_changed = Event()
        self.display_changed = Event()
        self.job_changed = Event()
        self.progress_changed = Event()
        self.status = Event()

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

    def select_model(self, source: Any | None) -> None:
        if source is self.selected_model:
            return
        self.selected_model = source
        self.model_selected.emit(source)

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

    def add_result(self, result: Any, label: str = "") -> list[VolumeEntry]:
        """Add every volume of an engine ``SamplingResult`` to the session; shows the first."""
        entries = []
        prov = result.provenance
        base = label or f"{prov.get('model', {}).get('id', 'model')} seed {result.request.seed}"
        count = result.volumes.shape[0]
        for index in range(count):
            volume = np.ascontiguousarray(result.volume(index), dtype=np.float32)
            if volume.ndim == 4:  # multi-channel: show channel 0
                volume = volume[0]
            name = base if count == 1 else f"{base} #{index + 1}"
            entries.append(
                VolumeEntry(
                    name=name,
                    data=volume,
                    affine=np.asarray(result.affine),
                    kind="generated",
                    provenance={**prov, "batch_index": index},
                    synthetic=True,
                )
            )
        for index, entry in enumerate(entries):
            self.add_volume(entry, show=index == 0)
        return entries

    def remove_volume(self, entry: VolumeEntry) -> None:
        if entry in self.volumes:
            self.volumes.remove(entry)
            self.volumes_changed.emit()
            if self.shown is entry:
                self.show(self.volumes[-1] if self.volumes else None)

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
        self.window_changed.emit(*self.window)

    def apply_window_preset(self, preset: str) -> None:
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

    def iso_threshold(self) -> float | None:
        if self.shown is None:
            return None
        low, high = self.shown.percentile(1.0), self.shown.percentile(99.9)
        return low + self.iso_fraction * (high - low)

    # -- job -----------------------------------------------------------------------------------------

    def set_job_running(self, running: bool) -> None:
        if running:
            self.progress.reset()
        self.job_running = running
        self.job_changed.emit(running)

    def report_progress(self, stage: str, step: int, total: int, elapsed_s: float, message: str = "") -> None:
        self.progress.update(stage, step, total, elapsed_s, message)
        self.progress_changed.emit(self.progress)
