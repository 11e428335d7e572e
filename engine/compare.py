"""Same request, two optimization settings, side by side: what the second setting buys and what it costs.

``compare_settings`` runs one request twice on one backend (local or remote), once with settings A and
once with settings B, same model, seed, noise and conditioning, and returns both results with:

- per-step latency (median and IQR of the loop's own step times; step 1, which warms up, and the
  kernel-profiled steps are left out), the decode time and the whole loop's time;
- a headline on the part of the run B's settings change (``headline_part``: U-Net step, decode, or end to
  end when both or neither change), worded by the one noise rule (``engine.metrics.speed_verdict``): no ratio is
  called faster or slower unless the rule says the difference is real;
- peak memory of each sampling loop (CUDA allocator on a GPU, process RSS on a CPU; see
  ``engine.machine.peak_memory``);
- what applied of each setting, and why not where it did not;
- a kernel profile of a few steps of each (top operators by self time; ``engine.telemetry.kernel_profile``);
- how far B's volume moved from A's: PSNR, SSIM, max and mean absolute error, and the difference volume.

It is one run of each, in order A then B, in one process: good for seeing a setting's effect on a volume
and a rough speed ratio. ``repeat_comparison`` runs both again, interleaved (B first every other round, so a
change in the machine's load falls on both alike), and the verdicts then count every run: three runs a side
are what the noise rule needs to decide. ``volsynth bench`` repeats rows in separate processes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Generator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from engine.api import Backend, Progress, SamplingRequest, SamplingResult, relay
from engine.api.optimization_config import OVERRIDE, SETTING_ROWS, UNET, OptimizationConfig
from engine.formatting import format_bytes
from engine.metrics.speed_verdict import MIN_SAMPLES, SpeedVerdict, speed_verdict
from engine.metrics.spread import median_iqr

DEFAULT_PROFILED_STEPS = 2

# The parts of a run a comparison can headline, and how people read them.
UNET_STEP, DECODE, END_TO_END = "unet_step", "decode", "end_to_end"
PART_TITLES = {
    UNET_STEP: "U-Net step",
    DECODE: "Decode",
    END_TO_END: "End to end (sampling loop incl. decode)",
}
PART_NAMES = {UNET_STEP: "U-Net step", DECODE: "decode", END_TO_END: "whole loop"}  # inside a sentence
# What to run when the rule cannot decide from one run of each.
MEASURE_MORE = {
    UNET_STEP: "run more steps, or `volsynth bench --repeats 3` (repeated, interleaved runs, one process each)",
    DECODE: "time the decode on its own with `volsynth bench --decoder-only --repeats 3`",
    END_TO_END: "`volsynth bench --repeats 3` repeats whole runs, interleaved, one process each",
}
# Settings by the part of the run they change (``engine.optimization.apply._prepare``), from their rows: the
# U-Net's, each with a report entry (a PSNR budget or the step cache level only qualifies another; see
# ``_unet_part``); tf32 and channels-last 3D reach both networks; autocast reaches the decoder too unless the
# decoder has its own precision.
_UNET_FIELDS = tuple(
    row.name for row in SETTING_ROWS if row.part == UNET and row.report_entry and not row.budget_of
)
# The settings whose report entry is their own: one that did not apply on its side changes nothing.
_REPORTED_FIELDS = tuple(
    row.name for row in SETTING_ROWS if row.report_entry == row.name and row.part != OVERRIDE
)


def _effective(config: OptimizationConfig, report: dict[str, dict[str, Any]] | None) -> dict[str, Any]:
    """``config``'s fields, with each setting the run's report says did not apply put back to its default."""
    values = dict(config.__dict__)
    defaults = OptimizationConfig().__dict__
    for name in _REPORTED_FIELDS:
        entry = (report or {}).get(name)
        if entry is not None and values[name] != defaults[name] and not entry.get("applied"):
            # A decoder precision that did not apply runs the decoder in fp32 (PreparedModel.decoder_autocast),
            # not at the U-Net's autocast.
            values[name] = "fp32" if name == "decoder_autocast" else defaults[name]
    return values


def _unet_part(v: dict[str, Any]) -> tuple:
    return (
        *(v[name] for name in _UNET_FIELDS),
        v["psnr_budget_db"] if v["quantization"] == "mixed" else None,
        (v["step_cache_level"], v["step_cache_forecast"]) if v["step_cache_interval"] > 1 else None,
    )


def _decoder_part(v: dict[str, Any], requested: OptimizationConfig) -> tuple:
    dtype = None if v["decoder_autocast"] == "fp32" else (v["decoder_autocast"] or v["autocast"])
    return (
        v["tf32"],
        v["channels_last_3d"] or v["decoder_channels_last"],
        dtype,
        # Any decoder setting asked for rewrites the upsampling as sub-pixel convolutions, applied or not.
        requested.optimizes_decoder or v["streamed_decode"],
        v["streamed_decode"],
        v["decoder_quantization"],
        v["decoder_psnr_budget_db"] if v["decoder_quantization"] == "mixed" else None,
    )


def changed_parts(
    a: OptimizationConfig,
    b: OptimizationConfig,
    report_a: dict[str, dict[str, Any]] | None = None,
    report_b: dict[str, dict[str, Any]] | None = None,
) -> frozenset[str]:
    """Which networks B's settings change against A's: a subset of {"unet", "decoder"}.

    With the runs' reports, a setting that did not apply on its side changes nothing (TF32 on a CPU)."""
    va, vb = _effective(a, report_a), _effective(b, report_b)
    parts = set()
    if _unet_part(va) != _unet_part(vb):
        parts.add("unet")
    if _decoder_part(va, a) != _decoder_part(vb, b):
        parts.add("decoder")
    return frozenset(parts)


def headline_part(parts: frozenset[str]) -> str:
    """The part of the run to headline: the U-Net step or the decode when only that changes, else end to end."""
    if parts == {"unet"}:
        return UNET_STEP
    if parts == {"decoder"}:
        return DECODE
    return END_TO_END


@dataclass(frozen=True)
class Headline:
    """The comparison's main line: the part B's settings change, and what the noise rule says of it."""

    part: str  # UNET_STEP, DECODE or END_TO_END
    reason: str  # why this part: "B's settings change only the decoder"
    verdict: SpeedVerdict
    caveat: str = ""  # set when the two runs ran under different load (``Comparison.load_shift``)

    @property
    def title(self) -> str:
        return PART_TITLES[self.part]

    @property
    def advice(self) -> str:
        """What to run for a verdict; empty when the rule has decided and the runs shared one load."""
        return MEASURE_MORE[self.part] if self.caveat or not self.verdict.decided else ""

    def text(self) -> str:
        line = f"{self.title} ({self.reason}): {self.verdict.words()}"
        if self.caveat:
            line += f"; but {self.caveat}"
        return f"{line}; for a verdict, {self.advice}" if self.advice else line

    def to_dict(self) -> dict[str, Any]:
        return {
            "part": self.part,
            "reason": self.reason,
            "text": self.text(),
            "advice": self.advice,
            "caveat": self.caveat,
            "verdict": self.verdict.to_dict(),
        }


@dataclass
class SideMeasurement:
    """One side of a comparison: its result and what its run measured."""

    label: str
    result: SamplingResult
    step_ms_median: float | None
    step_ms_iqr: float | None
    steps_measured: int
    loop_s: (
        float  # the whole sampling loop (denoise + decode) less its profiled steps, which the profiler slows
    )
    peak_bytes: int | None
    peak_kind: str
    # CPU: how much the process RSS grew during the run. Memory an earlier run freed usually stays mapped, so
    # the second of two runs in one process grows less: compare these only across separate processes.
    peak_over_start_bytes: int | None
    step_s: tuple[float, ...] = ()  # the measured step times (the samples behind the median), seconds
    decode_s: float | None = None  # the loop's decode of the final latents; 0 for a pixel-space model

    @property
    def report(self) -> dict[str, dict[str, Any]]:
        return self.result.provenance.get("optimization", {}).get("report", {})

    @property
    def kernel_profile(self) -> dict[str, Any] | None:
        return self.result.provenance.get("kernel_profile")

    def applied(self) -> list[str]:
        return [name for name, entry in self.report.items() if entry.get("applied")]

    def not_applied(self) -> list[tuple[str, str]]:
        """Settings that were asked for but did not apply here, with the reason."""
        return [
            (name, str(entry.get("reason", "")))
            for name, entry in self.report.items()
            if entry.get("requested") not in (False, None, "default") and not entry.get("applied")
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "optimization": self.result.request.optimization.to_dict(),
            "step_ms_median": self.step_ms_median,
            "step_ms_iqr": self.step_ms_iqr,
            "steps_measured": self.steps_measured,
            "decode_s": self.decode_s,
            "loop_s": self.loop_s,
            "step_s_measured": list(self.step_s),
            "peak_bytes": self.peak_bytes,
            "peak_kind": self.peak_kind,
            "peak_over_start_bytes": self.peak_over_start_bytes,
            "applied": self.applied(),
            "not_applied": dict(self.not_applied()),
            "kernel_profile": self.kernel_profile,
        }


@dataclass(frozen=True)
class RunTiming:
    """What one run of a side measured, without its volume (a repeat keeps only its times)."""

    loop_s: float
    decode_s: float | None
    step_s: tuple[float, ...]

    @classmethod
    def of(cls, side: SideMeasurement) -> RunTiming:
        return cls(side.loop_s, side.decode_s, side.step_s)

    @property
    def step_median_s(self) -> float | None:
        return float(np.median(self.step_s)) if self.step_s else None


@dataclass
class Comparison:
    a: SideMeasurement
    b: SideMeasurement
    psnr_db: float
    ssim: float | None
    max_abs_err: float
    mean_abs_err: float
    # (A's, B's) timings of each repeat (``repeat_comparison``); the first runs are ``a`` and ``b``.
    repeats: list[tuple[RunTiming, RunTiming]] = field(default_factory=list)

    def runs(self, side: str) -> list[RunTiming]:
        """Every run of side "a" or "b", the first one first."""
        first = RunTiming.of(self.a if side == "a" else self.b)
        return [first, *(pair[0 if side == "a" else 1] for pair in self.repeats)]

    def loop_median_s(self, side: str) -> float:
        return float(np.median([run.loop_s for run in self.runs(side)]))

    def decode_median_s(self, side: str) -> float | None:
        times = [run.decode_s for run in self.runs(side) if run.decode_s]
        return float(np.median(times)) if times else None

    @property
    def speedup_per_step(self) -> float | None:
        """How many times faster B's steps are than A's (> 1: B is faster)."""
        if not self.a.step_ms_median or not self.b.step_ms_median:
            return None
        return self.a.step_ms_median / self.b.step_ms_median

    @property
    def speedup_loop(self) -> float:
        return self.a.loop_s / self.b.loop_s if self.b.loop_s else math.nan

    @property
    def has_decode(self) -> bool:
        return bool(self.a.decode_s) or bool(self.b.decode_s)

    def changed_parts(self) -> frozenset[str]:
        """The networks B's settings change against A's, counting only what applied (see ``changed_parts``)."""
        parts = changed_parts(
            self.a.result.request.optimization,
            self.b.result.request.optimization,
            self.a.report,
            self.b.report,
        )
        return parts if self.has_decode else parts - {"decoder"}  # a pixel-space model decodes nothing

    def verdicts(self) -> dict[str, SpeedVerdict]:
        """The noise rule on each part, one sample a run for the decode and the loop. Steps: with enough runs
        for the rule, each run's median step (steps of one run are not independent: a busy spell slows
        several in a row); before that, the step times of the runs there are."""
        a, b = self.runs("a"), self.runs("b")
        if min(len(a), len(b)) >= MIN_SAMPLES:
            steps = speed_verdict(
                [r.step_median_s for r in a if r.step_median_s],
                [r.step_median_s for r in b if r.step_median_s],
            )
        else:
            steps = speed_verdict([t for r in a for t in r.step_s], [t for r in b for t in r.step_s])
        return {
            UNET_STEP: steps,
            DECODE: speed_verdict(
                [r.decode_s for r in a if r.decode_s], [r.decode_s for r in b if r.decode_s]
            ),
            END_TO_END: speed_verdict([r.loop_s for r in a], [r.loop_s for r in b]),
        }

    def unchanged_parts(self) -> tuple[str, ...]:
        """The timed parts B's settings leave alone: any difference there is the machine, not the setting."""
        parts = self.changed_parts()
        unchanged = [part for part, net in ((UNET_STEP, "unet"), (DECODE, "decoder")) if net not in parts]
        return tuple(part for part in unchanged if part != DECODE or self.has_decode)

    def load_shift(self) -> str:
        """Why the two runs cannot be compared as they stand, or "": a part B's settings leave alone that the
        rule nevertheless calls faster or slower shows the machine's load changed between A's run and B's."""
        verdicts = self.verdicts()
        for part in self.unchanged_parts():
            verdict = verdicts[part]
            if verdict.verdict in ("faster", "slower"):
                return (
                    f"the {PART_NAMES[part]}, which B's settings leave alone, ran at {verdict.ratio:.2f}x A's "
                    "speed in B's run: the machine's load changed between the runs, and every ratio here "
                    "carries that change"
                )
        return ""

    def headline(self) -> Headline:
        parts = self.changed_parts()
        part = headline_part(parts)
        reason = {
            frozenset({"unet"}): "B's settings change only the U-Net",
            frozenset({"decoder"}): "B's settings change only the decoder",
            frozenset({"unet", "decoder"}): "B's settings change the U-Net and the decoder",
        }.get(parts, "B's settings change nothing that applied here")
        a, b = self.a.result.request.optimization, self.b.result.request.optimization
        step_cache = ("step_cache_interval", "step_cache_level", "step_cache_forecast")
        if any(getattr(a, name) != getattr(b, name) for name in step_cache):
            # Full and cached steps take different times: a median step says nothing of the schedule's mean.
            part, reason = END_TO_END, "step caching mixes full and cached steps, so the whole loop is judged"
        return Headline(part, reason, self.verdicts()[part], self.load_shift())

    def difference(self, index: int = 0) -> np.ndarray:
        """B minus A for batch item ``index`` (x, y, z; channel 0), float32."""
        a, b = self.a.result.volume(index), self.b.result.volume(index)
        if a.ndim == 4:
            a, b = a[0], b[0]
        return (b.astype(np.float32) - a.astype(np.float32)).astype(np.float32)

    def to_dict(self) -> dict[str, Any]:
        return {
            "request": self.a.result.request.replace(optimization=OptimizationConfig()).to_dict(),
            "a": self.a.to_dict(),
            "b": self.b.to_dict(),
            "psnr_db": _json_float(self.psnr_db),
            "ssim": self.ssim,
            "max_abs_err": self.max_abs_err,
            "mean_abs_err": self.mean_abs_err,
            "speedup_per_step": self.speedup_per_step,
            "speedup_loop": _json_float(self.speedup_loop),
            "changed_parts": sorted(self.changed_parts()),
            "headline": self.headline().to_dict(),
            "runs": {
                side: [
                    {"loop_s": r.loop_s, "decode_s": r.decode_s, "step_s": list(r.step_s)}
                    for r in self.runs(side)
                ]
                for side in ("a", "b")
            },
            "verdicts": {part: verdict.to_dict() for part, verdict in self.verdicts().items()},
            "device": self.a.result.provenance.get("device_name"),
            "machine": self.a.result.provenance.get("machine"),  # the probe of the machine that ran it
            "method": f"{1 + len(self.repeats)} run(s) of each in one process (A then B, then the repeats "
            "interleaved, B first every other round); step statistics leave out step 1 and the profiled steps, "
            "loop times leave out the profiled steps' numbers in every run; verdicts by engine.metrics.speed_verdict "
            "(decode and loop one sample a run; steps each run's median from 3 runs a side, else the step times)",
        }

    def format_table(self) -> str:
        """A plain-text table for terminals and logs."""
        lines = [f"{'':24s} {'A: ' + self.a.label:>26s} {'B: ' + self.b.label:>26s}"]

        def row(name: str, a: str, b: str) -> None:
            lines.append(f"{name:24s} {a:>26s} {b:>26s}")

        row(
            "step (median, IQR)",
            _ms(self.a.step_ms_median, self.a.step_ms_iqr),
            _ms(self.b.step_ms_median, self.b.step_ms_iqr),
        )
        row("decode", _seconds(self.a.decode_s), _seconds(self.b.decode_s))
        row("sampling loop*", f"{self.loop_median_s('a'):.2f} s", f"{self.loop_median_s('b'):.2f} s")
        row(
            f"peak memory ({self.a.peak_kind})",
            format_bytes(self.a.peak_bytes),
            format_bytes(self.b.peak_bytes),
        )
        if self.a.peak_kind == "process_rss":  # B reuses what A freed: its growth is understated
            row(
                "  RSS growth in the run",
                format_bytes(self.a.peak_over_start_bytes),
                format_bytes(self.b.peak_over_start_bytes),
            )
        row("applied", ", ".join(self.a.applied()) or "fp32", ", ".join(self.b.applied()) or "fp32")
        headline = self.headline()
        verdicts = self.verdicts()
        lines.append(headline.text())
        unchanged = self.unchanged_parts()
        for part in (UNET_STEP, DECODE, END_TO_END):  # the other parts, by the same rule, below the headline
            if part != headline.part and (part != DECODE or self.has_decode):
                note = " (unchanged by B's settings)" if part in unchanged else ""
                lines.append(f"  {PART_TITLES[part]}{note}: {verdicts[part].words()}")
        lines.append(
            f"B vs A volume moved: PSNR {_db(self.psnr_db)}, "
            f"SSIM {'n/a' if self.ssim is None else f'{self.ssim:.4f}'}, max |B-A| {self.max_abs_err:.3g}, "
            f"mean |B-A| {self.mean_abs_err:.3g}"
        )
        lines.append(
            f"* without the kernel-profiled steps; median of {1 + len(self.repeats)} run(s) of each (repeats "
            "interleaved)"
        )
        for side in (self.a, self.b):
            for name, reason in side.not_applied():
                lines.append(f"{side.label}: {name} did not apply: {reason}")
        return "\n".join(lines)


def compare_settings(
    backend: Backend,
    request: SamplingRequest,
    a: OptimizationConfig,
    b: OptimizationConfig,
    labels: tuple[str, str] = ("A", "B"),
    kernel_profile_steps: int = DEFAULT_PROFILED_STEPS,
) -> Generator[Progress, None, Comparison]:
    """Run ``request`` with settings ``a`` then ``b``; yields Progress over both runs, returns a Comparison.

    Progress steps count over both runs (the total is twice the steps) and messages name the side.
    Previews are off: a preview decode inside the loop would blur the step times being compared.
    Closing the generator cancels the run in progress.
    """
    sides: list[SideMeasurement] = []
    started = time.perf_counter()
    for index, (config, label) in enumerate(zip((a, b), labels, strict=True)):
        run = request.replace(
            optimization=config, preview_interval=0, kernel_profile_steps=kernel_profile_steps
        )

        def on_side(progress: Progress, index: int = index, label: str = label) -> tuple[Progress]:
            total = max(progress.total, 1)
            return (
                Progress(
                    progress.stage,
                    index * total + progress.step,
                    2 * total,
                    time.perf_counter() - started,
                    f"{label}: {progress.message}",
                ),
            )

        result = yield from relay(backend.sample(run), on_side)
        sides.append(measure(label, result))

    from engine.metrics.image import psnr, ssim

    side_a, side_b = sides
    # How far the image moved (B against A); tissue maps decoded with it are not part of "the volume".
    image_a, image_b = side_a.result.images, side_b.result.images
    diff = np.abs(image_b.astype(np.float64) - image_a.astype(np.float64))
    return Comparison(
        a=side_a,
        b=side_b,
        psnr_db=psnr(image_a, image_b),
        ssim=ssim(image_a, image_b),
        max_abs_err=float(diff.max()),
        mean_abs_err=float(diff.mean()),
    )


def repeat_comparison(
    backend: Backend, comparison: Comparison, times: int
) -> Generator[Progress, None, Comparison]:
    """Run the comparison's A and B ``times`` more times each, interleaved (B then A, then A then B, ...), and
    return a copy with their timings added to ``repeats`` (the volumes stay the first runs').

    Repeats are not kernel-profiled; the step numbers the first runs profiled are left out of every repeat's
    statistics and loop time too, so each run's numbers cover the same steps. Closing the generator cancels
    the run in progress; the repeats finished so far are not returned.
    """
    from engine.errors import InvalidRequest

    if not isinstance(times, int) or not 1 <= times <= 50:
        raise InvalidRequest(f"repeat the comparison 1 to 50 times, not {times!r}")
    first = comparison.a.result
    profiled = set((first.provenance.get("kernel_profile") or {}).get("steps", []))
    request = first.request.replace(preview_interval=0, kernel_profile_steps=0)
    configs = {
        "a": comparison.a.result.request.optimization,
        "b": comparison.b.result.request.optimization,
    }
    labels = {"a": comparison.a.label, "b": comparison.b.label}
    started = time.perf_counter()
    done_runs, total_runs = 0, 2 * times
    added: list[tuple[RunTiming, RunTiming]] = []
    for round_index in range(times):
        order = ("a", "b") if round_index % 2 else ("b", "a")  # the first runs were A then B
        timing: dict[str, RunTiming] = {}
        for side in order:
            run = request.replace(optimization=configs[side])

            def on_side(
                progress: Progress, done: int = done_runs, side: str = side, index: int = round_index
            ):
                total = max(progress.total, 1)
                return (
                    Progress(
                        progress.stage,
                        done * total + progress.step,
                        total_runs * total,
                        time.perf_counter() - started,
                        f"repeat {index + 1} of {times}, {labels[side]}: {progress.message}",
                    ),
                )

            result = yield from relay(backend.sample(run), on_side)
            timing[side] = RunTiming.of(measure(labels[side], result, leave_out=profiled))
            done_runs += 1
        added.append((timing["a"], timing["b"]))
    return replace(comparison, repeats=[*comparison.repeats, *added])


def save_comparison(comparison: Comparison, folder) -> list:
    """Write ``a.nii.gz``, ``b.nii.gz`` (each with its provenance sidecar), ``difference.nii.gz`` (B - A) and
    ``compare.json`` into ``folder`` (created if missing). Every file is written atomically."""
    import json
    from pathlib import Path

    from engine.errors import InvalidRequest
    from engine.nifti.io import atomic_files, batch_paths, generated_volumes, image_files, save_volumes
    from engine.nifti.volume import Volume

    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidRequest(f"cannot create the folder {folder}: {exc.strerror}") from exc
    volumes, paths = [], []
    for side, name in ((comparison.a, "a.nii.gz"), (comparison.b, "b.nii.gz")):
        made = generated_volumes(side.result)
        volumes += made
        paths += batch_paths(folder / name, len(made))
    volumes.append(Volume(comparison.difference(), comparison.a.result.affine, synthetic=True))
    paths.append(folder / "difference.nii.gz")
    save_volumes(volumes, paths)
    with atomic_files([folder / "compare.json"]) as (json_temp,):
        json_temp.write_text(json.dumps(comparison.to_dict(), indent=2, default=str), encoding="utf-8")
    written = [p for path, volume in zip(paths, volumes, strict=True) for p in image_files(path, volume)]
    return [*written, folder / "compare.json"]


def measure(label: str, result: SamplingResult, leave_out: set[int] | None = None) -> SideMeasurement:
    """Latency and memory of one finished run, from its provenance record. The steps ``leave_out`` names (by
    default the run's own kernel-profiled ones) are left out of the step statistics and the loop time."""
    prov = result.provenance
    profiled = set((prov.get("kernel_profile") or {}).get("steps", [])) if leave_out is None else leave_out
    step_times = prov.get("step_times_s", [])
    times = [t for step, t in enumerate(step_times, start=1) if step != 1 and step not in profiled]
    profiled_s = sum(t for step, t in enumerate(step_times, start=1) if step in profiled)
    median = iqr = None
    if times:
        median, iqr = (1e3 * value for value in median_iqr(times))
    memory = prov.get("memory") or {}
    peak, start = memory.get("peak_bytes"), memory.get("start_bytes")
    own = peak - start if memory.get("since_start") and peak is not None and start is not None else None
    timings = prov.get("timings", {})
    return SideMeasurement(
        label=label,
        result=result,
        step_s=tuple(float(t) for t in times),
        decode_s=None if timings.get("decode_s") is None else float(timings["decode_s"]),
        step_ms_median=median,
        step_ms_iqr=iqr,
        steps_measured=len(times),
        loop_s=float(timings.get("loop_total_s", math.nan)) - profiled_s,
        peak_bytes=peak,
        peak_kind=str(memory.get("kind", "unknown")),
        peak_over_start_bytes=own,
    )


def _ms(median: float | None, iqr: float | None) -> str:
    return "n/a" if median is None else f"{median:.1f} ms (IQR {iqr:.1f})"


def _seconds(value: float | None) -> str:
    return "n/a (no decoder)" if not value else f"{value:.2f} s"


def _db(value: float) -> str:
    return "identical" if math.isinf(value) else f"{value:.1f} dB"


def _json_float(value: float) -> float | str:
    return value if math.isfinite(value) else str(value)
