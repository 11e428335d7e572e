"""On real NVIDIA hardware (skipped elsewhere): NVML and torch agree with what this process allocates."""

from __future__ import annotations

import pytest

from engine.telemetry import LocalCollector, Sampler


@pytest.mark.gpu
def test_real_gpu_metrics_and_run_summary(nvidia_gpu):
    import torch

    sampler = Sampler(interval_s=0.25, collector=LocalCollector(torch_mode="auto"))
    try:
        before = sampler.sample_now()
        assert before.gpu_available, before.gpu_reason
        assert before.driver_version
        gpu = before.gpus[0]
        assert gpu.name and gpu.memory_total_bytes > 0
        assert 0 <= gpu.sm_util_pct <= 100

        sampler.mark_run_start("hw-run")
        block = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")  # 256 MiB
        torch.cuda.synchronize()
        during = sampler.sample_now()
        summary = sampler.mark_run_end("hw-run")
        del block

        stats = during.torch
        assert stats.available, stats.reason
        assert stats.devices[0].allocated_bytes >= 256 * 2**20
        # NVML and CUDA may number GPUs differently, and a PID namespace can hide us from NVML entirely.
        ours = [g.process_memory_bytes for g in during.gpus if g.process_memory_bytes is not None]
        if ours:
            assert max(ours) >= 256 * 2**20
        assert summary["samples"] == 1 and summary["gpu_available"]
        assert summary["torch"]["peak_allocated_bytes"] >= 256 * 2**20
        if during.gpus[0].power_w is not None:
            assert summary["energy_j"] >= 0
    finally:
        sampler.stop()
