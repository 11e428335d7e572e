"""The Compare window's numbers: the bold headline on what B's settings change, the A / B / B-vs-A table
(speed with the noise rule's verdict, memory, what applied) and each side's top operators by self time."""

from __future__ import annotations

import html
import math
import re
from functools import partial

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.core.display import OPTIMIZATION_LABELS, format_bytes
from engine.compare import DECODE, END_TO_END, PART_TITLES, UNET_STEP

WARNING_COLOUR = "#e5c07b"
# What to do when the noise rule cannot decide: here it is a button (the engine's words name CLI commands).
REPEAT_ADVICE = (
    "press Repeat: A and B run again, interleaved, and the rule counts every run (it needs 3 a side)"
)


def _ratio(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "n/a"
    return f"{value:.2f}x"


# One wording for every speed ratio in this window (summary, table, CSV): B's speed as a multiple of A's.
def speed_text(ratio: float | None) -> str:
    """``"1.32x A's speed"`` (B faster), ``"0.76x A's speed"`` (B slower), ``"n/a"``."""
    if ratio is None or not math.isfinite(ratio) or ratio <= 0:
        return "n/a"
    return f"{ratio:.2f}x A's speed"


def verdict_text(verdict, unchanged: bool = False) -> str:
    """A table cell for one part: ``"1.32x A's speed \u00b7 faster"``, ``"... \u00b7 undecided (1 vs 1)"``;
    for a part B's settings leave alone (``unchanged``), that instead of a verdict: a difference there is load."""
    if verdict.ratio is None:
        return "n/a"
    if unchanged:
        # B's settings are A's for this part: a ratio away from 1 is the machine's load, said as such (it
        # read as a contradiction beside "unchanged by B").
        if verdict.verdict in ("faster", "slower"):
            return f"{speed_text(verdict.ratio)} \u00b7 same settings as A here: the difference is load"
        return f"{speed_text(verdict.ratio)} \u00b7 same settings as A here"
    text = f"{speed_text(verdict.ratio)} \u00b7 {verdict.verdict}"
    return f"{text} ({verdict.samples[1]} vs {verdict.samples[0]})" if verdict.too_few else text


WARNING_COLOUR = "#e5c07b"


def _memory_rows(a, b) -> list[tuple[str, str, str, str]]:
    """The peak-memory rows of sides ``a`` and ``b``: the CUDA allocator's with a ratio, or the process's RSS."""
    if a.peak_kind == "cuda_allocator":
        memory_rows = [
            (
                "Peak memory (CUDA allocator)",
                format_bytes(a.peak_bytes),
                format_bytes(b.peak_bytes),
                _ratio(b.peak_bytes / a.peak_bytes) if a.peak_bytes else "n/a",
            )
        ]
    else:
        # RSS is the process's: memory A freed stays mapped and B reuses it, so B's growth is understated
        # and a ratio would flatter B. `volsynth bench` measures each setting in its own process.
        memory_rows = [
            (
                "Peak memory (process RSS)",
                format_bytes(a.peak_bytes),
                format_bytes(b.peak_bytes),
                "n/a (1 process)",
            ),
            (
                "  RSS growth in the run",
                format_bytes(a.peak_over_start_bytes),
                format_bytes(b.peak_over_start_bytes),
                "understated for B",
            ),
        ]
    return memory_rows


def wrap_to_width(text: str, width: int, advance) -> str:
    """``text`` in lines no wider than ``width`` (``advance(str)``: its width), broken after '+', a space or
    '·'; a piece wider than ``width`` alone keeps a line of its own."""
    pieces = re.findall(r"[^+\s\u00b7]*[+\s\u00b7]*", text)
    lines, line = [], ""
    for piece in (p for p in pieces if p):
        if line and advance((line + piece).rstrip()) > width:
            lines.append(line.rstrip())
            line = piece
        else:
            line += piece
    if line.strip():
        lines.append(line.rstrip())
    return "\n".join(lines) or text


class ComparisonNumbers(QWidget):
    """The headline (``summary_label``), the numbers ``table`` and the ``kernel_tables`` with their
    ``kernel_titles``; ``show_comparison`` fills them all, ``table_rows`` is the table as exported."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.table_rows: list[tuple[str, ...]] = []  # the numbers table as exported (header row first)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.summary_label = QLabel("Run a comparison to see what B buys against A.")
        self.summary_label.setObjectName("compareSummary")
        self.summary_label.setWordWrap(True)
        layout.addWidget(self.summary_label)
        row = QHBoxLayout()
        self.table = self._table(["A", "B", "B vs A"])
        self.table.setObjectName("compareTable")
        self._header_texts = ["A", "B", "B vs A"]
        # Long settings ("B · streamed+dec:bf16-mixed-cl") wrap in the header to the width their column has.
        self.table.horizontalHeader().sectionResized.connect(self._on_header_section_resized)
        # The numbers first: half the width; each side's operators a quarter (empty without profiled steps).
        row.addWidget(self.table, 2)
        self.kernel_tables = {}
        self.kernel_titles = {}
        for side in ("a", "b"):
            column = QVBoxLayout()
            self.kernel_titles[side] = QLabel(f"{side.upper()}: top operators")
            self.kernel_titles[side].setWordWrap(True)
            self.kernel_tables[side] = self._table(["share", "ms/step", "calls", "operator"])
            column.addWidget(self.kernel_titles[side])
            column.addWidget(self.kernel_tables[side], 1)
            row.addLayout(column, 1)
        layout.addLayout(row, 1)

    @staticmethod
    def _table(headers: list[str]) -> QTableWidget:
        table = QTableWidget(0, len(headers))
        table.setHorizontalHeaderLabels(headers)
        table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        table.setWordWrap(True)
        table.setTextElideMode(Qt.TextElideMode.ElideNone)
        # Rows grow to their wrapped text whenever the columns change width: nothing needs a hover to read.
        table.verticalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        return table

    def _on_header_section_resized(self, _index: int, _old: int, _new: int) -> None:
        self._wrap_headers()

    def _wrap_headers(self) -> None:
        """Each column's header broken into lines that fit its width (after '+', ' ' or '·'), whole in its
        tooltip; the header grows to the lines."""
        header = self.table.horizontalHeader()
        metrics = header.fontMetrics()
        for column, text in enumerate(self._header_texts):
            item = self.table.horizontalHeaderItem(column)
            if item is None:
                continue
            width = header.sectionSize(column) - 2 * metrics.horizontalAdvance("M")  # the section's margins
            wrapped = wrap_to_width(text, width, metrics.horizontalAdvance)
            if item.text() != wrapped:
                item.setText(wrapped)
                item.setToolTip(text)

    def clear_tables(self) -> None:
        """Empty the numbers and operator tables (a new comparison starts)."""
        self.table.setRowCount(0)
        for side in ("a", "b"):
            self.kernel_tables[side].setRowCount(0)

    def show_comparison(self, comparison) -> None:
        """The headline, the table and both sides' operators of a finished ``engine.compare.Comparison``."""
        self.summary_label.setText(self.summary_text(comparison))
        self.fill_table(comparison)
        for side, measured in (("a", comparison.a), ("b", comparison.b)):
            self.fill_kernels(side, measured)

    @staticmethod
    def summary_text(comparison) -> str:
        """The bold headline on the part B's settings change, end to end beside it, then the volume's change."""
        esc = partial(html.escape, quote=False)  # a label shows apostrophes as they are
        headline = comparison.headline()
        text = (
            f"<b>{esc(headline.title)}</b> ({esc(headline.reason)}): <b>{esc(headline.verdict.words())}</b>"
        )
        if headline.caveat:
            text += (
                f'<br><span style="color:{WARNING_COLOUR}"><b>\u26a0 The load changed between the runs:</b> '
                f"{esc(headline.caveat)}. For a verdict, {esc(REPEAT_ADVICE)}.</span>"
            )
        elif headline.advice:
            text += (
                f'<br><span style="color:{WARNING_COLOUR}"><b>\u26a0 Not decided by the noise rule.</b> '
                f"For a verdict, {esc(REPEAT_ADVICE)}.</span>"
            )
        runs = 1 + len(comparison.repeats)
        median = f" (median of {runs} runs each)" if runs > 1 else ""
        if headline.part != END_TO_END:
            whole = comparison.verdicts()[END_TO_END]
            text += (
                f"<br>{esc(PART_TITLES[END_TO_END])}{median}: A {comparison.loop_median_s('a'):.2f} s, B "
                f"{comparison.loop_median_s('b'):.2f} s: {esc(whole.words())}."
            )
        psnr = "identical volumes" if math.isinf(comparison.psnr_db) else f"PSNR {comparison.psnr_db:.1f} dB"
        ssim = "" if comparison.ssim is None else f", SSIM {comparison.ssim:.4f}"
        text += (
            f"<br>Volume moved: <b>{psnr}</b>{ssim}, max |B\u2212A| {comparison.max_abs_err:.3g}, "
            f"mean |B\u2212A| {comparison.mean_abs_err:.3g}."
        )
        return text

    def fill_table(self, comparison) -> None:
        """The A / B / B-vs-A rows: speed (with the rule's verdict), memory, what applied and what did not."""
        a, b = comparison.a, comparison.b

        def step(side) -> str:
            return (
                "n/a"
                if side.step_ms_median is None
                else f"{side.step_ms_median:.1f} ms (IQR {side.step_ms_iqr:.1f})"
            )

        # Settings by the names the Optimization section gives them ("Measured here", not measured_here).
        def applied(side) -> str:
            return ", ".join(OPTIMIZATION_LABELS.get(n, n) for n in side.applied()) or "none (fp32)"

        def not_applied(side) -> str:
            lines = (f"{OPTIMIZATION_LABELS.get(n, n)}: {reason}" for n, reason in side.not_applied())
            return "\n".join(lines) or "\u2014"

        memory_rows = _memory_rows(a, b)

        def seconds(value) -> str:
            return "n/a (no decoder)" if not value else f"{value:.2f} s"

        runs = 1 + len(comparison.repeats)
        of_runs = f" (median of {runs})" if runs > 1 else ""

        verdicts = comparison.verdicts()
        headline = comparison.headline()
        unchanged = comparison.unchanged_parts()
        # (label, A, B, B vs A) with the part each speed row judges, so its cell can carry the rule's words
        speed_rows: list[tuple[str, str, str, str | None]] = [
            ("Step (median)", step(a), step(b), UNET_STEP),
            ("Steps measured", str(a.steps_measured), str(b.steps_measured), None),
            ("Runs", str(runs), str(runs), None),
            (
                f"Decode{of_runs}",
                seconds(comparison.decode_median_s("a")),
                seconds(comparison.decode_median_s("b")),
                DECODE,
            ),
            (
                f"Sampling loop (end to end){of_runs}",
                f"{comparison.loop_median_s('a'):.2f} s",
                f"{comparison.loop_median_s('b'):.2f} s",
                END_TO_END,
            ),
        ]
        # The B-vs-A cell of each speed row: the ratio with the rule's verdict (or "unchanged by B").
        rows: list[tuple[str, str, str, str, str | None]] = [
            (
                label,
                a_text,
                b_text,
                "" if part is None else verdict_text(verdicts[part], part in unchanged),
                part,
            )
            for label, a_text, b_text, part in speed_rows
        ]
        rows += [
            *((*r, None) for r in memory_rows),
            ("Applied", applied(a), applied(b), "", None),
            ("Did not apply", not_applied(a), not_applied(b), "", None),
        ]
        self.table_rows = [("", f"A: {a.label}", f"B: {b.label}", "B vs A"), *(r[:4] for r in rows)]
        self.table.setRowCount(len(rows))
        self._header_texts = [f"A \u00b7 {a.label}", f"B \u00b7 {b.label}", "B vs A"]
        self.table.setHorizontalHeaderLabels(self._header_texts)
        self._wrap_headers()
        self.table.setVerticalHeaderLabels([r[0] for r in rows])
        for row, (_, *cells, part) in enumerate(rows):
            for column, text in enumerate(cells):
                item = QTableWidgetItem(text)
                if column == 2 and part is not None:
                    verdict = verdicts[part]
                    if part in unchanged:  # called faster or slower here, it is the load that changed
                        doubtful = verdict.verdict in ("faster", "slower")
                        why = "B's settings leave this part alone: a difference here is the machine's load. "
                    else:
                        doubtful, why = not verdict.decided, ""
                    advice = f" For a verdict, {REPEAT_ADVICE}." if doubtful else ""
                    item.setToolTip(f"{why}{verdict.words()}.{advice}")
                    if doubtful:
                        item.setForeground(QColor(WARNING_COLOUR))
                self.table.setItem(row, column, item)
            # The row the bold headline is about: its name in bold (a bold cell wraps past its measured height).
            if part is not None and part == headline.part:
                label = self.table.verticalHeaderItem(row)
                font = label.font()
                font.setBold(True)
                label.setFont(font)
        self.table.resizeRowsToContents()

    def fill_kernels(self, side: str, measured) -> None:
        """The ten operators with the most self time per step on ``side`` (or why there is no profile)."""

        table, title = self.kernel_tables[side], self.kernel_titles[side]
        profile = measured.kernel_profile
        if not profile or not profile.get("operators"):
            title.setText(f"{side.upper()} \u00b7 {measured.label}: no kernel profile (profiled steps 0)")
            table.setRowCount(0)
            return
        steps = profile["steps"]
        span = f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}\u2013{steps[-1]}"
        title.setText(
            f"{side.upper()} \u00b7 {measured.label}: top operators by {profile['clock'].upper()} self "
            f"time, {span}, {profile['total_ms_per_step']:.1f} ms per step"
        )
        operators = profile["operators"][:10]
        table.setRowCount(len(operators))
        for row, op in enumerate(operators):
            cells = (
                f"{100 * op['share']:.1f} %",
                f"{op['self_ms_per_step']:.2f}",
                f"{op['calls_per_step']:.0f}",
                op["name"],
            )
            for column, text in enumerate(cells):
                item = QTableWidgetItem(text)
                item.setToolTip(op["name"])
                if column < 3:
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                table.setItem(row, column, item)
        table.verticalHeader().setVisible(False)  # the rank is the row order; its width goes to the names
        table.horizontalHeader().setSectionResizeMode(3, QHeaderView.ResizeMode.Stretch)
        for column in range(3):
            table.horizontalHeader().setSectionResizeMode(column, QHeaderView.ResizeMode.ResizeToContents)
