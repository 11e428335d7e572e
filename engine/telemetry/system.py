"""CPU load per core, RAM and this process's footprint, via psutil. Never raises."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil

from engine.telemetry.samples import SystemSample

log = logging.getLogger(__name__)


def _busy_and_total(times: Any) -> tuple[float, float]:
    # Same accounting as psutil.cpu_percent (and htop): guest time is already inside user/nice on Linux,
    # and iowait is idle time.
    total = sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
    idle = times.idle + getattr(times, "iowait", 0.0)
    return total - idle, total


class SystemMonitor:
    """Samples CPU, RAM and process metrics; each :meth:`sample` covers the time since the previous one.

    CPU percentages are computed here from ``psutil.cpu_times`` deltas instead of calling
    ``psutil.cpu_percent(interval=None)``, whose "since last call" state is global to the process: any
    other caller (a library, another monitor) would silently shorten our window.

    Args:
        pid: Process to report on; default this process.
        clock: Monotonic clock, injectable for tests.
    """

    def __init__(self, pid: int | None = None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._process: psutil.Process | None
        try:
            self._process = psutil.Process(pid)
        except (psutil.Error, OSError):
            self._process = None
        self._last_cores = self._cores_now()
        self._last_proc = self._proc_now()

    def _cores_now(self) -> list[tuple[float, float]] | None:
        try:
            return [_busy_and_total(t) for t in psutil.cpu_times(percpu=True)]
        except (psutil.Error, OSError):
            return None

    def _proc_now(self) -> tuple[float, float] | None:
        if self._process is None:
            return None
        try:
            times = self._process.cpu_times()
        except (psutil.Error, OSError):
            return None
        return self._clock(), times.user + times.system

    def sample(self) -> SystemSample:
        """Measure now.

        Returns:
            A :class:`SystemSample`. The first call's CPU figures cover the time since construction; a
            metric that cannot be read is ``None`` with its reason in ``unavailable``.
        """
        with self._lock:
            missing: dict[str, str] = {}
            values: dict[str, Any] = {}

            cores = self._cores_now()
            if cores is None or self._last_cores is None or len(cores) != len(self._last_cores):
                missing["cpu_pct"] = missing["cpu_pct_per_core"] = "per-core CPU times could not be read"
            else:
                per_core = []
                for (busy0, total0), (busy1, total1) in zip(self._last_cores, cores, strict=True):
                    elapsed = total1 - total0
                    pct = 100.0 * (busy1 - busy0) / elapsed if elapsed > 0 else 0.0
                    per_core.append(round(min(100.0, max(0.0, pct)), 1))
                values["cpu_pct_per_core"] = per_core
                values["cpu_pct"] = round(sum(per_core) / len(per_core), 1) if per_core else 0.0
            self._last_cores = cores

            try:
                memory = psutil.virtual_memory()
                values["ram_total_bytes"] = int(memory.total)
                values["ram_used_bytes"] = int(memory.total - memory.available)
                values["ram_pct"] = (
                    round(100.0 * values["ram_used_bytes"] / memory.total, 1) if memory.total else 0.0
                )
            except (psutil.Error, OSError) as exc:
                missing.update(dict.fromkeys(("ram_total_bytes", "ram_used_bytes", "ram_pct"), str(exc)))

            if self._process is None:
                missing["process_rss_bytes"] = missing["process_cpu_pct"] = "process not found"
            else:
                try:
                    values["process_rss_bytes"] = int(self._process.memory_info().rss)
                except (psutil.Error, OSError) as exc:
                    missing["process_rss_bytes"] = str(exc) or type(exc).__name__
                proc = self._proc_now()
                if proc is None or self._last_proc is None:
                    missing["process_cpu_pct"] = "process CPU times could not be read"
                else:
                    wall = proc[0] - self._last_proc[0]
                    values["process_cpu_pct"] = (
                        round(100.0 * (proc[1] - self._last_proc[1]) / wall, 1) if wall > 0 else 0.0
                    )
                self._last_proc = proc

            return SystemSample(unavailable=missing, **values)
