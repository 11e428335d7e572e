"""The quality report as one PNG a researcher reads at a glance (matplotlib, headless)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from engine.quality.measures import TISSUES

_COLOURS = ("#4c72b0", "#8c8c8c", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3")


def save_png(run, path) -> bool:
    """Write ``run`` (a ``QualityRun``) as a PNG: per tissue the volumes of every set side by side (one dot a seed,
    the box their quartiles) over a grey band for the fp32 seed-to-seed range (both fp32 seed sets), then the
    per-seed PSNR and SSIM against fp32 and the MS-SSIM diversity, each setting's verdict in the title.
    Returns False when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    reports = list(run.reports.values())
    first = reports[0]
    sets = [("fp32 A", first.reference), ("fp32 B", first.noise_b)] + [
        (r.label, r.candidate) for r in reports
    ]
    colours = {name: _COLOURS[i % len(_COLOURS)] for i, (name, _) in enumerate(sets)}
    has_tissue = bool(first.reference.tissue_ml)
    panels = (list(TISSUES) if has_tissue else []) + ["psnr", "ssim", "diversity"]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.1 * len(panels), 5.2), squeeze=False)
    axes = axes[0]
    positions = np.arange(len(sets))
    names = [name for name, _ in sets]
    for ax, panel in zip(axes, panels, strict=False):
        if panel in TISSUES:
            pool = np.array(first.reference.tissue_ml[panel] + first.noise_b.tissue_ml[panel])
            ax.axhspan(pool.min(), pool.max(), color="0.88", zorder=0, label="fp32 seed-to-seed range")
            ax.axhline(float(np.mean(first.reference.tissue_ml[panel])), color="0.5", lw=1, ls="--", zorder=1)
            data = [summary.tissue_ml[panel] for _, summary in sets]
            ax.boxplot(data, positions=positions, widths=0.5, showfliers=False, medianprops={"color": "k"})
            for x, (name, values) in zip(positions, zip(names, data, strict=True), strict=True):
                jitter = np.linspace(-0.12, 0.12, len(values)) if len(values) > 1 else [0.0]
                ax.scatter(x + np.asarray(jitter), values, s=12, color=colours[name], zorder=3)
            ax.set_title(f"{panel} volume (mL)")
        elif panel in ("psnr", "ssim"):
            key = "psnr_db" if panel == "psnr" else "ssim"
            for report in reports:
                values = [row[key] for row in report.per_seed]
                finite = [
                    np.nan if v is None else (99.0 if isinstance(v, float) and math.isinf(v) else v)
                    for v in values
                ]
                ax.plot(
                    range(len(finite)), finite, "o-", ms=3, color=colours[report.label], label=report.label
                )
            ax.set_xlabel("seed (index in set A)")
            ax.set_title("PSNR vs fp32, same seed (dB)" if panel == "psnr" else "SSIM vs fp32, same seed")
            if panel == "psnr":
                ax.axhline(40.0, color="0.6", lw=1, ls=":", label="40 dB")
        else:
            data = [summary.diversity for _, summary in sets]
            pool = np.array(first.reference.diversity + first.noise_b.diversity)
            ax.axhspan(pool.min(), pool.max(), color="0.88", zorder=0)
            ax.boxplot(data, positions=positions, widths=0.5, showfliers=False, medianprops={"color": "k"})
            for x, name, values in zip(positions, names, data, strict=True):
                ax.scatter(np.full(len(values), x), values, s=10, color=colours[name], zorder=3)
            ax.set_title("MS-SSIM between seeds\n(lower: more diverse)")
        if panel not in ("psnr", "ssim"):
            ax.set_xticks(positions)
            ax.set_xticklabels(
                [n if len(n) <= 16 else n[:15] + "…" for n in names], rotation=30, ha="right", fontsize=8
            )
        ax.grid(axis="y", alpha=0.3)
    axes[len(TISSUES) if has_tissue else 0].legend(fontsize=7, loc="lower left")
    import textwrap

    width = int(15 * 3.1 * len(panels))  # characters of 9-pt text across the figure
    source = f"tissue from {run.tissue_source}" if run.tissue_source else run.tissue_note
    lines = textwrap.wrap(
        f"Quality against fp32, {len(run.seeds)} seeds a set (grey: fp32 seed-to-seed range; {source})", width
    )
    for report in ([run.noise_check] if run.noise_check else []) + reports:
        verdict = report.verdict.split(" (tissue volumes not compared")[0]  # the first line says why
        lines += textwrap.wrap(f"{report.label}: {verdict}", width, subsequent_indent="    ")
    height = 4.4 + 0.17 * len(lines)
    fig.set_size_inches(3.1 * len(panels), height)
    fig.suptitle("\n".join(lines), fontsize=9, ha="left", x=0.01, y=0.995, va="top")
    fig.subplots_adjust(
        left=0.05, right=0.99, bottom=1.3 / height, top=1 - (0.17 * len(lines) + 0.55) / height, wspace=0.3
    )
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
