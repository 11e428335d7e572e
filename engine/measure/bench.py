"""``volsynth bench``: every optimization setting against fp32 NCDHW, same model, seed and noise, one run.

Each row runs in its own child process (so peak memory is that row's alone and no row inherits another's
caches or thread pools) through the engine's own path: ``ModelRegistry`` -> ``prepare`` -> the one
denoising loop ``engine.sampling.denoise``. The reference row runs MONAI's ``DiffusionInferer`` /
``LatentDiffusionInferer.sample`` on the same noise. Repeats interleave the rows (row order rotates each
repeat) because these machines are shared and noisy: a ratio measured side by side means something, an
absolute time much less.

Per row: per-step latency (the loop's own step times, warm-up steps excluded; median and IQR over all
steps of all repeats; on CUDA the U-Net call is also timed with CUDA events), end-to-end time, peak memory
(CUDA allocator peak on GPU, process peak RSS on CPU), and the final volume's PSNR / SSIM / max abs error
against the fp32 row.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.api.optimization_config import NAMED_SETTINGS
from engine.machine.peak_memory import device_peak_bytes
from engine.measure.harness import VERDICT_NOTE, interleaved, median_iqr, speed_verdict

# Named rows: every named optimization setting, plus "reference", MONAI's own inferer (fp32).
# Rows that are not optimization settings: "reference", MONAI's own inferer (fp32), and "xla", the same loop
# with the networks compiled by XLA (engine.backends.xla), float32 at "highest" precision.
SPECIAL_ROWS = {"reference": "MONAI inferer (fp32)", "xla": "XLA backend (jax, float32 'highest')"}
ROWS: dict[str, dict[str, Any] | None] = {
    "fp32": NAMED_SETTINGS["fp32"],
    **dict.fromkeys(SPECIAL_ROWS),
    **NAMED_SETTINGS,
}
DEFAULT_ROWS = {
    "cpu": [
        "fp32",
        "reference",
        "bf16",
        "channels_last",
        "sdpa",
        "int8",
        "bf16+sdpa",
        "int8+sdpa",
        "int8+bf16+sdpa",
        *(["xla"] if importlib.util.find_spec("jax") else []),  # JAX is an extra (not in the desktop build)
    ],
    "cuda": [
        "fp32",
        "reference",
        "tf32",
        "tf32+cl",
        "bf16",
        "sdpa",
        "bf16+sdpa+cl",
        "compile",
        "bf16+cl+sdpa+compile",
        "bf16+sdpa+graphs",
        "fp8",
    ],
}


@dataclass
class BenchSettings:
    model: str
    steps: int
    repeats: int
    warmup: int
    seed: int
    device: str
    latent_only: bool
    threads: int | None
    decoder_only: bool = False


# -- child: one row ------------------------------------------------------------------------------------


class _Timed:
    """Proxy of a PreparedModel that times the U-Net calls (CUDA events on GPU) and can skip the decode."""

    def __init__(self, prepared, device, skip_decode: bool):
        self.prepared, self.device, self.skip_decode = prepared, device, skip_decode
        self.unet_ms: list[float] = []
        self.decode_s = 0.0

    def autocast(self):
        return self.prepared.autocast()

    def denoiser(self, x, timesteps, context=None):
        import torch

        if self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = self.prepared.denoiser(x, timesteps, context)
            end.record()
            end.synchronize()
            self.unet_ms.append(start.elapsed_time(end))
        else:
            started = time.perf_counter()
            out = self.prepared.denoiser(x, timesteps, context)
            self.unet_ms.append(1e3 * (time.perf_counter() - started))
        return out

    def decode(self, z):
        if self.skip_decode:
            return z
        started = time.perf_counter()
        out = self.prepared.decode(z)
        self.decode_s = time.perf_counter() - started
        return out


def _request(source, settings: BenchSettings, config):
    from engine.api import SamplingRequest

    # Guidance pinned to 1 (one U-Net pass per step) whatever the model's default: MONAI's inferer, the
    # reference row, has no classifier-free guidance, and guidance doubles every row's work alike.
    return SamplingRequest(
        model=str(source.path),
        steps=settings.steps,
        seed=settings.seed,
        optimization=config,
        guidance_scale=1.0,
    )


def run_row(name: str, settings: BenchSettings, out_dir: Path) -> dict[str, Any]:
    """Run one row in this process; writes ``<name>.npy`` (final volume) and returns the measurements."""
    if settings.decoder_only:
        return run_decoder_row(name, settings, out_dir)
    import numpy as np
    import torch

    from engine.api import drive
    from engine.machine.devices import resolve_device
    from engine.models.registry import ModelRegistry
    from engine.optimization.apply import OptimizationConfig, prepare
    from engine.sampling import denoise

    if settings.threads:
        torch.set_num_threads(settings.threads)
    device = resolve_device(settings.device)
    source = ModelRegistry().get(settings.model)
    if settings.latent_only:
        _check_memory_without_decode(source)
    started = time.perf_counter()
    model = source.load()
    if settings.latent_only:
        # Rows compare final latents: without a decoder loaded, calibration (int8 / mixed) judges the
        # latent too, and the decoder's weights stay out of the peak memory.
        model.autoencoder = None
    model = model.to(device)
    load_s = time.perf_counter() - started
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    record: dict[str, Any] = {"row": name, "load_s": load_s}

    if name == "reference":
        volumes, step_s, unet_ms, prep_s = _run_reference(model, source.spec, settings, device)
        record["report"] = {
            "reference": {
                "requested": "MONAI inferer",
                "applied": True,
                "reason": "MONAI DiffusionInferer/LatentDiffusionInferer.sample, fp32",
            }
        }
        decode_s = None
    else:
        config = OptimizationConfig.from_dict(ROWS[name] or {})
        request = _request(source, settings, config)
        t0 = time.perf_counter()
        prepared = _prepare_xla(model) if name == "xla" else prepare(model, config, device, use_cache=False)
        prep_s = time.perf_counter() - t0
        timed = _Timed(prepared, device, settings.latent_only)
        loop = drive(denoise(timed, source.spec, request, device))
        assert loop is not None  # nothing asks it to stop: the loop ran to its end
        volumes, step_s, unet_ms = loop.volumes, loop.step_times_s, timed.unet_ms
        decode_s = None if settings.latent_only else timed.decode_s
        record["report"] = prepared.report
        details = getattr(prepared, "details", None) or (
            {"compile_s": getattr(prepared, "compile_s", None)} if name == "xla" else None
        )
        if details:
            record["details"] = details
    total_s = time.perf_counter() - started - load_s
    peak, kind = device_peak_bytes(device)
    np.save(out_dir / f"{_safe(name)}.npy", volumes.float().numpy())
    record.update(
        prepare_s=prep_s,
        step_s=step_s,
        unet_ms=unet_ms,
        decode_s=decode_s,
        end_to_end_s=total_s,
        peak_memory_bytes=peak,
        memory_kind=kind,
        device=str(device),
    )
    return record


def _check_memory_without_decode(source) -> None:
    """A latent-only row never decodes: refuse it only when the model without the decode's activations
    cannot fit (the bundle-sized U-Net's 7 GiB full-resolution decode would refuse every row otherwise)."""
    from engine.errors import OutOfMemory
    from engine.formatting import format_bytes
    from engine.nifti.checks import available_memory

    estimate = source.memory_estimate()
    need = estimate["total"] - estimate.get("decoding", 0)
    if need > available_memory():
        raise OutOfMemory(
            f"model {source.id!r} would need about {format_bytes(need)} without its decode, but only "
            f"{format_bytes(available_memory())} is available"
        )
    source.check_memory = lambda: estimate  # load() checks again, with the decode counted: checked here


def _prepare_xla(model):
    """The model as XLA programs on the first JAX device; its report says what ran and what compiling cost.

    The decoder is compiled here (part of prepare_s), so the row's decode time is decoding; the U-Net compiles
    in the first step, which the warm-up excludes.
    """
    from engine.backends.xla import XlaModel, jax_versions
    from engine.xla.runtime import configure_jax

    configure_jax(1)
    import jax

    device = jax.devices()[0]
    xla = XlaModel.from_loaded(model, "highest", device)
    if xla.decoder_arch is not None and model.spec.latent_shape is not None:
        xla.compile_decoder((1, *model.spec.latent_shape))
    versions = ", ".join(f"{k} {v}" for k, v in jax_versions().items())
    xla.report = {
        "xla": {
            "requested": "XLA, float32 'highest'",
            "applied": True,
            "reason": f"U-Net and decoder compiled by XLA on {device.platform} ({versions}); the decoder's "
            "compile is in the preparation time, the U-Net's in the first step (excluded as warm-up)",
        }
    }
    return xla


def _run_reference(model, spec, settings: BenchSettings, device):
    """MONAI's inferer on the same noise, conditioning and scheduler as the engine's loop."""
    import torch
    from monai.inferers import DiffusionInferer, LatentDiffusionInferer

    from engine.api import SamplingRequest
    from engine.models.networks import build_scheduler
    from engine.sampling import resolve_request

    request, conditioning = resolve_request(
        spec, SamplingRequest(steps=settings.steps, seed=settings.seed, guidance_scale=1.0)
    )
    scheduler = build_scheduler(request.sampler, spec.schedule)
    scheduler.set_timesteps(request.steps, device=device)
    shape = (1, *spec.diffusion_shape)
    noise = torch.randn(shape, generator=torch.Generator().manual_seed(request.seed), dtype=torch.float32).to(
        device
    )
    vector = torch.tensor(
        [spec.condition(n).normalise(v) for n, v in conditioning.items()], dtype=torch.float32, device=device
    ).view(1, 1, -1)
    unet_ms: list[float] = []
    step_s: list[float] = []
    last = [time.perf_counter()]

    class Conditioned(torch.nn.Module):
        """MONAI's inferer passes either concat channels or cross-attention context; some models use both."""

        def __init__(self, unet):
            super().__init__()
            self.unet = unet

        def forward(self, x, timesteps, context=None):
            started = time.perf_counter()
            if "concat" in spec.conditioning_modes and spec.conditioning:
                x = torch.cat([x, vector[:, 0, :, None, None, None].expand(-1, -1, *x.shape[2:])], dim=1)
            ctx = vector if "crossattn" in spec.conditioning_modes and spec.conditioning else None
            out = self.unet(x, timesteps=timesteps, context=ctx)
            now = time.perf_counter()
            unet_ms.append(1e3 * (now - started))
            step_s.append(now - last[0])  # previous scheduler step + this U-Net call, like the engine's step
            last[0] = now
            return out

    diffusion = Conditioned(model.unet)
    with torch.inference_mode():
        if spec.kind == "latent" and not settings.latent_only:
            inferer = LatentDiffusionInferer(scheduler, scale_factor=spec.scale_factor)
            out = inferer.sample(
                noise,
                autoencoder_model=model.autoencoder,
                diffusion_model=diffusion,
                scheduler=scheduler,
                mode="crossattn",
                verbose=False,
            )
        else:
            out = DiffusionInferer(scheduler).sample(
                noise, diffusion_model=diffusion, scheduler=scheduler, mode="crossattn", verbose=False
            )
            if spec.kind == "latent":
                out = out / spec.scale_factor  # what the engine's latent-only rows return
    step_s[0] = unet_ms[0] / 1e3
    return out.float().cpu(), step_s, unet_ms, 0.0


def _safe(name: str) -> str:
    return name.replace("+", "_").replace(":", "-")


# -- decoder only ----------------------------------------------------------------------------------------

# Decoder rows: fp32 full first, then the streamed decode and each decoder setting, streamed (bounded
# memory) and, for the fastest float setting, full too (the streamed decode must be at least as fast).
DEFAULT_DECODER_ROWS = [
    "fp32",
    "streamed_decode",
    "dec:bf16-cl",
    "streamed+dec:bf16-cl",
    "streamed+dec:int8-cl",
    "streamed+dec:mixed-bf16-cl",
]


def _decoder_model(settings: BenchSettings):
    """(model with only its autoencoder, spec): a synthetic one built here, or a model's without its U-Net."""
    import gc
    from types import SimpleNamespace

    if settings.model.startswith("synthetic:"):
        from engine.models.reference import SYNTHETIC_MODELS, perturbed_networks

        spec = SYNTHETIC_MODELS[settings.model.split(":", 1)[1]]()
        ae = perturbed_networks(spec, seed=0, roles=("autoencoder",))["autoencoder"]
        return SimpleNamespace(spec=spec, unet=None, autoencoder=ae)
    from engine.errors import InvalidRequest
    from engine.models.registry import ModelRegistry

    model = ModelRegistry().get(settings.model).load()
    if model.autoencoder is None:
        raise InvalidRequest(f"{settings.model} has no decoder (pixel-space model): nothing to benchmark")
    model.unet = None
    gc.collect()
    return model


def run_decoder_row(name: str, settings: BenchSettings, out_dir: Path) -> dict[str, Any]:
    """One decoder-only row: decode the same seeded latent with the row's settings, timed."""
    import numpy as np
    import torch

    from engine.machine.devices import resolve_device
    from engine.machine.peak_memory import current_peak_rss_bytes, reset_peak_rss
    from engine.optimization.apply import OptimizationConfig, prepare

    if settings.threads:
        torch.set_num_threads(settings.threads)
    device = resolve_device(settings.device)
    started = time.perf_counter()
    model = _decoder_model(settings)
    model.autoencoder.to(device)
    spec = model.spec
    load_s = time.perf_counter() - started
    noise = torch.Generator().manual_seed(settings.seed)
    z = (torch.randn((1, *spec.latent_shape), generator=noise) / spec.scale_factor).to(device)
    config = OptimizationConfig.from_dict(ROWS[name] or {})
    t0 = time.perf_counter()
    prepared = prepare(model, config, device, use_cache=False)
    prepare_s = time.perf_counter() - t0
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    was_reset = reset_peak_rss()
    wall, cpu = time.perf_counter(), time.process_time()
    with torch.inference_mode():
        volume = prepared.decode(z)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    decode_s, cpu_s = time.perf_counter() - wall, time.process_time() - cpu
    peak, kind = device_peak_bytes(device)
    np.save(out_dir / f"{_safe(name)}.npy", volume.float().cpu().numpy())
    return {
        "row": name,
        "load_s": load_s,
        "prepare_s": prepare_s,
        "decode_s": decode_s,
        "decode_cpu_s": cpu_s,
        "peak_memory_bytes": peak,
        "decode_peak_rss_bytes": current_peak_rss_bytes() if was_reset and device.type != "cuda" else None,
        "memory_kind": kind,
        "device": str(device),
        "report": prepared.report,
        "details": prepared.details,
        "shape": list(volume.shape),
    }


def run_decoder_bench(settings: BenchSettings, rows: list[str], out_dir: Path, log=print) -> dict[str, Any]:
    """Decoder-only rows, ``settings.repeats`` times interleaved (each in a child process), against fp32 full."""
    import numpy as np

    from engine.metrics.image import compare

    unknown = [r for r in rows if r not in ROWS or ROWS[r] is None]
    if unknown:
        from engine.errors import InvalidRequest

        raise InvalidRequest(
            f"unknown decoder bench row(s) {unknown}; known: {', '.join(r for r in ROWS if ROWS[r] is not None)}"
        )
    if "fp32" not in rows:
        rows = ["fp32", *rows]
    out_dir.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict[str, Any]]] = {r: [] for r in rows}
    for repeat, name in interleaved(rows, settings.repeats):
        log(f"[repeat {repeat + 1}/{settings.repeats}] {name} ...")
        runs[name].append(_spawn(name, settings, out_dir / f"r{repeat}"))
        last = runs[name][-1]
        if "error" not in last:
            log(
                f"    decode {last['decode_s']:.1f} s (cpu {last['decode_cpu_s']:.1f} s), "
                f"peak {last['peak_memory_bytes'] / 2**30:.2f} GiB"
            )
    reference = np.load(out_dir / "r0" / "fp32.npy")
    results = []
    for name in rows:
        ok = [r for r in runs[name] if "error" not in r]
        if not ok:
            results.append({"row": name, "error": runs[name][0]["error"]})
            continue
        times = [r["decode_s"] for r in ok]
        decode_median, decode_iqr = median_iqr(times)
        path = next(
            out_dir / f"r{i}" / f"{_safe(name)}.npy"
            for i in range(settings.repeats)
            if (out_dir / f"r{i}" / f"{_safe(name)}.npy").is_file()
        )
        results.append(
            {
                "row": name,
                "config": ROWS[name],
                "report": ok[0]["report"],
                "details": ok[0].get("details"),
                "decode_s_median": decode_median,
                "decode_s_iqr": decode_iqr,
                "decode_s_all": times,
                "decode_cpu_s_median": float(np.median([r["decode_cpu_s"] for r in ok])),
                "prepare_s_median": float(np.median([r["prepare_s"] for r in ok])),
                "peak_memory_bytes": max(r["peak_memory_bytes"] for r in ok),
                "memory_kind": ok[0]["memory_kind"],
                **compare(reference, np.load(path)),
            }
        )
    base = next(r for r in results if r["row"] == "fp32")
    for r in results:
        if "decode_s_median" in r and "decode_s_median" in base:
            r["speedup"] = base["decode_s_median"] / r["decode_s_median"]
            if r is not base:  # the one noise rule, over the repeats' decode times
                r["verdict"] = speed_verdict(base["decode_s_all"], r["decode_s_all"]).to_dict()
    summary = {
        "settings": settings.__dict__,
        "rows": results,
        "compared_on": "decoded volume (fp32 full decode)",
        "output_shape": list(reference.shape),
        "host": _host(),
        "created": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    (out_dir / "bench.json").write_text(json.dumps(summary, indent=2, default=str))
    (out_dir / "bench.txt").write_text(format_decoder_table(summary) + "\n")
    return summary


def format_decoder_table(summary: dict[str, Any]) -> str:
    header = (
        f"{'row':28s} {'decode s':>9s} {'IQR':>6s} {'x fp32':>7s} {'verdict':>9s} {'cpu s':>7s} "
        f"{'peak GiB':>8s} {'PSNR dB':>8s} {'SSIM':>7s} {'max err':>8s}  prepare s"
    )
    lines = [header, "-" * len(header)]
    for r in summary["rows"]:
        if "error" in r:
            lines.append(f"{r['row']:28s} ERROR {r['error']}")
            continue
        ssim = "-" if r["ssim"] is None else f"{r['ssim']:.5f}"
        psnr = "exact" if r["psnr_db"] == float("inf") else f"{r['psnr_db']:.1f}"
        lines.append(
            f"{r['row']:28s} {r['decode_s_median']:9.1f} {r['decode_s_iqr']:6.1f} {r['speedup']:7.2f} "
            f"{_verdict_cell(r, 'verdict'):>9s} {r['decode_cpu_s_median']:7.1f} "
            f"{r['peak_memory_bytes'] / 2**30:8.2f} {psnr:>8s} {ssim:>7s} "
            f"{r['max_abs_err']:8.2g}  {r['prepare_s_median']:.1f}"
        )
        not_applied = [
            f"{k}: {e.get('reason')}"
            for k, e in r["report"].items()
            if e.get("requested") not in (False, None, "default") and not e.get("applied")
        ]
        for line in not_applied:
            lines.append(f"{'':28s}   not applied - {line}")
    shape = "x".join(str(s) for s in summary["output_shape"][2:])
    lines.append(
        f"decoder only, {shape} output; deviation vs the fp32 full decode; {summary['settings']['repeats']} "
        "run(s) per row, interleaved, each in its own process (peak = that process's peak RSS)"
    )
    lines.append(f"verdict: {VERDICT_NOTE}, over each row's decode times (one per run)")
    return "\n".join(lines)


def _verdict_cell(row: dict[str, Any], key: str) -> str:
    """A row's verdict for a table column: faster / slower / same / undecided; "ref" for fp32 itself."""
    if row["row"] == "fp32":
        return "ref"
    return (row.get(key) or {}).get("verdict", "-")


# -- parent: orchestrate, compare, report ----------------------------------------------------------------


def run_bench(settings: BenchSettings, rows: list[str], out_dir: Path, log=print) -> dict[str, Any]:
    """Run every row ``settings.repeats`` times (interleaved, each in a child process) and summarise."""
    import numpy as np

    from engine.metrics.image import compare

    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        from engine.errors import InvalidRequest

        raise InvalidRequest(f"unknown bench row(s) {unknown}; known: {', '.join(ROWS)}")
    if "fp32" not in rows:
        rows = ["fp32", *rows]
    out_dir.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict[str, Any]]] = {r: [] for r in rows}
    for repeat, name in interleaved(rows, settings.repeats):
        log(f"[repeat {repeat + 1}/{settings.repeats}] {name} ...")
        runs[name].append(_spawn(name, settings, out_dir / f"r{repeat}"))

    reference = np.load(out_dir / "r0" / "fp32.npy")
    results = []
    step_samples: dict[str, list[float]] = {}
    for name in rows:
        ok = [r for r in runs[name] if "error" not in r]
        if not ok:
            results.append({"row": name, "error": runs[name][0]["error"]})
            continue
        steps = [s for r in ok for s in r["step_s"][settings.warmup :]]
        unet = [s for r in ok for s in r["unet_ms"][settings.warmup :]]
        step_median, step_iqr = median_iqr(steps)
        volume = (
            np.load(out_dir / "r0" / f"{_safe(name)}.npy")
            if (out_dir / "r0" / f"{_safe(name)}.npy").is_file()
            else np.load(out_dir / f"r{settings.repeats - 1}" / f"{_safe(name)}.npy")
        )
        results.append(
            {
                "row": name,
                "config": ROWS[name],
                "report": ok[0]["report"],
                "details": ok[0].get("details"),
                "step_ms_median": 1e3 * step_median,
                "step_ms_iqr": 1e3 * step_iqr,
                "unet_ms_median": float(np.median(unet)),
                "steps_measured": len(steps),
                "end_to_end_s_median": float(np.median([r["end_to_end_s"] for r in ok])),
                "end_to_end_s_all": [r["end_to_end_s"] for r in ok],
                "prepare_s_median": float(np.median([r["prepare_s"] for r in ok])),
                "decode_s_median": None
                if ok[0]["decode_s"] is None
                else float(np.median([r["decode_s"] for r in ok])),
                "peak_memory_bytes": max(r["peak_memory_bytes"] for r in ok),
                "memory_kind": ok[0]["memory_kind"],
                **compare(reference, volume),
            }
        )
        step_samples[name] = steps
    base = next(r for r in results if r["row"] == "fp32")
    for r in results:
        if "step_ms_median" in r:
            r["speedup_per_step"] = base["step_ms_median"] / r["step_ms_median"]
            r["speedup_end_to_end"] = base["end_to_end_s_median"] / r["end_to_end_s_median"]
            if r is not base and "step_ms_median" in base:
                # The one noise rule decides what a ratio may be called: per step over every measured step
                # of every repeat, end to end over the repeats.
                per_step = speed_verdict(step_samples["fp32"], step_samples[r["row"]])
                whole = speed_verdict(base["end_to_end_s_all"], r["end_to_end_s_all"])
                r["verdict_per_step"], r["verdict_end_to_end"] = per_step.to_dict(), whole.to_dict()
                r["per_step_verdict"] = per_step.verdict  # the CSV's columns
                r["end_to_end_verdict"] = whole.verdict
    summary = {
        "settings": settings.__dict__,
        "rows": results,
        "compared_on": "final latent" if settings.latent_only else "final decoded volume",
        "host": _host(),
        "created": time.strftime("%Y-%m-%d %H:%M:%S"),
        "quality": quality_block_for(settings.model, [(r["row"], r.get("config") or {}) for r in results]),
    }
    _write_outputs(summary, out_dir)
    return summary


def _spawn(name: str, settings: BenchSettings, out_dir: Path) -> dict[str, Any]:
    out_dir.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "engine.measure.bench",
        "--child",
        name,
        "--settings",
        json.dumps(settings.__dict__),
        "--out",
        str(out_dir),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy())
    result_file = out_dir / f"{_safe(name)}.json"
    if proc.returncode != 0 or not result_file.is_file():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"row": name, "error": f"exit {proc.returncode}: {tail[0][:300]}"}
    return json.loads(result_file.read_text())


def quality_block_for(
    model: str, rows: list[tuple[str, dict[str, Any]]], schedules: dict[str, int] | None = None
) -> dict[str, Any]:
    """The JSON's "quality" block: each row's cohort verdict kept by ``volsynth quality`` on this machine
    (``engine.quality.store``), or the command that measures it; ``schedules``: row name -> its steps, for the
    rows that are shorter schedules."""
    from engine.machine.probe import probe_machine
    from engine.models.registry import ModelRegistry
    from engine.optimization.tune_store import model_key
    from engine.quality.store import quality_block

    try:
        key = model_key(ModelRegistry().get(model or None).weights_sha256())
    except Exception as exc:  # noqa: BLE001 - a synthetic bench model has no weights to key a verdict by
        return {"cohort": None, "reason": f"no kept verdicts for this model: {exc}"}
    return quality_block(probe_machine().fingerprint(), key, rows, model, schedules)


def _host() -> dict[str, Any]:
    import platform

    import torch

    from engine.machine.probe import probe_machine

    probe = probe_machine()
    info = {
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cpu_threads": torch.get_num_threads(),
        "machine": probe.to_dict(),  # every figure names the machine it came from
        "machine_words": probe.describe(),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def format_table(summary: dict[str, Any]) -> str:
    header = (
        f"{'row':22s} {'step ms':>9s} {'IQR':>7s} {'x fp32':>7s} {'verdict':>9s} {'e2e s':>7s} {'x e2e':>6s} "
        f"{'verdict':>9s} {'peak GiB':>8s} {'PSNR dB':>8s} {'SSIM':>6s} {'max err':>8s}  applied"
    )
    lines = [header, "-" * len(header)]
    for r in summary["rows"]:
        if "error" in r:
            lines.append(f"{r['row']:22s} ERROR {r['error']}")
            continue
        applied = ",".join(k for k, e in r["report"].items() if e.get("applied")) or "-"
        not_applied = [
            k
            for k, e in r["report"].items()
            if e.get("requested") not in (False, None, "default") and not e.get("applied")
        ]
        if not_applied:
            applied += " (not applied: " + ",".join(not_applied) + ")"
        ssim = "-" if r["ssim"] is None else f"{r['ssim']:.4f}"
        lines.append(
            f"{r['row']:22s} {r['step_ms_median']:9.1f} {r['step_ms_iqr']:7.1f} {r['speedup_per_step']:7.2f} "
            f"{_verdict_cell(r, 'verdict_per_step'):>9s} {r['end_to_end_s_median']:7.1f} "
            f"{r['speedup_end_to_end']:6.2f} {_verdict_cell(r, 'verdict_end_to_end'):>9s} "
            f"{r['peak_memory_bytes'] / 2**30:8.2f} {r['psnr_db']:8.1f} {ssim:>6s} {r['max_abs_err']:8.2g}  "
            f"{applied}"
        )
    lines.append(
        f"deviation measured on the {summary['compared_on']} against the fp32 row; "
        f"{summary['settings']['steps']} steps x {summary['settings']['repeats']} repeat(s), "
        f"first {summary['settings']['warmup']} step(s) of each run excluded"
    )
    lines.append(
        f"verdicts: {VERDICT_NOTE}; per step over every measured step of every repeat, end to end over the "
        "repeats (one per run)"
    )
    return "\n".join(lines)


def _write_outputs(summary: dict[str, Any], out_dir: Path) -> None:
    import csv

    (out_dir / "bench.json").write_text(json.dumps(summary, indent=2, default=str))
    fields = [
        "row",
        "step_ms_median",
        "step_ms_iqr",
        "speedup_per_step",
        "per_step_verdict",
        "unet_ms_median",
        "end_to_end_s_median",
        "speedup_end_to_end",
        "end_to_end_verdict",
        "prepare_s_median",
        "decode_s_median",
        "peak_memory_bytes",
        "memory_kind",
        "psnr_db",
        "ssim",
        "max_abs_err",
        "error",
    ]
    with open(out_dir / "bench.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(summary["rows"])
    (out_dir / "bench.txt").write_text(format_table(summary) + "\n")
    _chart(summary, out_dir / "bench.png")


def _chart(summary: dict[str, Any], path: Path) -> bool:
    """Speed-up per step (bars) with the PSNR each row cost; False if matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = [r for r in summary["rows"] if "speedup_per_step" in r]
    fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(rows) + 2), 4))
    bars = ax.bar([r["row"] for r in rows], [r["speedup_per_step"] for r in rows], color="#4477aa")
    for bar, r in zip(bars, rows, strict=True):
        label = "exact" if r["psnr_db"] == float("inf") else f"{r['psnr_db']:.0f} dB"
        ax.annotate(
            label, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=8
        )
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_ylabel("per-step speed-up vs fp32 NCDHW")
    ax.set_title(
        f"{Path(summary['settings']['model']).name}\nspeed-up (bars) and PSNR vs fp32 (labels)", fontsize=10
    )
    plt.setp(ax.get_xticklabels(), rotation=30, ha="right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    """Child entry point: ``python -m engine.measure.bench --child ROW --settings JSON --out DIR``."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--child", required=True)
    parser.add_argument("--settings", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    settings = BenchSettings(**json.loads(args.settings))
    out = Path(args.out)
    record = run_row(args.child, settings, out)
    (out / f"{_safe(args.child)}.json").write_text(json.dumps(record, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
