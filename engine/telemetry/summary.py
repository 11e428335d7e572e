"""Per-run summaries: mean utilisation, peak memory, energy and duration, as a plain JSON-ready dict.

A :class:`RunAccumulator` is fed each sample as it arrives instead of summarising the ring buffer at the
end, so a run longer than the buffer (ten minutes by default) is still summarised completely, in constant
memory.

Energy is the integral of board power over the run window. Power is taken as varying linearly between
samples (the trapezoid rule); the window's edges are cut out of the segment that spans them, and before the
first or after the last reading the nearest reading is held. The result is exact for synthetic power that is
piecewise linear between samples. NVML's own energy counter (Volta and newer) is reported alongside, as
``energy_counter_j``, when the GPU has one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from engine.telemetry.samples import Sample


def _segment_energy(t0: float, p0: float, t1: float, p1: float, lo: float, hi: float) -> float:
    """Integral over ``[lo, hi]`` (inside ``[t0, t1]``) of the line through ``(t0, p0)`` and ``(t1, p1)``."""
    if hi <= lo:
        return 0.0
    slope = (p1 - p0) / (t1 - t0) if t1 > t0 else 0.0
    p_lo = p0 + slope * (lo - t0)
    p_hi = p0 + slope * (hi - t0)
    return 0.5 * (p_lo + p_hi) * (hi - lo)


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _mean(total: float | None, count: float) -> float | None:
    return None if total is None or count <= 0 else round(total / count, 2)


@dataclass
class _GpuRun:
    index: int
    name: str | None = None
    uuid: str | None = None
    util_sum: float = 0.0
    util_n: int = 0
    mem_util_sum: float = 0.0
    mem_util_n: int = 0
    peak_memory: int | None = None
    peak_process_memory: int | None = None
    peak_temperature: float | None = None
    energy_j: float = 0.0
    power_readings: int = 0
    energy_complete: bool = True
    last_power: tuple[float, float] | None = None  # (time, watts) of the newest reading
    counter_first: int | None = None
    counter_last: int | None = None


def _max(current: Any, value: Any) -> Any:
    if value is None:
        return current
    return value if current is None else max(current, value)


class RunAccumulator:
    """Builds one run's summary incrementally.

    Args:
        run_id: The run's id, copied into the summary.
        start: Start of the run on the samples' ``monotonic`` clock; ``None`` starts it at the first sample.
        started_at: Wall-clock start (epoch seconds) for the summary; ``None`` takes the first sample's.
        previous: The newest sample before the start, if any. Its power readings let energy be interpolated
            from the true start rather than from the first sample inside the run.
    """

    def __init__(
        self,
        run_id: str,
        start: float | None = None,
        started_at: float | None = None,
        previous: Sample | None = None,
    ) -> None:
        self.run_id = run_id
        self.start = start
        self.started_at = started_at
        self._source: str | None = None
        self._samples = 0
        self._last_time: float | None = None
        self._last_wall: float | None = None
        self._gpus: dict[int, _GpuRun] = {}
        self._gpu_available = False
        self._gpu_reason: str | None = None
        self._cpu_sum = 0.0
        self._cpu_n = 0
        self._peak_rss: int | None = None
        self._peak_ram: int | None = None
        self._torch_peak_alloc: int | None = None
        self._torch_peak_reserved: int | None = None
        self._result: dict[str, Any] | None = None
        if previous is not None:
            self._seed(previous)

    def _seed(self, sample: Sample) -> None:
        for gpu in sample.gpus:
            run = self._gpus.setdefault(gpu.index, _GpuRun(gpu.index, gpu.name, gpu.uuid))
            run.last_power = None if gpu.power_w is None else (sample.monotonic, gpu.power_w)

    def add(self, sample: Sample) -> None:
        """Account for one sample. Samples before ``start`` only serve as interpolation points."""
        if self._result is not None:
            return
        t = sample.monotonic
        if self.start is None:
            self.start = t
        if self.started_at is None:
            self.started_at = sample.timestamp
        if t < self.start:
            self._seed(sample)
            return
        self._samples += 1
        self._source = sample.source
        self._last_time, self._last_wall = t, sample.timestamp
        self._gpu_available = self._gpu_available or sample.gpu_available
        if not sample.gpu_available and self._gpu_reason is None:
            self._gpu_reason = sample.gpu_reason

        for gpu in sample.gpus:
            run = self._gpus.setdefault(gpu.index, _GpuRun(gpu.index))
            run.name = gpu.name or run.name
            run.uuid = gpu.uuid or run.uuid
            if gpu.sm_util_pct is not None:
                run.util_sum += gpu.sm_util_pct
                run.util_n += 1
            if gpu.mem_util_pct is not None:
                run.mem_util_sum += gpu.mem_util_pct
                run.mem_util_n += 1
            run.peak_memory = _max(run.peak_memory, gpu.memory_used_bytes)
            run.peak_process_memory = _max(run.peak_process_memory, gpu.process_memory_bytes)
            run.peak_temperature = _max(run.peak_temperature, gpu.temperature_c)
            if gpu.energy_mj is not None:
                if run.counter_first is None:
                    run.counter_first = gpu.energy_mj
                run.counter_last = gpu.energy_mj
            self._add_power(run, t, gpu.power_w, self.start)

        system = sample.system
        if system.cpu_pct is not None:
            self._cpu_sum += system.cpu_pct
            self._cpu_n += 1
        self._peak_rss = _max(self._peak_rss, system.process_rss_bytes)
        self._peak_ram = _max(self._peak_ram, system.ram_used_bytes)
        if sample.torch.available:
            for device in sample.torch.devices:
                self._torch_peak_alloc = _max(self._torch_peak_alloc, device.allocated_bytes)
                self._torch_peak_reserved = _max(self._torch_peak_reserved, device.reserved_bytes)

    @staticmethod
    def _add_power(run: _GpuRun, t: float, power: float | None, start: float) -> None:
        if power is None:
            if run.power_readings or run.last_power is not None:
                run.energy_complete = False  # a gap: its energy is unknown, not zero
            run.last_power = None
            return
        if run.last_power is None:
            if run.power_readings == 0:
                # First reading and nothing before the run to interpolate from: hold it back to the start.
                run.energy_j += power * max(0.0, t - start)
        else:
            t0, p0 = run.last_power
            run.energy_j += _segment_energy(t0, p0, t, power, max(t0, start), t)
        run.power_readings += 1
        run.last_power = (t, power)

    def finish(self, end: float | None = None, ended_at: float | None = None) -> dict[str, Any]:
        """Close the run and return its summary.

        Args:
            end: End of the run on the samples' ``monotonic`` clock; default the last sample's time.
            ended_at: Wall-clock end for the summary; default derived from ``end``.

        Returns:
            A JSON-ready dict::

                {"run_id": str, "source": str | None, "started_at": float, "ended_at": float,
                 "duration_s": float, "samples": int,
                 "gpu_available": bool, "gpu_reason": str | None,
                 "mean_gpu_util_pct": float | None,     # mean over GPUs and samples
                 "peak_gpu_memory_bytes": int | None,   # highest device memory in use on any GPU
                 "energy_j": float | None,              # sum over GPUs
                 "gpus": [{"index", "name", "uuid", "mean_sm_util_pct", "mean_mem_util_pct",
                           "peak_memory_used_bytes", "peak_process_memory_bytes", "peak_temperature_c",
                           "energy_j", "energy_complete", "energy_counter_j", "mean_power_w"}, ...],
                 "cpu": {"mean_cpu_pct", "peak_process_rss_bytes", "peak_ram_used_bytes"},
                 "torch": {"peak_allocated_bytes", "peak_reserved_bytes"} | None}
        """
        if self._result is not None:  # holding the last reading again would count its energy twice
            return self._result
        start = self.start
        if end is None:
            end = self._last_time if self._last_time is not None else start
        if start is None or end is None:
            start = end = 0.0
        end = max(end, start)
        duration = end - start
        started_at = self.started_at if self.started_at is not None else 0.0
        if ended_at is None:
            ended_at = started_at + duration

        gpus: list[dict[str, Any]] = []
        for run in sorted(self._gpus.values(), key=lambda r: r.index):
            if run.last_power is not None:
                t_last, p_last = run.last_power
                hold_from = max(t_last, start)
                if end > hold_from:
                    run.energy_j += p_last * (end - hold_from)
                    if run.power_readings == 0:
                        run.power_readings = 1  # the reading from before the start covered the whole run
            energy = run.energy_j if run.power_readings else None
            counter = None
            if run.counter_first is not None and run.counter_last is not None:
                counter = (run.counter_last - run.counter_first) / 1000.0  # mJ -> J
            gpus.append(
                {
                    "index": run.index,
                    "name": run.name,
                    "uuid": run.uuid,
                    "mean_sm_util_pct": _mean(run.util_sum, run.util_n),
                    "mean_mem_util_pct": _mean(run.mem_util_sum, run.mem_util_n),
                    "peak_memory_used_bytes": run.peak_memory,
                    "peak_process_memory_bytes": run.peak_process_memory,
                    "peak_temperature_c": run.peak_temperature,
                    "energy_j": _round(energy, 6),
                    "energy_complete": bool(energy is not None and run.energy_complete),
                    "energy_counter_j": _round(counter, 6),
                    "mean_power_w": _mean(energy, duration),
                }
            )

        utils = [(r.util_sum, r.util_n) for r in self._gpus.values() if r.util_n]
        energies = [g["energy_j"] for g in gpus if g["energy_j"] is not None]
        peaks = [g["peak_memory_used_bytes"] for g in gpus if g["peak_memory_used_bytes"] is not None]
        torch = None
        if self._torch_peak_alloc is not None:
            torch = {
                "peak_allocated_bytes": self._torch_peak_alloc,
                "peak_reserved_bytes": self._torch_peak_reserved,
            }
        self._result = {
            "run_id": self.run_id,
            "source": self._source,
            "started_at": started_at,
            "ended_at": ended_at,
            "duration_s": round(duration, 6),
            "samples": self._samples,
            "gpu_available": self._gpu_available,
            "gpu_reason": None if self._gpu_available else self._gpu_reason,
            "mean_gpu_util_pct": _mean(sum(s for s, _ in utils), sum(n for _, n in utils)),
            "peak_gpu_memory_bytes": max(peaks) if peaks else None,
            "energy_j": _round(sum(energies), 6) if energies else None,
            "gpus": gpus,
            "cpu": {
                "mean_cpu_pct": _mean(self._cpu_sum, self._cpu_n),
                "peak_process_rss_bytes": self._peak_rss,
                "peak_ram_used_bytes": self._peak_ram,
            },
            "torch": torch,
        }
        return self._result


def summarize_run(
    samples: Iterable[Sample],
    run_id: str = "run",
    *,
    start: float | None = None,
    end: float | None = None,
) -> dict[str, Any]:
    """Summarise a finished list of samples (e.g. a window of the ring buffer, or a recorded JSON stream).

    Args:
        samples: Samples in time order.
        run_id: Copied into the summary.
        start: Run start on the ``monotonic`` clock; default the first sample's time.
        end: Run end; default the last sample's time.

    Returns:
        The dict described in :meth:`RunAccumulator.finish`.
    """
    accumulator = RunAccumulator(run_id, start=start)
    for sample in samples:
        accumulator.add(sample)
    return accumulator.finish(end)
