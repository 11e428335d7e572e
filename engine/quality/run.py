"""Generate the cohorts a quality report needs, through any backend, and judge each setting.

``quality_run(backend, request, settings, seeds)`` is a generator like a backend's ``sample``: it yields
``Progress`` over every volume it generates and returns a ``QualityRun``; closing it cancels the generation in
progress (the backend's own clean-up runs) and nothing half-measured is returned.

What it generates, for N seeds starting at ``request.seed``:

- fp32 on seed set A (``seed .. seed + N - 1``): the reference, and half of the noise floor;
- fp32 on seed set B (``seed + N .. seed + 2N - 1``): the other half of the noise floor;
- each setting on seed set A; a ``Candidate`` with ``steps`` runs a shorter (or longer) schedule than the
  request's, so fewer denoising steps are judged by the same rule as the optimization settings.

The volumes are generated seed by seed, every set in turn (interleaved), so each setting's time per volume (the
sampling loop: denoising and decode, one-off costs apart) meets the same load as fp32's, and is judged against
fp32's by the noise rule (``engine.metrics.speed_verdict``): speed beside quality for every setting.

Tissue volumes come from the model's own decoded tissue channels where it has them (GM, WM, CSF), otherwise from
``engine.anatomy.segment`` on each volume (the contrast from the request's modality); the record says which.
"""

from __future__ import annotations

import math
import time
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.anatomy.checks import check_from_record, check_maps
from engine.api import Backend, Progress, SamplingRequest, relay
from engine.api.optimization_config import OptimizationConfig
from engine.errors import InvalidRequest
from engine.quality import (
    TISSUE_FROM_MODEL,
    TISSUE_FROM_SEGMENTATION,
    QualityReport,
    noise_floor,
    quality_report,
)
from engine.quality.field import MEASURES as FIELD_MEASURES
from engine.quality.field import NAMES as FIELD_NAMES
from engine.quality.field import fmt
from engine.quality.measures import TISSUES

MAX_SEEDS = 64
REFERENCE = "fp32"
#: Anatomy-check statuses of volumes without a check of their own maps (``engine.anatomy.checks`` names the rest).
NOT_BRAIN_LIKE = "not_brain_like"  # segmentation refused the volume as no brain
NOT_CHECKED = "not_checked"


SCHEDULE_PREFIX = "steps:"  # a candidate named steps:N is fp32 on a schedule of N steps


def schedule_steps(name: str) -> int | None:
    """N for a shorter schedule's name ``steps:N`` (quality, tune), None for any other name."""
    if not name.startswith(SCHEDULE_PREFIX):
        return None
    count = name.removeprefix(SCHEDULE_PREFIX)
    if not count.isdigit() or not 1 <= int(count) <= 1000:
        raise InvalidRequest(f"{name!r}: give the schedule's steps as a whole number, e.g. steps:25")
    return int(count)


@dataclass(frozen=True)
class Candidate:
    """What a quality run judges against fp32 on the request's schedule: settings, and a number of steps when it
    is a schedule of its own (``volsynth quality --settings steps:25``)."""

    config: OptimizationConfig
    steps: int | None = None


def _candidate(value: OptimizationConfig | Candidate) -> Candidate:
    return value if isinstance(value, Candidate) else Candidate(value)


@dataclass
class QualityRun:
    """Every setting's report, with the noise floor they share and what the run cost."""

    reports: dict[str, QualityReport]
    seeds: list[int]
    noise_seeds: list[int]
    tissue_source: str | None
    timings: dict[str, float] = field(default_factory=dict)  # generate_s, segment_s, measure_s, total_s
    request: dict[str, Any] = field(default_factory=dict)
    tissue_note: str = ""  # why there are no tissue volumes, where there are none
    # The fp32 volumes' distribution against itself (seed set A vs seed set B), judged by the same rule.
    noise_check: QualityReport | None = None
    # Seconds of sampling loop (denoising and decode) per volume, by set label, in seed order.
    times_s: dict[str, list[float]] = field(default_factory=dict)
    # The template space every anatomy check judged its volume in (None: native mm).
    space: str | None = None

    def speed(self) -> dict[str, dict[str, Any]]:
        """Each setting's time per volume against fp32's (both fp32 seed sets), by the noise rule."""
        from engine.metrics.speed_verdict import speed_verdict

        reference = self.times_s.get(f"{REFERENCE} (seeds A)", []) + self.times_s.get(
            f"{REFERENCE} (seeds B)", []
        )
        out = {}
        for label in self.reports:
            times = self.times_s.get(label, [])
            if not times or not reference:
                continue
            verdict = speed_verdict(reference, times)
            out[label] = {
                "median_s": float(np.median(times)),
                "reference_median_s": float(np.median(reference)),
                "verdict": verdict.to_dict("it", "fp32"),
            }
        return out

    @property
    def within_noise(self) -> dict[str, bool]:
        return {label: report.within_noise for label, report in self.reports.items()}

    def to_dict(self) -> dict[str, Any]:
        return {
            "request": self.request,
            "seeds": self.seeds,
            "noise_seeds": self.noise_seeds,
            "tissue_source": self.tissue_source,
            "tissue_note": self.tissue_note,
            "timings": self.timings,
            "noise_check": self.noise_check.to_dict() if self.noise_check else None,
            "settings": {label: report.to_dict() for label, report in self.reports.items()},
            "times_s": self.times_s,
            "speed": self.speed(),
            "anatomy_space": self.space or "native",
        }

    def measures_table(self, rows: list[QualityReport]) -> list[str]:
        """The field's measures per setting: value [95 % interval] (FLAG where it decided), the fp32 floor's value
        beside each, and each set's share of volumes passing the anatomy check (passed/count)."""
        head = f"{'setting':28s}" + "".join(f" {FIELD_NAMES[name]:>30s}" for name in FIELD_MEASURES)
        lines = [head + f" {'reliable (n)':>14s}"]
        first = rows[0]
        floors = f"{'fp32 floor (A vs B)':28s}"
        for name in FIELD_MEASURES:
            measure = first.measures.get(name)
            floors += f" {fmt(name, measure['floor']) if measure else 'n/a':>30s}"
        share = first.reliability.get("reference")
        lines.append(floors + f" {_share_cell(share):>14s}")
        for report in rows:
            line = f"{report.label[:28]:28s}"
            for name in FIELD_MEASURES:
                line += f" {_measure_cell(report.measures.get(name), name):>30s}"
            lines.append(line + f" {_share_cell(report.reliability.get('candidate')):>14s}")
        return lines

    def format_table(self) -> str:
        """A plain-text table: one row per setting (and the fp32-vs-fp32 check), then each verdict."""
        head = f"{'setting':28s} {'PSNR med':>9s} {'PSNR min':>9s} {'SSIM med':>9s}"
        for tissue in TISSUES:
            head += f" {tissue + ' mL':>14s}"
        head += f" {'MS-SSIM':>8s} {'feat MMD':>9s} {'(thresh)':>9s}"
        lines = [head]
        rows = ([self.noise_check] if self.noise_check else []) + list(self.reports.values())
        first = rows[0]
        lines.append(_row(REFERENCE + " (seeds A)", first.reference.to_dict(), None, None, None))
        for report in rows:
            psnr = [r["psnr_db"] for r in report.per_seed if r["psnr_db"] is not None]
            ssim = [r["ssim"] for r in report.per_seed if r["ssim"] is not None]
            stats = report.statistics.get("features", {})
            lines.append(
                _row(
                    report.label,
                    report.candidate.to_dict(),
                    (float(np.median(psnr)), float(np.min(psnr))) if psnr else None,
                    float(np.median(ssim)) if ssim else None,
                    stats,
                )
            )
        lines.append("")
        lines += self.measures_table(rows)
        lines.append("")
        speed = self.speed()
        for report in rows:
            pace = speed.get(report.label)
            took = f"; {pace['median_s']:.2f} s a volume, {pace['verdict']['words']}" if pace else ""
            lines.append(f"{report.label}: {report.verdict}{took}")
        note = f"tissue volumes from {self.tissue_source}" if self.tissue_source else self.tissue_note
        lines.append(
            f"{len(self.seeds)} seeds a set; noise floor: fp32 on seeds {self.seeds[0]}-{self.seeds[-1]} against "
            f"seeds {self.noise_seeds[0]}-{self.noise_seeds[-1]}; {note}; "
            f"{self.timings.get('total_s', math.nan):.0f} s in all"
        )
        return "\n".join(lines)


def _measure_cell(measure: dict[str, Any] | None, name: str) -> str:
    if measure is None:
        return "n/a"
    low, high = measure["interval"]
    mark = " FLAG" if measure["flagged"] else ""
    return f"{fmt(name, measure['value'])} [{fmt(name, low)}, {fmt(name, high)}]{mark}"


def _share_cell(share: dict[str, Any] | None) -> str:
    return f"{share['passed']}/{share['count']}" if share else "n/a"


def _row(label, summary, psnr, ssim, stats) -> str:
    def db(v):
        return "identical" if math.isinf(v) else f"{v:.1f}"

    text = f"{label[:28]:28s}"
    text += f" {db(psnr[0]):>9s} {db(psnr[1]):>9s}" if psnr else f" {'':>9s} {'':>9s}"
    text += f" {ssim:9.4f}" if ssim is not None else f" {'':>9s}"
    for tissue in TISSUES:
        mean = summary["tissue_ml_mean"].get(tissue)
        sd = summary["tissue_ml_sd"].get(tissue)
        text += f" {f'{mean:.0f} ± {sd:.0f}':>14s}" if mean is not None else f" {'n/a':>14s}"
    ms = summary["ms_ssim_mean"]
    text += f" {ms:8.3f}" if ms is not None else f" {'':>8s}"
    if stats:
        text += f" {stats['value']:9.3f} {stats['seed_to_seed_threshold']:9.3f}"
    return text


def _voxel_ml(affine: np.ndarray) -> float:
    return abs(float(np.linalg.det(np.asarray(affine, np.float64)[:3, :3]))) / 1000.0


def quality_run(
    backend: Backend,
    request: SamplingRequest,
    settings: Mapping[str, OptimizationConfig | Candidate],
    seeds: int,
    *,
    contrast: str | None = None,
) -> Generator[Progress, None, QualityRun]:
    """Generate fp32 on two seed sets and each of ``settings`` on the first, then judge each setting.

    Args:
        backend: where to generate (local or an engine server).
        request: the request every volume shares but for its seed and settings; its seed starts set A.
        settings: label -> settings (or a ``Candidate``: settings and a schedule) to judge against fp32 on the
            request's schedule (an fp32 entry is judged like any other).
        seeds: N, the seeds a set (4 to 64: the rule needs 4; 16 gives a usable noise floor).
        contrast: the contrast segmentation assumes for models without tissue channels (default: from the
            request's modality, else T1w).

    Yields Progress: stage "denoise" counting steps over every volume (message: which set and seed),
    then "segment" and "measure". Closing the generator cancels.
    """
    if not isinstance(seeds, int) or not 4 <= seeds <= MAX_SEEDS:
        raise InvalidRequest(f"--seeds must be from 4 to {MAX_SEEDS} (the rule needs 4 a set), got {seeds!r}")
    if not settings:
        raise InvalidRequest("name at least one setting to judge against fp32")
    started = time.perf_counter()
    seeds_a = [request.seed + i for i in range(seeds)]
    seeds_b = [request.seed + seeds + i for i in range(seeds)]
    candidates = {label: _candidate(value) for label, value in settings.items()}
    reference = Candidate(OptimizationConfig())
    plan = [(REFERENCE + " (seeds A)", reference, seeds_a), (REFERENCE + " (seeds B)", reference, seeds_b)]
    plan += [(label, candidate, seeds_a) for label, candidate in candidates.items()]
    runs = sum(len(s) for _, _, s in plan)
    # Progress counts denoising steps over every volume; schedules of their own make volumes differ in steps.
    # The request's own schedule may be the model's default (steps 0): its length is known from the first
    # volume's progress, which is an fp32 volume on that schedule.
    default_steps = request.steps or None
    steps_before = 0

    def total_steps() -> int:
        return sum(len(s) * (c.steps or default_steps or 1) for _, c, s in plan)

    volumes: dict[str, list[np.ndarray]] = {label: [] for label, _, _ in plan}
    # Per volume, kept small: the model's tissue volumes (mL) and the anatomy check's status, made as each volume
    # arrives, so that no set's tissue maps are held in memory (160 volumes' maps would be 1.5 GB).
    model_tissue: dict[str, list[dict[str, float]]] = {label: [] for label, _, _ in plan}
    checks: dict[str, list[str]] = {label: [] for label, _, _ in plan}
    anatomy_s = 0.0
    space: str | None = None
    times: dict[str, list[float]] = {label: [] for label, _, _ in plan}
    affine = None
    label_names: tuple[str, ...] = ()
    done = 0
    # Seed by seed, every set in turn: a change in the machine's load falls on every setting's times alike.
    for index in range(seeds):
        for label, candidate, set_seeds in plan:
            seed = set_seeds[index]
            run = request.replace(
                seed=seed,
                optimization=candidate.config,
                steps=candidate.steps or request.steps,
                preview_interval=0,
                batch_size=1,
            )

            def each(
                progress: Progress,
                done: int = done,
                label: str = label,
                seed: int = seed,
                before: int = steps_before,
            ):
                nonlocal default_steps
                if progress.stage == "denoise":
                    default_steps = default_steps or progress.total
                    return (
                        Progress(
                            "denoise",
                            before + progress.step,
                            total_steps(),
                            time.perf_counter() - started,
                            f"{label}, seed {seed} ({done + 1} of {runs} volumes)",
                        ),
                    )
                return (
                    Progress(
                        progress.stage,
                        done,
                        runs,
                        time.perf_counter() - started,
                        f"{label}, seed {seed}: {progress.message}",
                    ),
                )

            result = yield from relay(backend.sample(run), each)
            volumes[label].append(np.asarray(result.volume(0), np.float32))
            made_maps = result.tissue_maps(0) if result.label_names else {}
            if all(name in made_maps for name in TISSUES):
                voxel_ml = _voxel_ml(result.affine)
                model_tissue[label].append(
                    {t: float(np.clip(made_maps[t], 0, 1).sum() * voxel_ml) for t in TISSUES}
                )
                yield Progress(
                    "anatomy",
                    done,
                    runs,
                    time.perf_counter() - started,
                    f"{label}, seed {seed}: anatomy check",
                )
                checked = time.perf_counter()
                check = check_from_record(
                    made_maps, result.affine, result.tissue_maps_made, space=result.space
                )
                anatomy_s += time.perf_counter() - checked
                checks[label].append(check.status if check is not None else NOT_CHECKED)
            space = result.space
            loop_s = (result.provenance.get("timings") or {}).get("loop_total_s")
            if loop_s is not None:
                times[label].append(float(loop_s))
            affine, label_names = result.affine, result.label_names
            done += 1
            steps_before += run.steps or default_steps or 0
    generated = time.perf_counter()
    inline_anatomy_s = anatomy_s  # the checks of the model's own maps, made between generations

    if affine is None:  # the plan has at least 8 volumes (4 seeds, two fp32 sets): unreachable
        raise InvalidRequest("the quality run generated no volumes")
    voxel_ml = _voxel_ml(affine)
    tissue_source: str | None = None
    tissue_note = ""
    tissue: dict[str, list[dict[str, float]]] | None = None
    if all(name in label_names for name in TISSUES):
        tissue_source = TISSUE_FROM_MODEL
        tissue = model_tissue
    else:
        from engine.anatomy.segment import METHOD, NotBrainLike, contrast_from_modality, segment

        try:
            chosen = contrast_from_modality(contrast or request.modality or "")
        except InvalidRequest as exc:
            chosen, tissue_note = None, f"no tissue volumes: {exc}"
        if chosen is not None:
            segmented_tissue: dict[str, list[dict[str, float]]] = {}
            count = 0
            # Every volume is segmented even after a refusal: a volume refused as no brain fails the anatomy
            # check, and the reliability share counts it; the tissue volumes are then left out.
            for label, vols in volumes.items():
                segmented_tissue[label] = []
                for vol in vols:
                    yield Progress(
                        "segment", count, runs, time.perf_counter() - started, f"{label}: tissue maps"
                    )
                    count += 1
                    try:
                        made = segment(vol, affine, chosen)
                    except NotBrainLike as exc:
                        tissue_note = f"no tissue volumes: segmentation refused a volume ({exc})"
                        checks[label].append(NOT_BRAIN_LIKE)
                        continue
                    except InvalidRequest as exc:  # not about the volume (the contrast): no checks either
                        tissue_note = f"no tissue volumes: segmentation refused a volume ({exc})"
                        checks = {}
                        break
                    segmented_tissue[label].append(
                        {t: float(np.clip(made.maps[t], 0, 1).sum() * voxel_ml) for t in TISSUES}
                    )
                    checked = time.perf_counter()
                    checks[label].append(check_maps(made.maps, affine, space=space, maps_from=METHOD).status)
                    anatomy_s += time.perf_counter() - checked
                if not checks:
                    break
            if not tissue_note:
                tissue, tissue_source = segmented_tissue, TISSUE_FROM_SEGMENTATION
    segmented = time.perf_counter()

    a_label, b_label = REFERENCE + " (seeds A)", REFERENCE + " (seeds B)"
    yield Progress(
        "measure", 0, len(settings) + 1, time.perf_counter() - started, "noise floor (fp32 A vs B)"
    )
    checked_all = bool(checks) and all(len(checks[label]) == len(volumes[label]) for label in volumes)
    floor = noise_floor(
        volumes[a_label],
        volumes[b_label],
        tissue_a=tissue[a_label] if tissue else None,
        tissue_b=tissue[b_label] if tissue else None,
        voxel_ml=voxel_ml,
        tissue_source=tissue_source,
        labels=(a_label, b_label),
        checks_a=checks[a_label] if checked_all else None,
        checks_b=checks[b_label] if checked_all else None,
    )
    common: dict[str, Any] = {
        "noise_floor": floor,
        "voxel_ml": voxel_ml,
        "tissue_source": tissue_source,
        "seeds": seeds_a,
        "noise_seeds": seeds_b,
        "reference_label": a_label,
        "tissue_missing": tissue_note.removeprefix("no tissue volumes: ") or "none given",
    }
    noise_check = quality_report(
        volumes[a_label],
        volumes[b_label],
        reference_tissue=tissue[a_label] if tissue else None,
        candidate_tissue=tissue[b_label] if tissue else None,
        label=f"{REFERENCE}, seeds B",
        reference_checks=checks[a_label] if checked_all else None,
        candidate_checks=checks[b_label] if checked_all else None,
        **common,
    )
    reports = {}
    for index, label in enumerate(candidates, start=1):
        yield Progress("measure", index, len(candidates) + 1, time.perf_counter() - started, label)
        reports[label] = quality_report(
            volumes[a_label],
            volumes[label],
            reference_tissue=tissue[a_label] if tissue else None,
            candidate_tissue=tissue[label] if tissue else None,
            label=label,
            reference_checks=checks[a_label] if checked_all else None,
            candidate_checks=checks[label] if checked_all else None,
            **common,
        )
    finished = time.perf_counter()
    # Radiomic features: fp32 A and B once (the floor, reused by the noise check), then each setting's set.
    radiomics_s = floor.radiomics_s + sum(r.radiomics_s for r in reports.values())
    measured = seeds * (2 + len(reports))
    return QualityRun(
        reports=reports,
        seeds=seeds_a,
        noise_seeds=seeds_b,
        tissue_source=tissue_source,
        tissue_note=tissue_note,
        noise_check=noise_check,
        times_s=times,
        timings={
            "generate_s": generated - started - inline_anatomy_s,
            "segment_s": segmented - generated - (anatomy_s - inline_anatomy_s),
            "anatomy_s": anatomy_s,
            "measure_s": finished - segmented,
            "radiomics_s": radiomics_s,
            "radiomics_s_per_volume": radiomics_s / measured if measured else math.nan,
            "total_s": finished - started,
            "volumes": runs,
        },
        space=space,
        request={
            **request.replace(optimization=OptimizationConfig()).to_dict(),
            "settings": {label: candidate.config.to_dict() for label, candidate in candidates.items()},
            # Candidates with a schedule of their own: label -> steps (the others run the request's steps).
            "schedules": {label: c.steps for label, c in candidates.items() if c.steps is not None},
        },
    )
