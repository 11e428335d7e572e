"""Kernel profile of a few denoising steps: which operators (and, on CUDA, which kernels) the time goes to.

``KernelProfiler`` wraps a ``PreparedModel`` the way the sampling loop sees it (``denoiser``, ``decode``,
``autocast``) and runs ``torch.profiler`` around the denoiser calls of chosen steps only, so the loop itself
stays the one loop and unprofiled steps run at full speed. Step 1 (the first) is never profiled: it pays
for lazy initialisation (cuDNN autotuning, allocator growth, compilation) and would say little about the
steady state.

The summary is JSON-ready and goes into the provenance record (``provenance["kernel_profile"]``):
the top operators by *self* time (time in the operator itself, not its children, so the rows add up),
their call counts and share of the profiled time. On CUDA the ranking is by device time.
"""

from __future__ import annotations

import os
from typing import Any

TOP_OPERATORS = 15


def quiet_kineto() -> None:
    """Keep kineto's own log lines off the user's terminal, unless the user set ``KINETO_LOG_LEVEL``.

    Kineto (torch.profiler's back end) writes "USDT: ... profiler_start" and "STAGE: ..." lines straight to file
    descriptor 2 at every profile, whatever Python does with sys.stderr, and an "ERROR: External init
    callback ..." line when a thread other than torch's importer profiles (the app's workers). It reads its
    level from the environment when torch loads and again when the first profile starts.
    """
    from engine import KINETO_QUIET_LEVEL  # set first in engine/__init__.py, before torch loads

    os.environ.setdefault("KINETO_LOG_LEVEL", KINETO_QUIET_LEVEL)


class KernelProfiler:
    """Proxy of a prepared model that profiles the denoiser calls of ``steps`` (1-based step numbers)."""

    def __init__(self, prepared, steps: range | list[int], device) -> None:
        self.prepared = prepared
        self.steps = set(steps)
        self.device = device
        self._step = 0
        self._events: list[Any] = []  # key_averages() of each profiled step
        if self.steps:
            quiet_kineto()  # here, before the first profile starts, where kineto reads it

    def __getattr__(self, name: str) -> Any:  # report, details, config... of the wrapped model
        return getattr(self.prepared, name)

    def autocast(self):
        return self.prepared.autocast()

    def decode(self, z):
        return self.prepared.decode(z)

    def denoiser(self, x, timesteps, context=None):
        self._step += 1
        if self._step not in self.steps:
            return self.prepared.denoiser(x, timesteps, context)
        import torch
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        with profile(activities=activities) as prof:
            out = self.prepared.denoiser(x, timesteps, context)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
        self._events.append(prof.key_averages())
        return out

    def summary(self, top: int = TOP_OPERATORS) -> dict[str, Any]:
        """The profiled steps' operators, merged over steps, ranked by self time (device time on CUDA)."""
        on_device = self.device.type == "cuda"
        totals: dict[str, dict[str, float]] = {}
        for averages in self._events:
            for event in averages:
                self_us = float(event.self_device_time_total if on_device else event.self_cpu_time_total)
                row = totals.setdefault(event.key, {"self_us": 0.0, "calls": 0})
                row["self_us"] += self_us
                row["calls"] += int(event.count)
        profiled = len(self._events)
        total_us = sum(r["self_us"] for r in totals.values())
        ranked = sorted(totals.items(), key=lambda item: -item[1]["self_us"])
        rows: list[dict[str, Any]] = [
            {
                "name": name,
                "self_ms_per_step": r["self_us"] / 1e3 / max(profiled, 1),
                "calls_per_step": r["calls"] / max(profiled, 1),
                "share": r["self_us"] / total_us if total_us else 0.0,
            }
            for name, r in ranked[:top]
            if r["self_us"] > 0
        ]
        return {
            "steps": sorted(s for s in self.steps if s <= self._step),
            "clock": "cuda" if on_device else "cpu",
            "total_ms_per_step": total_us / 1e3 / max(profiled, 1),
            "operators": rows,
            "other_share": max(0.0, 1.0 - sum(r["share"] for r in rows)),
        }


def profiled_steps(count: int, total_steps: int) -> list[int]:
    """Which steps to profile: ``count`` steps from step 2 on (step 1 warms up), within the run."""
    if count <= 0 or total_steps < 2:
        return []
    return list(range(2, min(total_steps, 1 + count) + 1))
