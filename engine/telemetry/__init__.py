"""Live GPU and system metrics for the engine, the app's metrics view and ``volsynth monitor``.

Qt-free and safe on any machine: without an NVIDIA driver or GPU, samples say ``gpu_available=False`` and
``gpu_reason="no NVIDIA GPU: <why>"`` while CPU and RAM stay live. Nothing here imports torch; the torch
allocator is read only when the process has already imported it.

Typical use::

    from engine.telemetry import Sampler

    sampler = Sampler()                 # 4 Hz, ten minutes of history
    sampler.start()
    new = sampler.history(after_seq=last_seq)   # from a UI timer
    sampler.mark_run_start(run_id)
    summary = sampler.mark_run_end(run_id)      # plain dict for provenance
    sampler.stop()
"""

from __future__ import annotations

from engine.telemetry.collector import LocalCollector
from engine.telemetry.gpu import NO_GPU_PREFIX, GpuMonitor, GpuReading, decode_throttle_reasons
from engine.telemetry.sampler import (
    DEFAULT_HISTORY_S,
    DEFAULT_INTERVAL_S,
    FeedSource,
    MetricsSource,
    RingBuffer,
    Sampler,
)
from engine.telemetry.samples import GpuSample, Sample, SystemSample, TorchDeviceStats, TorchSample
from engine.telemetry.summary import RunAccumulator, summarize_run
from engine.telemetry.system import SystemMonitor
from engine.telemetry.torch_stats import torch_allocator_stats

__all__ = [
    "DEFAULT_HISTORY_S",
    "DEFAULT_INTERVAL_S",
    "NO_GPU_PREFIX",
    "FeedSource",
    "GpuMonitor",
    "GpuReading",
    "GpuSample",
    "LocalCollector",
    "MetricsSource",
    "RingBuffer",
    "RunAccumulator",
    "Sample",
    "Sampler",
    "SystemMonitor",
    "SystemSample",
    "TorchDeviceStats",
    "TorchSample",
    "decode_throttle_reasons",
    "summarize_run",
    "torch_allocator_stats",
]
