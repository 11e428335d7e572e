"""``volsynth monitor``: live GPU, CPU and RAM metrics in the terminal, or as JSON lines.

Usage::

    volsynth monitor                    # live view, refreshed in place every second; Ctrl-C quits
    volsynth monitor --interval 0.25    # 4 Hz
    volsynth monitor --once             # one sample, then exit
    volsynth monitor --json             # one JSON object per sample per line (Sample.to_dict())
    volsynth monitor --bench 20         # measure the 4 Hz sampler's own CPU cost for 20 s

Only ``engine.telemetry`` is imported (psutil; ``pynvml`` on first sample); torch is never imported here,
so the command starts in a fraction of a second.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from typing import TYPE_CHECKING, TextIO

from engine.errors import InvalidRequest

if TYPE_CHECKING:  # imported for real inside the functions, after argparse is done
    from engine.telemetry import GpuSample, LocalCollector, Sample, SystemSample

DEFAULT_INTERVAL_S = 1.0
BENCH_INTERVAL_S = 0.25  # the app's sampler rate, which the 1% budget is about

# Indirections that tests replace: how long to wait, and what measures.
_sleep = time.sleep


def _make_collector() -> LocalCollector:
    from engine.telemetry import LocalCollector

    # The monitor process holds no tensors: asking torch would only cost an import.
    return LocalCollector(torch_mode="off")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``monitor`` sub-command to ``volsynth``'s parser."""
    parser = subparsers.add_parser(
        "monitor",
        help="show live GPU, CPU and RAM metrics",
        description=(
            "Show live metrics: per NVIDIA GPU its utilisation, memory, temperature, power, clocks, PCIe "
            "throughput and throttle reasons, plus CPU per core and RAM. Without an NVIDIA GPU the CPU and "
            "RAM line stays live and the GPU line says why. Ctrl-C quits."
        ),
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=None,
        metavar="S",
        help=f"seconds between samples (default {DEFAULT_INTERVAL_S:g}; {BENCH_INTERVAL_S:g} with --bench)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object per sample per line")
    parser.add_argument("--once", action="store_true", help="take one sample and exit")
    parser.add_argument(
        "--bench",
        type=float,
        metavar="SECONDS",
        help=(
            "measure the background sampler's CPU cost for SECONDS (after as long an idle baseline); "
            "exits 1 if it is over 1%% of one core"
        ),
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run ``volsynth monitor``; returns the exit code (0, also after Ctrl-C)."""
    interval = args.interval
    if interval is None:
        interval = BENCH_INTERVAL_S if args.bench is not None else DEFAULT_INTERVAL_S
    if not (math.isfinite(interval) and interval > 0):
        raise InvalidRequest(f"--interval must be a positive number of seconds, not {interval}")
    if args.bench is not None:
        return _bench(args.bench, interval, json_output=args.json)

    collector = _make_collector()
    out = sys.stdout
    live = not args.json and not args.once and out.isatty()
    try:
        if args.once:
            # CPU load is a rate: it needs a window, so give the first sample a short one.
            _sleep(min(interval, 0.25))
            _emit(collector.collect(), out, json_lines=args.json, previous_lines=0)
            return 0
        return _loop(collector, interval, out, json_lines=args.json, live=live)
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:
        # The reader went away (``volsynth monitor --json | head -3``): that is the end, not an error.
        # Point stdout at devnull so the interpreter's final flush does not complain again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    finally:
        collector.close()


def _loop(collector: LocalCollector, interval: float, out: TextIO, *, json_lines: bool, live: bool) -> int:
    previous_lines = 0
    seq = 0
    if live:
        out.write("\x1b[?25l")  # hide the cursor while redrawing
    try:
        _sleep(min(interval, 0.25))
        next_tick = time.monotonic()
        while True:
            previous_lines = _emit(
                collector.collect(seq),
                out,
                json_lines=json_lines,
                previous_lines=previous_lines if live else 0,
                live=live,
            )
            seq += 1
            next_tick += interval
            _sleep(max(0.0, next_tick - time.monotonic()))
    except KeyboardInterrupt:
        return 0  # Ctrl-C is how the user says "done", not an error
    finally:
        if live:
            out.write("\x1b[?25h")
            out.flush()


def _emit(sample: Sample, out: TextIO, *, json_lines: bool, previous_lines: int, live: bool = False) -> int:
    """Write one sample; returns how many lines it took (for the next in-place redraw)."""
    if json_lines:
        out.write(json.dumps(sample.to_dict(), separators=(",", ":")) + "\n")
        out.flush()
        return 1
    lines = format_sample(sample)
    if live:
        # A wrapped line would break the cursor arithmetic of the in-place redraw, so cut to the width.
        width = max(20, shutil.get_terminal_size().columns - 1)
        lines = [line if len(line) <= width else line[: width - 1] + "…" for line in lines]
    if previous_lines:
        out.write(f"\x1b[{previous_lines}F\x1b[J")  # back to the first line of the last frame, clear below
    out.write("\n".join(lines) + "\n")
    out.flush()
    return len(lines)


# -- text formatting ------------------------------------------------------------------------------------

_NA = "n/a"


def _gib(value: int | None) -> str:
    return _NA if value is None else f"{value / 2**30:.1f}"


def _num(value: float | None, fmt: str, unit: str = "") -> str:
    return _NA if value is None else f"{value:{fmt}}{unit}"


def _rate(kb_s: int | None) -> str:
    if kb_s is None:
        return _NA
    return f"{kb_s / 1024:.1f} MB/s" if kb_s >= 1024 else f"{kb_s} KB/s"


def format_gpu_line(gpu: GpuSample) -> str:
    """One line for one GPU (a ``GpuSample``)."""
    head = f"GPU{gpu.index} {gpu.name or 'unknown GPU'}"
    if not gpu.available:
        return f"{head} | unavailable: {gpu.reason}"
    memory = f"mem {_gib(gpu.memory_used_bytes)}/{_gib(gpu.memory_total_bytes)} GiB"
    if gpu.process_memory_bytes is not None:
        memory += f" (this process {_gib(gpu.process_memory_bytes)})"
    power = f"{_num(gpu.power_w, '.0f')}/{_num(gpu.power_limit_w, '.0f')} W"
    clocks = f"clk SM {_num(gpu.sm_clock_mhz, 'd')} mem {_num(gpu.mem_clock_mhz, 'd')} MHz"
    pcie = f"PCIe tx {_rate(gpu.pcie_tx_kb_s)} rx {_rate(gpu.pcie_rx_kb_s)}"
    if gpu.throttle_reasons is None:
        throttle = f"throttle {_NA}"
    else:
        active = [r for r in gpu.throttle_reasons if r != "gpu_idle"]
        throttle = "throttle " + (
            ",".join(active) if active else ("idle" if gpu.throttle_reasons else "none")
        )
    util = f"SM {_num(gpu.sm_util_pct, '3.0f', '%')} memBW {_num(gpu.mem_util_pct, '3.0f', '%')}"
    return " | ".join(
        (head, util, memory, _num(gpu.temperature_c, ".0f", " C"), power, clocks, pcie, throttle)
    )


def format_system_line(system: SystemSample) -> str:
    """The CPU/RAM/process line (a ``SystemSample``)."""
    cores = system.cpu_pct_per_core
    if len(cores) <= 16:
        per_core = " ".join(f"{c:3.0f}" for c in cores)
    else:  # a 64-core line would wrap; the extremes say what matters
        per_core = f"{len(cores)} cores, busiest {max(cores):.0f}%"
    ram = f"RAM {_gib(system.ram_used_bytes)}/{_gib(system.ram_total_bytes)} GiB ({_num(system.ram_pct, '.0f', '%')})"
    rss = f"RSS {_num(None if system.process_rss_bytes is None else system.process_rss_bytes / 2**20, '.0f', ' MiB')}"
    return f"CPU {_num(system.cpu_pct, '3.0f', '%')} [{per_core}] | {ram} | {rss}"


def format_sample(sample: Sample) -> list[str]:
    """The live view's lines for one ``Sample``: a line per GPU (or why there is none), then CPU/RAM."""
    stamp = time.strftime("%H:%M:%S", time.localtime(sample.timestamp))
    driver = f"driver {sample.driver_version}" if sample.driver_version else ""
    lines = [f"volsynth monitor  {stamp}  {driver}".rstrip()]
    if sample.gpus:
        lines.extend(format_gpu_line(gpu) for gpu in sample.gpus)
    if not sample.gpu_available:
        lines.append(sample.gpu_reason or "no NVIDIA GPU")
    lines.append(format_system_line(sample.system))
    return lines


def _bench(seconds: float, interval: float, *, json_output: bool) -> int:
    from engine.telemetry.bench import format_report, measure_overhead

    if not (math.isfinite(seconds) and seconds > 0):
        raise InvalidRequest(f"--bench needs a positive number of seconds, not {seconds}")
    print(
        f"measuring: {seconds:g} s idle, then {seconds:g} s sampling at {1 / interval:g} Hz ...",
        file=sys.stderr,
    )
    try:
        result = measure_overhead(seconds, interval)
    except KeyboardInterrupt:
        return 0
    if json_output:
        print(json.dumps(result))
    else:
        print(format_report(result))
    return 0 if result["within_budget"] else 1
