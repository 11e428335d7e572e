"""The quality report as one PNG a researcher reads at a glance (matplotlib, headless).

Drawn from the report's JSON (``QualityRun.to_dict()``), the same data the Compare window shows. The top row is
what decided each verdict: the field's four measures (FRD, tissue-volume distance, MS-SSIM diversity,
reliability) per setting with their 95 % intervals over fp32's seed-to-seed floor, and the permutation rule's
statistics over their thresholds (the feature groups that moved named beside them). The bottom row shows the
sets themselves: GM, WM and CSF volumes per seed over fp32's seed-to-seed range, and each seed's PSNR against
fp32. Pass and fail are told apart by colour (the Okabe-Ito blue and vermillion, safe for colour-blind readers),
by marker (circle, cross) and by word.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any

import numpy as np

from engine.metrics.colours import FAIL_COLOUR, PASS_COLOUR
from engine.quality.field import MEASURES, NAMES, RELIABLE_SHARE, UNITS, fmt
from engine.quality.measures import TISSUES

FLOOR_COLOUR = "0.55"
_SET_COLOURS = ("#56B4E9", "#999999", "#E69F00", "#009E73", "#CC79A7", "#F0E442", "#0072B2", "#D55E00")
_PERMUTATION = {"tissue": "tissue MMD", "features": "feature MMD", "diversity": "MS-SSIM diff."}
_GROUP_WORDS = {
    "tissue_ml": "tissue",
    "intensity_quantiles": "intensity",
    "texture": "texture",
    "downsampled": "layout",
}
_WIDTH = 3.3  # inches a panel


def save_png(run, path) -> bool:
    """Write ``run`` (a ``QualityRun``) as a PNG; False when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig = draw(run.to_dict())
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def draw(data: dict[str, Any]):
    """The report's figure from its JSON (``QualityRun.to_dict()``); the caller saves and closes it."""
    import matplotlib.pyplot as plt

    rows = ([data["noise_check"]] if data.get("noise_check") else []) + list(data["settings"].values())
    short = {r["label"]: _short(r["label"]) for r in rows}
    top = [m for m in MEASURES if any(m in r["measures"] for r in rows)] + ["permutation"]
    first = next(iter(data["settings"].values()))
    bottom = (list(TISSUES) if first["reference_set"]["tissue_ml"] else []) + ["psnr"]
    columns = max(len(top), len(bottom))
    fig = plt.figure(figsize=(_WIDTH * columns, 9.0))
    grid = fig.add_gridspec(2, columns, hspace=0.6, wspace=0.35)
    for column, name in enumerate(top):
        ax = fig.add_subplot(grid[0, column])
        if name == "permutation":
            _permutation_panel(ax, rows, short)
        elif name == "reliability":
            _reliability_panel(ax, data, rows, short)
        else:
            _measure_panel(ax, name, rows, short)
    for column, name in enumerate(bottom):
        ax = fig.add_subplot(grid[1, column])
        if name == "psnr":
            _psnr_panel(ax, data)
        else:
            _tissue_panel(ax, name, data)
    lines = _header(data, rows, int(_WIDTH * columns * 13))
    header = 0.25 + 0.2 * len(lines)  # inches of verdict text above the panels' three-line titles
    height = 9.0 + header
    fig.set_size_inches(_WIDTH * columns, height)
    for index, (text, colour, weight) in enumerate(lines):
        fig.text(
            0.01, 1 - (0.15 + 0.2 * index) / height, text, color=colour, fontsize=9, weight=weight, va="top"
        )
    fig.subplots_adjust(left=0.05, right=0.99, bottom=1.0 / height, top=1 - (header + 0.75) / height)
    return fig


def _short(label: str, width: int = 18) -> str:
    return label if len(label) <= width else label[: width - 1] + "…"


def _header(data: dict[str, Any], rows: list[dict[str, Any]], width: int) -> list[tuple[str, str, str]]:
    """The figure's text: what was compared, then each verdict (PASS / FAIL, coloured) and what decided it."""
    seeds = len(data["seeds"])
    source = f"tissue from {data['tissue_source']}" if data["tissue_source"] else data["tissue_note"]
    lines = [
        (
            f"Quality against fp32: {seeds} seeds a set (n = {seeds} volumes behind every figure but the floor's "
            f"{seeds} + {seeds}); floor = fp32 seeds A vs fp32 seeds B; {source}; anatomy checks in "
            f"{data.get('anatomy_space', 'native')} space",
            "black",
            "bold",
        )
    ]
    for report in rows:
        mark, colour = ("PASS", PASS_COLOUR) if report["within_noise"] else ("FAIL", FAIL_COLOUR)
        decided = ", ".join(_decided_words(report)) or "nothing beyond the floor"
        text = f"{mark}  {report['label']}: {report['verdict'].split(':')[0]}; decided by {decided}"
        for index, part in enumerate(textwrap.wrap(text, width, subsequent_indent="        ")):
            lines.append((part, colour, "bold" if index == 0 else "normal"))
    return lines


def _decided_words(report: dict[str, Any]) -> list[str]:
    words = []
    for name in report.get("decided_by", []):
        if name.startswith("permutation:"):
            stat = name.split(":", 1)[1]
            groups = _top_groups(report["statistics"].get(stat, {}))
            words.append(f"{_PERMUTATION[stat]} (permutation rule{', ' + groups if groups else ''})")
        else:
            words.append(NAMES[name])
    return words


def _top_groups(stat: dict[str, Any]) -> str:
    """The feature groups that carry at least a tenth of a feature MMD, largest first: "texture 85 %"."""
    groups = {k: max(v, 0.0) for k, v in (stat.get("by_group") or {}).items()}
    total = sum(groups.values())
    if total <= 0:
        return ""
    shares = sorted(((v / total, k) for k, v in groups.items()), reverse=True)
    return ", ".join(f"{_GROUP_WORDS.get(k, k)} {100 * f:.0f} %" for f, k in shares if f >= 0.1)


def _mark(ax, x: float, y: float, low: float, high: float, flagged: bool) -> None:
    colour = FAIL_COLOUR if flagged else PASS_COLOUR
    ax.errorbar(
        [x],
        [y],
        yerr=[[y - min(low, y)], [max(high, y) - y]],
        fmt="X" if flagged else "o",
        ms=9 if flagged else 7,
        color=colour,
        ecolor=colour,
        capsize=4,
        lw=1.6,
        zorder=3,
    )


def _settings_axis(ax, names: list[str]) -> None:
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
    ax.set_xlim(-0.6, len(names) - 0.4)
    ax.grid(axis="y", alpha=0.3)


def _measure_panel(ax, name: str, rows: list[dict[str, Any]], short: dict[str, str]) -> None:
    """One field measure: each setting's value and 95 % interval over the fp32 floor (its value and interval)."""
    shown = [r for r in rows if name in r["measures"]]
    first = shown[0]["measures"][name]
    low, high = first["floor_interval"]
    ax.axhspan(low, high, color="0.9", zorder=0)
    ax.axhline(first["floor"], color=FLOOR_COLOUR, ls="--", lw=1.2, zorder=1, label="fp32 floor (A vs B)")
    for x, report in enumerate(shown):
        m = report["measures"][name]
        _mark(ax, x, m["value"], m["interval"][0], m["interval"][1], m["flagged"])
        ax.annotate(
            f"{'FLAGGED' if m['flagged'] else 'within'} {fmt(name, m['value'])}",
            (x, m["interval"][1]),
            textcoords="offset points",
            xytext=(0, 5),
            ha="center",
            fontsize=7,
            color=FAIL_COLOUR if m["flagged"] else PASS_COLOUR,
            weight="bold" if m["flagged"] else "normal",
        )
    if name == "frd" and "features" in first:
        unit = f"{UNITS[name]}, {first['features']} features"
    else:
        unit = UNITS[name]
    pairs = " pairs" if name == "diversity" else ""
    ax.set_title(
        f"{NAMES[name]}\n{unit}\nn = {first['n']}{pairs} a set; grey: floor's 95 % interval", fontsize=9
    )
    ax.margins(y=0.25)  # room for the words above the intervals
    ax.legend(fontsize=7, loc="best")
    if name == "frd":
        ax.set_ylabel("log(d²)")
    _settings_axis(ax, [short[r["label"]] for r in shown])


def _reliability_panel(ax, data: dict[str, Any], rows: list[dict[str, Any]], short: dict[str, str]) -> None:
    """Each set's share of volumes passing the anatomy check, with its Wilson interval and passed/count."""
    first = rows[0]["reliability"]
    sets = [("fp32 A", first["reference"], False)]
    for report in rows:
        if report["reliability"]:
            flagged = bool(report["measures"].get("reliability", {}).get("flagged"))
            sets.append((short[report["label"]], report["reliability"]["candidate"], flagged))
    for x, (_label, share, flagged) in enumerate(sets):
        colour = FAIL_COLOUR if flagged else PASS_COLOUR
        value = 100 * share["share"]
        low, high = (100 * v for v in share["interval"])
        ax.bar([x], [value], color=colour, alpha=0.35 if not flagged else 0.6, width=0.6, zorder=2)
        ax.errorbar(
            [x], [value], yerr=[[value - low], [high - value]], color=colour, capsize=4, lw=1.4, zorder=3
        )
        ax.text(x, 2, f"{share['passed']}/{share['count']}", ha="center", fontsize=8, zorder=4)
    ax.axhline(100 * RELIABLE_SHARE, color=FLOOR_COLOUR, ls=":", lw=1.2)
    ax.text(-0.5, 100 * RELIABLE_SHARE - 1, "95 % (Wu et al.)", fontsize=7, va="top", color="0.3", zorder=5)
    ax.set_ylim(0, 108)
    ax.set_ylabel("% passing")
    ax.set_title(
        f"reliability: share passing the anatomy check\n({data.get('anatomy_space', 'native')} space; "
        "Wilson 95 % intervals)\npassed/checked on each bar",
        fontsize=9,
    )
    _settings_axis(ax, [label for label, _, _ in sets])


def _permutation_panel(ax, rows: list[dict[str, Any]], short: dict[str, str]) -> None:
    """The permutation rule: each statistic over its threshold (above 1: beyond seed-to-seed variation)."""
    offsets = {"tissue": -0.22, "features": 0.0, "diversity": 0.22}
    markers = {"tissue": "s", "features": "D", "diversity": "^"}
    top = 1.0
    for x, report in enumerate(rows):
        for stat, result in report["statistics"].items():
            threshold = result["seed_to_seed_threshold"]
            ratio = result["value"] / threshold if threshold > 0 else math.inf
            shown = min(ratio, 1e4) if math.isfinite(ratio) else 1e4
            top = max(top, shown)
            colour = FAIL_COLOUR if result["beyond_noise"] else PASS_COLOUR
            ax.scatter(
                [x + offsets[stat]], [max(shown, 1e-3)], marker=markers[stat], color=colour, s=36, zorder=3
            )
            if stat == "features" and result["beyond_noise"]:
                ax.annotate(
                    _top_groups(result).replace(", ", "\n"),
                    (x, max(shown, 1e-3)),
                    textcoords="offset points",
                    xytext=(0, -10),
                    ha="center",
                    va="top",
                    fontsize=7,
                    color=FAIL_COLOUR,
                )
    for stat, marker in markers.items():
        ax.scatter([], [], marker=marker, color="0.3", label=_PERMUTATION[stat])
    ax.axhline(1.0, color=FLOOR_COLOUR, ls="--", lw=1.2, label="threshold (98.3 % of splits)")
    ax.set_yscale("log")
    ax.set_ylim(1e-3, top * 3)
    ax.set_ylabel("statistic / its threshold")
    ax.set_title(
        "permutation rule (2000 splits of fp32 A+B)\nstatistic over threshold; feature groups\nthat moved beside it",
        fontsize=9,
    )
    ax.legend(fontsize=7, loc="lower left")
    _settings_axis(ax, [short[r["label"]] for r in rows])


def _tissue_panel(ax, tissue: str, data: dict[str, Any]) -> None:
    """One tissue's volumes, one dot a seed, per set, over fp32's seed-to-seed range (both fp32 sets)."""
    reports = list(data["settings"].values())
    first = reports[0]
    sets = [("fp32 A", first["reference_set"]), ("fp32 B", first["noise_floor"]["b"])]
    sets += [(_short(r["label"]), r["candidate_set"]) for r in reports]
    pool = np.array(
        first["reference_set"]["tissue_ml"][tissue] + first["noise_floor"]["b"]["tissue_ml"][tissue]
    )
    ax.axhspan(pool.min(), pool.max(), color="0.9", zorder=0, label="fp32 seed-to-seed range")
    data_sets = [summary["tissue_ml"][tissue] for _, summary in sets]
    ax.boxplot(
        data_sets, positions=range(len(sets)), widths=0.5, showfliers=False, medianprops={"color": "k"}
    )
    for x, values in enumerate(data_sets):
        jitter = np.linspace(-0.12, 0.12, len(values)) if len(values) > 1 else [0.0]
        ax.scatter(x + np.asarray(jitter), values, s=10, color=_SET_COLOURS[x % len(_SET_COLOURS)], zorder=3)
    ax.set_title(f"{tissue} volume (mL), n = {len(data_sets[0])} a set", fontsize=9)
    ax.legend(fontsize=7, loc="best")
    _settings_axis(ax, [name for name, _ in sets])


def _psnr_panel(ax, data: dict[str, Any]) -> None:
    """Each setting's PSNR against fp32 on the same seed (per-seed closeness; reported, not voted on)."""
    for index, report in enumerate(data["settings"].values()):
        values = []
        for row in report["per_seed"]:
            value = row["psnr_db"]
            value = math.inf if value in ("inf", math.inf) else value
            values.append(np.nan if value is None else 99.0 if math.isinf(float(value)) else float(value))
        ax.plot(
            range(len(values)),
            values,
            "o-",
            ms=3,
            color=_SET_COLOURS[(index + 2) % len(_SET_COLOURS)],
            label=_short(report["label"]),
        )
    ax.axhline(40.0, color=FLOOR_COLOUR, lw=1, ls=":", label="40 dB")
    ax.set_xlabel("seed (index in set A)")
    ax.set_title("PSNR vs fp32, same seed (dB)\n(beside the verdict, not voted on)", fontsize=9)
    ax.legend(fontsize=7, loc="lower left")
    ax.grid(axis="y", alpha=0.3)
