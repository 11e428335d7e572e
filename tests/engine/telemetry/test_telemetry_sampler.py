"""Ring buffer, the background sampler, run markers, and the remote-ready FeedSource."""

from __future__ import annotations

import json
import threading

import pytest

from engine.errors import InvalidRequest
from engine.telemetry import (
    FeedSource,
    GpuMonitor,
    LocalCollector,
    MetricsSource,
    RingBuffer,
    Sampler,
    SystemMonitor,
)
from tests.engine.telemetry.fake_nvml import FakeGpu, FakeNvml
from tests.engine.telemetry.synthetic import make_sample

WAIT_S = 20.0  # generous guard against a hung test on a loaded machine; never a timing assertion


def _collector(nvml: FakeNvml) -> LocalCollector:
    return LocalCollector(GpuMonitor(nvml, pcie_interval_s=0), SystemMonitor(), torch_mode="off")


def test_ring_buffer_keeps_the_newest_in_order():
    buffer = RingBuffer(3)
    assert buffer.newest() is None and buffer.items() == []
    for item in range(5):
        buffer.append(item)
    assert buffer.items() == [2, 3, 4] and len(buffer) == 3 and buffer.capacity == 3
    assert buffer.newest() == 4
    assert buffer.tail(2) == [3, 4] and buffer.tail(10) == [2, 3, 4] and buffer.tail(0) == []
    with pytest.raises(InvalidRequest):
        RingBuffer(0)


def test_default_sampler_is_4_hz_with_ten_minutes_of_history():
    sampler = Sampler(collector=_collector(FakeNvml([FakeGpu()])))
    assert sampler.interval_s == 0.25
    assert sampler.capacity == 2400  # 600 s * 4 Hz
    assert Sampler(interval_s=0.5, history_s=900, collector=_collector(FakeNvml([]))).capacity == 1800


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf")])
def test_bad_interval_is_refused(bad):
    with pytest.raises(InvalidRequest):
        Sampler(interval_s=bad, collector=_collector(FakeNvml([])))


def test_history_wraps_and_filters_by_seq_and_time():
    sampler = Sampler(interval_s=1.0, history_s=3.0, collector=_collector(FakeNvml([FakeGpu()])))
    taken = [sampler.sample_now() for _ in range(5)]
    assert [s.seq for s in taken] == [0, 1, 2, 3, 4]
    assert [s.seq for s in sampler.history()] == [2, 3, 4]  # capacity 3: the oldest two are gone
    assert [s.seq for s in sampler.history(after_seq=3)] == [4]
    assert [s.seq for s in sampler.history(after_seq=0)] == [2, 3, 4]
    assert sampler.history(after_seq=4) == []
    assert [s.seq for s in sampler.history(last_seconds=0.0)] == [4]
    assert sampler.latest().seq == 4


def test_run_markers_summarise_the_samples_in_between():
    nvml = FakeNvml([FakeGpu(), FakeGpu(util_gpu=13, power_mw=50_000, memory_used=2**30)])
    sampler = Sampler(collector=_collector(nvml))
    sampler.sample_now()
    sampler.mark_run_start("vol-1")
    assert sampler.active_runs() == ["vol-1"]
    for _ in range(3):
        sampler.sample_now()
    summary = sampler.mark_run_end("vol-1")
    assert summary["run_id"] == "vol-1" and summary["samples"] == 3
    assert summary["mean_gpu_util_pct"] == pytest.approx(50.0)  # (87 + 13) / 2
    assert summary["peak_gpu_memory_bytes"] == 20 * 2**30
    # Constant power, so energy is power x duration whatever the timing was.
    assert summary["gpus"][0]["energy_j"] == pytest.approx(251.5 * summary["duration_s"], rel=1e-3, abs=1e-3)
    assert summary["energy_j"] == pytest.approx(301.5 * summary["duration_s"], rel=1e-3, abs=1e-3)
    assert sampler.run_summary("vol-1") == summary and sampler.active_runs() == []
    with pytest.raises(InvalidRequest):
        sampler.mark_run_end("vol-1")


def test_thread_survives_a_lost_gpu_a_failing_listener_and_a_collector_bug():
    nvml = FakeNvml([FakeGpu(), FakeGpu(name="second")])
    collector = _collector(nvml)
    real_collect = collector.collect
    calls = {"n": 0}

    def flaky_collect(seq=0):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("a bug in a collector")
        return real_collect(seq)

    collector.collect = flaky_collect
    sampler = Sampler(interval_s=0.01, collector=collector)
    enough = threading.Event()
    seen = []

    def count(sample):
        seen.append(sample)
        if len(seen) >= 3:
            enough.set()

    def broken_listener(sample):
        raise ValueError("listener bug")

    sampler.add_listener(broken_listener)
    sampler.add_listener(count)
    sampler.start()
    try:
        assert enough.wait(WAIT_S)
        assert all(g.available for g in seen[-1].gpus)
        enough.clear()
        seen.clear()
        nvml.gpus[0].lost = True
        assert enough.wait(WAIT_S)
        assert sampler.running
        latest = seen[-1]
        assert latest.gpus[0].available is False and latest.gpus[0].reason == "GPU is lost"
        assert latest.gpus[1].available and latest.gpu_available
    finally:
        sampler.stop()
    assert not sampler.running
    stats = sampler.stats()
    assert stats["errors"] == 1 and stats["samples"] >= 6 and stats["cpu_s"] >= 0.0
    assert nvml.calls["nvmlShutdown"] == 1  # stop released NVML


def test_remove_listener():
    sampler = Sampler(collector=_collector(FakeNvml([])))
    seen = []
    remove = sampler.add_listener(seen.append)
    sampler.sample_now()
    remove()
    remove()
    sampler.sample_now()
    assert [s.seq for s in seen] == [0]


def test_sources_satisfy_the_protocol():
    assert isinstance(Sampler(collector=_collector(FakeNvml([]))), MetricsSource)
    assert isinstance(FeedSource(), MetricsSource)


def test_feed_source_rebuilds_remote_samples_and_summarises_on_their_clock():
    remote = FeedSource(history_s=60, interval_s=1.0)
    received = []
    remote.add_listener(received.append)
    remote.mark_run_start("remote-run")  # before the first sample: the run starts with it
    for t, power in enumerate([100.0, 200.0, 200.0, 0.0, 100.0]):
        line = json.dumps(make_sample(1000.0 + t, power, seq=90 + t).to_dict())
        remote.feed(line)
    summary = remote.mark_run_end("remote-run")
    assert [s.seq for s in remote.history()] == [0, 1, 2, 3, 4]  # re-sequenced locally
    assert received[-1].gpus[0].power_w == 100.0
    assert summary["energy_j"] == pytest.approx(500.0)
    assert summary["duration_s"] == pytest.approx(4.0)
    assert remote.capacity == 60


@pytest.mark.parametrize("garbage", ["not json", "[1, 2]", b"\xff\xfe", {"gpus": "nope"}])
def test_feed_source_rejects_garbage(garbage):
    with pytest.raises(InvalidRequest):
        FeedSource().feed(garbage)
