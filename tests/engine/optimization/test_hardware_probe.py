"""The capability probe and the decisions it drives, from recorded probes of several machine classes.

The records in ``probes/`` describe CPUs and GPUs by what the probe reports on them: AMD EPYC with AVX2
only (where bf16 autocast ran 60-125x slower than fp32), Intel AVX-512 + VNNI without BF16 (emulated bf16),
AMD EPYC Zen 5 with AVX-512 BF16, Intel Sapphire Rapids with AMX and AVX-512 FP16, and CUDA GPUs of compute
capability 7.0, 8.0 and 9.0. The decisions must not depend on the machine the tests run on.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.api.optimization_config import OptimizationConfig
from engine.errors import InvalidRequest
from engine.machine.probe import (
    AVX2_STAND_IN,
    MachineProbe,
    autocast_slower_reason,
    hardware_isa,
    probe_machine,
)
from engine.optimization.apply import check_combination, expected_report, slower_here

PROBES = Path(__file__).parent / "probes"
CPU = torch.device("cpu")
CUDA = torch.device("cuda:0")


def recorded(name: str) -> MachineProbe:
    return MachineProbe.from_dict(json.loads((PROBES / f"{name}.json").read_text()))


@pytest.mark.parametrize(
    ("machine", "bf16_slower", "fp16_slower"),
    [
        ("amd-epyc-avx2", True, True),
        ("intel-cascadelake-avx512", True, True),  # emulated bf16
        ("amd-epyc-zen5-avx512bf16", False, True),
        ("intel-sapphirerapids-amx", False, False),
    ],
)
def test_cpu_precision_decisions(machine, bf16_slower, fp16_slower):
    probe = recorded(machine)
    assert bool(autocast_slower_reason(probe, "cpu", "bf16")) is bf16_slower
    assert bool(autocast_slower_reason(probe, "cpu", "fp16")) is fp16_slower


def test_avx2_bf16_is_refused_with_the_reason_and_runs_with_the_override(no_slower_override):
    probe = recorded("amd-epyc-avx2")
    with pytest.raises(InvalidRequest) as refused:
        check_combination(OptimizationConfig(autocast="bf16"), CPU, probe=probe)
    message = str(refused.value)
    assert "no native bf16" in message and "--allow-slower" in message and "\n" not in message
    # The decoder's own bf16 is the same trap.
    with pytest.raises(InvalidRequest, match="decoder"):
        check_combination(OptimizationConfig(decoder_autocast="bf16"), CPU, probe=probe)
    # The override runs it and the report records why it is slow.
    report = expected_report(OptimizationConfig(autocast="bf16", allow_slower=True), CPU, probe=probe)
    assert "no native bf16" in report["autocast"]["expected_slower"]
    assert (
        report["allow_slower"]["applied"]
        and "run although expected slower" in report["allow_slower"]["reason"]
    )


def test_native_bf16_cpu_is_not_a_trap(no_slower_override):
    for machine in ("amd-epyc-zen5-avx512bf16", "intel-sapphirerapids-amx"):
        report = expected_report(OptimizationConfig(autocast="bf16"), CPU, probe=recorded(machine))
        assert report["autocast"]["applied"] and "expected_slower" not in report["autocast"]
        assert "allow_slower" not in report
    # int8 is not a trap on AVX2: fbgemm's AVX2 kernels were measured 1.7-2.65x faster than fp32 there.
    assert slower_here(OptimizationConfig(quantization="int8"), CPU, probe=recorded("amd-epyc-avx2")) == []


def test_fp16_pays_on_cpus_with_avx512_fp16():
    assert (
        slower_here(OptimizationConfig(autocast="fp16"), CPU, probe=recorded("intel-sapphirerapids-amx"))
        == []
    )


@pytest.mark.parametrize(
    ("machine", "tf32", "bf16", "fp16_slower"),
    [("v100-cc70", False, False, False), ("a100-cc80", True, True, False), ("h100-cc90", True, True, False)],
)
def test_cuda_decisions_from_recorded_gpus(machine, tf32, bf16, fp16_slower, no_slower_override):
    probe = recorded(machine)
    report = expected_report(OptimizationConfig(tf32=True, autocast="bf16"), CUDA, probe=probe)
    assert report["tf32"]["applied"] is tf32
    assert report["autocast"]["applied"] is bf16
    if not tf32:
        assert "compute capability 8.0+" in report["tf32"]["reason"] and "7.0" in report["tf32"]["reason"]
        assert "7.0" in report["autocast"]["reason"]
    assert bool(autocast_slower_reason(probe, "cuda", "fp16")) is fp16_slower
    assert probe.gpus[0].fp8 is (machine == "h100-cc90")


def test_no_gpu_pascal_fp16_is_slower():
    probe = recorded("v100-cc70")
    pascal = MachineProbe.from_dict(
        {
            **probe.to_dict(),
            "gpus": [{**probe.to_dict()["gpus"][0], "compute_capability": [6, 1], "name": "GTX 1080"}],
        }
    )
    assert "no fp16 tensor cores" in autocast_slower_reason(pascal, "cuda", "fp16")
    no_gpu = recorded("amd-epyc-zen5-avx512bf16")
    assert no_gpu.gpus == () and no_gpu.describe().endswith("no GPU")


def test_probe_round_trips_and_fingerprints_differ_by_machine():
    probes = [recorded(p.stem) for p in sorted(PROBES.glob("*.json"))]
    for probe in probes:
        assert MachineProbe.from_dict(json.loads(json.dumps(probe.to_dict()))) == probe
    assert len({p.fingerprint() for p in probes}) == len(probes)


def test_isa_levels_from_cpu_flags():
    assert hardware_isa({"sse4_1", "avx", "avx2", "fma"}) == "AVX2"
    assert hardware_isa({"sse4_1", "avx", "avx2", "fma", "avx_vnni"}) == "AVX2_VNNI"
    core = {"sse4_1", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq"}
    assert hardware_isa(core) == "AVX512_CORE"
    assert hardware_isa(core | {"avx_vnni", "avx512_vnni", "avx512_bf16"}) == "AVX512_CORE_BF16"
    amx = core | {"avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_int8", "amx_bf16"}
    assert hardware_isa(amx) == "AVX10_1_512_AMX"


def test_this_machine_probe_is_consistent():
    probe = probe_machine()
    assert probe.cpu.logical_cores >= 1 and probe.cpu.torch_capability
    assert probe.cpu.native_bf16 == (
        probe.cpu.onednn_isa in ("AVX512_CORE_BF16", "AVX10_1_512", "AVX10_1_512_AMX", "AVX10_1_512_AMX_FP16")
    )
    assert MachineProbe.from_dict(probe.to_dict()) == probe


@pytest.mark.slow
def test_avx2_stand_in_caps_what_the_probe_and_onednn_report():
    """The stand-in variables make this process look like an AVX2 CPU to oneDNN, ATen and the probe."""
    import os

    repo = Path(__file__).resolve().parents[3]
    out = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("child_probe_stand_in.py"))],
        env={**os.environ, **AVX2_STAND_IN, "PYTHONPATH": str(repo)},
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    )
    onednn, native, aten, torch_bf16, stand_in = json.loads(out.stdout.strip().splitlines()[-1])
    assert onednn in ("AVX2", "AVX", "SSE41") and native is False and aten in ("AVX2", "DEFAULT")
    assert torch_bf16 is False
    assert stand_in == sorted(AVX2_STAND_IN)
    assert (
        probe_machine().fingerprint()
        != MachineProbe.from_dict(
            {**probe_machine().to_dict(), "cpu": {**probe_machine().to_dict()["cpu"], "onednn_isa": onednn}}
        ).fingerprint()
    )


def _volsynth(args, env_extra, model_dir):
    import os

    env = {k: v for k, v in os.environ.items() if k != "VOLSYNTH_ALLOW_SLOWER"}
    env.update(env_extra, VOLSYNTH_MODEL_PATH=str(model_dir))
    return subprocess.run(
        [sys.executable, "-m", "engine", *args], env=env, capture_output=True, text=True, timeout=600
    )


@pytest.mark.slow
def test_generate_bf16_on_the_avx2_stand_in_ends_at_once_or_runs_with_the_override(tiny_models_dir, tmp_path):
    out = tmp_path / "v.nii.gz"
    args = ["generate", "--model", "tiny-latent", "--steps", "2", "--autocast", "bf16", "--out", str(out)]
    refused = _volsynth(args, AVX2_STAND_IN, tiny_models_dir)
    assert refused.returncode == 2
    errors = [line for line in refused.stderr.splitlines() if line.startswith("volsynth: error:")]
    assert len(errors) == 1 and "no native bf16" in errors[0] and "--allow-slower" in errors[0]
    assert "Traceback" not in refused.stderr and not out.exists()

    ran = _volsynth([*args, "--allow-slower"], AVX2_STAND_IN, tiny_models_dir)
    assert ran.returncode == 0, ran.stderr
    assert "warning: expected slower than fp32 here" in ran.stderr  # said before it starts
    sidecar = json.loads(out.with_name("v.json").read_text())
    report = sidecar["optimization"]["report"]
    assert report["allow_slower"]["applied"] and "no native bf16" in report["autocast"]["expected_slower"]
    assert sidecar["optimization"]["requested"]["allow_slower"] is True
    assert sidecar["machine"]["cpu"]["onednn_isa"] == "AVX2" and sidecar["machine"]["cpu"]["stand_in"]


def test_a_server_decides_with_its_own_probe(registry, monkeypatch, no_slower_override):
    """The client cannot know the server's CPU: the server refuses what is slower there, and says why."""
    from engine.api import SamplingRequest, run
    from engine.backends.local import LocalBackend
    from engine.backends.remote import RemoteBackend
    from engine.server import create_app
    from engine.testing import ServerThread

    for name, value in AVX2_STAND_IN.items():
        monkeypatch.setenv(name, value)  # the server process's machine: an AVX2 CPU to its probe
    with ServerThread(create_app(LocalBackend("cpu", registry))) as url:
        remote = RemoteBackend(url)
        assert remote.info().details["machine"]["cpu"]["onednn_isa"] == "AVX2"
        request = SamplingRequest(
            model="tiny-latent", steps=2, optimization=OptimizationConfig(autocast="bf16")
        )
        with pytest.raises(InvalidRequest, match="no native bf16"):
            run(remote.sample(request))


def test_a_local_cohort_refuses_a_trap_once_before_any_worker_starts(
    registry, tmp_path, monkeypatch, no_slower_override
):
    from engine.cohort.runner import run_cohort
    from engine.cohort.spec import CohortSpec

    for name, value in AVX2_STAND_IN.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    spec = CohortSpec.from_dict(
        {"name": "trap", "model": "tiny-latent", "steps": 2, "seeds": 2, "optimization": {"autocast": "bf16"}}
    )

    def ray_running() -> bool:
        return "ray" in sys.modules and sys.modules["ray"].is_initialized()

    before = ray_running()
    with pytest.raises(InvalidRequest, match="no native bf16"):
        run_cohort(spec, tmp_path / "cohort", device="cpu", registry=registry)
    assert ray_running() == before  # no runtime was started for it
    assert not list((tmp_path / "cohort").rglob("*.nii.gz"))
