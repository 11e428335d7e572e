"""The Compare window's quality view: A's and B's settings judged against fp32 over N seeds, with a noise floor.

*Compute Quality Report* runs ``engine.quality.run.quality_run`` in the one worker class (progress, Cancel at
the next step, the window never waits): fp32 on seed set A and on seed set B (the noise floor), each chosen
setting on set A. The plots show each set's GM, WM and CSF volumes side by side, one dot a seed, over a grey
band for fp32's seed-to-seed range, and the PSNR of each seed against fp32 on the same seed; below them, each
setting's verdict ("within seed-to-seed variation" or "shifts the distribution: what moved") beside its time
per volume against fp32's, by the noise rule (the volumes are made seed by seed, every setting in turn). Under
each verdict, the statistics behind it: the field's measures (FRD, tissue-volume distance, MS-SSIM diversity,
reliability) with their 95 % intervals against fp32's floor and the number of volumes behind them, the one that
decided in bold, and each set's share of volumes passing the anatomy check. Pass and fail are told apart by
colour (blue, orange: safe for colour-blind readers) and by word.
"""

from __future__ import annotations

import html
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSizePolicy,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.services.job_view import JobStrip
from app.services.workers import Worker
from engine.metrics.colours import FAIL_ON_DARK, PASS_ON_DARK
from engine.quality.measures import TISSUES

DEFAULT_SEEDS = 8
PLOT_BACKGROUND = "#15181c"
BAND_COLOUR = (200, 200, 200, 45)
SET_COLOURS = ("#6fa8dc", "#b7b7b7", "#f6b26b", "#93c47d", "#e06666", "#b4a7d6")
WITHIN_COLOUR, SHIFT_COLOUR = PASS_ON_DARK, FAIL_ON_DARK
PSNR_IDENTICAL = 100.0  # where an identical volume (PSNR = inf) is drawn on the PSNR plot


def _progress_line(progress) -> tuple[float | None, str]:
    """The strip's line: the bar moves with the denoising steps only, the line says every stage."""
    return (progress.fraction if progress.stage == "denoise" else None), progress.message or progress.stage


def _quality_job(pool, device: str, request, settings: dict, seeds: int):
    """Called in the worker thread: the device's backend (a local one imports torch), then the run."""
    from engine.quality.run import quality_run

    return quality_run(pool.get(device), request, settings, seeds)


class QualityView(QWidget):
    """The quality view; ``start()`` runs, ``cancel()`` stops at the next step, ``show_run`` draws a result."""

    report_ended = Signal(str)  # "finished", "cancelled" or "failed"

    def __init__(self, app, what_to_judge: Callable[[], Any], parent: QWidget | None = None) -> None:
        """``what_to_judge()`` gives ``(request, {label: OptimizationConfig}, device)`` or raises EngineError."""
        super().__init__(parent)
        self.app = app
        self.what_to_judge = what_to_judge
        self.run = None
        self._job = None
        self._started = 0.0

        self.seeds_spin = QSpinBox()
        self.seeds_spin.setRange(4, 64)
        self.seeds_spin.setValue(DEFAULT_SEEDS)
        self.seeds_spin.setToolTip(
            "Seeds a set: fp32 runs on this many seeds twice (two seed sets, the noise floor) and each setting "
            "on the first set. 16 gives a usable noise floor; the rule needs at least 4."
        )
        self.schedule_spin = QSpinBox()
        self.schedule_spin.setRange(0, 1000)
        self.schedule_spin.setSpecialValueText("none")
        self.schedule_spin.setSuffix(" steps")
        self.schedule_spin.setToolTip(
            "Also judge a shorter schedule: fp32 on this many steps against fp32 on the Generate panel's steps, "
            "by the same rule (fewer U-Net evaluations are faster but change the volume)"
        )
        self.compute_button = QPushButton("Compute Quality Report")
        self.compute_button.setToolTip(
            "Judge A's and B's settings against fp32 over the seeds: tissue volumes, diversity, features, "
            "per-seed PSNR/SSIM (the same as `volsynth quality`)"
        )
        self.compute_button.clicked.connect(self.start)
        # The running report's progress, its line and Cancel (Esc in the Compare window).
        self.strip = JobStrip(self, cancel_tip="Stop the quality report at the next step (Esc)")
        self.progress_bar, self.progress_label = self.strip.progress_bar, self.strip.progress_label
        self.cancel_button = self.strip.cancel_button
        top = QHBoxLayout()
        top.addWidget(QLabel("Seeds"))
        top.addWidget(self.seeds_spin)
        top.addWidget(QLabel("Fewer steps"))
        top.addWidget(self.schedule_spin)
        top.addWidget(self.compute_button)
        top.addWidget(self.cancel_button)
        top.addWidget(self.progress_bar, 1)
        top.addWidget(self.progress_label, 2)

        self.plots: dict[str, Any] = {}
        grid = QGridLayout()
        grid.setSpacing(6)
        for column, name in enumerate((*TISSUES, "psnr")):
            self.plots[name] = self._make_plot(name)
            grid.addWidget(self.plots[name], 0, column)
            grid.setColumnStretch(column, 1)
        self.verdict_label = QLabel(
            "Compute the report to judge A's and B's settings against fp32 over seeds."
        )
        self.verdict_label.setObjectName("qualityVerdicts")
        self.verdict_label.setTextFormat(Qt.TextFormat.RichText)
        self.verdict_label.setWordWrap(True)
        self.verdict_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.verdict_label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(top)
        layout.addLayout(grid, 1)
        layout.addWidget(self.verdict_label)
        self._set_running(False)

    def _make_plot(self, name: str):
        import pyqtgraph as pg

        plot = pg.PlotWidget(background=PLOT_BACKGROUND)
        plot.setObjectName(f"quality-{name}")
        plot.setMinimumSize(160, 150)
        item = plot.getPlotItem()
        item.hideButtons()
        item.setMenuEnabled(False)
        item.setMouseEnabled(x=False, y=False)
        item.showGrid(x=False, y=True, alpha=0.15)
        item.setTitle(
            f"{name} volume (mL)" if name in TISSUES else "PSNR vs fp32, same seed (dB)", size="9pt"
        )
        if name == "psnr":
            item.setLabel("bottom", "seed")
        return plot

    # -- running -------------------------------------------------------------------------------------

    def start(self) -> bool:
        """Start a report from the window's request and A/B settings; False (and says why) if it cannot."""
        from engine.errors import EngineError

        if self._job is not None:
            return False
        if self.app.state.job_running:
            self.progress_label.setText(
                "A run is in progress. Wait for it to finish or cancel it, then compute."
            )
            return False
        try:
            request, settings, device = self.what_to_judge()
        except EngineError as exc:
            self.progress_label.setText(str(exc))
            self.app.show_error("Cannot compute the quality report", str(exc))
            return False
        if self.schedule_spin.value():
            from engine.api.optimization_config import OptimizationConfig
            from engine.quality.run import Candidate

            steps = self.schedule_spin.value()
            settings = {**settings, f"fp32, {steps} steps": Candidate(OptimizationConfig(), steps)}
        seeds = self.seeds_spin.value()
        self._volumes = seeds * (2 + len(settings))
        names = ", ".join(settings)
        self._job = self.app.runner.run(
            "quality",
            Worker.generator(lambda: _quality_job(self.app.backends, device, request, settings, seeds)),
            what="Quality report",
            done=self._on_job_finished,
            strip=self.strip,
            text=f"{self._volumes} volumes: fp32 on two seed sets of {seeds}, then {names}",
            cancelling_text="Cancelling at the next step...",
            describe=_progress_line,
            ended=self._on_job_ended,
            holds_engine=True,  # one engine job at a time: Generate and Compare wait for it
        )
        self._started = time.monotonic()
        self._set_running(True)
        return True

    def cancel(self) -> None:
        if self._job is not None:
            self._job.cancel()

    def _set_running(self, running: bool) -> None:
        self.compute_button.setEnabled(not running)
        self.cancel_button.setEnabled(running)
        self.seeds_spin.setEnabled(not running)

    def _on_job_finished(self, run) -> None:
        self.run = run
        self.progress_label.setText(
            f"Done in {time.monotonic() - self._started:.0f} s ({self._volumes} volumes)"
        )
        self.show_run(run)

    def _on_job_ended(self, outcome: str) -> None:
        """After the report's thread ended: the runner has shown a failure and freed the engine."""
        self._job = None
        self._set_running(False)
        self.report_ended.emit(outcome)

    # -- showing -------------------------------------------------------------------------------------

    def show_run(self, run) -> None:
        """Draw a finished ``QualityRun``."""
        self.show_report(run.to_dict())

    def show_report(self, data: dict) -> None:
        """Draw a quality report as ``QualityRun.to_dict()`` (and ``volsynth quality --json``) writes it."""
        import pyqtgraph as pg

        reports = list(data["settings"].values())
        first = reports[0]
        sets = [("fp32 A", first["reference_set"]), ("fp32 B", first["noise_floor"]["b"])]
        sets += [(r["label"], r["candidate_set"]) for r in reports]
        # Settings go by number on the axes (their names overlap there and pyqtgraph drops overlapping ticks);
        # the verdicts below name them in full.
        ticks = [[(i, name if i < 2 else f"S{i - 1}") for i, (name, _) in enumerate(sets)]]
        for name in TISSUES:
            plot = self.plots[name]
            plot.clear()
            plot.getAxis("bottom").setTicks(ticks)
            if not first["reference_set"]["tissue_ml"]:
                plot.getPlotItem().setTitle(f"{name}: no tissue volumes", size="9pt")
                continue
            plot.getPlotItem().setTitle(f"{name} volume (mL)", size="9pt")
            pool = first["reference_set"]["tissue_ml"][name] + first["noise_floor"]["b"]["tissue_ml"][name]
            band = pg.LinearRegionItem(
                values=(min(pool), max(pool)),
                orientation="horizontal",
                movable=False,
                brush=pg.mkBrush(*BAND_COLOUR),
                pen=pg.mkPen(None),
            )
            band.setZValue(-10)
            plot.addItem(band)
            edge = pg.mkPen((200, 200, 200), width=1, style=Qt.PenStyle.DashLine)
            for value in (min(pool), max(pool)):  # the band's edges stay visible when it fills the plot
                plot.addItem(pg.InfiniteLine(pos=value, angle=0, pen=edge))
            for index, (label, summary) in enumerate(sets):
                values = np.asarray(summary["tissue_ml"][name], float)
                jitter = np.linspace(-0.18, 0.18, len(values)) if len(values) > 1 else np.zeros(1)
                colour = SET_COLOURS[index % len(SET_COLOURS)]
                plot.addItem(
                    pg.ScatterPlotItem(
                        index + jitter,
                        values,
                        size=6,
                        brush=pg.mkBrush(colour),
                        pen=pg.mkPen(None),
                        name=label,
                    )
                )
                mean = float(values.mean())
                plot.addItem(
                    pg.PlotDataItem([index - 0.3, index + 0.3], [mean, mean], pen=pg.mkPen("w", width=2))
                )
            plot.getPlotItem().setXRange(-0.6, len(sets) - 0.4, padding=0)
            every = [v for _, summary in sets for v in summary["tissue_ml"][name]]
            span = max(max(every) - min(every), 1e-6)
            plot.getPlotItem().setYRange(min(every) - 0.2 * span, max(every) + 0.2 * span, padding=0)
        psnr = self.plots["psnr"]
        psnr.clear()
        psnr.addLegend(offset=(-4, 4), labelTextSize="8pt")  # top right, over the headroom left below
        psnr.addItem(
            pg.InfiniteLine(pos=40.0, angle=0, pen=pg.mkPen((180, 180, 180), style=Qt.PenStyle.DotLine))
        )
        for index, report in enumerate(reports, start=2):
            shown = [_db(row["psnr_db"]) for row in report["per_seed"]]
            colour = SET_COLOURS[index % len(SET_COLOURS)]
            psnr.plot(
                list(range(len(shown))),
                shown,
                pen=pg.mkPen(colour, width=1.5),
                symbol="o",
                symbolSize=5,
                symbolBrush=colour,
                name=f"S{index - 1} " + _short(report["label"], 14),
            )
        shown_db = [_db(row["psnr_db"]) for r in reports for row in r["per_seed"]]
        finite = [v for v in shown_db if v == v]
        if finite:  # headroom above the highest curve for the legend
            low, high = min(finite + [40.0]), max(finite + [40.0])
            psnr.getPlotItem().setYRange(low - 3, high + 0.35 * (high - low) + 3, padding=0)
        self.verdict_label.setText(self.verdict_html(data))

    @staticmethod
    def verdict_html(data: dict) -> str:
        lines = []
        speed = data.get("speed") or {}
        rows = ([data["noise_check"]] if data.get("noise_check") else []) + list(data["settings"].values())
        for report in rows:
            colour = WITHIN_COLOUR if report["within_noise"] else SHIFT_COLOUR
            number = (
                ""
                if report is data.get("noise_check")
                else f"S{list(data['settings'].values()).index(report) + 1} \u00b7 "
            )
            psnr = _db(report["psnr_median_db"])
            if psnr != psnr or report is data.get(
                "noise_check"
            ):  # none, or between different seeds: no meaning
                dist = ""
            elif psnr >= PSNR_IDENTICAL:
                dist = " \u00b7 identical to fp32"
            else:
                dist = f" \u00b7 PSNR median {psnr:.1f} dB"
            mark = "PASS" if report["within_noise"] else "FAIL"
            lines.append(
                f"<b>{number}{html.escape(report['label'])}</b>: "
                f"<span style='color:{colour}'><b>{mark}</b> {html.escape(report['verdict'])}</span>{dist}"
                + _time_html(speed.get(report["label"]), report is data.get("noise_check"), speed)
            )
            measures = _measures_html(report)
            if measures:
                lines.append(f"&nbsp;&nbsp;&nbsp;&nbsp;<span style='color:#bbb'>{measures}</span>")
        seeds, noise = data["seeds"], data["noise_seeds"]
        source = (
            f"tissue volumes from {data['tissue_source']}" if data["tissue_source"] else data["tissue_note"]
        )
        lines.append(
            f"<span style='color:#999'>{len(seeds)} seeds a set; grey band: fp32's seed-to-seed range (seeds "
            f"{seeds[0]}-{seeds[-1]} and {noise[0]}-{noise[-1]}); {html.escape(source)}</span>"
        )
        return "<br>".join(lines)


def _measures_html(report: dict) -> str:
    """The field's measures behind a verdict, one phrase each: value [95 % interval] against the fp32 floor, the
    volumes behind it; those that flagged the setting in bold and the fail colour; then the setting's share of
    volumes passing the anatomy check."""
    from engine.quality.field import MEASURES, NAMES, fmt

    parts = []
    for name in MEASURES:
        measure = report.get("measures", {}).get(name)
        if measure is None:
            continue
        low, high = measure["interval"]
        what = "pairs" if name == "diversity" else "volumes"
        text = html.escape(
            f"{NAMES[name]} {fmt(name, measure['value'])} [{fmt(name, low)}, {fmt(name, high)}] vs floor "
            f"{fmt(name, measure['floor'])}, n={measure['n']} {what}"
        )
        parts.append(f"<b style='color:{SHIFT_COLOUR}'>{text} (decided)</b>" if measure["flagged"] else text)
    for name in report.get("decided_by", []):
        if name.startswith("permutation:"):
            stat = report["statistics"][name.split(":", 1)[1]]
            parts.append(
                f"<b style='color:{SHIFT_COLOUR}'>permutation rule: {html.escape(name.split(':', 1)[1])} "
                f"{stat['value']:.3g} over threshold {stat['seed_to_seed_threshold']:.3g} (decided)</b>"
            )
    share = (report.get("reliability") or {}).get("candidate")
    if share:
        low, high = share["interval"]
        parts.append(
            f"reliable {share['passed']}/{share['count']} ({100 * share['share']:.0f} %, 95 % interval "
            f"{100 * low:.0f}-{100 * high:.0f} %)"
        )
    return " \u00b7 ".join(parts)


def _time_html(pace: dict | None, is_fp32: bool, speed: dict) -> str:
    """A setting's time per volume beside its quality: " · 2.31 s a volume, 1.42x fp32 (faster)"; fp32's own
    time on its row."""
    if is_fp32:
        first = next(iter(speed.values()), None)
        return f" \u00b7 {first['reference_median_s']:.2f} s a volume" if first else ""
    if not pace:
        return ""
    verdict = pace["verdict"]
    ratio = f"{verdict['ratio']:.2f}x fp32's speed" if verdict.get("ratio") else "n/a"
    colour = {"faster": WITHIN_COLOUR, "slower": SHIFT_COLOUR}.get(verdict["verdict"], "#999")
    return (
        f" \u00b7 {pace['median_s']:.2f} s a volume, <span style='color:{colour}' title='{html.escape(verdict['words'])}'>"
        f"{ratio} ({html.escape(verdict['verdict'])})</span>"
    )


def _db(value) -> float:
    """A PSNR from the report's JSON as a number to plot: "inf" (identical) at PSNR_IDENTICAL, None as NaN."""
    if value is None:
        return math.nan
    value = float(value)
    return PSNR_IDENTICAL if math.isinf(value) else value


def _short(label: str, width: int = 18) -> str:
    return label if len(label) <= width else label[: width - 1] + "\u2026"
