"""Every GPU check in one unattended run, each part in its own process with its own time limit.

    python -m benchmarks.gpu_suite --out build/gpu            # on an NVIDIA GPU: at most --budget-s (600 s)
    python -m benchmarks.gpu_suite --cpu-smoke --out x        # the same parts at tiny sizes on the CPU

``packaging/gpu_check.sh`` sets up Python (a CUDA build of torch) and runs this. Parts, in order:

==================  =========================================================================================
environment         GPU, driver, clocks, torch/CUDA/cuDNN versions, the peak table's card
gpu-tests           the ``gpu``-marked pytest tests, with a JUnit report of which passed
gpu-check           ``benchmarks.gpu_check``: both networks, every row, ms, TFLOP/s, fraction of peak, PSNR
kernel-shares       kernel-time shares by category from profiled kernel names, fp32 NCDHW vs TF32 +
                    channels-last, with the Tensor-Core share (a stand-in for hardware counters)
generate-demo       one default generation of the shipped model (``volsynth generate --device cuda``)
generate-bundle     one full-size generation with MONAI's brain-bundle architecture (random weights)
nvml-4hz            the Metrics dock's 4 Hz sampler (``engine.telemetry``) during generations
maisi-v2            a 256x256x128 MAISI-v2 generation, when this build has MAISI-v2 support (optional)
probe-tune          the hardware probe's record for this host and ``volsynth tune`` of the shipped model on it
==================  =========================================================================================

A part that runs past its budget is killed with everything it started and recorded as "timed out", with
what it had saved so far; one that crashes is recorded as "crashed" with the end of its output; the next
part starts either way. The whole run stops starting parts when --budget-s is spent. ``gpu_suite.json``
(rewritten after every part) holds every number, ``gpu_suite.txt`` the table, which is printed last.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
TOTAL_BUDGET_S = 600.0
MIN_PART_S = 5.0  # a part given less than this is skipped: it could not even import torch
KILL_GRACE_S = 3.0  # between SIGTERM and SIGKILL of a part's process group
TAIL_CHARS = 3000
TENSOR_CORE_NOTE = (
    "Tensor-Core share = share of GPU kernel time in kernels whose names mark Tensor-Core instructions "
    "(benchmarks.kernel_categories): a stand-in for the paper's hardware counters (SM cycles, tensor-pipe "
    "use), not the same measurement"
)

# Seconds per part on a GPU and in --cpu-smoke on a 2-core CPU. The GPU budgets add up to 635 s, over the
# 600 s total: each part gets at most what is left, so only the last (optional) part can be cut short, and
# only if every earlier part ran to its full budget.
GPU_BUDGETS_S = {
    "environment": 15,
    "gpu-tests": 45,
    "gpu-check": 240,
    "kernel-shares": 60,
    "generate-demo": 35,
    "generate-bundle": 90,  # writing the 2.2 GB random-weights bundle folder is part of it
    "nvml-4hz": 25,
    "maisi-v2": 70,
    "probe-tune": 55,
}
SMOKE_BUDGETS_S = {
    "environment": 30,
    "gpu-tests": 120,
    "gpu-check": 150,
    "kernel-shares": 120,
    "generate-demo": 120,
    "generate-bundle": 120,
    "nvml-4hz": 90,
    "maisi-v2": 60,
    "probe-tune": 90,
}
OPTIONAL_PARTS: tuple[str, ...] = ()


# -- the runner: parts as subprocesses with time limits ---------------------------------------------------


@dataclass(frozen=True)
class Part:
    """One part of the suite: a command whose result is a JSON file.

    Attributes:
        name: The part's name in the JSON and the table.
        budget_s: Time limit; past it the part's process group is killed.
        argv: The command; ``{result}`` in any argument is replaced by the result file's path. The command
            writes its result there (it may do so several times: the last complete write counts).
        optional: A part that only runs when this build has the feature (recorded, not failed, otherwise).
    """

    name: str
    budget_s: float
    argv: tuple[str, ...]
    optional: bool = False


def _tail(path: Path, chars: int = TAIL_CHARS) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-chars:].decode(errors="replace")


def _read_result(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM then SIGKILL the part's whole process group (pytest, volsynth generate... included)."""
    for sig, wait_s in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, KILL_GRACE_S)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def run_part(part: Part, work: Path, timeout_s: float, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run one part in its own process group, at most ``timeout_s`` seconds; never raises for the part.

    Returns:
        ``{"status", "seconds", "exit_code", "result", "output_tail"?, "error"?}``. ``status`` is the one the
        part wrote (``ok``, ``failed``, ``skipped``, ``not available``) or, from the runner, ``timed out`` or
        ``crashed``.
    """
    work.mkdir(parents=True, exist_ok=True)
    result_path = work / f"{part.name}.result.json"
    log_path = work / f"{part.name}.log"
    result_path.unlink(missing_ok=True)
    argv = [a.replace("{result}", str(result_path)) for a in part.argv]
    started = time.monotonic()
    outcome: dict[str, Any] = {}
    with open(log_path, "wb") as log:
        try:
            proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=REPO_ROOT,
                env=env,
                start_new_session=True,  # its own process group: a timeout kills its children too
            )
        except OSError as exc:
            return {"status": "crashed", "seconds": 0.0, "exit_code": None, "result": None, "error": str(exc)}
        try:
            exit_code = proc.wait(timeout=max(timeout_s, 0.1))
            timed_out = False
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            exit_code = proc.returncode
            timed_out = True
        else:
            _kill_group(proc)  # whatever the part left running in its group (a server, a stray worker)
    seconds = time.monotonic() - started
    result = _read_result(result_path)
    outcome.update(seconds=round(seconds, 2), exit_code=exit_code, result=result)
    if timed_out:
        outcome["status"] = "timed out"
        outcome["error"] = f"ran past its {timeout_s:.0f} s budget and was killed"
    elif exit_code != 0:
        outcome["status"] = "crashed"
        reason = (result or {}).get("error") or f"exit code {exit_code}"
        if exit_code is not None and exit_code < 0:
            reason = f"killed by signal {-exit_code} ({signal.Signals(-exit_code).name})"
        outcome["error"] = reason
    elif result is None:
        outcome["status"] = "crashed"
        outcome["error"] = "exited without writing its result"
    else:
        outcome["status"] = str(result.get("status", "ok"))
    if outcome["status"] not in ("ok", "not available"):
        outcome["output_tail"] = _tail(log_path)
    return outcome


def run_suite(
    parts: list[Part],
    work: Path,
    total_budget_s: float,
    *,
    on_update: Callable[[dict[str, Any]], None] = lambda results: None,
    log: Callable[[str], None] = print,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run ``parts`` in order within ``total_budget_s``; each gets ``min(its budget, time left)``.

    Returns:
        ``{"parts": {name: outcome + "budget_s", "timeout_s", "optional"}, "total_s", "total_budget_s"}``,
        also passed to ``on_update`` after every part.
    """
    started = time.monotonic()
    results: dict[str, Any] = {"total_budget_s": total_budget_s, "parts": {}, "total_s": 0.0}
    for part in parts:
        left = total_budget_s - (time.monotonic() - started)
        timeout = min(part.budget_s, left)
        if left < MIN_PART_S:
            outcome = {
                "status": "skipped",
                "seconds": 0.0,
                "result": None,
                "error": f"total budget spent ({total_budget_s:.0f} s): {max(left, 0):.0f} s left",
            }
        else:
            log(f"[{part.name}] starting (budget {timeout:.0f} s)")
            outcome = run_part(part, work, timeout, env=env)
            log(f"[{part.name}] {outcome['status']} in {outcome['seconds']:.1f} s")
        outcome.update(budget_s=part.budget_s, timeout_s=round(max(timeout, 0.0), 1), optional=part.optional)
        results["parts"][part.name] = outcome
        results["total_s"] = round(time.monotonic() - started, 1)
        on_update(results)
    return results


# -- the parts (each runs in its own process: ``--part NAME``) ---------------------------------------------


@dataclass
class PartContext:
    """What a part function gets: sizes, its folder, its budget, and ``save`` for partial results."""

    smoke: bool
    work: Path
    budget_s: float
    result_path: Path
    started: float = field(default_factory=time.monotonic)

    @property
    def device(self) -> str:
        return "cpu" if self.smoke else "cuda"

    def left_s(self) -> float:
        return self.budget_s - (time.monotonic() - self.started)

    def save(self, result: dict[str, Any]) -> None:
        """Write ``result`` now (atomically), so it survives a later timeout or crash of this part."""
        write_json(self.result_path, result)


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Replace ``path`` in one step: a reader, or a kill, never finds half a file."""
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(data, indent=2, default=str))
    os.replace(temporary, path)


def _command(argv: list[str], timeout_s: float, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run a command inside a part (its own budget within the part's); exit code and output tail."""
    started = time.monotonic()
    try:
        done = subprocess.run(
            argv,
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=max(timeout_s, 1.0),
            env=env,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        # TimeoutExpired carries bytes even with text=True (CPython gh-87597): decode either way
        output = "".join(
            part.decode(errors="replace") if isinstance(part, bytes) else (part or "")
            for part in (exc.stdout, exc.stderr)
        )
        return {
            "exit_code": None,
            "timed_out": True,
            "seconds": timeout_s,
            "output_tail": output[-TAIL_CHARS:],
        }
    except OSError as exc:
        return {"exit_code": None, "timed_out": False, "seconds": 0.0, "output_tail": str(exc)}
    output = done.stdout + done.stderr
    return {
        "exit_code": done.returncode,
        "timed_out": False,
        "seconds": round(time.monotonic() - started, 2),
        "output_tail": output[-TAIL_CHARS:],
    }


def part_environment(ctx: PartContext) -> dict[str, Any]:
    import torch

    from benchmarks.gpu_peaks import card_for

    info: dict[str, Any] = {
        "status": "ok",
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "load_average": list(os.getloadavg()),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "cuda_available": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(
            device=props.name,
            compute_capability=f"{props.major}.{props.minor}",
            multiprocessors=props.multi_processor_count,
            memory_gib=round(props.total_memory / 2**30, 1),
            peak_table_card=card_for(props.name),
        )
    else:
        info["device"] = "cpu"
        info["note"] = (
            "no CUDA device: the GPU parts run their CPU stand-ins" if ctx.smoke else "no CUDA device"
        )
        if not ctx.smoke:
            info["status"] = "failed"
    query = "name,driver_version,memory.total,clocks.sm,clocks.max.sm,power.limit,temperature.gpu,compute_cap"
    smi = _command(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"], min(10.0, ctx.left_s()))
    info["nvidia_smi"] = (
        {"fields": query.split(","), "rows": smi["output_tail"].strip().splitlines()}
        if smi["exit_code"] == 0
        else f"not available: {smi['output_tail'].strip()[:200] or 'nvidia-smi is not installed'}"
    )
    return info


def _gpu_test_files() -> list[str]:
    """Test files that hold ``gpu``-marked tests (collecting only those keeps Qt/VTK imports out)."""
    files = []
    for path in sorted((REPO_ROOT / "tests").rglob("test_*.py")):
        text = path.read_text(errors="replace")
        if "mark.gpu" in text:
            files.append(str(path.relative_to(REPO_ROOT)))
    return files


def parse_junit(path: Path) -> dict[str, Any]:
    """Which tests of a JUnit XML report passed, failed, errored or were skipped (and why)."""
    import xml.etree.ElementTree as ElementTree

    outcome: dict[str, list[dict[str, str]]] = {"passed": [], "failed": [], "error": [], "skipped": []}
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        test = f"{case.get('classname', '')}::{case.get('name', '')}"
        for kind, key in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
            element = case.find(kind)
            if element is not None:
                outcome[key].append({"test": test, "message": (element.get("message") or "")[:300]})
                break
        else:
            outcome["passed"].append({"test": test})
    return outcome


def part_gpu_tests(ctx: PartContext) -> dict[str, Any]:
    files = _gpu_test_files()
    report = ctx.work / "gpu-tests.junit.xml"
    report.unlink(missing_ok=True)
    argv = [
        sys.executable,
        "-m",
        "pytest",
        "-m",
        "gpu",
        "-q",
        "-p",
        "no:cacheprovider",
        f"--junitxml={report}",
    ]
    run = _command([*argv, *files], ctx.left_s() - 3)
    result: dict[str, Any] = {"files": files, "command": " ".join(argv + files), **run}
    if not report.is_file():
        result.update(status="crashed", error="pytest wrote no JUnit report")
        return result
    tests = parse_junit(report)
    result["tests"] = tests
    counts = {k: len(v) for k, v in tests.items()}
    result["counts"] = counts
    if counts["failed"] or counts["error"]:
        result["status"] = "failed"
    elif counts["passed"] == 0:
        result["status"] = "skipped"
    else:
        result["status"] = "ok"
    return result


def part_gpu_check(ctx: PartContext) -> dict[str, Any]:
    out = ctx.work / "gpu_check.json"
    out.unlink(missing_ok=True)
    inner_budget = max(ctx.left_s() - 25, 10)  # room to start, and to stop at the end of a row
    argv = [
        sys.executable,
        "-m",
        "benchmarks.gpu_check",
        "--out",
        str(out),
        "--budget-s",
        f"{inner_budget:.0f}",
    ]
    if ctx.smoke:
        # No compile rows in the smoke run: Inductor takes minutes to compile even these tiny U-Nets on two
        # CPU cores. The rows' code is the same; the GPU run compiles.
        argv += ["--cpu-smoke", "--iters", "2"]
    holder: dict[str, Any] = {"status": "ok", "command": " ".join(argv)}
    run = _command(argv, ctx.left_s() - 3)
    holder.update(run)
    check = _read_result(out)
    if check is None:
        holder.update(status="crashed", error="gpu_check wrote no results")
        return holder
    holder["check"] = check
    if "skipped" in check:  # gpu_check found no CUDA device
        holder.update(status="failed", error=f"gpu_check: {check['skipped']}")
        return holder
    errors = [f"{r['network']} {r['row']}: {r['error']}" for r in check.get("rows", []) if "error" in r]
    holder["row_errors"] = errors
    holder["headline"] = gpu_check_headline(check)
    if run["exit_code"] != 0 or errors or not check.get("complete", False):
        holder["status"] = "failed"
    return holder


def gpu_check_headline(check: dict[str, Any]) -> dict[str, Any]:
    """Per network: TF32 + channels-last and the bf16 + compile row against fp32 NCDHW."""
    headline = {}
    for network in check.get("networks", {}):
        rows = {r["row"]: r for r in check.get("rows", []) if r["network"] == network}
        entry: dict[str, Any] = {}
        for row in ("fp32", "tf32+cl", "bf16+cl+sdpa+compile"):
            r = rows.get(row, {})
            if "ms_per_step" in r:
                entry[row] = {
                    "ms": r["ms_per_step"],
                    "tflops": r["tflops"],
                    "fraction_of_peak": r.get("fraction_of_peak"),
                    "x_fp32": r.get("speedup_vs_fp32", 1.0),
                    "psnr_db": r.get("psnr_vs_fp32_db"),
                }
            else:
                entry[row] = r.get("skipped") or r.get("error") or "not run"
        headline[network] = entry
    return headline


KERNEL_SETTINGS = (("fp32 NCDHW", {}), ("tf32+channels-last", {"tf32": True, "channels_last_3d": True}))


def part_kernel_shares(ctx: PartContext) -> dict[str, Any]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from benchmarks.gpu_check import build_bench_network, network_defs
    from benchmarks.kernel_categories import profile_kernels, summarise
    from engine.optimization.apply import OptimizationConfig, prepare
    from engine.telemetry.kernel_profile import quiet_kineto

    quiet_kineto()
    device = torch.device(ctx.device)
    on_cuda = device.type == "cuda"
    result: dict[str, Any] = {
        "status": "ok",
        "clock": "cuda kernels" if on_cuda else "cpu operators (self time)",
        "note": TENSOR_CORE_NOTE,
        "networks": {},
    }
    warmup, profiled = (3, 2) if on_cuda else (1, 1)
    for name, spec in network_defs(ctx.smoke).items():
        model, x, t, context, _ = build_bench_network(name, spec, device)
        entries = result["networks"].setdefault(name, {})
        for label, fields in KERNEL_SETTINGS:
            prepared = prepare(model, OptimizationConfig(**fields), device, use_cache=False)
            with torch.inference_mode():
                for _ in range(warmup):  # cuDNN picks its algorithms on the first calls
                    prepared.denoiser(x, t, context)
                if on_cuda:
                    torch.cuda.synchronize(device)
                activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
                with profile(activities=activities) as prof:
                    for _ in range(profiled):
                        prepared.denoiser(x, t, context)
                    if on_cuda:
                        torch.cuda.synchronize(device)
            summary = summarise(profile_kernels(prof, on_cuda))
            summary["ms_per_call"] = summary["total_us"] / 1e3 / profiled
            summary["applied"] = {k: v["applied"] for k, v in prepared.report.items() if k in fields}
            entries[label] = summary
            ctx.save(result)
            del prepared
        fp32, fast = (entries.get(label) for label, _ in KERNEL_SETTINGS)
        if fp32 and fast and fast["total_us"]:
            entries["tf32+cl vs fp32"] = {
                "kernel_time_ratio": fp32["total_us"] / fast["total_us"],
                "tensor_core_share": [fp32["tensor_core_share"], fast["tensor_core_share"]],
                "layout_share": [fp32["shares"]["layout"], fast["shares"]["layout"]],
                "warnings": applied_but_not_seen(fp32, fast, fast["applied"]) if on_cuda else [],
            }
            if entries["tf32+cl vs fp32"]["warnings"]:
                result["status"] = "failed"  # a setting reported as applied that the kernels do not show
        del model
        if on_cuda:
            torch.cuda.empty_cache()
    return result


def applied_but_not_seen(fp32: dict[str, Any], fast: dict[str, Any], applied: dict[str, bool]) -> list[str]:
    """Settings the engine reported as applied that the profiled kernels contradict (CUDA profiles only).

    TF32 applied means cuDNN/cuBLAS may use TF32 Tensor-Core kernels; if none of the kernels' names marks
    Tensor-Core use, either TF32 did not reach the libraries or the names are read wrongly: both need a look.
    Channels-last applied means the convolutions get NDHWC input, so cuDNN's NCHW<->NHWC conversion kernels
    should not take a larger share than in the NCDHW run.
    """
    warnings = []
    if applied.get("tf32") and fast["tensor_core_share"] == 0.0:
        warnings.append("TF32 reported as applied, but no kernel name marks Tensor-Core use")
    if applied.get("channels_last_3d") and fast["shares"]["layout"] > max(fp32["shares"]["layout"], 0.01):
        warnings.append(
            f"channels-last reported as applied, but layout conversions take {100 * fast['shares']['layout']:.1f} % "
            f"of kernel time (NCDHW run: {100 * fp32['shares']['layout']:.1f} %)"
        )
    return warnings


def _generate(ctx: PartContext, model: str, out: Path, extra: list[str]) -> dict[str, Any]:
    """``volsynth generate`` as a user runs it, on this part's device; the sidecar's numbers."""
    argv = [sys.executable, "-m", "engine", "generate", "--device", ctx.device, "--out", str(out), *extra]
    if model:
        argv[4:4] = ["--model", model]
    run = _command(argv, ctx.left_s() - 3)
    result: dict[str, Any] = {"command": " ".join(argv), **run}
    sidecar = out.with_name(out.name.replace(".nii.gz", ".json"))
    provenance = _read_result(sidecar)
    if run["exit_code"] != 0 or provenance is None:
        last = [line for line in run["output_tail"].splitlines() if line.strip()][-1:] or [""]
        result.update(
            status="failed", error=f"volsynth generate exit code {run['exit_code']}: {last[0][:200]}"
        )
        return result
    import nibabel as nib

    report = (provenance.get("optimization") or {}).get("report") or {}
    result.update(
        status="ok",
        shape=list(nib.load(str(out)).shape),
        device=provenance.get("device"),
        device_name=provenance.get("device_name"),
        steps=(provenance.get("request") or {}).get("steps"),
        timings=provenance.get("timings"),
        memory=provenance.get("memory"),
        telemetry=provenance.get("telemetry"),
        applied={
            k: v.get("applied")
            for k, v in report.items()
            if v.get("requested") not in (None, False, "default")
        },
        model=provenance.get("model"),
        versions=provenance.get("versions"),
    )
    if not ctx.smoke and result["device"] != "cuda":
        result.update(status="failed", error=f"ran on {result['device']}, not cuda")
    return result


def part_generate_demo(ctx: PartContext) -> dict[str, Any]:
    extra = ["--steps", "5"] if ctx.smoke else []  # the model's own defaults on the GPU
    return _generate(ctx, "", ctx.work / "demo.nii.gz", extra)


def _tiny_bundle_spec():
    """MONAI's brain-bundle architecture (the same classes and blocks) at tiny widths, for --cpu-smoke."""
    from engine.models.reference import bundle_sized_spec
    from engine.models.spec import ModelSpec

    data = bundle_sized_spec().to_dict()
    unet = dict(
        data["networks"]["unet"], channels=[16, 32, 48], num_head_channels=[0, 32, 48], norm_num_groups=8
    )
    autoencoder = dict(data["networks"]["autoencoder"], channels=[8, 16, 16, 16], norm_num_groups=8)
    data.update(
        id="bench-bundle-tiny",
        name="Brain-bundle architecture at tiny widths (random weights)",
        networks={"unet": unet, "autoencoder": autoencoder},
        output_shape=[1, 32, 64, 32],  # the autoencoder's 8x, like the bundle's 20x28x20 -> 160x224x160
        latent_shape=[3, 4, 8, 4],  # divisible by 4: the U-Net halves it twice
        voxel_spacing_mm=[5.0, 5.0, 5.0],
    )
    return ModelSpec.from_dict(data)


def part_generate_bundle(ctx: PartContext) -> dict[str, Any]:
    from engine.models.export import save_model_folder
    from engine.models.reference import bundle_sized_spec, perturbed_networks

    spec = _tiny_bundle_spec() if ctx.smoke else bundle_sized_spec()
    folder = ctx.work / "models" / spec.id
    started = time.monotonic()
    if not (folder / "spec.json").is_file():
        save_model_folder(
            folder, spec, perturbed_networks(spec, 0), card=f"# {spec.name}\n\nBenchmarks only.\n"
        )
    built_s = time.monotonic() - started
    # Saved now: if the generation then runs past the budget, the record still says what the folder cost.
    ctx.save({"status": "ok", "model_build_s": round(built_s, 1), "note": "model folder written; generating"})
    extra = ["--steps", "3"] if ctx.smoke else []
    result = _generate(ctx, str(folder), ctx.work / "bundle.nii.gz", extra)
    result.update(
        model_build_s=round(built_s, 1),
        architecture={"unet": spec.networks["unet"], "autoencoder": spec.networks["autoencoder"]},
        weights="random perturbed (speed and memory only; image quality needs the real bundle's weights)",
    )
    return result


def part_nvml_4hz(ctx: PartContext) -> dict[str, Any]:
    import statistics

    from engine.api import SamplingRequest, run
    from engine.backends.factory import make_backend
    from engine.telemetry import LocalCollector, Sampler

    sampler = Sampler(interval_s=0.25, collector=LocalCollector(torch_mode="auto"))
    backend = make_backend(ctx.device)
    request = SamplingRequest(steps=3 if ctx.smoke else 0, seed=0)
    run(backend.sample(request))  # load and warm up outside the sampled window
    wanted_s = 3.0 if ctx.smoke else 8.0
    generations = 0
    sampler.start()
    try:
        sampler.mark_run_start("gpu-suite")
        started = time.monotonic()
        while time.monotonic() - started < wanted_s and ctx.left_s() > 8:
            run(backend.sample(request.replace(seed=generations)))
            generations += 1
        summary = sampler.mark_run_end("gpu-suite")
        samples = sampler.history()
    finally:
        sampler.stop()
    window = [s for s in samples if s.monotonic >= started]
    gaps = [b.monotonic - a.monotonic for a, b in zip(window, window[1:], strict=False)]
    span = window[-1].monotonic - window[0].monotonic if len(window) > 1 else 0.0
    rate = (len(window) - 1) / span if span > 0 else 0.0
    result: dict[str, Any] = {
        "interval_s": 0.25,
        "generations": generations,
        "samples": len(window),
        "span_s": round(span, 2),
        "achieved_hz": round(rate, 2),
        "gap_s": {"median": statistics.median(gaps), "max": max(gaps)} if gaps else None,
        "gpu_available": window[-1].gpu_available if window else None,
        "gpu_reason": window[-1].gpu_reason if window else None,
        "driver_version": window[-1].driver_version if window else None,
        "run_summary": summary,
        "gpus": _gpu_readings(window),
        "system": {
            "cpu_pct_max": max((s.system.cpu_pct or 0.0) for s in window) if window else None,
            "process_rss_max_bytes": max((s.system.process_rss_bytes or 0) for s in window)
            if window
            else None,
        },
    }
    # The Metrics dock promises 4 Hz: fewer than 3 samples a second is a failure of that promise.
    result["status"] = "ok" if rate >= 3.0 else "failed"
    if not ctx.smoke and not result["gpu_available"]:
        result["status"] = "failed"
    return result


def _gpu_readings(window) -> list[dict[str, Any]]:
    """Per GPU over the sampled window: ranges of what NVML gave, and why the rest was not available."""
    readings: dict[int, dict[str, Any]] = {}
    for sample in window:
        for gpu in sample.gpus:
            entry = readings.setdefault(gpu.index, {"index": gpu.index, "name": gpu.name, "values": {}})
            for key in ("sm_util_pct", "memory_used_bytes", "power_w", "temperature_c", "sm_clock_mhz"):
                value = getattr(gpu, key)
                if value is not None:
                    entry["values"].setdefault(key, []).append(value)
            entry["throttle_reasons"] = sorted(
                set(entry.get("throttle_reasons", [])) | set(gpu.throttle_reasons or [])
            )
            entry["unavailable"] = dict(gpu.unavailable)
    out = []
    for entry in readings.values():
        values = entry.pop("values")
        entry["ranges"] = {
            k: {"min": min(v), "max": max(v), "mean": sum(v) / len(v)} for k, v in values.items()
        }
        out.append(entry)
    return out


def _find_module(*names: str) -> str | None:
    """The first of ``names`` that this checkout holds (a module found elsewhere, e.g. through another
    checkout's editable install, does not count: it is not what this build would ship)."""
    import importlib.util

    for name in names:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        if spec is not None and spec.origin and Path(spec.origin).resolve().is_relative_to(REPO_ROOT):
            return name
    return None


def _maisi_model_folder() -> str | None:
    """A MAISI-v2 model folder: $VOLSYNTH_MAISI_MODEL, or a registry entry whose id says MAISI/rflow-mr."""
    folder = os.environ.get("VOLSYNTH_MAISI_MODEL")
    if folder:
        return folder
    try:
        from engine.models.registry import ModelRegistry

        for entry in ModelRegistry().list():
            ident = str(getattr(entry, "id", "") or getattr(entry, "model_id", ""))
            if "maisi" in ident.lower() or "rflow-mr" in ident.lower():
                return ident
    except Exception:  # noqa: BLE001 - an unreadable registry only means no MAISI model was found
        return None
    return None


def part_maisi_v2(ctx: PartContext) -> dict[str, Any]:
    """A full-size (256x256x128) NV-Generate-MR-Brain generation: the user's model folder when one is named
    ($VOLSYNTH_MAISI_MODEL or the registry), else its real architecture with seeded random weights (the
    timing is the architecture's; the volume is noise). Goal on an H200: 5 s or less for sampling plus decode,
    load and compile apart (the sidecar's timings)."""
    from engine.testing import write_maisi_folder

    folder = _maisi_model_folder()
    weights = "the user's model"
    if folder is None:
        target = ctx.work / "NV-Generate-CTMR"
        if not (target / "models" / "diff_unet_3d_rflow-mr-brain_v1.pt").is_file():
            write_maisi_folder(target, tiny=ctx.smoke, seed=0)
        folder, weights = (
            str(target),
            "random weights at the real architecture" + (" (tiny)" if ctx.smoke else ""),
        )
    args = ["--steps", "2"] if ctx.smoke else ["--size", "256x256x128"]
    result = _generate(ctx, folder, ctx.work / "maisi.nii.gz", args)
    result["weights"] = weights
    if not ctx.smoke and result.get("shape") and list(result["shape"][:3]) != [256, 256, 128]:
        result["note"] = f"output {result['shape']}, not the 256x256x128 this part is meant to time"
    return result


def part_probe_tune(ctx: PartContext) -> dict[str, Any]:
    """The hardware probe's record for this GPU host, and ``volsynth tune`` of the shipped model on it."""
    from engine.machine.probe import probe_machine

    result: dict[str, Any] = {"probe": probe_machine().to_dict()}
    budget = max(int(ctx.left_s() - 15), 10)
    argv = [sys.executable, "-m", "engine", "tune", "--device", ctx.device, "--budget", str(budget), "--json"]
    env = None
    if ctx.smoke:  # the plumbing, not a measurement: fp32 and one row, short runs, kept apart from the user's
        argv += ["--rows", "preset:Low memory", "--steps", "2"]
        env = {**os.environ, "VOLSYNTH_TUNE_DIR": str(ctx.work / "tune")}
    tune = _command(argv, ctx.left_s() - 5, env=env)
    result["tune"] = {"command": " ".join(argv), **tune}
    kept = [
        line[len("kept in ") :]
        for line in tune.get("output_tail", "").splitlines()
        if line.startswith("kept in ")
    ]
    try:  # the stored result (rows, verdicts, one-off costs), when the command finished
        result["tune_result"] = json.loads(Path(kept[-1]).read_text()) if kept else None
    except (OSError, ValueError):
        result["tune_result"] = None
    result["status"] = "ok" if tune["exit_code"] == 0 else "failed"
    return result


PARTS: dict[str, Callable[[PartContext], dict[str, Any]]] = {
    "environment": part_environment,
    "gpu-tests": part_gpu_tests,
    "gpu-check": part_gpu_check,
    "kernel-shares": part_kernel_shares,
    "generate-demo": part_generate_demo,
    "generate-bundle": part_generate_bundle,
    "nvml-4hz": part_nvml_4hz,
    "maisi-v2": part_maisi_v2,
    "probe-tune": part_probe_tune,
}


def run_part_here(name: str, result_path: Path, work: Path, smoke: bool, budget_s: float) -> int:
    """The child side of ``--part``: run one part function and write its result, whatever happens."""
    ctx = PartContext(smoke=smoke, work=work, budget_s=budget_s, result_path=result_path)
    try:
        result = PARTS[name](ctx)
    except Exception as exc:  # noqa: BLE001 - recorded as this part's crash; the suite goes on
        previous = _read_result(result_path) or {}
        previous.update(
            status="crashed",
            error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}",
            traceback=traceback.format_exc()[-TAIL_CHARS:],
        )
        write_json(result_path, previous)
        return 1
    write_json(result_path, result)
    return 0


def suite_parts(
    smoke: bool, work: Path, only: list[str] | None = None, skip: list[str] | None = None
) -> list[Part]:
    """The suite's parts as commands of this interpreter (``python -m benchmarks.gpu_suite --part ...``)."""
    budgets = SMOKE_BUDGETS_S if smoke else GPU_BUDGETS_S
    parts = []
    for name in PARTS:
        if (only and name not in only) or (skip and name in skip):
            continue
        argv = [sys.executable, "-m", "benchmarks.gpu_suite", "--part", name, "--result", "{result}"]
        argv += ["--work", str(work), "--part-budget-s", str(budgets[name])] + (
            ["--cpu-smoke"] if smoke else []
        )
        parts.append(Part(name, float(budgets[name]), tuple(argv), optional=name in OPTIONAL_PARTS))
    return parts


# -- the table ---------------------------------------------------------------------------------------------


def _headline(name: str, outcome: dict[str, Any]) -> str:
    result = outcome.get("result") or {}
    if outcome["status"] in ("timed out", "crashed") or outcome.get("result") is None or "error" in result:
        return str(outcome.get("error") or result.get("error") or "")[:100]
    if name == "environment":
        bits = [
            str(result.get("device")),
            f"CC {result.get('compute_capability')}" if "compute_capability" in result else "",
        ]
        bits += [
            f"torch {result.get('torch')}",
            f"CUDA {result.get('torch_cuda')}",
            f"cuDNN {result.get('cudnn')}",
        ]
        return ", ".join(b for b in bits if b)
    if name == "gpu-tests" and "counts" in result:
        c = result["counts"]
        return f"{c['passed']} passed, {c['failed']} failed, {c['error']} errors, {c['skipped']} skipped"
    if name == "gpu-check" and "check" in result:
        rows = result["check"].get("rows", [])
        timed = sum(1 for r in rows if "ms_per_step" in r)
        return f"{timed} of {len(rows)} rows timed, {len(result.get('row_errors', []))} errors"
    if name == "kernel-shares":
        return f"{len(result.get('networks', {}))} networks x {len(KERNEL_SETTINGS)} settings profiled"
    if name.startswith("generate") or name == "maisi-v2":
        if "timings" in result and result["timings"]:
            t = result["timings"]
            return (
                f"{result.get('shape')} in {t.get('total_s', 0):.1f} s (denoise {t.get('denoise_s', 0):.1f}, "
                f"decode {t.get('decode_s', 0):.1f}) on {result.get('device_name')}"
            )
        return str(result.get("reason") or result.get("error") or "")[:100]
    if name == "nvml-4hz":
        gpu = "GPU on" if result.get("gpu_available") else f"GPU off ({result.get('gpu_reason')})"
        return f"{result.get('samples')} samples at {result.get('achieved_hz')} Hz over {result.get('span_s')} s, {gpu}"[
            :110
        ]
    if name == "probe-tune":
        probe = result.get("probe")
        tune = result.get("tune")
        return f"probe: {'recorded' if isinstance(probe, dict) else probe}; tune: " + (
            f"exit {tune.get('exit_code')}" if isinstance(tune, dict) else str(tune)
        )
    return ""


def must_show(results: dict[str, Any]) -> dict[str, Any]:
    """What issue 29 asks a GPU run to show, gathered from the parts in one place of the JSON."""

    def result(name: str) -> dict[str, Any]:
        return (results["parts"].get(name) or {}).get("result") or {}

    check = result("gpu-check").get("check") or {}
    rows = [
        {
            "network": r["network"],
            "row": r["row"],
            "ms_per_call": r.get("ms_per_step"),
            "tflops": r.get("tflops"),
            "fraction_of_peak": r.get("fraction_of_peak"),
            "x_fp32": r.get("speedup_vs_fp32", 1.0 if "ms_per_step" in r else None),
            "psnr_vs_fp32_db": r.get("psnr_vs_fp32_db"),
            "not_run": r.get("skipped") or r.get("error"),
        }
        for r in check.get("rows", [])
    ]
    shares = {
        network: entries.get("tf32+cl vs fp32")
        for network, entries in (result("kernel-shares").get("networks") or {}).items()
    }
    tests = result("gpu-tests").get("tests") or {}
    nvml = result("nvml-4hz")
    return {
        "device": check.get("device") or result("environment").get("device"),
        "rows": rows,
        "tf32_cl_vs_fp32": {
            network: entry
            for network, entry in (result("gpu-check").get("headline") or {}).items()
            if isinstance(entry, dict)
        },
        "kernel_shares_tf32_cl_vs_fp32": shares,
        "tensor_core_share_note": TENSOR_CORE_NOTE,
        "nvml": {k: nvml.get(k) for k in ("samples", "achieved_hz", "gpu_available", "gpu_reason", "gpus")},
        "gpu_tests": {k: [t["test"] for t in v] for k, v in tests.items()},
    }


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def format_table(results: dict[str, Any]) -> str:
    """The readable summary: one line per part, then the measurements of the parts that ran."""
    from benchmarks.gpu_check import format_table as gpu_check_table

    env = (results["parts"].get("environment") or {}).get("result") or {}
    install = results.get("install") or {}
    mode = (
        "CPU smoke run (tiny sizes: checks the script, measures nothing about GPUs)"
        if results["smoke"]
        else "GPU run"
    )
    lines = [
        f"VolSynth GPU check: {mode}",
        f"device {env.get('device', '?')}, torch {env.get('torch', '?')}; suite {results['total_s']:.0f} s of "
        f"{results['total_budget_s']:.0f} s budget"
        + (
            f"; set-up ({install.get('mode')}) {install.get('seconds', 0):.0f} s, apart from the budget"
            if install
            else ""
        ),
        "",
        f"{'part':16s} {'status':13s} {'s':>6s} {'budget':>6s}  result",
    ]
    for name, outcome in results["parts"].items():
        lines.append(
            f"{name:16s} {outcome['status']:13s} {outcome['seconds']:6.1f} {outcome['timeout_s']:6.0f}  "
            f"{_headline(name, outcome)}"
        )
    check = ((results["parts"].get("gpu-check") or {}).get("result") or {}).get("check")
    if check and check.get("rows"):
        lines += ["", gpu_check_table({"total_s": 0, **check}).replace(", 0 s", "")]
    shares = (results["parts"].get("kernel-shares") or {}).get("result") or {}
    if shares.get("networks"):
        lines += [
            "",
            f"Kernel-time shares ({shares.get('clock')}), % of profiled time; TC = Tensor-Core share, a "
            "stand-in for the paper's hardware counters",
            f"{'network':14s} {'setting':20s} {'ms/call':>8s} {'conv':>6s} {'gemm':>6s} {'attn':>6s} {'norm':>6s} "
            f"{'layout':>6s} {'copy':>6s} {'elem':>6s} {'other':>6s} {'TC':>6s}",
        ]
        for network, entries in shares["networks"].items():
            for label, _ in KERNEL_SETTINGS:
                s = entries.get(label)
                if not s:
                    continue
                sh = s["shares"]
                lines.append(
                    f"{network:14s} {label:20s} {s['ms_per_call']:8.2f} {_pct(sh['convolution']):>6s} "
                    f"{_pct(sh['gemm']):>6s} {_pct(sh['attention']):>6s} {_pct(sh['normalisation']):>6s} "
                    f"{_pct(sh['layout']):>6s} {_pct(sh['copy']):>6s} {_pct(sh['elementwise']):>6s} "
                    f"{_pct(sh['other']):>6s} {_pct(s['tensor_core_share']):>6s}"
                )
            ratio = entries.get("tf32+cl vs fp32")
            if ratio:
                lines.append(
                    f"{'':14s} kernel time fp32 / tf32+cl = {ratio['kernel_time_ratio']:.2f}; TC share "
                    f"{_pct(ratio['tensor_core_share'][0])} % -> {_pct(ratio['tensor_core_share'][1])} %"
                )
                for warning in ratio.get("warnings", []):
                    lines.append(f"{'':14s} WARNING: {warning}")
    nvml = (results["parts"].get("nvml-4hz") or {}).get("result") or {}
    for gpu in nvml.get("gpus", []):
        r = gpu.get("ranges", {})

        def span(key: str, scale: float = 1.0, unit: str = "", r=r) -> str:
            return f"{r[key]['min'] / scale:.0f}-{r[key]['max'] / scale:.0f}{unit}" if key in r else "n/a"

        lines.append(
            f"NVML GPU {gpu['index']} {gpu.get('name')}: SM util {span('sm_util_pct', unit=' %')}, memory "
            f"{span('memory_used_bytes', 2**30, ' GiB')}, power {span('power_w', unit=' W')}, "
            f"{span('temperature_c', unit=' C')}, SM clock {span('sm_clock_mhz', unit=' MHz')}"
        )
    return "\n".join(lines)


def archive_logs(work: Path, archive: Path) -> Path:
    """The parts' logs, results and small reports in one file (a GPU host may send back only a few files)."""
    import tarfile

    patterns = ("*.log", "*.result.json", "gpu_check.json", "*.junit.xml", "*.json")
    with tarfile.open(archive, "w:gz") as tar:
        seen = set()
        for pattern in patterns:
            for path in sorted(work.glob(pattern)):
                if path not in seen and path.stat().st_size < 8 * 2**20:
                    seen.add(path)
                    tar.add(path, arcname=path.name)
    return archive


# -- command line ------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out",
        default="build/gpu-check",
        help="folder for gpu_suite.json, gpu_suite.txt and the logs' archive",
    )
    parser.add_argument(
        "--work", default="", help="folder for the parts' bulky files (models, volumes); default OUT/work"
    )
    parser.add_argument("--cpu-smoke", action="store_true", help="the same parts at tiny sizes on the CPU")
    parser.add_argument("--budget-s", type=float, default=TOTAL_BUDGET_S, help="whole run (default 600)")
    parser.add_argument("--parts", default="", help="comma-separated parts to run (default all)")
    parser.add_argument("--skip-parts", default="", help="comma-separated parts to leave out")
    parser.add_argument("--install-record", default="", help="install.json of packaging/gpu_check.sh")
    parser.add_argument("--part", default="", help=argparse.SUPPRESS)  # the child side: one part
    parser.add_argument("--result", default="", help=argparse.SUPPRESS)
    parser.add_argument("--part-budget-s", type=float, default=60.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    out = Path(args.out).resolve()
    work = Path(args.work).resolve() if args.work else out / "work"
    work.mkdir(parents=True, exist_ok=True)
    if args.part:
        from engine.telemetry.kernel_profile import quiet_kineto

        quiet_kineto()
        return run_part_here(args.part, Path(args.result), work, args.cpu_smoke, args.part_budget_s)

    names = [n.strip() for n in args.parts.split(",") if n.strip()]
    skip = [n.strip() for n in args.skip_parts.split(",") if n.strip()]
    unknown = [n for n in names + skip if n not in PARTS]
    if unknown:
        print(f"gpu_suite: unknown part {', '.join(unknown)}; parts are {', '.join(PARTS)}", file=sys.stderr)
        return 2
    install = _read_result(Path(args.install_record)) if args.install_record else None
    started_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    out.mkdir(parents=True, exist_ok=True)
    json_path, table_path = out / "gpu_suite.json", out / "gpu_suite.txt"

    def record(results: dict[str, Any]) -> dict[str, Any]:
        return {
            "suite": "volsynth gpu_suite 1",
            "started_at": started_at,
            "smoke": args.cpu_smoke,
            "install": install,
            **results,
        }

    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    results = run_suite(
        suite_parts(args.cpu_smoke, work, names or None, skip or None),
        work,
        args.budget_s,
        on_update=lambda partial: write_json(json_path, record(partial)),
        log=lambda m: print(m, flush=True),
        env=env,
    )
    full = record(results)
    full["must_show"] = must_show(full)
    write_json(json_path, full)
    table = format_table(full)
    table_path.write_text(table + "\n")
    archive = archive_logs(work, out / "gpu_suite_logs.tar.gz")
    print(f"\nfull numbers: {json_path}; logs: {archive}\n")
    print(table)
    failed = [n for n, o in results["parts"].items() if o["status"] not in ("ok", "not available", "skipped")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
