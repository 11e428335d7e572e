"""The measuring harness: how ``volsynth bench``, ``volsynth tune`` and the benchmarks repeat, sum up and judge.

- **Interleaved, rotated repeats.** These machines are shared and noisy: a busy spell must hit every row alike,
  so each repeat runs every row once (:func:`interleaved`), and the order rotates by one row each repeat
  (:func:`rotated`) so that no row always runs first, on a cold cache, or last, after the others warmed it.
- **Median and IQR** of each row's samples (:func:`median_iqr`, :mod:`engine.metrics.spread`).
- **The noise rule** (:func:`speed_verdict`, :mod:`engine.metrics.speed_verdict`): whether a ratio of
  medians may be called faster, slower or the same; :data:`VERDICT_NOTE` says how in a table's footnote.

The median, the IQR and the noise rule are defined in ``engine.metrics`` because the product's compare
(below this package in the engine's floors) uses them too; measuring code takes all three from here.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TypeVar

from engine.metrics.speed_verdict import paired_speed_verdict, speed_verdict
from engine.metrics.spread import iqr, median_iqr

__all__ = [
    "VERDICT_NOTE",
    "interleaved",
    "iqr",
    "median_iqr",
    "paired_speed_verdict",
    "rotated",
    "speed_verdict",
]

Row = TypeVar("Row")

# How the tables' verdict columns are decided (engine.metrics.speed_verdict), in one line.
VERDICT_NOTE = (
    "the noise rule of engine.metrics.speed_verdict against fp32 (95 % bootstrap interval of the ratio of medians, "
    "5 % minimum effect, 3 samples a side or 'undecided')"
)


def rotated(rows: Sequence[Row], repeat: int) -> list[Row]:
    """``rows`` in the order of repeat number ``repeat``: moved on by one row each repeat."""
    if not rows:
        return []
    shift = repeat % len(rows)
    return [*rows[shift:], *rows[:shift]]


def interleaved(rows: Sequence[Row], repeats: int) -> Iterator[tuple[int, Row]]:
    """(repeat, row) for every row in every repeat: each repeat runs every row once, in its rotated order."""
    for repeat in range(repeats):
        for row in rotated(rows, repeat):
            yield repeat, row
