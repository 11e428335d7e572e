"""``volsynth cohort report``: the cohort as generated, on one page (PNG, or HTML around the same figure).

Histograms of the requested conditioning values and of the brain and ventricle volumes measured on the
generated images (the evaluation's measurements: Otsu brain mask, dark voxels in the template ventricle
region; for a segmented cohort, MAISI v2 or a bundle, the brain is the sum of its GM and WM maps), a montage of axial mid-slices of a sample of the volumes, throughput over time, failures and
retries from the manifest, and each volume's anatomy check (``engine.anatomy.checks``: from its sidecar, or from
the tissue maps beside it) with how many passed, were outside a range, or were not brain-like, and the
reliability share: the checked volumes that passed, with its 95 % interval (``engine.metrics.reliability.share``,
the same record as the quality report's per setting).
"""

from __future__ import annotations

import base64
import html
import json
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from engine.cohort.dataset import STATE_DIR
from engine.cohort.manifest import DONE, FAILED, Manifest
from engine.errors import InvalidRequest
from engine.metrics.colours import FAIL_COLOUR, PASS_COLOUR
from engine.metrics.rank import spearman

MEASURED = {"brain_volume": "brain tissue (mL)", "ventricle_volume": "ventricles (mL)"}


#: Contrasts the brain mask (dark CSF, bright tissue) and the ventricle measurement are made for.
T1_LIKE = ("t1w", "t1w-skullstripped")


def measurements_skipped(model: dict[str, Any]) -> str:
    """Why the brain and ventricle measurements are skipped for this cohort's model, or ""."""
    modality = model.get("modality")
    if model.get("tissue_maps_method"):
        return ""  # its volumes are segmented for any contrast: the brain is measured on the maps
    if modality and modality not in T1_LIKE:
        return (
            f"brain and ventricle volumes are measured on T1-like images only; this cohort is {modality} "
            "(CSF is bright there), so they are not measured"
        )
    return ""


def measure_segmented(image: Path, provenance: dict[str, Any], voxel_ml: float) -> dict[str, float]:
    """Brain tissue volume (mL: the GM and WM maps' sum) of a segmented cohort volume; nan where segmentation
    refused the volume. The method gives no ventricle map, so ventricles are not measured here."""
    from engine.nifti.io import load_nifti

    names = provenance.get("tissue_maps") or {}
    out = {"brain_volume": float("nan"), "ventricle_volume": float("nan")}
    if {"GM", "WM"} <= set(names):
        total = sum(float(load_nifti(image.with_name(Path(names[n]).name)).data.sum()) for n in ("GM", "WM"))
        out["brain_volume"] = total * voxel_ml
    return out


#: How the report counts the anatomy checks' outcomes (``engine.anatomy.checks`` statuses, plus no check).
ANATOMY_STATUSES = ("within", "outside", "not_brain_like", "not_checked")


def anatomy_check(image: Path, loaded) -> dict[str, Any]:
    """The anatomy check of one cohort volume as ``{"status", "verdict", "flags"}``: the record its sidecar
    carries, else checked here from the tissue maps beside it (the model's channels or segmented maps), else
    not brain-like when segmentation refused it as no brain, else not checked (no maps to check)."""
    from engine.anatomy.checks import check_from_record
    from engine.nifti.io import load_nifti

    provenance = loaded.provenance
    stored = provenance.get("anatomy_check")
    if isinstance(stored, dict) and stored.get("status") in ANATOMY_STATUSES:
        return {k: stored.get(k) for k in ("status", "verdict", "flags")}
    names = provenance.get("tissue_maps") or {}
    maps = {}
    for name, file in names.items():
        path = image.with_name(Path(str(file)).name)
        if path.is_file():
            maps[str(name)] = load_nifti(path).data
    made = provenance.get("tissue_maps_made")
    record = made if isinstance(made, dict) else provenance
    check = check_from_record(maps, loaded.affine, record, space=loaded.space)
    if check is None:
        return {"status": "not_checked", "verdict": "not checked: no tissue maps", "flags": []}
    return {"status": check.status, "verdict": check.verdict, "flags": list(check.flags)}


def measure(volume: np.ndarray, voxel_ml: float) -> dict[str, float]:
    """Brain tissue and ventricle volumes (mL) measured on a brain T1 image; nan where not measurable."""
    from engine.anatomy.measures import brain_mask, ventricle_volume_ml
    from engine.anatomy.template import ventricle_roi

    mask = brain_mask(volume)
    if not mask.any():
        return {"brain_volume": float("nan"), "ventricle_volume": float("nan")}
    tissue = mask & (volume >= 0.5 * float(np.median(volume[mask])))
    out = {"brain_volume": float(tissue.sum() * voxel_ml), "ventricle_volume": float("nan")}
    roi = _roi(ventricle_roi)
    if roi is not None and roi.shape == volume.shape:
        out["ventricle_volume"] = ventricle_volume_ml(volume, roi, mask) * voxel_ml / 0.008
    return out


_ROI_CACHE: dict[str, Any] = {}


def _roi(make) -> np.ndarray | None:
    if "roi" not in _ROI_CACHE:
        try:
            _ROI_CACHE["roi"] = make()
        except Exception:  # the template is an optional resource; without it, no ventricle measurement
            _ROI_CACHE["roi"] = None
    return _ROI_CACHE["roi"]


def _sample(items: list[str], n: int) -> list[str]:
    if len(items) <= n:
        return items
    picks = np.linspace(0, len(items) - 1, n).round().astype(int)
    return [items[i] for i in sorted(set(picks.tolist()))]


def collect(root: Path, montage: int = 12) -> dict[str, Any]:
    """Everything the report shows, as data (tests check this; the figure only draws it)."""
    from engine.nifti.io import load_nifti

    manifest = Manifest.load(root)
    items = manifest.items
    done = sorted(p for p, e in items.items() if e["state"] == DONE)
    conditions = sorted({n for e in items.values() for n in e["conditioning"]})
    requested = {
        n: [items[p]["conditioning"][n] for p in done if n in items[p]["conditioning"]] for n in conditions
    }
    measured: dict[str, list[float]] = {n: [] for n in MEASURED}
    pairs: dict[str, list[tuple[float, float]]] = {n: [] for n in MEASURED}
    slices: list[tuple[str, np.ndarray]] = []
    montage_set = set(_sample(done, montage))
    folder = manifest.data.get("target", "folder") == "folder"
    model = manifest.data.get("model", {})
    skipped = measurements_skipped(model)
    segmented = bool(model.get("tissue_maps_method"))
    not_segmented = 0
    anatomy: dict[str, dict[str, Any]] = {}
    if skipped:
        measured, pairs = {}, {}
    if folder:
        for participant in done:
            path = root / items[participant]["file"]
            loaded = load_nifti(path)
            voxel_ml = float(np.prod(loaded.spacing)) / 1000.0
            if skipped:
                values = {}
            elif segmented:
                values = measure_segmented(path, loaded.provenance, voxel_ml)
                not_segmented += bool(loaded.provenance.get("tissue_maps_not_made"))
            else:
                values = measure(loaded.data, voxel_ml)
            for name, value in values.items():
                if np.isfinite(value):
                    measured[name].append(value)
                    if name in items[participant]["conditioning"]:
                        pairs[name].append((items[participant]["conditioning"][name], value))
            anatomy[participant] = anatomy_check(path, loaded)
            if participant in montage_set:
                slices.append((participant, loaded.data[:, :, loaded.data.shape[2] // 2].T[::-1]))
    finished = sorted(
        datetime.fromisoformat(items[p]["finished_utc"]).timestamp()
        for p in done
        if items[p].get("finished_utc")
    )
    runs = manifest.data.get("runs", [])
    elapsed = sum(r.get("elapsed_s", 0.0) for r in runs)
    produced = sum(r.get("done", 0) for r in runs)
    seconds = [items[p]["seconds"] for p in done if items[p].get("seconds")]
    return {
        "cohort_id": manifest.cohort_id,
        "model": manifest.data.get("model", {}),
        "total": len(items),
        "done": len(done),
        "failed": manifest.count(FAILED),
        "retries": manifest.retries,
        "failures": [
            {"participant": p, "state": e["state"], "errors": e["errors"]}
            for p, e in items.items()
            if e["errors"]
        ],
        "requested": requested,
        "measured": measured,
        "measurements_skipped": skipped,
        # Volumes of a segmented cohort that segmentation refused (not brain-like): no maps, not measured.
        "not_segmented": not_segmented,
        "pairs": pairs,
        # Per participant: the anatomy check's status, verdict and flags; and how many got each status.
        "anatomy": anatomy,
        "anatomy_counts": {k: sum(a["status"] == k for a in anatomy.values()) for k in ANATOMY_STATUSES},
        # The share of checked volumes that passed (volumes without maps are not counted either way).
        "reliability": reliability_share(anatomy),
        "slices": slices,
        "finished_times": finished,
        "runs": runs,
        "volumes_per_min": 60.0 * produced / elapsed if elapsed else 0.0,
        "seconds_per_volume": float(np.median(seconds)) if seconds else float("nan"),
        "target": manifest.data.get("target", "folder"),
    }


def reliability_share(anatomy: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The quality report's reliability record (``engine.metrics.reliability.share``) over the checked volumes, or None
    when none was checked."""
    from engine.metrics.reliability import share

    statuses = [a["status"] for a in anatomy.values() if a["status"] != "not_checked"]
    return share(statuses) if statuses else None


def reliability_words(reliability: dict[str, Any]) -> str:
    """ "reliability: 30/32 checked volumes pass the anatomy check (94 %, 95 % interval 80-98 %), below 95 %"."""
    low, high = reliability["interval"]
    reached = "reaches" if reliability["reaches_95"] else "below"
    return (
        f"reliability: {reliability['passed']}/{reliability['count']} checked volumes pass the anatomy check "
        f"({100 * reliability['share']:.0f} %, 95 % interval {100 * low:.0f}-{100 * high:.0f} %), {reached} 95 %"
    )


# Long on purpose: one linear matplotlib figure build, panel after panel; split, the layout would scatter.
def draw(data: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.gridspec import GridSpec

    n_slices = len(data["slices"])
    cols = 6
    montage_rows = max(1, -(-n_slices // cols))
    fig = plt.figure(figsize=(15, 7.2 + 2.3 * montage_rows), dpi=90)
    grid = GridSpec(2 + montage_rows, cols, figure=fig, height_ratios=[3, 3] + [2.3] * montage_rows)
    runs = data["runs"]
    workers = ", ".join(
        f"{r.get('workers', '?')}x{r.get('threads_per_worker', '?')} {r.get('device', '')}" for r in runs
    )
    fig.suptitle(
        f"SYNTHETIC cohort {data['cohort_id']}  |  model {data['model'].get('id', '?')}  |  "
        f"{data['done']}/{data['total']} volumes, {data['failed']} failed, {data['retries']} retried",
        fontsize=13,
        fontweight="bold",
    )
    # Row 1: requested vs measured, one panel per measured quantity.
    for col, name in enumerate(MEASURED):
        ax = fig.add_subplot(grid[0, 2 * col : 2 * col + 2])
        req, meas = data["requested"].get(name, []), data["measured"].get(name, [])
        both = [v for v in (*req, *meas) if np.isfinite(v)]
        bins = np.linspace(min(both), max(both), 16) if len(both) > 1 and min(both) < max(both) else 10
        if req:
            ax.hist(req, bins=bins, alpha=0.6, label=f"requested (n={len(req)})", color="tab:blue")
        if meas:
            ax.hist(meas, bins=bins, alpha=0.6, label=f"measured (n={len(meas)})", color="tab:orange")
        ax.set_title(name.replace("_", " ") + f": requested vs measured {MEASURED[name]}", fontsize=10)
        ax.set_xlabel("mL")
        ax.set_ylabel("volumes")
        if req or meas:
            ax.legend(fontsize=8)
        else:
            note = (
                "not measured: T1-like contrasts only"
                if data.get("measurements_skipped")
                else "nothing to show"
            )
            ax.text(0.5, 0.5, note, ha="center", va="center", transform=ax.transAxes)
    # Requested vs measured ventricles, one point per volume.
    ax = fig.add_subplot(grid[0, 4:6])
    pairs = data["pairs"].get("ventricle_volume", [])
    if pairs:
        x, y = zip(*pairs, strict=True)
        ax.scatter(x, y, s=12)
        lo, hi = min(*x, *y), max(*x, *y)
        ax.plot([lo, hi], [lo, hi], color="grey", lw=0.8, ls="--", label="measured = requested")
        rho = spearman(x, y, min_points=3, constant=float("nan"))  # too few or flat: no rho
        ax.set_title(f"ventricles: measured vs requested (Spearman {rho:.2f})", fontsize=10)
        ax.legend(fontsize=8)
    else:
        ax.set_title("ventricles: measured vs requested", fontsize=10)
        ax.text(
            0.5,
            0.5,
            "not measured: T1-like contrasts only"
            if data.get("measurements_skipped")
            else "not measurable on this model's images",
            ha="center",
            va="center",
            transform=ax.transAxes,
        )
    ax.set_xlabel("requested (mL)")
    ax.set_ylabel("measured (mL)")
    # Row 2: other requested conditions, throughput over time, the numbers.
    ax = fig.add_subplot(grid[1, 0:3])
    times = data["finished_times"]
    if times:
        t0 = times[0]
        ax.step([(t - t0) / 60 for t in times], range(1, len(times) + 1), where="post")
    ax.set_title(f"throughput: {data['volumes_per_min']:.2f} volumes/min over all runs", fontsize=10)
    ax.set_xlabel("minutes since the first volume")
    ax.set_ylabel("volumes finished")
    ax = fig.add_subplot(grid[1, 3:6])
    ax.axis("off")
    lines = [
        f"cohort id: {data['cohort_id']}",
        f"target: {data['target']}",
        f"volumes: {data['done']} done of {data['total']}, {data['failed']} failed",
        f"worker deaths retried: {data['retries']}",
        f"runs: {len(runs)} ({workers or 'n/a'})",
        f"median seconds per volume (worker): {data['seconds_per_volume']:.1f}",
        f"throughput: {data['volumes_per_min']:.2f} volumes/min",
        f"model weights sha256: {next(iter(data['model'].get('weights_sha256', {}).values()), '?')[:16]}...",
    ]
    for k, run in enumerate(runs[-4:], start=max(1, len(runs) - 3)):
        rate = 60.0 * run.get("done", 0) / run["elapsed_s"] if run.get("elapsed_s") else 0.0
        lines.append(
            f"run {k}: {run.get('workers', '?')} worker(s) x {run.get('threads_per_worker', '?')} thread(s), "
            f"{run.get('done', 0)} volumes in {run.get('elapsed_s', 0):.0f} s = {rate:.2f}/min"
            + (" (stopped)" if run.get("stopped") else "")
        )
    counts = data.get("anatomy_counts") or {}
    if any(counts.values()):
        lines.append(
            f"anatomy checks: {counts['within']} within ranges, {counts['outside']} outside, "
            f"{counts['not_brain_like']} not brain-like, {counts['not_checked']} not checked"
        )
        flagged = [
            (p, a) for p, a in sorted(data["anatomy"].items()) if a["status"] in ("outside", "not_brain_like")
        ]
        for participant, check in flagged[:4]:
            lines.append(f"  {participant}: {check['verdict'][:70]}")
    for failure in data["failures"][:4]:
        last = failure["errors"][-1]["error"] if failure["errors"] else ""
        lines.append(f"{failure['participant']} ({failure['state']}): {last[:60]}")
    reliability = data.get("reliability")
    ax.text(0, 0.92 if reliability else 1, "\n".join(lines), va="top", family="monospace", fontsize=9)
    if reliability:  # above the numbers, in the colour of whether it reaches 95 %
        reached = reliability["reaches_95"]
        ax.text(
            0,
            1,
            reliability_words(reliability),
            va="top",
            family="monospace",
            fontsize=9,
            weight="bold",
            color=PASS_COLOUR if reached else FAIL_COLOUR,
        )
    # Montage.
    for i, (participant, image) in enumerate(data["slices"]):
        ax = fig.add_subplot(grid[2 + i // cols, i % cols])
        ax.imshow(image, cmap="gray", vmin=0, vmax=max(1e-6, float(np.percentile(image, 99.5))))
        ax.set_title(participant, fontsize=8)
        ax.axis("off")
    if not data["slices"]:
        ax = fig.add_subplot(grid[2, :])
        ax.axis("off")
        ax.text(0.5, 0.5, "no montage (vault target or no volumes)", ha="center", va="center")
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(path)
    plt.close(fig)
    return path


def write_report(root: str | Path, out: str | Path | None = None, montage: int = 12) -> Path:
    """Write the report of the cohort folder ``root`` as .png or .html; returns its path."""
    from engine.cohort.dataset import write_text_atomic
    from engine.nifti.io import atomic_files

    root = Path(root).expanduser()
    out_path = Path(out).expanduser() if out else root / STATE_DIR / "report.png"
    if out_path.suffix.lower() not in (".png", ".html"):
        raise InvalidRequest(f"report file {out_path.name} must end in .png or .html")
    data = collect(root, montage)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    if out_path.suffix.lower() == ".png":
        with atomic_files([out_path]) as (temp,):
            draw(data, temp)
        return out_path
    png = out_path.with_suffix(".figure.png")
    with atomic_files([png]) as (temp,):
        draw(data, temp)
    encoded = base64.b64encode(png.read_bytes()).decode()
    png.unlink()
    failures = "".join(
        f"<tr><td>{html.escape(f['participant'])}</td><td>{html.escape(f['state'])}</td>"
        f"<td>{html.escape(json.dumps(f['errors']))}</td></tr>"
        for f in data["failures"]
    )
    page = (
        f"<!doctype html><meta charset='utf-8'><title>Cohort {html.escape(data['cohort_id'])}</title>"
        f"<h1>SYNTHETIC cohort {html.escape(data['cohort_id'])}</h1>"
        f"<p>{data['done']}/{data['total']} volumes, {data['failed']} failed, {data['retries']} retried; "
        f"{data['volumes_per_min']:.2f} volumes/min.</p>"
        + (f"<p>{html.escape(data['measurements_skipped'])}.</p>" if data.get("measurements_skipped") else "")
        + (
            f"<p>{data['not_segmented']} volume(s) not brain-like enough to segment: no tissue maps, not "
            "measured (each sidecar's tissue_maps_not_made says why).</p>"
            if data.get("not_segmented")
            else ""
        )
        + _anatomy_html(data)
        + f"<img alt='cohort report' src='data:image/png;base64,{encoded}'>"
        f"<h2>Failures and retries</h2><table><tr><th>participant</th><th>state</th><th>errors</th></tr>"
        f"{failures or '<tr><td colspan=3>none</td></tr>'}</table>"
    )
    write_text_atomic(out_path, page)
    return out_path


def _anatomy_html(data: dict[str, Any]) -> str:
    """The anatomy checks' counts and each participant's verdict, as HTML (empty when nothing was checked)."""
    counts = data.get("anatomy_counts") or {}
    if not any(counts.values()):
        return ""
    rows = "".join(
        f"<tr><td>{html.escape(p)}</td><td>{html.escape(a['status'])}</td><td>{html.escape(a['verdict'])}</td></tr>"
        for p, a in sorted(data["anatomy"].items())
    )
    reliability = data.get("reliability")
    words = (
        f"<p><b style='color:{PASS_COLOUR if reliability['reaches_95'] else FAIL_COLOUR}'>"
        f"{html.escape(reliability_words(reliability))}</b></p>"
        if reliability
        else ""
    )
    return (
        f"<h2>Anatomy checks</h2>{words}<p>{counts['within']} within normative ranges, {counts['outside']} outside a "
        f"range, {counts['not_brain_like']} not brain-like, {counts['not_checked']} not checked (no tissue "
        "maps). Ranges and their sources: each sidecar's anatomy_check, or docs/anatomy-checks.md.</p>"
        f"<table><tr><th>participant</th><th>status</th><th>verdict</th></tr>{rows}</table>"
    )
