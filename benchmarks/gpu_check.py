"""GPU check: two real-sized 3D diffusion U-Nets under fp32, TF32, channels-last, bf16 and compile.

    python -m benchmarks.gpu_check --out results.json        # on an NVIDIA GPU, ~3-6 minutes
    python -m benchmarks.gpu_check --cpu-smoke --out x.json   # tiny sizes on the CPU: tests the script

Builds nothing and needs no network: the networks are MONAI's, with seeded random weights (speed depends on
shape only; PSNR on random weights is indicative, see below). Every row goes through
``engine.optimization.apply.prepare``, the same code path ``volsynth generate`` uses.

Networks:

* ``med-ddpm-128``: a Med-DDPM-like pixel-space 3D U-Net on 1x2x128^3 (image + one conditioning mask
  channel, as Med-DDPM concatenates the segmentation mask): channels (64, 128, 256, 512), one res block per
  level, self-attention only at the 16^3 level (Med-DDPM's attention resolution), 64-channel heads.
* ``bundle-latent``: MONAI's brain latent-diffusion bundle U-Net: channels (256, 512, 768), attention on the
  last two levels with head channels 0/512/768, cross-attention dim 4, 7 input channels, latent 3x20x28x20.

Per row: ms per U-Net call (CUDA events, median over timed calls after warm-up), achieved TFLOP/s (FLOPs
counted once with ``torch.utils.flop_counter.FlopCounterMode``) and the fraction of the card's dense peak
for the precision that really applied (``benchmarks.gpu_peaks``, a cited datasheet table; None for cards
not in it), PSNR of the U-Net output against the fp32 row on the same input. The JSON is rewritten after
every row, so a run killed in a compile row keeps the rows before it. Rows run eager first for both networks, compile rows last, each only while the time
budget (--budget-s) lasts; skipped rows say so. The table is printed last; everything goes to --out.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from types import SimpleNamespace
from typing import Any

from benchmarks.gpu_peaks import achieved_tflops, effective_precision, peak_tflops
from engine.measure.harness import iqr
from engine.metrics.image import psnr

ROWS = [  # name, OptimizationConfig fields, precision class for the peak table, compile row?
    ("fp32", {}, "fp32", False),
    ("tf32", {"tf32": True}, "tf32", False),
    ("tf32+cl", {"tf32": True, "channels_last_3d": True}, "tf32", False),
    ("bf16+cl", {"autocast": "bf16", "channels_last_3d": True}, "bf16", False),
    ("bf16+cl+sdpa", {"autocast": "bf16", "channels_last_3d": True, "attention": "sdpa"}, "bf16", False),
    (
        "bf16+cl+sdpa+compile",
        {"autocast": "bf16", "channels_last_3d": True, "attention": "sdpa", "compile_mode": "default"},
        "bf16",
        True,
    ),
]


def network_defs(smoke: bool) -> dict[str, dict[str, Any]]:
    """Network definitions and input shapes; tiny versions for --cpu-smoke."""
    from engine.models.reference import (
        BUNDLE_UNET,
        MED_DDPM_INPUT,
        MED_DDPM_SMOKE_INPUT,
        MED_DDPM_SMOKE_UNET,
        MED_DDPM_UNET,
    )

    if smoke:
        return {
            "med-ddpm-128": {
                "unet": dict(MED_DDPM_SMOKE_UNET),
                "input": list(MED_DDPM_SMOKE_INPUT),
                "context": None,
            },
            "bundle-latent": {
                "unet": {
                    **BUNDLE_UNET,
                    "channels": [16, 32, 48],
                    "num_head_channels": [0, 32, 48],
                    "norm_num_groups": 8,
                },
                "input": [1, 7, 8, 12, 8],
                "context": [1, 1, 4],
            },
        }
    return {
        "med-ddpm-128": {"unet": dict(MED_DDPM_UNET), "input": list(MED_DDPM_INPUT), "context": None},
        "bundle-latent": {"unet": dict(BUNDLE_UNET), "input": [1, 7, 20, 28, 20], "context": [1, 1, 4]},
    }


def count_flops(unet, x, t, context) -> int:
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with torch.inference_mode(), counter:
        unet(x, timesteps=t, context=context)
    return int(counter.get_total_flops())


def time_calls(prepared, x, t, context, device, warmup: int, iters: int) -> tuple[list[float], Any]:
    """Milliseconds per ``prepared.denoiser`` call (CUDA events on GPU) and the last output."""
    import torch

    with torch.inference_mode():
        for _ in range(warmup):
            out = prepared.denoiser(x, t, context)
        times = []
        for _ in range(iters):
            if device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                out = prepared.denoiser(x, t, context)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            else:
                started = time.perf_counter()
                out = prepared.denoiser(x, t, context)
                times.append(1e3 * (time.perf_counter() - started))
    return times, out


def build_bench_network(name: str, spec: dict[str, Any], device) -> tuple[Any, Any, Any, Any, int]:
    """One of ``network_defs``' U-Nets with seeded perturbed weights on ``device``, its seeded input, timestep
    and context, and its FLOPs per call: ``(model, x, t, context, flops)``, ``model`` shaped as ``prepare``
    takes it."""
    import torch

    from engine.models.networks import build_network
    from engine.models.reference import perturb_

    torch.manual_seed(0)
    # MONAI zero-initialises the output conv; perturb so outputs are not all zero
    unet = perturb_(build_network(spec["unet"], where=name), 0.02)
    unet = unet.eval().requires_grad_(False).to(device)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(spec["input"], generator=gen).to(device)
    t = torch.full((spec["input"][0],), 500.0, device=device)
    ctx = None if spec["context"] is None else torch.rand(spec["context"], generator=gen).to(device)
    flops = count_flops(unet, x, t, ctx)
    return SimpleNamespace(unet=unet, autoencoder=None, spec=None), x, t, ctx, flops


def run_check(
    smoke: bool,
    budget_s: float,
    iters: int,
    warmup: int,
    include_compile: bool,
    log=print,
    on_update=lambda results: None,
) -> dict[str, Any]:
    """Every row of ``ROWS`` for both networks; ``on_update(results)`` after each network and row, so a
    caller can keep what was measured when a later row hangs or the process is killed."""
    import torch

    started = time.perf_counter()
    device = torch.device("cuda" if not smoke else "cpu")
    device_name = (
        torch.cuda.get_device_name(device) if device.type == "cuda" else (platform.processor() or "CPU")
    )
    results: dict[str, Any] = {
        "device": device_name,
        "torch": torch.__version__,
        "smoke": smoke,
        "budget_s": budget_s,
        "networks": {},
        "rows": [],
    }
    if device.type == "cuda":
        cap = torch.cuda.get_device_capability(device)
        results["compute_capability"] = f"{cap[0]}.{cap[1]}"
    nets = _build_networks(smoke, device, results, log, on_update)
    order = [(n, r) for r in ROWS if not r[3] for n in nets] + [(n, r) for r in ROWS if r[3] for n in nets]
    references: dict[str, Any] = {}
    for net_name, (row, fields, precision, is_compile) in order:
        record: dict[str, Any] = {"network": net_name, "row": row, "config": fields}
        results["rows"].append(record)
        elapsed = time.perf_counter() - started
        if is_compile and not include_compile:
            record["skipped"] = "compile rows off (--no-compile, or --cpu-smoke without --with-compile)"
            continue
        if elapsed > budget_s * (0.6 if is_compile else 0.9):  # compile rows need room for compilation
            record["skipped"] = f"time budget: {elapsed:.0f} s of {budget_s:.0f} s used"
            continue
        _measure_row(
            record,
            nets[net_name],
            precision,
            is_compile,
            device,
            device_name,
            warmup,
            iters,
            references,
            results,
        )
        if "error" in record:
            on_update(results)
            continue
        log(f"{net_name:14s} {row:22s} {record['ms_per_step']:9.2f} ms  {record['tflops']:7.1f} TFLOP/s")
        on_update(results)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    results["total_s"] = time.perf_counter() - started
    return results


def _build_networks(smoke: bool, device, results: dict[str, Any], log, on_update) -> dict[str, tuple]:
    """Both benchmark networks on ``device`` with their inputs, each described in ``results["networks"]``."""
    nets = {}
    for name, spec in network_defs(smoke).items():
        model, x, t, ctx, flops = build_bench_network(name, spec, device)
        params = sum(p.numel() for p in model.unet.parameters())
        results["networks"][name] = {
            "definition": spec["unet"],
            "input": spec["input"],
            "context": spec["context"],
            "gflop_per_call": flops / 1e9,
            "parameters": params,
        }
        nets[name] = (model, x, t, ctx, flops)
        log(f"{name}: {params / 1e6:.1f} M parameters, {flops / 1e9:.1f} GFLOP per call")
        on_update(results)
    return nets


def _measure_row(
    record: dict[str, Any],
    net: tuple,
    precision: str,
    is_compile: bool,
    device,
    device_name: str,
    warmup: int,
    iters: int,
    references: dict[str, Any],
    results: dict[str, Any],
) -> None:
    """Prepare one row's settings on one network and time its calls into ``record`` (or its error); fp32's
    output becomes that network's reference for the others' PSNR."""
    import statistics

    from engine.optimization.apply import OptimizationConfig, prepare

    net_name, row, fields = record["network"], record["row"], record["config"]
    model, x, t, ctx, flops = net
    try:
        prepared = prepare(model, OptimizationConfig(**fields), device, use_cache=False)
        row_started = time.perf_counter()
        times, out = time_calls(prepared, x, t, ctx, device, warmup + (2 if is_compile else 0), iters)
        record["wall_s"] = time.perf_counter() - row_started
    except Exception as exc:  # noqa: BLE001 - one failing row must not lose the others' numbers
        record["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
        return
    ms = statistics.median(times)
    tflops = achieved_tflops(flops, ms)
    applied = {
        k: v["applied"] for k, v in prepared.report.items() if v["requested"] not in (False, None, "default")
    }
    effective = effective_precision(precision, applied)
    peak = peak_tflops(device_name, effective) if device.type == "cuda" else None
    out = out.float().cpu()
    if row == "fp32":
        references[net_name] = out
    record.update(
        ms_per_step=ms,
        ms_min=min(times),
        ms_iqr=iqr(times),
        calls=len(times),
        tflops=tflops,
        precision=effective,
        peak_tflops=peak,
        fraction_of_peak=None if peak is None else tflops / peak,
        psnr_vs_fp32_db=psnr(references[net_name], out) if net_name in references else None,
        applied=applied,
        report=prepared.report,
    )
    if row != "fp32" and net_name in references:
        record["speedup_vs_fp32"] = _row(results, net_name, "fp32")["ms_per_step"] / ms


def _write_json(path: str, data: dict[str, Any]) -> None:
    """Replace ``path`` in one step, so a reader (or a kill) never sees half a file."""
    import os

    temporary = f"{path}.tmp"
    with open(temporary, "w") as handle:
        json.dump(data, handle, indent=2, default=str)
    os.replace(temporary, path)


def _row(results, network: str, row: str) -> dict[str, Any]:
    return next(r for r in results["rows"] if r["network"] == network and r["row"] == row)


def format_table(results: dict[str, Any]) -> str:
    lines = [
        f"GPU check on {results['device']} (torch {results['torch']}), {results.get('total_s', 0):.0f} s"
        + ("" if results.get("complete", True) else " (incomplete: stopped before its last row)"),
        f"{'network':14s} {'row':22s} {'ms/step':>9s} {'x fp32':>7s} {'TFLOP/s':>8s} {'% peak':>7s} {'PSNR dB':>8s}",
    ]
    for r in results["rows"]:
        if "ms_per_step" not in r:
            lines.append(f"{r['network']:14s} {r['row']:22s} {r.get('skipped') or r.get('error')}")
            continue
        frac = "-" if r["fraction_of_peak"] is None else f"{100 * r['fraction_of_peak']:.1f}"
        psnr = (
            "-"
            if r["psnr_vs_fp32_db"] is None
            else ("exact" if math.isinf(r["psnr_vs_fp32_db"]) else f"{r['psnr_vs_fp32_db']:.1f}")
        )
        speed = f"{r.get('speedup_vs_fp32', 1.0):.2f}"
        lines.append(
            f"{r['network']:14s} {r['row']:22s} {r['ms_per_step']:9.2f} {speed:>7s} {r['tflops']:8.1f} "
            f"{frac:>7s} {psnr:>8s}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Time two real-sized 3D diffusion U-Nets under fp32/TF32/bf16/"
        "channels-last/compile on an NVIDIA GPU."
    )
    parser.add_argument("--out", default="gpu_check.json", help="JSON file for the full numbers")
    parser.add_argument(
        "--cpu-smoke", action="store_true", help="tiny networks on the CPU: checks the script only"
    )
    parser.add_argument(
        "--with-compile", action="store_true", help="with --cpu-smoke: also run the compile row"
    )
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile rows")
    parser.add_argument(
        "--budget-s", type=float, default=420.0, help="stop starting rows after this (default 420)"
    )
    parser.add_argument(
        "--iters", type=int, default=None, help="timed calls per row (default 20 GPU, 3 smoke)"
    )
    parser.add_argument(
        "--warmup", type=int, default=None, help="untimed calls first (default 3 GPU, 1 smoke)"
    )
    args = parser.parse_args(argv)

    import torch

    if not args.cpu_smoke and not torch.cuda.is_available():
        message = "no CUDA GPU here: nothing to check (use --cpu-smoke to test the script on tiny networks)"
        print(f"gpu_check: {message}")
        with open(args.out, "w") as handle:
            json.dump({"skipped": message, "torch": torch.__version__}, handle, indent=2)
        return 0
    iters = args.iters or (3 if args.cpu_smoke else 20)
    warmup = args.warmup if args.warmup is not None else (1 if args.cpu_smoke else 3)
    include_compile = not args.no_compile and (not args.cpu_smoke or args.with_compile)
    results = run_check(
        args.cpu_smoke,
        args.budget_s,
        iters,
        warmup,
        include_compile,
        log=lambda m: print(m, flush=True),
        on_update=lambda partial: _write_json(args.out, {**partial, "complete": False}),
    )
    _write_json(args.out, {**results, "complete": True})
    print(format_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
