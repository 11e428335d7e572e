"""CPU/RAM via psutil, and the torch allocator view."""

from __future__ import annotations

import sys
import types

import psutil

from engine.telemetry import SystemMonitor, torch_allocator_stats


def test_system_sample_is_live_and_plausible():
    monitor = SystemMonitor()
    sum(i * i for i in range(200_000))  # some CPU time for this process between the two readings
    sample = monitor.sample()
    assert sample.unavailable == {}
    assert len(sample.cpu_pct_per_core) == psutil.cpu_count()
    assert all(0.0 <= pct <= 100.0 for pct in sample.cpu_pct_per_core)
    assert sample.cpu_pct == round(sum(sample.cpu_pct_per_core) / len(sample.cpu_pct_per_core), 1)
    assert 0 < sample.ram_used_bytes <= sample.ram_total_bytes
    assert sample.process_rss_bytes > 10 * 2**20  # a Python process with pytest loaded
    assert sample.process_cpu_pct >= 0.0


class _GoneProcess:
    """A psutil.Process whose process has exited."""

    def memory_info(self):
        raise psutil.NoSuchProcess(424242)

    def cpu_times(self):
        raise psutil.NoSuchProcess(424242)


def test_vanished_process_is_reported_not_raised():
    monitor = SystemMonitor()
    monitor._process = _GoneProcess()
    sample = monitor.sample()
    assert sample.process_rss_bytes is None and sample.process_cpu_pct is None
    assert {"process_rss_bytes", "process_cpu_pct"} <= set(sample.unavailable)
    assert sample.cpu_pct is not None and sample.ram_used_bytes  # machine-wide numbers are unaffected


def test_torch_not_loaded_is_not_imported(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    stats = torch_allocator_stats()
    assert stats.available is False and stats.reason == "torch is not loaded in this process"
    assert "torch" not in sys.modules


def test_torch_without_cuda_says_so():
    import torch

    stats = torch_allocator_stats()
    if torch.cuda.is_available():  # pragma: no cover - GPU machines
        assert stats.available or "not initialised" in stats.reason
    else:
        assert stats.available is False and stats.reason == "CUDA is not available to torch"


def _fake_torch(initialized: bool) -> types.ModuleType:
    torch = types.ModuleType("torch")
    stats = {
        "allocated_bytes.all.current": 300,
        "reserved_bytes.all.current": 1000,
        "allocated_bytes.all.peak": 700,
        "reserved_bytes.all.peak": 2000,
        "num_alloc_retries": 2,
        "num_ooms": 1,
    }
    torch.cuda = types.SimpleNamespace(
        is_available=lambda: True,
        is_initialized=lambda: initialized,
        device_count=lambda: 2,
        memory_stats=lambda index: stats,
    )
    return torch


def test_torch_allocator_stats_are_read_per_device(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(initialized=True))
    stats = torch_allocator_stats()
    assert stats.available and [d.device for d in stats.devices] == [0, 1]
    device = stats.devices[0]
    assert (device.allocated_bytes, device.reserved_bytes) == (300, 1000)
    assert (device.peak_allocated_bytes, device.peak_reserved_bytes) == (700, 2000)
    assert (device.num_alloc_retries, device.num_ooms) == (2, 1)


def test_torch_before_cuda_init_does_not_initialise_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(initialized=False))
    stats = torch_allocator_stats()
    assert stats.available is False and "not initialised" in stats.reason


def test_torch_errors_become_reasons(monkeypatch):
    torch = _fake_torch(initialized=True)

    def broken_memory_stats(index):
        raise RuntimeError("CUDA error: device-side assert")

    torch.cuda.memory_stats = broken_memory_stats
    monkeypatch.setitem(sys.modules, "torch", torch)
    stats = torch_allocator_stats()
    assert stats.available is False and "device-side assert" in stats.reason
