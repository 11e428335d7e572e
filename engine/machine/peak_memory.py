"""Peak memory of one piece of work: the CUDA allocator's peak on a GPU, the process's peak RSS on a CPU."""

from __future__ import annotations

import sys
from typing import Any


def peak_rss_bytes() -> int:
    """This process's peak resident set size so far (bytes)."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # macOS reports bytes, Linux KiB


def reset_peak_rss() -> bool:
    """Reset this process's peak RSS (Linux ``/proc/self/clear_refs``); False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def current_peak_rss_bytes() -> int | None:
    """Peak RSS since the last :func:`reset_peak_rss` (Linux ``VmHWM``); None where unavailable."""
    return _status_bytes("VmHWM:")


def current_rss_bytes() -> int | None:
    """Resident set size now (Linux ``VmRSS``); None where unavailable."""
    return _status_bytes("VmRSS:")


def process_peak_rss_bytes() -> int:
    """This process's peak RSS: Linux ``VmHWM`` where it can be read, else ``ru_maxrss``.

    ``ru_maxrss`` survives ``execve``, so in a child started from an evaluation it reported the parent's peak
    (2.2 GB, against 0.8 GB for the same generation in a shell-started process); ``VmHWM`` does not."""
    peak = current_peak_rss_bytes()
    return peak if peak is not None else peak_rss_bytes()


def device_peak_bytes(device) -> tuple[int, str]:
    """(peak bytes so far, kind) on ``device``: the CUDA allocator's peak on a GPU (``"cuda_allocator"``), the
    process's lifetime peak RSS elsewhere (``"process_rss"``)."""
    if device.type == "cuda":
        import torch

        return int(torch.cuda.max_memory_allocated(device)), "cuda_allocator"
    return peak_rss_bytes(), "process_rss"


def _status_bytes(field: str) -> int | None:
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith(field):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


class PeakMemory:
    """Measures the peak memory of the work inside ``with PeakMemory(device) as peak:``; then ``peak.record``.

    On CUDA: the caching allocator's peak (``torch.cuda.max_memory_allocated``) after resetting it, plus
    what was allocated at the start. On a CPU: the process's peak RSS after resetting the high-water mark,
    plus the RSS at the start, so the run's own share is ``peak - start``. Where the high-water mark cannot be
    reset (not Linux), the peak is the process's lifetime peak and ``since_start`` is False.
    """

    def __init__(self, device) -> None:
        self.device = device
        self.record: dict[str, Any] = {}
        self._start: int | None = None
        self._reset = False

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            import torch

            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._start = int(torch.cuda.memory_allocated(self.device))
            self._reset = True
        else:
            self._start = current_rss_bytes()
            self._reset = reset_peak_rss()
        return self

    def __exit__(self, *exc_info) -> None:
        if self.device.type == "cuda":
            import torch

            torch.cuda.synchronize(self.device)
            peak, kind = device_peak_bytes(self.device)
        else:
            reset_peak = current_peak_rss_bytes() if self._reset else None
            peak, kind = (reset_peak if reset_peak is not None else peak_rss_bytes()), "process_rss"
        self.record = {
            "peak_bytes": peak,
            "start_bytes": self._start,
            "kind": kind,
            "since_start": self._reset and self._start is not None,
        }
