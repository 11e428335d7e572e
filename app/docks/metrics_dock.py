"""Live GPU, CPU and memory plots from a telemetry source, with marks where each generation ran.

The dock reads an ``engine.telemetry`` metrics source (the local ``Sampler``, or a ``FeedSource`` filled
from a remote server) by polling ``history(after_seq=...)`` from a QTimer in the GUI thread. No signal
crosses threads: the sampler's listeners run on its own thread, and PySide6 may run a callable connected to
a signal emitted there in that thread too, where touching a widget crashes; polling from the GUI thread
avoids both.

Costs are kept off the start-up path and off hidden docks: pyqtgraph is imported when the dock is first
drawn, and nothing is fetched or drawn while the dock is off screen (behind another tab, or closed). Samples
keep accumulating in the source's ring buffer meanwhile, so the plots are complete when it is shown again.

X is seconds before the newest sample, on the samples' own clock, so a remote server's clock needs no
translation; run marks are placed on that clock too.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QFont
from PySide6.QtWidgets import (
    QComboBox,
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

from app.core.display import format_bytes, format_duration, run_summary_lines
from engine.formatting import count_of

DEFAULT_WINDOW_S = 120.0
WINDOW_CHOICES = ((60.0, "1 min"), (120.0, "2 min"), (300.0, "5 min"), (600.0, "10 min"))
REDRAW_MS = 250  # 4 Hz: the sampler's rate; a 2-minute window moves less than a pixel per redraw
GIB = float(2**30)

# Colours of resources/ui/dark.qss, so the plots sit in the dark theme.
PLOT_BACKGROUND = "#15181c"
AXIS_PEN = "#3a404a"
AXIS_TEXT = "#8b93a1"
CARD_COLOURS = {
    "gpu_util": "#3d8fd6",
    "gpu_memory": "#c678dd",
    "gpu_power": "#e5a04b",
    "gpu_temperature": "#e06c75",
    "cpu": "#56b6c2",
    "memory": "#98c379",
}
GPU_COLOURS = ("#3d8fd6", "#c678dd", "#98c379", "#e5a04b", "#56b6c2", "#e06c75", "#d19a66", "#61afef")
LIMIT_COLOUR = "#e06c75"
RSS_COLOUR = "#e5c07b"
MARK_COLOURS = {"start": "#aab2bf", "finished": "#98c379", "cancelled": "#e5c07b", "failed": "#e06c75"}
AXIS_WIDTH = 40  # the same for every card, so their time axes line up

GPU_CARDS = ("gpu_util", "gpu_memory", "gpu_power", "gpu_temperature")
CARD_TITLES = {
    "gpu_util": "GPU utilization (%)",
    "gpu_memory": "GPU memory (GiB)",
    "gpu_power": "GPU power (W)",
    "gpu_temperature": "GPU temperature (\u00b0C)",
    "cpu": "CPU (%)",
    "memory": "Memory (GiB)",
}


@dataclass
class RunMark:
    """A generation's start or end, drawn as a vertical line.

    Attributes:
        run_id: The telemetry run id.
        kind: ``"start"`` or ``"end"``.
        timestamp: Where, on the samples' clock (``Sample.timestamp``, epoch seconds).
        outcome: For an end: ``"finished"``, ``"cancelled"`` or ``"failed"``.
    """

    run_id: str
    kind: str
    timestamp: float
    outcome: str = ""

    @property
    def key(self) -> tuple[str, str]:
        return self.run_id, self.kind

    @property
    def colour(self) -> str:
        return MARK_COLOURS.get(self.outcome or self.kind, MARK_COLOURS["start"])

    @property
    def label(self) -> str:
        return "start" if self.kind == "start" else self.outcome or "end"


def sample_row(sample: Any) -> dict[str, float]:
    """The plotted numbers of one ``Sample`` (memory in GiB); metrics that are not available are left out."""
    system = sample.system
    cores = list(system.cpu_pct_per_core or [])
    values: dict[str, Any] = {
        "cpu": system.cpu_pct,
        "cpu_min": min(cores) if cores else None,
        "cpu_max": max(cores) if cores else None,
        # psutil gives the process's CPU in percent of one core; as a share of the machine it compares
        # directly with the total.
        "app_cpu": system.process_cpu_pct / len(cores)
        if cores and system.process_cpu_pct is not None
        else None,
        "ram": _gib(system.ram_used_bytes),
        "ram_total": _gib(system.ram_total_bytes),
        "rss": _gib(system.process_rss_bytes),
    }
    for gpu in sample.gpus:
        prefix = f"gpu{gpu.index}."
        values.update(
            {
                prefix + "sm": gpu.sm_util_pct,
                prefix + "mem_util": gpu.mem_util_pct,
                prefix + "mem_used": _gib(gpu.memory_used_bytes),
                prefix + "mem_total": _gib(gpu.memory_total_bytes),
                prefix + "power": gpu.power_w,
                prefix + "power_limit": gpu.power_limit_w,
                prefix + "temp": gpu.temperature_c,
            }
        )
    return {key: float(value) for key, value in values.items() if value is not None}


def _gib(count: int | None) -> float | None:
    return None if count is None else count / GIB


def elapsed_text(seconds: float) -> str:
    """Time since a run started, in whole seconds *completed* (``0:00`` for the first second).

    ``format_duration`` rounds up, which suits a countdown (it never shows ``0:00`` early) but makes a clock
    that counts up run a second ahead: ``0:01`` at 0.1 s."""
    return format_duration(math.floor(max(0.0, seconds)))


def time_ticks(window_s: float) -> list[list[tuple[float, str]]]:
    """Major ticks ``-2:00 ... now`` and unlabelled minor ticks for a window of ``window_s`` seconds."""
    step = 15.0 if window_s <= 60 else 30.0 if window_s <= 150 else 60.0 if window_s <= 300 else 120.0
    count = int(window_s // step)
    major = [(-i * step, "now" if i == 0 else "-" + format_duration(i * step)) for i in range(count, -1, -1)]
    minor = [(-(i + 0.5) * step, "") for i in range(count)]
    return [major, minor]


class _Columns:
    """The plotted numbers of the samples in the window, one column per metric (NaN where missing)."""

    def __init__(self) -> None:
        self.times: deque[float] = deque()
        self.seqs: deque[int] = deque()
        self.data: dict[str, deque[float]] = {}

    def __len__(self) -> int:
        return len(self.times)

    def clear(self) -> None:
        self.times.clear()
        self.seqs.clear()
        self.data.clear()

    def append(self, sample: Any) -> None:
        row = sample_row(sample)
        length = len(self.times)
        for key in row.keys() - self.data.keys():  # a metric (or GPU) seen for the first time
            self.data[key] = deque([math.nan] * length)
        for key, column in self.data.items():
            column.append(row.get(key, math.nan))
        self.times.append(float(sample.timestamp))
        self.seqs.append(int(sample.seq))

    def drop_before(self, timestamp: float) -> None:
        while self.times and self.times[0] < timestamp:
            self.times.popleft()
            self.seqs.popleft()
            for column in self.data.values():
                column.popleft()

    def array(self, key: str) -> np.ndarray:
        column = self.data.get(key)
        if column is None:
            return np.full(len(self.times), np.nan)
        return np.fromiter(column, dtype=np.float64, count=len(column))


class _PlotCard(QFrame):
    """One metric: a title, the current value (doubling as the legend) and a pyqtgraph plot."""

    def __init__(
        self, key: str, window_s: float, show_time_axis: bool, parent: QWidget | None = None
    ) -> None:
        import pyqtgraph as pg

        super().__init__(parent)
        self.key = key
        self.setObjectName("metricsCard")
        self.title_label = QLabel(CARD_TITLES[key])
        self.title_label.setObjectName("metricsTitle")
        self.value_label = QLabel("\u2013")
        self.value_label.setObjectName("metricsValue")
        self.value_label.setTextFormat(Qt.TextFormat.RichText)
        self.value_label.setAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        self.value_label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.title_label.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Preferred)

        self.plot = pg.PlotWidget(background=PLOT_BACKGROUND)
        self.plot.setObjectName(f"{key}Plot")
        self.plot.setMinimumHeight(70)
        self.plot.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)
        item = self.plot.getPlotItem()
        item.hideButtons()
        item.setMenuEnabled(False)
        item.setMouseEnabled(x=False, y=False)
        item.enableAutoRange(x=False, y=False)
        # Vertical grid lines are drawn as items (see set_window): with pyqtgraph's x grid on, the time axis
        # drops the edge labels ("-2:00", "now") that overhang its ends.
        item.showGrid(x=False, y=True, alpha=0.13)
        self._time_grid: list[Any] = []
        # Room on the right for the "now" tick label and on top for the highest y label.
        item.setContentsMargins(0, 6, 14, 0 if show_time_axis else 2)
        font = QFont(self.font())
        font.setPointSizeF(8.0)
        for name in ("left", "bottom"):
            axis = item.getAxis(name)
            axis.setPen(pg.mkPen(AXIS_PEN))
            axis.setTextPen(pg.mkPen(AXIS_TEXT))
            axis.setStyle(tickFont=font, tickLength=-4, tickTextOffset=4)
        item.getAxis("left").setWidth(AXIS_WIDTH)
        bottom = item.getAxis("bottom")
        if show_time_axis:
            bottom.setStyle(hideOverlappingLabels=16)
        else:
            bottom.setStyle(showValues=False)
            bottom.setHeight(4)
        self.set_window(window_s)
        self.curves: dict[str, pg.PlotDataItem] = {}
        self.fills: dict[str, pg.FillBetweenItem] = {}
        self.mark_lines: dict[tuple[str, str], pg.InfiniteLine] = {}
        self._y_range: tuple[float, float, float] | None = None

        # Title and legend share a row while they fit; in a narrow dock the legend moves under the title
        # instead of being cut off (see _place_legend).
        self.header = QGridLayout()
        self.header.setContentsMargins(8, 5, 8, 0)
        self.header.setHorizontalSpacing(8)
        self.header.setVerticalSpacing(1)
        self.header.addWidget(self.title_label, 0, 0)
        self.header.addWidget(self.value_label, 0, 1)
        self.header.setColumnStretch(1, 1)
        self.legend_below = False
        header = self.header
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 2, 2)
        layout.setSpacing(0)
        layout.addLayout(header)
        layout.addWidget(self.plot, 1)

    @property
    def plot_item(self):
        return self.plot.getPlotItem()

    def set_value_text(self, text: str) -> None:
        """The current values (the legend): beside the title, or under it when the card is too narrow."""
        if text != self.value_label.text():
            self.value_label.setText(text)
            self._place_legend()

    def _place_legend(self) -> None:
        margins = self.header.contentsMargins()
        needed = (
            self.title_label.sizeHint().width()
            + self.header.horizontalSpacing()
            + self.value_label.sizeHint().width()
            + margins.left()
            + margins.right()
            + 4
        )
        below = needed > self.width()
        if below == self.legend_below:
            return
        self.legend_below = below
        self.header.removeWidget(self.value_label)
        if below:
            self.header.addWidget(self.value_label, 1, 0, 1, 2)
            self.value_label.setAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter)
        else:
            self.header.addWidget(self.value_label, 0, 1)
            self.value_label.setAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().resizeEvent(event)
        self._place_legend()

    def set_window(self, window_s: float) -> None:
        # Every card sets the same fixed range (no X link: a hidden, zero-sized card would skew a linked one).
        # A hair of padding keeps the edge ticks ("-2:00", "now") from being dropped.
        import pyqtgraph as pg

        self.plot_item.setXRange(-window_s, 0, padding=0.004)
        ticks = time_ticks(window_s)
        self.plot_item.getAxis("bottom").setTicks(ticks)
        for line in self._time_grid:
            self.plot_item.removeItem(line)
        pen = pg.mkPen(255, 255, 255, 24, width=1)
        pen.setCosmetic(True)
        self._time_grid = [
            pg.InfiniteLine(pos=value, angle=90, movable=False, pen=pen) for value, _ in ticks[0] if value < 0
        ]
        for line in self._time_grid:
            line.setZValue(-10)
            self.plot_item.addItem(line, ignoreBounds=True)

    def set_y_range(self, low: float, high: float, ticks: Iterable[float] | None = None) -> None:
        # About 10 px of padding keeps the edge tick labels (0, 100) from being dropped at any height.
        padding = min(0.25, 10.0 / max(40, self.plot.height()))
        if self._y_range == (low, high, padding):
            return
        self._y_range = (low, high, padding)
        self.plot_item.setYRange(low, high, padding=padding)
        if ticks is not None:
            self.plot_item.getAxis("left").setTicks([[(v, f"{v:g}") for v in ticks], []])

    def curve(
        self,
        name: str,
        colour: str,
        *,
        width: float = 1.6,
        dashed: bool = False,
        alpha: int = 255,
        fill_alpha: int = 0,
        z: int = 0,
    ):
        """The curve called ``name``, created on first use."""
        import pyqtgraph as pg

        curve = self.curves.get(name)
        if curve is None:
            pen = pg.mkPen(
                pg.mkColor(colour),
                width=width,
                style=Qt.PenStyle.DashLine if dashed else Qt.PenStyle.SolidLine,
            )
            pen.setCosmetic(True)
            if alpha < 255:
                color = pen.color()
                color.setAlpha(alpha)
                pen.setColor(color)
            options: dict[str, Any] = {"pen": pen, "connect": "finite", "antialias": True}
            if fill_alpha:
                brush = pg.mkColor(colour)
                brush.setAlpha(fill_alpha)
                options.update(fillLevel=0.0, brush=brush)
            curve = pg.PlotDataItem(**options)
            curve.setZValue(z)
            curve.setClipToView(True)
            curve.setDownsampling(auto=True, method="peak")
            self.plot_item.addItem(curve)
            self.curves[name] = curve
        return curve

    def band(self, name: str, lower, upper, colour: str, alpha: int = 45):
        """A shaded area between two (invisible) curves, created on first use."""
        import pyqtgraph as pg

        fill = self.fills.get(name)
        if fill is None:
            brush = pg.mkColor(colour)
            brush.setAlpha(alpha)
            fill = pg.FillBetweenItem(lower, upper, brush=brush)
            fill.setZValue(-5)
            self.plot_item.addItem(fill)
            self.fills[name] = fill
        return fill

    def points(self, name: str) -> int:
        """Finite points of a curve (what tests check)."""
        curve = self.curves.get(name)
        if curve is None:
            return 0
        _, y = curve.getData()
        return 0 if y is None else int(np.isfinite(y).sum())

    def sync_marks(self, marks: list[RunMark], now: float, window_s: float, labelled: bool) -> None:
        """Draw the marks inside the window; drop lines that scrolled out."""
        import pyqtgraph as pg

        visible = {}
        for mark in marks:
            x = mark.timestamp - now
            if -window_s <= x <= 0.5:
                visible[mark.key] = (mark, x)
        for key in list(self.mark_lines):
            line = self.mark_lines[key]
            stale = (
                key not in visible
                or (getattr(line, "label", None) is not None) != labelled
                or line.mark_label != visible[key][0].label
            )
            if stale:
                self.plot_item.removeItem(line)
                del self.mark_lines[key]
        for key, (mark, x) in visible.items():
            line = self.mark_lines.get(key)
            if line is None:
                pen = pg.mkPen(
                    mark.colour,
                    width=1.4,
                    style=Qt.PenStyle.DashLine if mark.kind == "start" else Qt.PenStyle.SolidLine,
                )
                options: dict[str, Any] = {}
                if labelled:
                    options = {
                        "label": mark.label,
                        "labelOpts": {
                            "position": 0.86 if mark.kind == "start" else 0.55,
                            "color": mark.colour,
                            "fill": pg.mkBrush(21, 24, 28, 200),
                        },
                    }
                line = pg.InfiniteLine(pos=x, angle=90, movable=False, pen=pen, **options)
                line.mark_label = mark.label
                line.setZValue(10)
                if labelled:
                    font = QFont(self.font())
                    font.setPointSizeF(8.0)
                    line.label.setFont(font)
                self.plot_item.addItem(line)
                self.mark_lines[key] = line
            else:
                line.setValue(x)


class MetricsDock(QWidget):
    """Live telemetry: GPU utilisation, memory, power and temperature per GPU; CPU and RAM; run marks.

    Args:
        source: An ``engine.telemetry`` metrics source (``Sampler`` or ``FeedSource``); can be set later.
        window_s: Seconds of history on the x axis.
        redraw_ms: Redraw period while shown.
    """

    redrawn = Signal(int)  # seq of the newest sample drawn (tests and benchmarks listen)

    def __init__(
        self,
        source: Any = None,
        *,
        window_s: float = DEFAULT_WINDOW_S,
        redraw_ms: int = REDRAW_MS,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.setObjectName("metricsPanel")
        self.source: Any = None
        self.window_s = float(window_s)
        self.columns = _Columns()
        self.run_marks: list[RunMark] = []
        self.cards: dict[str, _PlotCard] = {}
        self.redraw_count = 0
        self._last_seq: int | None = None
        self._active_runs: dict[str, float] = {}  # run id -> timestamp of its start mark
        self._last_summary: Mapping[str, Any] | None = None
        self._latest: Any = None
        self._last_outcome = ""
        self._gpu_shown: bool | None = None
        self._dirty = False  # run marks changed since the last redraw

        self.device_label = QLabel("Waiting for the first measurement...")
        self.device_label.setObjectName("metricsDevice")
        self.device_label.setWordWrap(True)
        self.device_label.setTextFormat(Qt.TextFormat.RichText)
        # A note, not a warning: a CPU-only or XLA setup has no NVIDIA GPU to chart, and nothing is wrong.
        self.gpu_warning = QLabel("")
        self.gpu_warning.setObjectName("gpuNote")
        self.gpu_warning.setStyleSheet(f"color: {AXIS_TEXT};")
        self.gpu_warning.setWordWrap(True)
        self.gpu_warning.setTextFormat(Qt.TextFormat.PlainText)
        self.gpu_warning.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.gpu_warning.hide()
        self.run_label = QLabel("No generation has run yet.")
        self.run_label.setObjectName("runStatus")
        self.run_label.setWordWrap(True)
        self.run_label.setTextFormat(Qt.TextFormat.PlainText)
        self.window_box = QComboBox()
        self.window_box.setToolTip("How much history the plots show")
        self.window_box.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        for seconds, text in WINDOW_CHOICES:
            self.window_box.addItem(text, seconds)
        self.window_box.setCurrentIndex(max(0, self.window_box.findData(self.window_s)))
        self.window_box.activated.connect(self._on_window_box_activated)

        runs = QHBoxLayout()
        runs.setSpacing(8)
        runs.addWidget(self.run_label, 1)
        runs.addWidget(self.window_box, 0, Qt.AlignmentFlag.AlignTop)
        self.cards_layout = QVBoxLayout()
        self.cards_layout.setSpacing(6)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 8, 8)
        layout.setSpacing(6)
        layout.addWidget(self.device_label)
        layout.addWidget(self.gpu_warning)
        layout.addLayout(runs)
        layout.addLayout(self.cards_layout, 1)

        self._timer = QTimer(self)
        self._timer.setInterval(redraw_ms)
        self._timer.timeout.connect(self._on_redraw_timer_timeout)
        if source is not None:
            self.set_source(source)

    def sizeHint(self):  # noqa: N802 - Qt override
        hint = super().sizeHint()
        hint.setWidth(340)  # wide enough for the value texts; the session list shares this width
        return hint

    # -- public ---------------------------------------------------------------------------------------

    def set_source(self, source: Any) -> None:
        """Show ``source`` (anything with ``history``/``latest``, see ``engine.telemetry.MetricsSource``).

        Another source (an engine server's instead of this machine's) has another clock: its run marks go."""
        if source is not self.source:
            self.run_marks, self._active_runs = [], {}
            self._dirty = True
        self.source = source
        self.columns.clear()
        self._last_seq = None

    def start(self) -> None:
        """Start redrawing (4 Hz by default) while the dock is shown."""
        self._timer.start()

    def stop(self) -> None:
        self._timer.stop()

    @property
    def running(self) -> bool:
        return self._timer.isActive()

    @property
    def plots_built(self) -> bool:
        return bool(self.cards)

    def set_window(self, window_s: float) -> None:
        """Show the last ``window_s`` seconds (one of ``WINDOW_CHOICES`` in the box; any positive value works)."""
        self.window_s = float(window_s)
        index = self.window_box.findData(self.window_s)
        if index >= 0:
            self.window_box.setCurrentIndex(index)
        for card in self.cards.values():
            card.set_window(self.window_s)
        self.columns.clear()  # refetch: a longer window shows history the dock had dropped
        self._last_seq = None
        self.refresh()

    def add_run_start(self, run_id: str) -> RunMark:
        """Mark a generation's start now, on the samples' clock (the end call moves it to the exact time)."""
        mark = RunMark(run_id, "start", self._source_now())
        self.run_marks = [m for m in self.run_marks if m.key != mark.key] + [mark]
        self._active_runs[run_id] = mark.timestamp
        self._dirty = True
        self._update_run_label()
        return mark

    def add_run_end(self, run_id: str, outcome: str, summary: Mapping[str, Any] | None = None) -> RunMark:
        """Mark a generation's end; ``summary`` (from ``mark_run_end``) gives the exact start and end times."""
        end = self._source_now()
        if summary is not None:
            end = float(summary.get("ended_at") or end)
            started = summary.get("started_at")
            for mark in self.run_marks:
                if mark.key == (run_id, "start") and started:
                    mark.timestamp = float(started)
            self._last_summary = dict(summary)
        mark = RunMark(run_id, "end", end, outcome)
        self.run_marks = [m for m in self.run_marks if m.key != mark.key] + [mark]
        self._active_runs.pop(run_id, None)
        self._last_outcome = outcome
        self._dirty = True
        self._update_run_label()
        return mark

    def on_screen(self) -> bool:
        """Whether any of the dock can be seen. A dock tabbed behind another stays ``isVisible()``, merely
        covered, so the visible region is what tells."""
        return self.isVisible() and not self.visibleRegion().isEmpty()

    def refresh(self) -> bool:
        """Fetch new samples and redraw. Does nothing while not on screen. Returns True when it drew."""
        if self.source is None or not self.on_screen():
            return False
        new = self._fetch()
        if not len(self.columns):
            return False
        if not new and self.cards and not self._dirty:
            self._update_run_label()  # the running clock
            return False
        self._dirty = False
        self._ensure_cards()
        self._redraw()
        return True

    # -- data -----------------------------------------------------------------------------------------

    def _fetch(self) -> list[Any]:
        if self._last_seq is None:
            new = self.source.history(last_seconds=self.window_s)
        else:
            new = self.source.history(after_seq=self._last_seq)
        for sample in new:
            self.columns.append(sample)
        if new:
            self._last_seq = new[-1].seq
            self._latest = new[-1]
            # Keep one extra sample to the left so the lines run into the left edge.
            self.columns.drop_before(new[-1].timestamp - self.window_s - 1.0)
        return new

    def _source_now(self) -> float:
        """Now on the samples' clock: the newest sample's time (local samples use this machine's clock)."""
        import time

        latest = self.source.latest() if self.source is not None else None
        if latest is None or latest.source == "local":
            return time.time()
        return float(latest.timestamp)

    # -- drawing --------------------------------------------------------------------------------------

    def _ensure_cards(self) -> None:
        if self.cards:
            return
        keys = (*GPU_CARDS, "cpu", "memory")
        for key in keys:
            card = _PlotCard(key, self.window_s, show_time_axis=key == keys[-1])
            self.cards[key] = card
            self.cards_layout.addWidget(card, 1)
        for key, card in self.cards.items():  # GPU cards appear once a sample has a GPU
            card.setVisible(key not in GPU_CARDS)  # explicit: a layout shows new children only later
        self._gpu_shown = False

    def _redraw(self) -> None:
        latest = self._latest
        now = float(latest.timestamp)
        x = np.fromiter(self.columns.times, dtype=np.float64, count=len(self.columns)) - now
        gpu_indices = sorted({int(k[3:].split(".")[0]) for k in self.columns.data if k.startswith("gpu")})
        has_gpu = bool(gpu_indices)
        if has_gpu != self._gpu_shown:
            self._gpu_shown = has_gpu
            for key in GPU_CARDS:
                self.cards[key].setVisible(has_gpu)
        self._update_header(latest, gpu_indices)
        if has_gpu:
            self._draw_gpus(x, gpu_indices, latest)
        self._draw_cpu(x, latest)
        self._draw_memory(x, latest)
        # Marks that scrolled out of the longest window are forgotten (a running run's start is kept).
        oldest = now - max(seconds for seconds, _ in WINDOW_CHOICES) - 60.0
        self.run_marks = [m for m in self.run_marks if m.timestamp >= oldest or m.run_id in self._active_runs]
        labelled = "gpu_util" if has_gpu else "cpu"
        for key, card in self.cards.items():
            if card.isVisibleTo(self):
                card.sync_marks(self.run_marks, now, self.window_s, labelled=key == labelled)
        self._update_run_label()
        self.redraw_count += 1
        self.redrawn.emit(int(latest.seq))

    def _gpu_colour(self, card: str, index: int, count: int) -> str:
        return CARD_COLOURS[card] if count == 1 else GPU_COLOURS[index % len(GPU_COLOURS)]

    def _draw_gpus(self, x: np.ndarray, indices: list[int], latest: Any) -> None:
        cols = self.columns
        count = len(indices)
        now_by_index = {g.index: g for g in latest.gpus}
        util, memory, power, temperature = (self.cards[k] for k in GPU_CARDS)
        texts: dict[str, list[str]] = {k: [] for k in GPU_CARDS}
        mem_high = power_high = 1.0
        temp_values: list[float] = []
        for index in indices:
            p = f"gpu{index}."
            c_util = self._gpu_colour("gpu_util", index, count)
            util.curve(p + "sm", c_util, width=1.8, fill_alpha=40 if count == 1 else 0).setData(
                x, cols.array(p + "sm")
            )
            util.curve(p + "mem_util", c_util, dashed=True, alpha=190).setData(x, cols.array(p + "mem_util"))

            c_mem = self._gpu_colour("gpu_memory", index, count)
            used, total = cols.array(p + "mem_used"), cols.array(p + "mem_total")
            memory.curve(p + "mem_used", c_mem, width=1.8, fill_alpha=45 if count == 1 else 0).setData(
                x, used
            )
            memory.curve(p + "mem_total", c_mem, dashed=True, width=1.1, alpha=170).setData(x, total)
            mem_high = max(mem_high, _finite_max(total), _finite_max(used))

            c_power = self._gpu_colour("gpu_power", index, count)
            watts, limit = cols.array(p + "power"), cols.array(p + "power_limit")
            power.curve(p + "power", c_power, width=1.8, fill_alpha=40 if count == 1 else 0).setData(x, watts)
            power.curve(
                p + "power_limit", LIMIT_COLOUR if count == 1 else c_power, dashed=True, width=1.1, alpha=200
            ).setData(x, limit)
            power_high = max(power_high, _finite_max(limit), _finite_max(watts))

            c_temp = self._gpu_colour("gpu_temperature", index, count)
            temps = cols.array(p + "temp")
            temperature.curve(p + "temp", c_temp, width=1.8).setData(x, temps)
            temp_values.extend(temps[np.isfinite(temps)].tolist())

            gpu = now_by_index.get(index)
            tag = (
                f'<span style="color:{GPU_COLOURS[index % len(GPU_COLOURS)]}">\u25cf</span>{index} '
                if count > 1
                else ""
            )
            if gpu is None or not gpu.available:
                for key in GPU_CARDS:
                    texts[key].append(tag + "lost" if gpu is not None else tag + "\u2013")
                continue
            sm = _pct(gpu.sm_util_pct)
            texts["gpu_util"].append(
                f"{tag}<b>{sm}</b>" if count > 1 else f"SM <b>{sm}</b> \u00b7 mem {_pct(gpu.mem_util_pct)}"
            )
            used_text = _num(_gib(gpu.memory_used_bytes), "{:.1f}")
            total_text = _num(_gib(gpu.memory_total_bytes), "{:.0f}")
            texts["gpu_memory"].append(
                f"{tag}<b>{used_text}</b>"
                if count > 1
                # totals: in the header
                else f"<b>{used_text}</b> / {total_text} GiB"
            )
            texts["gpu_power"].append(
                f"{tag}<b>{_num(gpu.power_w, '{:.0f}')} W</b>"
                + (f" / {_num(gpu.power_limit_w, '{:.0f}')} W" if count == 1 else "")
            )
            texts["gpu_temperature"].append(f"{tag}<b>{_num(gpu.temperature_c, '{:.0f}')} \u00b0C</b>")
        separator = "  "
        for key in GPU_CARDS:
            self.cards[key].set_value_text(separator.join(texts[key]))
        util.set_y_range(0, 100, ticks=(0, 50, 100))
        memory.set_y_range(0, _nice_ceiling(mem_high))
        power.set_y_range(0, _nice_ceiling(power_high * 1.05))
        low = min([30.0, *temp_values])
        high = max([90.0, *(v + 5 for v in temp_values)])
        temperature.set_y_range(math.floor(low / 10) * 10, math.ceil(high / 10) * 10)

    def _draw_cpu(self, x: np.ndarray, latest: Any) -> None:
        card = self.cards["cpu"]
        cols = self.columns
        colour = CARD_COLOURS["cpu"]
        lower = card.curve("cpu_min", colour, alpha=0, width=0.5)
        upper = card.curve("cpu_max", colour, alpha=0, width=0.5)
        lower.setData(x, np.nan_to_num(cols.array("cpu_min")))
        upper.setData(x, np.nan_to_num(cols.array("cpu_max")))
        card.band("cores", lower, upper, colour)
        card.curve("cpu", colour, width=1.8, z=2).setData(x, cols.array("cpu"))
        card.curve("app_cpu", RSS_COLOUR, width=1.3, z=1).setData(x, cols.array("app_cpu"))
        card.set_y_range(0, 100, ticks=(0, 50, 100))
        system = latest.system
        cores = len(system.cpu_pct_per_core or [])
        app = None
        if system.process_cpu_pct is not None and cores:
            app = system.process_cpu_pct / cores
        title = f"CPU (% of {count_of(cores, 'core')})" if cores else CARD_TITLES["cpu"]
        if card.title_label.text() != title:
            card.title_label.setText(title)
        card.set_value_text(
            f'<span style="color:{colour}">\u25cf</span> total <b>{_pct(system.cpu_pct)}</b>'
            f' \u00b7 <span style="color:{RSS_COLOUR}">\u25cf</span> app <b>{_pct(app)}</b>'
        )
        card.setToolTip(
            "Total: every process on the machine, as a share of all its cores (line; the band is the range "
            "over the cores). App: this application's own process, as a share of the same cores (yellow)"
        )

    def _draw_memory(self, x: np.ndarray, latest: Any) -> None:
        card = self.cards["memory"]
        cols = self.columns
        colour = CARD_COLOURS["memory"]
        used, total, rss = cols.array("ram"), cols.array("ram_total"), cols.array("rss")
        card.curve("ram", colour, width=1.8, fill_alpha=40).setData(x, used)
        card.curve("ram_total", colour, dashed=True, width=1.1, alpha=170).setData(x, total)
        card.curve("rss", RSS_COLOUR, width=1.3, z=1).setData(x, rss)
        card.set_y_range(0, _nice_ceiling(max(1.0, _finite_max(total), _finite_max(used))))
        system = latest.system
        card.set_value_text(
            f'<span style="color:{colour}">\u25cf</span> <b>{_num(_gib(system.ram_used_bytes), "{:.1f}")}</b>'
            f" / {_num(_gib(system.ram_total_bytes), '{:.0f}')}"
            f' \u00b7 <span style="color:{RSS_COLOUR}">\u25cf</span> app <b>{_num(_gib(system.process_rss_bytes), "{:.2f}")}</b>'
        )
        card.setToolTip(
            "RAM in use (filled), installed RAM (dashed) and this application's resident memory (yellow)"
        )

    def _update_header(self, latest: Any, gpu_indices: list[int]) -> None:
        if latest.gpus:
            count = len(latest.gpus)
            rows = []
            for gpu in latest.gpus:
                dot = (
                    f'<span style="color:{GPU_COLOURS[gpu.index % len(GPU_COLOURS)]}">\u25cf</span> '
                    if count > 1
                    else ""
                )
                total = f" \u00b7 {format_bytes(gpu.memory_total_bytes)}" if gpu.memory_total_bytes else ""
                lost = f" \u2013 unavailable: {_escape(gpu.reason or 'lost')}" if not gpu.available else ""
                rows.append(f"{dot}<b>{_escape(gpu.name or f'GPU {gpu.index}')}</b>{total}{lost}")
            driver = f"NVIDIA driver {_escape(latest.driver_version)}" if latest.driver_version else ""
            self.device_label.setText(
                f"{self._machine_html(latest)}<br>"
                + "<br>".join(rows)
                + f'<br><span style="color:{AXIS_TEXT}">{driver}</span>'
            )
            self.gpu_warning.hide()
        else:
            self.device_label.setText(f"{self._machine_html(latest)}: CPU and memory")
            reason = latest.gpu_reason or "no NVIDIA GPU"
            text = f"No GPU charts ({reason})"
            if self.gpu_warning.text() != text:
                self.gpu_warning.setText(text)
                self.gpu_warning.setToolTip(
                    "GPU plots appear when NVML reports an NVIDIA GPU; on a CPU or XLA setup there is none to "
                    "chart, and CPU and memory stay live."
                )
            self.gpu_warning.show()

    @staticmethod
    def _machine_html(latest: Any) -> str:
        """Which machine the charts are of: this computer, or the engine server the device is."""
        if latest.source in ("", "local"):
            return "Charting <b>this computer</b>"
        return f"Charting <b>the server {_escape(latest.source)}</b>"

    def _update_run_label(self) -> None:
        if self._active_runs:
            started = max(self._active_runs.values())  # the run started last is the one running
            self.run_label.setText(f"Generating \u00b7 {elapsed_text(self._source_now() - started)}")
        elif self._last_summary is not None:
            lines = run_summary_lines(self._last_summary)
            text = (
                f"Last run ({self._last_outcome}): " + lines[0].removeprefix("telemetry: ") + "; " + lines[1]
            )
            self.run_label.setText(text)

    # -- slots ----------------------------------------------------------------------------------------

    def _on_redraw_timer_timeout(self) -> None:
        self.refresh()

    def _on_window_box_activated(self, index: int) -> None:
        self.set_window(float(self.window_box.itemData(index)))


def _finite_max(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    return float(finite.max()) if finite.size else 0.0


def _nice_ceiling(value: float) -> float:
    """The next tidy number (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6 or 8 times a power of ten) at or above ``value``."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10):
        if step * power >= value - 1e-9:
            return step * power
    return 10 * power


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}%"


def _num(value: float | None, fmt: str) -> str:
    return "n/a" if value is None else fmt.format(value)


def _escape(text: Any) -> str:
    import html

    return html.escape(str(text))
