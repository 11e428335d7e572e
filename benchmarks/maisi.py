"""Benchmark of NV-Generate-MR-Brain (MAISI v2) at its real architecture with random weights, on this machine.

``python -m benchmarks.maisi [--out build/benchmarks/maisi.json] [--unet-repeats 2] [--skip-preview]``

Each phase runs in its own process so that its peak RSS is its own:

* ``preview``: the preview size (128x128x64 at 1.88x1.88x2.72 mm), 30 steps, guidance 2, through the engine
  (LocalBackend, the one sampling loop, streamed decode on a CPU): wall time, peak RSS, seconds per step;
* ``full``: the same at 256x256x128 (not in the default phases on a CPU: about half an hour there; on an
  NVIDIA GPU ``--phases full --device cuda --runs 3`` is the GPU check's MAISI row: load and the first
  run apart from the later runs);
* ``unet``: full-size guided U-Net steps (latent 2x4x64x64x32): the loop's denoiser against MONAI's own call
  of DiffusionModelUNetMaisi, alternated, as a ratio;
* ``decode``: the full decode (4x64x64x32 -> 256x256x128) streamed, wall time and peak RSS; against
  MONAI's own ``decode_stage_2_outputs`` at the preview size, as a ratio, and the largest difference;
* ``decode_full_monai`` (after ``decode``, not in the default phases): MONAI's own decode at full size, in a
  process of its own because it peaks near 15.5 GB; the full-size ratio and difference against ``decode``.

The full-size estimate is 30 x the guided step + the streamed decode. Random weights: the volumes are noise;
the numbers are about cost, not quality.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from engine.machine.peak_memory import peak_rss_bytes
from engine.measure.harness import iqr

FULL = (256, 256, 128)
FULL_SPACING = (0.94, 0.94, 1.36)
PREVIEW = (128, 128, 64)
PREVIEW_SPACING = (1.88, 1.88, 2.72)


def _folder(root: Path) -> Path:
    from engine.testing import write_maisi_folder

    folder = root / "NV-Generate-CTMR"
    if not (folder / "models" / "diff_unet_3d_rflow-mr-brain_v1.pt").is_file():
        write_maisi_folder(folder, tiny=False, seed=0)
    return folder


def _context(batch_guided: int, label: int, spacing):
    import torch

    row = [float(label), *(100.0 * v for v in spacing)]
    context = torch.tensor([row] * batch_guided, dtype=torch.float32).view(batch_guided, 1, 4)
    context[: batch_guided // 2, 0, 0] = 0.0  # the unconditioned half
    return context


def phase_generate(
    folder: Path,
    size,
    spacing,
    device: str = "cpu",
    runs: int = 1,
    autocast: str | None = None,
    decoder_autocast: str | None = "fp32",
) -> dict:
    """A whole generation through the engine (load, 30 guided steps, streamed decode). With ``runs`` > 1
    (a GPU check) the first run's load and first-call costs are reported apart from the later runs'."""
    from engine.api import SamplingRequest, run
    from engine.api.optimization_config import OptimizationConfig
    from engine.backends.factory import make_backend
    from engine.models.registry import ModelRegistry

    backend = make_backend(device, registry=ModelRegistry([folder.parent]))
    request = SamplingRequest(
        model=str(folder),
        steps=30,
        seed=0,
        modality="t2w",
        output_size=tuple(size),
        voxel_spacing_mm=tuple(spacing),
        # bf16 for the U-Net only: the decode stays exact fp32 (decoder_autocast), so the PSNR measures the
        # U-Net's precision.
        optimization=OptimizationConfig(
            streamed_decode=device == "cpu",
            autocast=autocast,
            decoder_autocast=decoder_autocast if autocast else None,
        ),
    )
    walls, timings = [], []
    for _ in range(max(1, runs)):
        started = time.perf_counter()
        result = run(backend.sample(request))
        walls.append(time.perf_counter() - started)
        timings.append(result.provenance["timings"])
    wall = walls[0]
    steps = result.provenance["step_times_s"]
    import numpy as np

    reference = folder.parent / f"volume-{'x'.join(map(str, size))}-fp32.npy"
    psnr = None
    if autocast is None:
        np.save(reference, result.volumes)
    elif reference.is_file():
        exact = np.load(reference).astype(np.float64)
        mse = float(((result.volumes.astype(np.float64) - exact) ** 2).mean())
        peak = float(np.abs(exact).max()) or 1.0
        psnr = float("inf") if mse == 0 else 10 * np.log10(peak * peak / mse)
    return {
        "device": result.provenance["device_name"],
        "walls_s": walls,
        "runs_timings": timings,
        "size": list(size),
        "steps": 30,
        "guidance": result.request.guidance_scale,
        "wall_s": wall,
        "timings": result.provenance["timings"],
        "step_s_median": statistics.median(steps),
        "step_s_iqr": iqr(steps),
        "peak_rss_bytes": peak_rss_bytes(),
        "attention": result.provenance["model_build"]["attention"]["kernel"],
        "autocast": autocast,
        "decoder_autocast": decoder_autocast if autocast else None,
        "autocast_applied": result.provenance["optimization"]["report"]["autocast"],
        "psnr_db_vs_fp32": psnr,
    }


def phase_unet(folder: Path, repeats: int) -> dict:
    import torch

    from engine.api.optimization_config import OptimizationConfig
    from engine.models.registry import open_model_folder
    from engine.optimization.apply import prepare

    model = open_model_folder(folder).load()
    prepared = prepare(model, OptimizationConfig(), torch.device("cpu"))
    bf16 = prepare(model, OptimizationConfig(autocast="bf16"), torch.device("cpu"))
    inner = model.unet.unet  # DiffusionModelUNetMaisi itself
    x = torch.randn(2, 4, *(n // 4 for n in FULL), generator=torch.Generator().manual_seed(0))
    t = torch.full((2,), 500.0)
    context = _context(2, 10, FULL_SPACING)

    def loop_call():
        return prepared.denoiser(x, t, context)

    def monai_call():
        return inner(x, timesteps=t, class_labels=context[:, 0, 0].long(), spacing_tensor=context[:, 0, 1:4])

    def bf16_call():
        return bf16.denoiser(x, t, context)

    ours, monai, halves, outputs = [], [], [], {}
    with torch.inference_mode():
        monai_call()  # warm-up (first-call allocations and kernel choices), not counted
        bf16_call()
        for index in range(repeats):
            # Order reversed every other repeat: whichever runs after another finds the allocator warm.
            calls = [("loop", loop_call, ours), ("monai", monai_call, monai), ("bf16", bf16_call, halves)]
            for name, call, times in calls if index % 2 == 0 else calls[::-1]:
                started = time.perf_counter()
                outputs[name] = call()
                times.append(time.perf_counter() - started)
    a, b = outputs["loop"], outputs["monai"]
    return {
        "latent": list(x.shape),
        "loop_denoiser_s": ours,
        "monai_unet_s": monai,
        "ratio_loop_over_monai": statistics.median(ours) / statistics.median(monai),
        "max_abs_difference": float((a - b).abs().max()),
        "bf16_loop_denoiser_s": halves,
        "ratio_bf16_over_fp32": statistics.median(halves) / statistics.median(ours),
        "bf16_step_output_psnr_db": _psnr(outputs["bf16"], a),
        "bf16_report": bf16.report["autocast"],
        "parameters": sum(p.numel() for p in inner.parameters()),
        "peak_rss_bytes": peak_rss_bytes(),
    }


def phase_decode(folder: Path, repeats: int, bf16: bool = False) -> dict:
    import torch

    from engine.models.registry import open_model_folder
    from engine.optimization.streamed_decode import streamed_decode

    source = open_model_folder(folder)
    autoencoder = source.load().autoencoder
    out: dict = {}
    small = torch.randn(1, 4, *(n // 4 for n in PREVIEW), generator=torch.Generator().manual_seed(1))
    ours, monai = [], []
    with torch.inference_mode():
        for _ in range(repeats):
            started = time.perf_counter()
            a = streamed_decode(autoencoder, small)
            ours.append(time.perf_counter() - started)
            started = time.perf_counter()
            b = autoencoder.decode_stage_2_outputs(small)
            monai.append(time.perf_counter() - started)
    out["preview_size"] = {
        "streamed_s": ours,
        "monai_s": monai,
        "ratio_streamed_over_monai": statistics.median(ours) / statistics.median(monai),
        "max_abs_difference": float((a - b).abs().max()),
        "psnr_db_vs_monai": _psnr(a, b),
    }
    del a, b
    full = torch.randn(1, 4, *(n // 4 for n in FULL), generator=torch.Generator().manual_seed(2))
    stats: dict = {}
    started = time.perf_counter()
    image = streamed_decode(autoencoder, full, stats=stats)
    out["full_size"] = {
        "streamed_s": time.perf_counter() - started,
        "shape": list(image.shape),
        "budget_bytes": stats.get("budget_bytes"),
    }
    # Kept for the decode_full_monai phase, which runs MONAI's own full decode in a process of its own so
    # that each peak RSS is its own.
    torch.save(image, folder.parent / "decode-full-streamed.pt")
    if bf16:
        # The same decode with activations in bf16 (autocast, as the decoder_autocast setting runs it).
        started = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            half = streamed_decode(autoencoder, full)
        out["full_size"]["bf16_streamed_s"] = time.perf_counter() - started
        out["full_size"]["bf16_psnr_db_vs_fp32"] = _psnr(half, image)
    out["peak_rss_bytes"] = peak_rss_bytes()
    return out


def phase_decode_full_monai(folder: Path) -> dict:
    """MONAI's own ``decode_stage_2_outputs`` at full size (near 15.5 GB peak): its time and peak RSS, and
    how far the streamed decode of the ``decode`` phase (same latent) is from it."""
    import torch

    from engine.models.registry import open_model_folder

    autoencoder = open_model_folder(folder).load().autoencoder
    full = torch.randn(1, 4, *(n // 4 for n in FULL), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        started = time.perf_counter()
        image = autoencoder.decode_stage_2_outputs(full)
        monai_s = time.perf_counter() - started
    out = {"monai_s": monai_s, "shape": list(image.shape), "peak_rss_bytes": peak_rss_bytes()}
    streamed = folder.parent / "decode-full-streamed.pt"
    if streamed.is_file():
        ours = torch.load(streamed, weights_only=True)
        out["max_abs_difference"] = float((ours - image).abs().max())
        out["psnr_db_streamed_vs_monai"] = _psnr(ours, image)
    return out


def _psnr(a, b) -> float:
    import math

    peak = float(b.abs().max()) or 1.0
    mse = float(((a.double() - b.double()) ** 2).mean())
    return math.inf if mse == 0 else 10 * math.log10(peak * peak / mse)


def _machine() -> dict:
    load = os.getloadavg()
    cpu = ""
    with contextlib.suppress(OSError, StopIteration):
        cpu = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    import torch

    return {
        "cpu": cpu or platform.processor(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average": list(load),
        "torch": torch.__version__,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--root", default="build/benchmarks/maisi-model", help="where the random-weight folder is"
    )
    parser.add_argument("--out", default="build/benchmarks/maisi.json")
    parser.add_argument("--unet-repeats", type=int, default=2)
    parser.add_argument("--decode-repeats", type=int, default=2)
    parser.add_argument("--phases", default="preview,unet,decode")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (the preview and full phases)")
    parser.add_argument("--runs", type=int, default=1, help="generations per preview/full phase (GPU: 3)")
    parser.add_argument("--decode-bf16", action="store_true", help="also the full decode under bf16 autocast")
    parser.add_argument("--phase", default="", help=argparse.SUPPRESS)  # one phase, in a child process
    args = parser.parse_args(argv)
    root = Path(args.root)
    root.mkdir(parents=True, exist_ok=True)
    if args.phase:
        folder = _folder(root)
        result = {
            "preview": lambda: phase_generate(folder, PREVIEW, PREVIEW_SPACING, args.device, args.runs),
            "full": lambda: phase_generate(folder, FULL, FULL_SPACING, args.device, args.runs),
            "preview_bf16": lambda: phase_generate(
                folder, PREVIEW, PREVIEW_SPACING, args.device, args.runs, "bf16"
            ),
            # bf16 U-Net and bf16 decoder at full size: the fastest combination measured here.
            "full_bf16": lambda: phase_generate(
                folder, FULL, FULL_SPACING, args.device, args.runs, "bf16", "bf16"
            ),
            "unet": lambda: phase_unet(folder, args.unet_repeats),
            "decode": lambda: phase_decode(folder, args.decode_repeats, args.decode_bf16),
            "decode_full_monai": lambda: phase_decode_full_monai(folder),
        }[args.phase]()
        print("RESULT " + json.dumps(result))
        return 0

    _folder(root)
    record = {"machine_before": _machine(), "phases": {}}
    for phase in [p for p in args.phases.split(",") if p]:
        started = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "benchmarks.maisi", "--phase", phase, "--root", str(root),
             "--unet-repeats", str(args.unet_repeats), "--decode-repeats", str(args.decode_repeats),
             "--device", args.device, "--runs", str(args.runs)] + (["--decode-bf16"] if args.decode_bf16 else []),
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if line is None:
            print(proc.stdout[-2000:], proc.stderr[-4000:], file=sys.stderr)
            record["phases"][phase] = {"error": proc.stderr[-500:]}
            continue
        record["phases"][phase] = {**json.loads(line[7:]), "phase_wall_s": time.perf_counter() - started}
        print(phase, json.dumps(record["phases"][phase]), flush=True)
    record["machine_after"] = _machine()
    phases = record["phases"]
    if (
        "unet" in phases
        and "decode" in phases
        and "error" not in phases["unet"]
        and "error" not in phases["decode"]
    ):
        step = statistics.median(phases["unet"]["loop_denoiser_s"])
        record["full_size_estimate_s"] = 30 * step + phases["decode"]["full_size"]["streamed_s"]
    if "monai_s" in phases.get("decode_full_monai", {}) and "full_size" in phases.get("decode", {}):
        record["full_decode_ratio_streamed_over_monai"] = (
            phases["decode"]["full_size"]["streamed_s"] / phases["decode_full_monai"]["monai_s"]
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2))
    print(json.dumps({k: v for k, v in record.items() if k != "phases"}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
