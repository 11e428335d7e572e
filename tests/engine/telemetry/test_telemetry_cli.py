"""``volsynth monitor``: --once, --json, the live loop's Ctrl-C, and --bench."""

from __future__ import annotations

import io
import json
import os

import psutil
import pytest

from engine.cli import build_parser, main
from engine.cli import monitor as monitor_cli
from engine.telemetry import GpuMonitor, LocalCollector, Sample, SystemMonitor
from engine.telemetry.bench import format_report, measure_overhead
from tests.engine.telemetry.fake_nvml import FakeGpu, FakeNvml


@pytest.fixture
def fake_gpus(monkeypatch):
    """Make the CLI measure two simulated GPUs instead of this machine's (missing) ones."""
    nvml = FakeNvml(
        [
            FakeGpu(processes=[(os.getpid(), 3 * 2**30)]),
            FakeGpu(name="NVIDIA L4", unsupported={"nvmlDeviceGetPowerUsage"}),
        ]
    )
    monkeypatch.setattr(
        monitor_cli,
        "_make_collector",
        lambda: LocalCollector(GpuMonitor(nvml, pcie_interval_s=0), SystemMonitor(), torch_mode="off"),
    )
    monkeypatch.setattr(monitor_cli, "_sleep", lambda seconds: None)
    return nvml


def test_monitor_is_registered():
    parser = build_parser()
    args = parser.parse_args(["monitor", "--once", "--json", "--interval", "0.5"])
    assert args.func is monitor_cli.run and args.once and args.json and args.interval == 0.5


def test_once_json_on_this_machine(capsys):
    assert main(["monitor", "--once", "--json", "--interval", "0.05"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1
    sample = Sample.from_dict(json.loads(lines[0]))
    assert len(sample.system.cpu_pct_per_core) == psutil.cpu_count()
    assert sample.system.process_rss_bytes > 0
    assert sample.gpu_available or sample.gpu_reason.startswith("no NVIDIA GPU: ")
    assert sample.torch.available is False  # the monitor never imports torch for itself


def test_once_text_without_gpu(capsys, no_nvidia_driver):
    assert main(["monitor", "--once", "--interval", "0.05"]) == 0
    out = capsys.readouterr().out
    assert "no NVIDIA GPU: " in out
    assert "\nCPU " in out and "RAM " in out and "\x1b[" not in out  # not a terminal: no escape codes


def test_once_text_with_gpus(capsys, fake_gpus):
    assert main(["monitor", "--once"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("volsynth monitor") and "driver 550.54.15" in lines[0]
    gpu0, gpu1, system = lines[1], lines[2], lines[3]
    assert gpu0.startswith(
        "GPU0 NVIDIA RTX A6000 | SM  87% memBW  45% | mem 20.0/48.0 GiB (this process 3.0)"
    )
    assert "66 C" in gpu0 and "252/300 W" in gpu0 and "clk SM 1800 mem 8001 MHz" in gpu0
    assert "PCIe tx 2.0 MB/s rx 512 KB/s" in gpu0 and "throttle sw_power_cap" in gpu0
    assert gpu1.startswith("GPU1 NVIDIA L4") and "n/a/300 W" in gpu1
    assert system.startswith("CPU ")
    assert len(lines) == 4


def test_json_stream_until_ctrl_c_exits_zero(capsys, fake_gpus, monkeypatch):
    sleeps = []

    def sleep(seconds):
        sleeps.append(seconds)
        if len(sleeps) == 4:  # the priming sleep, then one per sample: Ctrl-C during the third wait
            raise KeyboardInterrupt

    monkeypatch.setattr(monitor_cli, "_sleep", sleep)
    assert main(["monitor", "--json", "--interval", "0.5"]) == 0
    samples = [Sample.from_dict(json.loads(line)) for line in capsys.readouterr().out.splitlines()]
    assert [s.seq for s in samples] == [0, 1, 2]
    assert all(s.gpus[0].name == "NVIDIA RTX A6000" for s in samples)
    assert fake_gpus.calls["nvmlShutdown"] == 1  # NVML released on the way out


def test_live_view_redraws_in_place_and_restores_the_cursor(fake_gpus, monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    terminal = Terminal()
    monkeypatch.setattr(monitor_cli.sys, "stdout", terminal)
    count = {"n": 0}

    def sleep(seconds):
        count["n"] += 1
        if count["n"] == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(monitor_cli, "_sleep", sleep)
    assert main(["monitor"]) == 0
    text = terminal.getvalue()
    assert text.startswith("\x1b[?25l") and text.endswith("\x1b[?25h")
    assert text.count("\x1b[4F\x1b[J") == 1  # second frame moves up over the first frame's 4 lines
    assert text.count("GPU0 ") == 2


def test_bad_interval_is_a_usage_error(capsys):
    assert main(["monitor", "--once", "--interval", "0"]) == 2
    assert "--interval must be a positive number" in capsys.readouterr().err


def test_bench_measures_the_sampler_thread():
    nvml = FakeNvml([FakeGpu()])
    collector = LocalCollector(GpuMonitor(nvml), SystemMonitor(), torch_mode="off")
    result = measure_overhead(0.2, 0.05, collector=collector, baseline=False)
    assert result["samples"] >= 1 and result["gpu_available"] is True
    assert result["thread_cpu_s"] >= 0.0 and result["idle_cpu_pct_of_core"] is None
    assert result["within_budget"] == (result["thread_cpu_pct_of_core"] <= 1.0)
    report = format_report(result)
    assert "sampler at 20 Hz" in report and "% of one core" in report


def test_bench_from_the_cli(capsys):
    code = main(["monitor", "--bench", "0.2", "--json"])
    result = json.loads(capsys.readouterr().out)
    assert result["interval_s"] == 0.25 and result["samples"] >= 1
    assert result["idle_cpu_pct_of_core"] is not None
    assert code == (0 if result["within_budget"] else 1)
