"""Measure what the sampler costs: CPU time of its thread as a percent of one core.

Run it as ``volsynth monitor --bench 20`` or ``python -m engine.telemetry.bench 20``. The budget is 1% of
one core at 4 Hz.

Two measurements are taken, because each has a blind spot:

* the thread's own CPU time (``time.thread_time`` inside the sampling thread), which counts exactly the
  sampling work, listeners included, and nothing else;
* the whole process's CPU time while sampling, minus the same process idling for the same length of time,
  which also catches work the sampler causes on other threads (there should be none).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import psutil

from engine.telemetry.collector import LocalCollector
from engine.telemetry.sampler import DEFAULT_INTERVAL_S, Sampler

BUDGET_PCT_OF_CORE = 1.0


def _process_cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def measure_overhead(
    seconds: float = 20.0,
    interval_s: float = DEFAULT_INTERVAL_S,
    *,
    collector: LocalCollector | None = None,
    baseline: bool = True,
) -> dict[str, Any]:
    """Run a :class:`Sampler` for ``seconds`` and report its CPU cost.

    Args:
        seconds: How long to sample.
        interval_s: Sampling interval (0.25 = 4 Hz).
        collector: What to measure with; default this machine.
        baseline: Also measure the idle process for ``seconds`` first, for the process-level figure.

    Returns:
        ``{"interval_s", "seconds", "samples", "thread_cpu_s", "thread_cpu_pct_of_core",
        "process_cpu_pct_of_core", "idle_cpu_pct_of_core", "process_overhead_pct_of_core",
        "ms_per_sample", "gpu_available", "gpu_reason", "budget_pct_of_core", "within_budget"}``.
    """
    process = psutil.Process()
    idle_pct = None
    if baseline:
        cpu0, wall0 = _process_cpu(process), time.monotonic()
        time.sleep(seconds)
        idle_pct = 100.0 * (_process_cpu(process) - cpu0) / (time.monotonic() - wall0)

    sampler = Sampler(interval_s=interval_s, collector=collector)
    cpu0, wall0 = _process_cpu(process), time.monotonic()
    sampler.start()
    try:
        time.sleep(seconds)
    finally:
        sampler.stop()
    process_pct = 100.0 * (_process_cpu(process) - cpu0) / (time.monotonic() - wall0)
    stats = sampler.stats()
    latest = sampler.latest()
    samples = int(stats["samples"])
    thread_pct = stats["cpu_pct_of_core"]
    return {
        "interval_s": interval_s,
        "seconds": seconds,
        "samples": samples,
        "thread_cpu_s": round(stats["cpu_s"], 4),
        "thread_cpu_pct_of_core": round(thread_pct, 3),
        "process_cpu_pct_of_core": round(process_pct, 3),
        "idle_cpu_pct_of_core": None if idle_pct is None else round(idle_pct, 3),
        "process_overhead_pct_of_core": None if idle_pct is None else round(process_pct - idle_pct, 3),
        "ms_per_sample": round(1000.0 * stats["cpu_s"] / samples, 3) if samples else None,
        "gpu_available": latest.gpu_available if latest else None,
        "gpu_reason": latest.gpu_reason if latest else None,
        "budget_pct_of_core": BUDGET_PCT_OF_CORE,
        "within_budget": thread_pct <= BUDGET_PCT_OF_CORE,
    }


def format_report(result: dict[str, Any]) -> str:
    """Human-readable lines for :func:`measure_overhead`'s result."""
    hz = 1.0 / result["interval_s"]
    gpu = "GPU metrics on" if result["gpu_available"] else f"GPU metrics off ({result['gpu_reason']})"
    lines = [
        f"sampler at {hz:g} Hz for {result['seconds']:g} s: {result['samples']} samples, {gpu}",
        f"  sampling thread CPU: {result['thread_cpu_pct_of_core']:.3f}% of one core "
        f"({result['ms_per_sample']} ms per sample)",
    ]
    if result["process_overhead_pct_of_core"] is not None:
        lines.append(
            f"  process CPU: {result['process_cpu_pct_of_core']:.3f}% vs idle {result['idle_cpu_pct_of_core']:.3f}%"
            f" -> overhead {result['process_overhead_pct_of_core']:.3f}% of one core"
        )
    verdict = "within" if result["within_budget"] else "OVER"
    lines.append(f"  budget {result['budget_pct_of_core']:g}% of one core: {verdict}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m engine.telemetry.bench [SECONDS] [--interval S]``; exit 1 if over budget."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("seconds", nargs="?", type=float, default=20.0)
    parser.add_argument("--interval", type=float, default=DEFAULT_INTERVAL_S, metavar="S")
    parser.add_argument("--no-baseline", action="store_true", help="skip the idle-process measurement")
    args = parser.parse_args(argv)
    result = measure_overhead(args.seconds, args.interval, baseline=not args.no_baseline)
    print(format_report(result))
    return 0 if result["within_budget"] else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
