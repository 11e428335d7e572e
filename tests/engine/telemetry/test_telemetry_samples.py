"""Samples are plain data: JSON round trip, tolerant of versions a step apart."""

from __future__ import annotations

import json

from engine.telemetry import GpuMonitor, Sample, SystemSample, TorchDeviceStats, TorchSample
from tests.engine.telemetry.fake_nvml import FakeGpu, FakeNvml


def _rich_sample() -> Sample:
    reading = GpuMonitor(FakeNvml([FakeGpu(), FakeGpu(lost=True)])).sample()
    return Sample(
        seq=7,
        timestamp=1_700_000_123.5,
        monotonic=4321.25,
        source="render-server-1",
        gpu_available=reading.available,
        gpu_reason=reading.reason,
        driver_version=reading.driver_version,
        gpus=reading.gpus,
        system=SystemSample(
            cpu_pct_per_core=[12.5, 80.0],
            cpu_pct=46.2,
            ram_used_bytes=8 * 2**30,
            ram_total_bytes=32 * 2**30,
            ram_pct=25.0,
            process_rss_bytes=512 * 2**20,
            process_cpu_pct=None,
            unavailable={"process_cpu_pct": "process CPU times could not be read"},
        ),
        torch=TorchSample(
            available=True, devices=[TorchDeviceStats(device=0, allocated_bytes=1024, reserved_bytes=4096)]
        ),
    )


def test_json_round_trip_is_lossless():
    sample = _rich_sample()
    assert sample.gpus[1].available is False  # the lost device travels too
    text = json.dumps(sample.to_dict())
    back = Sample.from_dict(json.loads(text))
    assert back == sample
    assert back.to_dict() == sample.to_dict()
    assert isinstance(back.gpus[0].throttle_reasons, list)
    assert isinstance(back.torch.devices[0], TorchDeviceStats)


def test_from_dict_ignores_unknown_keys_and_defaults_missing_ones():
    data = _rich_sample().to_dict()
    data["added_in_a_later_version"] = {"x": 1}
    data["gpus"][0]["nvlink_kb_s"] = 5
    del data["monotonic"]  # an older or simpler sender with wall time only
    del data["torch"]
    back = Sample.from_dict(data)
    assert back.monotonic == back.timestamp
    assert back.torch == TorchSample()
    assert back.gpus[0].name == "NVIDIA RTX A6000"


def test_no_gpu_sample_dict_shape():
    data = Sample(seq=0, timestamp=1.0, monotonic=1.0, gpu_reason="no NVIDIA GPU: test").to_dict()
    assert set(data) == {
        "seq", "timestamp", "monotonic", "source", "gpu_available", "gpu_reason", "driver_version", "gpus",
        "system", "torch",
    }  # fmt: skip
    assert data["gpus"] == [] and data["gpu_available"] is False
