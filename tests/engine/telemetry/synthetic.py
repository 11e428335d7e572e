"""Synthetic samples with known values, for summary and sampler tests."""

from __future__ import annotations

from engine.telemetry import GpuSample, Sample, SystemSample


def make_sample(
    t: float,
    power_w: float | None = None,
    *,
    util: float | None = None,
    memory_used: int | None = None,
    energy_mj: int | None = None,
    cpu: float = 10.0,
    rss: int = 100,
    seq: int = 0,
) -> Sample:
    """A synthetic sample at monotonic time ``t`` with one GPU (or none when every GPU value is None)."""
    gpus = []
    has_gpu = any(v is not None for v in (power_w, util, memory_used, energy_mj))
    if has_gpu:
        gpus.append(
            GpuSample(
                index=0,
                name="Synthetic GPU",
                sm_util_pct=util,
                memory_used_bytes=memory_used,
                power_w=power_w,
                energy_mj=energy_mj,
                unavailable={} if power_w is not None else {"power_w": "not supported by this GPU"},
            )
        )
    return Sample(
        seq=seq,
        timestamp=1_700_000_000.0 + t,
        monotonic=t,
        gpu_available=has_gpu,
        gpu_reason=None if has_gpu else "no NVIDIA GPU: synthetic",
        gpus=gpus,
        system=SystemSample(cpu_pct_per_core=[cpu, cpu], cpu_pct=cpu, process_rss_bytes=rss),
    )
