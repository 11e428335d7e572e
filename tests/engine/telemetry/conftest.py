"""Fixtures for the telemetry tests: the NVML stand-in, synthetic samples, and real-hardware gating."""

from __future__ import annotations

import functools

import pytest

from engine.telemetry import GpuMonitor
from tests.engine.telemetry.fake_nvml import FakeGpu, FakeNvml


@functools.cache
def real_nvml_failure() -> str | None:
    """Why the real NVML cannot be used here, or ``None`` when it can (a GPU machine)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    try:
        count = pynvml.nvmlDeviceGetCount()
    finally:
        pynvml.nvmlShutdown()
    return None if count else "NVML reports no devices"


@pytest.fixture
def nvidia_gpu():
    """Skip unless this machine has a working NVIDIA driver, a GPU, and CUDA in torch."""
    reason = real_nvml_failure()
    if reason is not None:
        pytest.skip(f"needs an NVIDIA GPU: nvmlInit failed ({reason})")
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA in torch")


@pytest.fixture
def no_nvidia_driver():
    """Skip on machines where NVML works: the test is about the no-GPU path."""
    if real_nvml_failure() is None:
        pytest.skip("this machine has a working NVIDIA driver")


@pytest.fixture
def fake_nvml():
    """Two simulated GPUs; this process holds 3 GiB on the first."""
    import os

    gpu0 = FakeGpu(processes=[(os.getpid(), 3 * 2**30), (999_999, 2**30)])
    gpu1 = FakeGpu(
        name="NVIDIA GeForce RTX 3060",
        uuid="GPU-00000000-aaaa-bbbb-cccc-dddddddddddd",
        util_gpu=0,
        util_memory=0,
        memory_total=12 * 2**30,
        memory_used=300 * 2**20,
        power_mw=15_000,
        power_limit_mw=170_000,
        clock_event_reasons=0x1,
    )
    return FakeNvml([gpu0, gpu1])


@pytest.fixture
def fake_monitor(fake_nvml):
    monitor = GpuMonitor(fake_nvml, pcie_interval_s=0)
    yield monitor
    monitor.close()
