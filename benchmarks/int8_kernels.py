"""Which int8 Conv3d kernel pays on this CPU: one layer, every path that can run, side by side.

``python -m benchmarks.int8_kernels`` times one 3x3x3 ``Conv3d`` (and one ``Linear``) at the shapes the
networks use, or with ``--unet`` a model's whole U-Net step, for:

* ``fp32``: ``F.conv3d`` (oneDNN), the reference of every ratio;
* ``legacy``: ``torch.ao.nn.quantized.Conv3d`` on quantized tensors (x86 engine), deprecated in torch 2.13;
* ``onednn``: ``torch.ops.onednn.qconv_pointwise`` on plain uint8/int8 tensors (the kernel torchao's x86
  Inductor lowering emits), called eagerly: :class:`engine.quantization.Int8Conv3d` (for Linear shapes:
  ``qlinear_pointwise``, :class:`engine.quantization.DynamicInt8Linear`);
* ``onednn-7bit``: the same with 7-bit activations (what CPUs without VNNI need, see the module's notes);
* ``torchao-quantize_``: torchao's eager ``Int8DynamicActivationInt8WeightConfig`` applied to the Conv3d
  (or the Linear);
* ``pt2e-eager``: torchao's PT2E flow (``X86InductorQuantizer``; Conv3d annotated by hand because the
  quantizer annotates only conv1d/conv2d/linear) run eagerly: reference quantize/dequantize ops;
* ``pt2e-inductor``: the same through ``torch.compile`` (freezing on), only where a C++ compiler exists.

Rows are interleaved (each repeat runs every row once, in an order that rotates: ``engine.measure.harness``),
warm-up excluded; each row reports the median, IQR and minimum of its wall times (on a shared machine the minimum is the least disturbed), its median ratio to
fp32, the median CPU time of the process per call and its ratio (with ``--threads 1`` the CPU time is the
least load-sensitive figure: time this process computed, not time it waited for a core), and its PSNR against fp32 on the same input. Run it under the AVX2
stand-in (``ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2``) to see an AVX2-only CPU.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time

from engine.measure.harness import interleaved, median_iqr

SHAPES = {
    "64ch@40^3": (64, 40),
    "256ch@20^3": (256, 20),
    "512ch@10^3": (512, 10),
    # The bundle-sized U-Net's levels (latent 20x28x20; channels 256, 512, 768).
    "bundle 256ch@20x28x20": (256, (20, 28, 20)),
    "bundle 512ch@10x14x10": (512, (10, 14, 10)),
    "bundle 768ch@5x7x5": (768, (5, 7, 5)),
}
# Linear layers of the U-Net's attention blocks: (tokens, in, out), e.g. 10x12x10 latent tokens, GEGLU 4x.
LINEAR_SHAPES = {
    "linear 150x128->128": (150, 128, 128),
    "linear 1200x128->128": (1200, 128, 128),
    "linear 1200x128->1024": (1200, 128, 1024),
    "linear 9600x256->2048": (9600, 256, 2048),
}


def _rows(channels: int, size, with_inductor: bool):
    import torch
    from torch import nn

    from engine.quantization import Calibration, candidate_layers, quantize_int8

    torch.manual_seed(0)
    conv = nn.Conv3d(channels, channels, 3, padding=1).eval()
    # A post-SiLU-like input: mostly small, some large values, as inside the U-Net.
    spatial = tuple(size) if isinstance(size, tuple) else (size, size, size)
    x = torch.nn.functional.silu(torch.randn(1, channels, *spatial) * 2)
    rows = {"fp32": lambda: torch.nn.functional.conv3d(x, conv.weight, conv.bias, padding=1)}
    failures = {}

    calibration = Calibration()
    model = nn.Sequential(conv)
    handles = calibration.attach(model, candidate_layers(model))
    with torch.inference_mode():
        model(x)
    for handle in handles:
        handle.remove()

    import copy

    for name, reduce_range in (("onednn", False), ("onednn-7bit", True)):
        quantized = copy.deepcopy(model)
        quantize_int8(quantized, calibration, ["0"], reduce_range=reduce_range)
        rows[name] = quantized

    from engine.quantization import legacy

    if legacy.available():
        legacy_model = copy.deepcopy(model)
        legacy_model[0] = legacy.LegacyInt8Conv3d(conv, calibration.ranges["0"])
        rows["legacy"] = legacy_model
    else:
        failures["legacy"] = "torch.ao quantized Conv3d not available"

    from engine.quantization import torchao_support

    try:
        rows["torchao-quantize_"] = torchao_support.eager_int8_conv3d(copy.deepcopy(conv), x)
    except Exception as exc:  # noqa: BLE001 - recorded: the table says why the row cannot run
        failures["torchao-quantize_"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:110]}"
    try:
        pt2e = torchao_support.pt2e_int8_conv3d(copy.deepcopy(model), x)
        rows["pt2e-eager"] = pt2e
        if with_inductor:
            compiled = torchao_support.compile_frozen(pt2e)
            with torch.inference_mode():
                compiled(x)  # the compile itself stays out of the timing
            rows["pt2e-inductor"] = compiled
    except Exception as exc:  # noqa: BLE001
        failures["pt2e"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:110]}"
    return x, rows, failures


def _linear_rows(tokens: int, features_in: int, features_out: int):
    import torch
    from torch import nn

    from engine.quantization import DynamicInt8Linear, legacy, torchao_support

    torch.manual_seed(0)
    linear = nn.Linear(features_in, features_out).eval()
    x = torch.randn(1, tokens, features_in)
    rows = {"fp32": lambda: linear(x), "onednn": DynamicInt8Linear(linear)}
    failures = {}
    try:
        rows["torchao-quantize_"] = torchao_support.int8_linear(linear)
    except ImportError as exc:
        failures["torchao-quantize_"] = str(exc)
    if legacy.available():
        rows["legacy"] = legacy.LegacyDynamicInt8Linear(linear)
    else:
        failures["legacy"] = "torch.ao quantized dynamic Linear not available"
    return x, rows, failures


def measure(shape: str, repeats: int, with_inductor: bool) -> list[dict]:
    import torch

    from engine.metrics.image import psnr

    if shape in LINEAR_SHAPES:
        x, rows, failures = _linear_rows(*LINEAR_SHAPES[shape])
    else:
        x, rows, failures = _rows(*SHAPES[shape], with_inductor)
    times: dict[str, list[float]] = {name: [] for name in rows}
    cpu: dict[str, list[float]] = {name: [] for name in rows}
    outputs = {}
    with torch.inference_mode():
        for name, fn in rows.items():  # warm-up (oneDNN primitive creation, weight reorders)
            outputs[name] = (fn(x) if isinstance(fn, torch.nn.Module) else fn()).float()
        for _, name in interleaved(list(rows), repeats):
            fn = rows[name]
            start, start_cpu = time.perf_counter(), time.process_time()
            fn(x) if isinstance(fn, torch.nn.Module) else fn()
            times[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    fp32 = statistics.median(times["fp32"])
    table = []
    for name, values in times.items():
        median, spread = median_iqr(values)
        table.append(
            {
                "shape": shape,
                "row": name,
                "median_ms": 1e3 * median,
                "iqr_ms": 1e3 * spread,
                "min_ms": 1e3 * min(values),
                "cpu_ms": 1e3 * statistics.median(cpu[name]),
                "x_fp32": fp32 / median,
                "cpu_x_fp32": statistics.median(cpu["fp32"]) / statistics.median(cpu[name]),
                "psnr_db": psnr(outputs["fp32"], outputs[name]),
            }
        )
    for name, why in failures.items():
        table.append({"shape": shape, "row": name, "failed": why})
    return table


def measure_unet(model_id: str | None, repeats: int) -> list[dict]:
    """The model's U-Net through the engine's calibration sampling loop: fp32, int8 (oneDNN + torchao), legacy."""
    import copy

    import torch

    from engine.metrics.image import psnr
    from engine.models.registry import ModelRegistry
    from engine.optimization import apply as optimization
    from engine.quantization import Calibration, candidate_layers, quantize_int8

    device = torch.device("cpu")
    model = ModelRegistry().get(model_id).load()
    unets = {"fp32": model.unet}
    candidates = candidate_layers(model.unet)
    calibration = Calibration()
    handles = calibration.attach(model.unet, candidates)
    optimization._run_calibration(model, model.unet, device, decode=False)
    for handle in handles:
        handle.remove()
    for name, legacy_kernels in (("int8 onednn", False), ("int8 legacy torch.ao", True)):
        unet = copy.deepcopy(model.unet)
        quantize_int8(unet, calibration, candidates, legacy_kernels=legacy_kernels)
        unets[name] = unet
    steps = optimization.CALIBRATION_STEPS
    times: dict[str, list[float]] = {name: [] for name in unets}
    cpu: dict[str, list[float]] = {name: [] for name in unets}
    outputs = {
        name: optimization._run_calibration(model, unet, device, decode=False) for name, unet in unets.items()
    }
    for _, name in interleaved(list(unets), repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        optimization._run_calibration(model, unets[name], device, decode=False)
        times[name].append((time.perf_counter() - start) / steps)
        cpu[name].append((time.process_time() - start_cpu) / steps)
    fp32 = statistics.median(times["fp32"])
    table = []
    for name, values in times.items():
        median, spread = median_iqr(values)
        table.append(
            {
                "shape": f"U-Net step ({steps}-step loop)",
                "row": name,
                "median_ms": 1e3 * median,
                "iqr_ms": 1e3 * spread,
                "min_ms": 1e3 * min(values),
                "cpu_ms": 1e3 * statistics.median(cpu[name]),
                "x_fp32": fp32 / median,
                "cpu_x_fp32": statistics.median(cpu["fp32"]) / statistics.median(cpu[name]),
                "psnr_db": psnr(outputs["fp32"], outputs[name]),
            }
        )
    return table


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    every = [*SHAPES, *LINEAR_SHAPES]
    parser.add_argument(
        "--shapes", default=",".join(every), help="comma-separated, from: " + ", ".join(every)
    )
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument(
        "--unet", metavar="MODEL", help="time this model's U-Net steps instead ('' = shipped)"
    )
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    parser.add_argument("--inductor", action="store_true", help="add the PT2E + Inductor row (needs g++)")
    parser.add_argument("--json", metavar="FILE", help="also write the rows, the machine and the load here")
    args = parser.parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    with_inductor = args.inductor and bool(shutil.which("g++") or shutil.which("clang++"))
    print(
        f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}, "
        f"ONEDNN_MAX_CPU_ISA={os.environ.get('ONEDNN_MAX_CPU_ISA', '-')}, threads {torch.get_num_threads()}, "
        f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}, {args.repeats} repeats interleaved"
    )
    print(
        f"{'shape':<22} {'row':<18} {'median ms':>10} {'IQR ms':>8} {'min ms':>8} {'x fp32':>7} {'cpu ms':>8} {'cpu x':>6} {'PSNR dB':>8}"
    )
    load_before = os.getloadavg()
    tables = (
        [measure_unet(args.unet or None, args.repeats)]
        if args.unet is not None
        else [measure(shape, args.repeats, with_inductor) for shape in args.shapes.split(",")]
    )
    if args.json:
        import json

        from engine.machine.probe import probe_machine

        record = {
            "machine": probe_machine().describe(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA"),
            "threads": torch.get_num_threads(),
            "repeats": args.repeats,
            "load_average_before": load_before,
            "load_average_after": os.getloadavg(),
            "rows": [row for table in tables for row in table],
        }
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(record, out, indent=1, default=str)
    for table in tables:
        for row in table:
            if "failed" in row:
                print(f"{row['shape']:<22} {row['row']:<18} cannot run: {row['failed']}")
            else:
                print(
                    f"{row['shape']:<22} {row['row']:<18} {row['median_ms']:>10.1f} {row['iqr_ms']:>8.1f} {row['min_ms']:>8.1f} "
                    f"{row['x_fp32']:>7.2f} {row['cpu_ms']:>8.1f} {row['cpu_x_fp32']:>6.2f} {row['psnr_db']:>8.1f}"
                )
    print(f"load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
