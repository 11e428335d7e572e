"""Step caching and shorter schedules, measured: where a U-Net's compute sits, what caching saves, what it costs.

``python -m benchmarks.step_cache --profile``: time per level (time embedding and input convolution, each down
block, the middle block, each up block, the output convolution) of three U-Nets: the shipped demo model's, the
MONAI brain-LDM bundle's architecture and NV-Generate-MR-Brain's (MAISI v2) at 256x256x128's latent (random
weights: timing only). From these, the best a cached step can save at each branch level (Amdahl: the deep
levels skipped are all a cached step saves; the shallow ones still run).

``python -m benchmarks.step_cache``:

1. The shipped model's default generation (DDIM 50 steps, guidance 3) through the local backend, uncached against
   the step-caching rows and the shorter-schedule rows (DDIM 25 and 20 steps), interleaved seed by seed (row order
   rotating). Speed: the loop's denoising time per run, by the noise rule (engine.metrics.speed_verdict). Quality:
   per-seed PSNR/SSIM against the uncached full schedule on the same seed, and the cohort verdict of
   ``engine.quality.quality_report`` (the uncached run on seed set A against set B as the noise floor).
2. NV-Generate-MR-Brain's architecture at 256x256x128 (latent 4x64x64x32, guidance's doubled batch), random
   weights: per-step U-Net time of a full pass and of a cached pass at each branch level, interleaved, in bf16
   (``--maisi-fp32`` adds fp32), and one streamed decode; the end-to-end time of 30 steps is projected from them
   (not run end to end): ceil(30 / k) full passes + the rest cached + the decode. Its quality cannot be judged
   with random weights: the demo model's rows are the quality evidence.

Prints the machine (CPU model), the load before and after, and the spread (min-max) of every time. These
machines are shared: absolute times are rough, ratios measured interleaved in one run mean more.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEMO = "brain-t1-demo"
DEMO_ROWS: dict[str, dict[str, Any]] = {
    "uncached": {},
    **{
        f"cache:k{k}-l{level}": {"optimization": {"step_cache_interval": k, "step_cache_level": level}}
        for k, level in ((2, 1), (3, 1), (4, 1), (5, 1), (3, 2))
    },
    **{
        f"cache:k{k}-l1-f": {
            "optimization": {"step_cache_interval": k, "step_cache_level": 1, "step_cache_forecast": True}
        }
        for k in (3, 4, 5, 6)
    },
    "ddim-25": {"steps": 25},
    "ddim-20": {"steps": 20},
}
MAISI_STEPS = 30
MAISI_LATENT = (4, 64, 64, 32)  # 256x256x128 / 4
MAISI_SPACING = (0.94, 0.94, 1.36)


# -- the machine --------------------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    """The CPU model (lscpu), cores, torch threads and the load (uptime)."""
    import torch

    cpu = ""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        cpu = next(
            (ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Model name")), ""
        )
    except OSError:
        pass
    try:
        uptime = subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        uptime = ""
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average": [round(v, 2) for v in os.getloadavg()],
        "uptime": uptime,
        "torch": torch.__version__,
    }


def spread(values) -> dict[str, Any]:
    values = [float(v) for v in values]
    return {
        "median": statistics.median(values) if values else None,
        "min": min(values, default=None),
        "max": max(values, default=None),
        "n": len(values),
    }


# -- 1. where the compute sits -------------------------------------------------------------------------------


def profile_levels(denoiser, x, t, context, repeats: int = 2, autocast: str | None = None) -> dict[str, Any]:
    """Wall time per part of one U-Net pass (forward hooks; the CPU runs the parts one after another), the
    median over ``repeats`` after one warm-up pass; and per branch level the time of a cached pass and the
    best speed-up caching at that level can give (Amdahl)."""
    import contextlib

    import torch

    from engine.optimization.step_cache import _inner

    inner = _inner(denoiser)
    parts: dict[str, Any] = {"down": list(inner.down_blocks), "middle": [inner.middle_block]}
    parts["up"] = list(inner.up_blocks)
    named = [(f"down{i}", m) for i, m in enumerate(parts["down"])] + [("middle", inner.middle_block)]
    named += [(f"up{j}", m) for j, m in enumerate(parts["up"])]
    times: dict[str, list[float]] = {name: [] for name, _ in named}
    totals: list[float] = []
    started: dict[str, float] = {}
    handles = []
    for name, module in named:
        handles.append(
            module.register_forward_pre_hook(
                lambda m, a, k, n=name: started.__setitem__(n, time.perf_counter()), with_kwargs=True
            )
        )
        handles.append(
            module.register_forward_hook(
                lambda m, a, k, o, n=name: times[n].append(time.perf_counter() - started[n]), with_kwargs=True
            )
        )
    cast = torch.autocast("cpu", dtype=torch.bfloat16) if autocast == "bf16" else contextlib.nullcontext()
    try:
        with torch.inference_mode(), cast:
            for index in range(repeats + 1):
                begun = time.perf_counter()
                denoiser(x, timesteps=t, context=context)
                if index:
                    totals.append(time.perf_counter() - begun)
                else:
                    for v in times.values():
                        v.clear()
    finally:
        for handle in handles:
            handle.remove()
    median = {name: statistics.median(v) for name, v in times.items()}
    total = statistics.median(totals)
    levels = len(parts["down"])
    # What runs outside the blocks: the embeddings, the input and output convolutions.
    rest = max(0.0, total - sum(median.values()))
    by_level = {}
    for level in range(1, levels + 1):
        shallow = rest + sum(median[f"down{i}"] for i in range(level))
        shallow += sum(median[f"up{j}"] for j in range(levels - level, levels))
        by_level[str(level)] = {
            "cached_pass_s": shallow,
            "cached_share_of_full": shallow / total,
            "best_speedup_per_cached_step": total / shallow,
            **{f"best_speedup_k{k}": k / (1 + (k - 1) * shallow / total) for k in (2, 3, 4, 5)},
        }
    return {
        "input": list(x.shape),
        "autocast": autocast,
        "full_pass_s": spread(totals),
        "parts_s": median,
        "parts_share": {name: v / total for name, v in median.items()},
        "outside_blocks_s": rest,
        "by_level": by_level,
        "note": "a cached pass at level l runs the time/input/output layers, down0..down(l-1) (the last one "
        "without its downsampler, counted here with it: a slight over-estimate) and the last l up blocks",
    }


def _demo_network():
    from engine.models.registry import ModelRegistry

    model = ModelRegistry().get(DEMO).load()
    return model.unet


def _bundle_network():
    import torch
    from monai.networks.nets import DiffusionModelUNet

    from engine.models.reference import BUNDLE_UNET, perturb_

    torch.manual_seed(0)
    unet = DiffusionModelUNet(**{k: v for k, v in BUNDLE_UNET.items() if k != "_target_"}).eval()
    perturb_(unet, 0.02, torch.Generator().manual_seed(1))
    return unet


def _maisi_network():
    from engine.models.maisi import maisi_denoiser
    from engine.testing import build_maisi_networks

    unet, autoencoder = build_maisi_networks(tiny=False, seed=0)
    return maisi_denoiser(unet).eval(), autoencoder


def _maisi_context(batch: int):
    import torch

    row = [10.0, *(100.0 * v for v in MAISI_SPACING)]  # class label 10 (t1w in the mapping), spacing x 100
    context = torch.tensor([row] * batch, dtype=torch.float32).view(batch, 1, 4)
    context[: batch // 2, 0, 0] = 0.0  # guidance's unconditioned half
    return context


def run_profile(repeats: int, log=print) -> dict[str, Any]:
    import torch

    g = torch.Generator().manual_seed(0)
    out: dict[str, Any] = {}
    demo = _demo_network()
    x = torch.randn(2, 10, 20, 24, 20, generator=g)
    out["demo"] = profile_levels(demo, x, torch.full((2,), 500.0), torch.rand(2, 1, 2, generator=g), repeats)
    log("demo", json.dumps(out["demo"]["by_level"]))
    bundle = _bundle_network()
    x = torch.randn(2, 7, 20, 28, 20, generator=g)
    out["bundle"] = profile_levels(
        bundle, x, torch.full((2,), 500.0), torch.rand(2, 1, 4, generator=g), repeats
    )
    log("bundle", json.dumps(out["bundle"]["by_level"]))
    del bundle
    maisi, _ = _maisi_network()
    x = torch.randn(2, *MAISI_LATENT, generator=g)
    out["maisi_bf16"] = profile_levels(
        maisi, x, torch.full((2,), 500.0), _maisi_context(2), max(1, repeats - 1), autocast="bf16"
    )
    log("maisi (bf16)", json.dumps(out["maisi_bf16"]["by_level"]))
    return out


# -- 2. the shipped model's default generation ---------------------------------------------------------------


@dataclass
class SavedRun:
    """One generation as the summary needs it (kept on disk, so seed groups can run in parallel processes)."""

    image: Any  # (x, y, z)
    tissue: dict[str, Any]
    steps: int
    timings: dict[str, float]
    step_cache: dict[str, Any] | None

    def volume(self, index: int = 0):
        return self.image

    def tissue_maps(self, index: int = 0):
        return self.tissue

    def save(self, path: Path) -> None:
        import numpy as np

        np.savez_compressed(
            path.with_suffix(".npz"), image=self.image, **{f"t_{k}": v for k, v in self.tissue.items()}
        )
        meta = {"steps": self.steps, "timings": self.timings, "step_cache": self.step_cache}
        path.with_suffix(".json").write_text(json.dumps(meta))

    @classmethod
    def load(cls, path: Path) -> SavedRun:
        import numpy as np

        data = np.load(path.with_suffix(".npz"))
        meta = json.loads(path.with_suffix(".json").read_text())
        tissue = {k[2:]: data[k] for k in data.files if k.startswith("t_")}
        return cls(data["image"], tissue, meta["steps"], meta["timings"], meta["step_cache"])


def measure_demo(seeds_a: list[int], seeds_b: list[int], rows: list[str], folder: Path, log=print) -> None:
    """Every row on ``seeds_a`` (row order rotating seed by seed), the uncached row on ``seeds_b`` (the quality
    noise floor); each run saved in ``folder`` as ``<row>_<seed>``."""
    from engine.api import SamplingRequest, run
    from engine.api.optimization_config import OptimizationConfig
    from engine.backends.local import LocalBackend
    from engine.measure.harness import rotated

    backend = LocalBackend("cpu")
    folder.mkdir(parents=True, exist_ok=True)

    def one(row: str, seed: int, steps: int | None = None) -> SavedRun:
        spec = DEMO_ROWS[row]
        request = SamplingRequest(
            model=DEMO,
            seed=seed,
            steps=steps or spec.get("steps", 50),  # the model's default, stated: the rows' reference
            optimization=OptimizationConfig.from_dict(spec.get("optimization", {})),
        )
        result = run(backend.sample(request))
        return SavedRun(
            result.volume(0),
            result.tissue_maps(0),
            result.request.steps,
            result.provenance["timings"],
            result.provenance["optimization"]["report"].get("step_cache"),
        )

    one("uncached", 999, steps=5)  # warm-up: the load, first-call allocations
    for seed in seeds_a:
        for row in rotated(rows, seed):  # rotates across seeds and seed groups
            saved = one(row, seed)
            saved.save(folder / f"{_safe(row)}_{seed}")
            log(f"seed {seed} {row}: denoise {saved.timings['denoise_s']:.2f}s", flush=True)
    for seed in seeds_b:
        one("uncached", seed).save(folder / f"noise_{seed}")


def _safe(name: str) -> str:
    return name.replace(":", "_")


def run_demo(
    seeds_a: list[int], seeds_b: list[int], rows: list[str], folder: Path, log=print
) -> dict[str, Any]:
    """The summary of the runs saved in ``folder`` (``measure_demo``): speed by the noise rule, quality."""
    from engine.measure.harness import speed_verdict
    from engine.metrics.image import psnr, ssim

    results = {
        row: {seed: SavedRun.load(folder / f"{_safe(row)}_{seed}") for seed in seeds_a} for row in rows
    }
    noise = {seed: SavedRun.load(folder / f"noise_{seed}") for seed in seeds_b}
    times = {row: [results[row][s].timings["denoise_s"] for s in seeds_a] for row in rows}
    per_step = {
        row: [results[row][s].timings["denoise_s"] / results[row][s].steps for s in seeds_a] for row in rows
    }
    quality = _quality_reports(results, noise, seeds_a, seeds_b, rows)
    summary: dict[str, Any] = {}
    for row in rows:
        psnrs, ssims = [], []
        for seed in seeds_a:
            ref, got = results["uncached"][seed].volume(0), results[row][seed].volume(0)
            psnrs.append(psnr(ref, got))
            ssims.append(ssim(ref[None], got[None]))
        verdict = speed_verdict(times["uncached"], times[row])
        summary[row] = {
            "settings": DEMO_ROWS[row],
            "steps": results[row][seeds_a[0]].steps,
            "denoise_s": spread(times[row]),
            "per_step_s": spread(per_step[row]),
            "speedup_vs_uncached": statistics.median(times["uncached"]) / statistics.median(times[row]),
            "speed_verdict": verdict.to_dict(row, "uncached"),
            "psnr_db_vs_uncached": [None if math.isinf(v) else v for v in psnrs],
            "ssim_vs_uncached": ssims,
            "report": results[row][seeds_a[0]].step_cache,
            "quality": quality.get(row),
        }
    # Seed-to-seed variation in the same terms: uncached seed A_i against uncached seed B_i.
    floor = [
        psnr(results["uncached"][a].volume(0), noise[b].volume(0))
        for a, b in zip(seeds_a, seeds_b, strict=False)
    ]
    return {
        "model": DEMO,
        "request": "DDIM, 50 steps (rows ddim-N: N steps), guidance 3, default conditioning",
        "seeds_a": seeds_a,
        "seeds_b": seeds_b,
        "rows": summary,
        "seed_to_seed_psnr_db": floor,
    }


def _quality_reports(results, noise, seeds_a, seeds_b, rows) -> dict[str, Any]:
    try:
        from engine.quality import noise_floor, quality_report
    except ImportError:
        return {}

    def images(by_seed, seeds):
        return [by_seed[s].volume(0) for s in seeds]

    def tissue(by_seed, seeds):
        maps = [by_seed[s].tissue_maps(0) for s in seeds]
        return maps if all({"GM", "WM", "CSF"} <= set(m) for m in maps) else None

    ref_tissue, noise_tissue = tissue(results["uncached"], seeds_a), tissue(noise, seeds_b)
    with_tissue = ref_tissue is not None and noise_tissue is not None
    voxel_ml = 0.008  # 2 mm voxels
    floor = noise_floor(
        images(results["uncached"], seeds_a),
        images(noise, seeds_b),
        tissue_a=ref_tissue if with_tissue else None,
        tissue_b=noise_tissue if with_tissue else None,
        voxel_ml=voxel_ml,
        tissue_source="model" if with_tissue else None,
    )
    out = {}
    for row in rows:
        if row == "uncached":
            continue
        cand_tissue = tissue(results[row], seeds_a) if with_tissue else None
        report = quality_report(
            images(results["uncached"], seeds_a),
            images(results[row], seeds_a),
            floor,
            reference_tissue=ref_tissue if cand_tissue is not None else None,
            candidate_tissue=cand_tissue,
            voxel_ml=voxel_ml,
            tissue_source="model" if cand_tissue is not None else None,
            label=row,
            reference_label="uncached 50 steps",
            seeds=seeds_a,
            noise_seeds=seeds_b,
        )
        full = report.to_dict()
        out[row] = {
            "verdict": report.verdict,
            "within_noise": report.within_noise,
            "words": report.words(),
            "statistics": full["statistics"],
        }
    return out


# -- 3. NV-Generate-MR-Brain's architecture at full size: per step, projected ---------------------------------


def run_maisi(
    repeats: int, levels: list[int], intervals: list[int], dtypes: list[str], log=print, decode: bool = True
) -> dict[str, Any]:
    import contextlib

    import torch

    from engine.optimization.step_cache import StepCachedUNet
    from engine.optimization.streamed_decode import streamed_decode
    from engine.sampling import CURRENT_STEP, StepIndex

    denoiser, autoencoder = _maisi_network()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, *MAISI_LATENT, generator=g)
    t = torch.full((2,), 500.0)
    context = _maisi_context(2)
    cached = {level: StepCachedUNet(denoiser, 2, level) for level in levels}
    out: dict[str, Any] = {"latent": [2, *MAISI_LATENT], "steps": MAISI_STEPS, "by_dtype": {}}
    for dtype in dtypes:
        cast = torch.autocast("cpu", dtype=torch.bfloat16) if dtype == "bf16" else contextlib.nullcontext()
        samples: dict[str, list[float]] = {"full": [], **{f"l{level}": [] for level in levels}}
        errors: dict[str, float] = {}
        with torch.inference_mode(), cast:
            full_out = denoiser(x, t, context)  # warm-up
            for index in range(repeats):
                calls = [("full", None)] + [(f"l{level}", level) for level in levels]
                for name, level in calls if index % 2 == 0 else calls[::-1]:
                    if level is None:
                        begun = time.perf_counter()
                        denoiser(x, t, context)
                        samples[name].append(time.perf_counter() - begun)
                        continue
                    wrapper = cached[level]
                    # Step 0 of a run is a full pass that fills the cache (timed: one more full sample);
                    # step 1 is a cached step.
                    for step in (0, 1):
                        token = CURRENT_STEP.set(StepIndex(index + 1, step, MAISI_STEPS))
                        try:
                            begun = time.perf_counter()
                            got = wrapper(x, t, context)
                            samples["full" if step == 0 else name].append(time.perf_counter() - begun)
                        finally:
                            CURRENT_STEP.reset(token)
                    # Same input as the full pass that filled the cache: the cached pass must match it.
                    errors[name] = float((got.float() - full_out.float()).abs().max())
                log(
                    f"maisi {dtype} repeat {index + 1}: "
                    + ", ".join(f"{k} {v[-1]:.1f}s" for k, v in samples.items()),
                    flush=True,
                )
            decode_s = 0.0
            if decode:
                z = torch.randn(1, *MAISI_LATENT, generator=g)
                begun = time.perf_counter()
                streamed_decode(autoencoder, z)
                decode_s = time.perf_counter() - begun
        full = statistics.median(samples["full"])
        rows = {"uncached": {"projected_s": MAISI_STEPS * full + decode_s, "full_passes": MAISI_STEPS}}
        for level in levels:
            c = statistics.median(samples[f"l{level}"])
            for k in intervals:
                n_full = math.ceil(MAISI_STEPS / k)
                projected = n_full * full + (MAISI_STEPS - n_full) * c + decode_s
                rows[f"cache:k{k}-l{level}"] = {
                    "projected_s": projected,
                    "full_passes": n_full,
                    "speedup_vs_uncached_projected": rows["uncached"]["projected_s"] / projected,
                }
        out["by_dtype"][dtype] = {
            "pass_s": {k: spread(v) for k, v in samples.items()},
            "cached_pass_max_abs_vs_full_same_input": errors,
            "decode_s": decode_s,
            "projected": rows,
            "method": f"projected end to end = ceil({MAISI_STEPS}/k) x full pass + the rest x cached pass (medians "
            "of interleaved passes) + one streamed decode; not run end to end",
        }
    return out


# -- the command ---------------------------------------------------------------------------------------------


def _table_demo(demo: dict[str, Any]) -> str:
    lines = [
        f"{'row':<14} {'steps':>5} {'denoise s (min-max)':>22} {'speed-up':>8}  {'PSNR dB (min)':>13} "
        f"{'SSIM (min)':>10}  speed verdict / quality verdict"
    ]
    for name, row in demo["rows"].items():
        d = row["denoise_s"]
        ps = [p for p in row["psnr_db_vs_uncached"] if p is not None]
        psnr_cell = f"{statistics.median(ps):.1f} ({min(ps):.1f})" if ps else "identical"
        ss = row["ssim_vs_uncached"]
        q = (row.get("quality") or {}).get("verdict", "-")
        lines.append(
            f"{name:<14} {row['steps']:>5} {d['median']:>8.2f} ({d['min']:.2f}-{d['max']:.2f}) "
            f"{row['speedup_vs_uncached']:>7.2f}x  {psnr_cell:>13} {statistics.median(ss):.4f} ({min(ss):.4f})  "
            f"{row['speed_verdict']['verdict']} / {q}"
        )
    floor = demo["seed_to_seed_psnr_db"]
    lines.append(
        f"seed-to-seed (uncached seed A vs B): PSNR {statistics.median(floor):.1f} dB (min {min(floor):.1f})"
    )
    return "\n".join(lines)


def _table_maisi(maisi: dict[str, Any]) -> str:
    lines = []
    for dtype, block in maisi["by_dtype"].items():
        passes = ", ".join(
            f"{k} {v['median']:.1f}s ({v['min']:.1f}-{v['max']:.1f})" for k, v in block["pass_s"].items()
        )
        lines.append(f"MAISI {dtype}: passes {passes}; decode {block['decode_s']:.0f}s")
        for name, row in block["projected"].items():
            extra = (
                f" ({row['speedup_vs_uncached_projected']:.2f}x)"
                if "speedup_vs_uncached_projected" in row
                else ""
            )
            lines.append(f"  {name:<14} projected {row['projected_s'] / 60:5.1f} min{extra}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--profile", action="store_true", help="only the per-level profile of the three U-Nets"
    )
    parser.add_argument(
        "--parts", default="demo,maisi", help="demo, maisi or demo,maisi (the default; without --profile)"
    )
    parser.add_argument("--seeds", type=int, default=4, help="seeds per set (the quality report needs 4)")
    parser.add_argument("--rows", default=",".join(DEMO_ROWS), help="demo rows, comma-separated")
    parser.add_argument("--repeats", type=int, default=2, help="profile / MAISI passes per row")
    parser.add_argument("--maisi-levels", default="1,2")
    parser.add_argument("--maisi-fp32", action="store_true", help="MAISI in fp32 too (twice as long)")
    parser.add_argument("--maisi-dtypes", default="", help="MAISI precisions, e.g. fp32 (default: bf16)")
    parser.add_argument("--maisi-no-decode", action="store_true", help="MAISI per-step times only, no decode")
    parser.add_argument("--out", default="build/benchmarks/step_cache.json")
    parser.add_argument(
        "--runs-dir",
        default="build/benchmarks/step_cache_runs",
        help="where the demo's runs are kept (seed groups may run in parallel processes into one folder)",
    )
    parser.add_argument(
        "--seed-group", default="", help="only measure these seeds of set A and B (e.g. 1,101)"
    )
    parser.add_argument("--summarise-only", action="store_true", help="only summarise the runs already kept")
    args = parser.parse_args(argv)
    parts = set(args.parts.split(","))
    if not parts <= {"demo", "maisi"}:
        parser.error(f"--parts takes demo, maisi or demo,maisi, got {args.parts!r}")
    record: dict[str, Any] = {"machine_before": machine()}
    print("machine:", json.dumps(record["machine_before"]), flush=True)
    if args.profile:
        record["profile"] = run_profile(args.repeats)
    else:
        if "demo" in parts:
            rows = [r for r in args.rows.split(",") if r]
            unknown = [r for r in rows if r not in DEMO_ROWS]
            if unknown:
                parser.error(f"unknown row(s) {unknown}; known: {', '.join(DEMO_ROWS)}")
            rows = ["uncached", *[r for r in rows if r != "uncached"]]
            seeds_a = list(range(1, args.seeds + 1))
            seeds_b = list(range(101, 101 + args.seeds))
            folder = Path(args.runs_dir)
            if args.seed_group:
                group = {int(v) for v in args.seed_group.split(",")}
                measure_demo(
                    [s for s in seeds_a if s in group], [s for s in seeds_b if s in group], rows, folder
                )
                print(f"runs kept in {folder}")
                return 0
            if not args.summarise_only:
                measure_demo(seeds_a, seeds_b, rows, folder)
            record["demo"] = run_demo(seeds_a, seeds_b, rows, folder)
        if "maisi" in parts:
            record["maisi"] = run_maisi(
                args.repeats,
                [int(v) for v in args.maisi_levels.split(",")],
                [2, 3, 4, 5],
                args.maisi_dtypes.split(",")
                if args.maisi_dtypes
                else ["bf16", "fp32"]
                if args.maisi_fp32
                else ["bf16"],
                decode=not args.maisi_no_decode,
            )
    record["machine_after"] = machine()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2, default=str))
    print("load before:", record["machine_before"]["uptime"])
    print("load after: ", record["machine_after"]["uptime"])
    if "profile" in record:
        for name, block in record["profile"].items():
            f = block["full_pass_s"]
            print(
                f"{name}: full pass {f['median']:.2f}s ({f['min']:.2f}-{f['max']:.2f}), input {block['input']}"
            )
            print("  share: " + ", ".join(f"{k} {100 * v:.0f}%" for k, v in block["parts_share"].items()))
            for level, row in block["by_level"].items():
                print(
                    f"  level {level}: cached pass {100 * row['cached_share_of_full']:.0f}% of a full one, best "
                    f"{row['best_speedup_per_cached_step']:.2f}x per cached step; k=3 at best "
                    f"{row['best_speedup_k3']:.2f}x, k=5 {row['best_speedup_k5']:.2f}x"
                )
    if "demo" in record:
        print(_table_demo(record["demo"]))
    if "maisi" in record:
        print(_table_maisi(record["maisi"]))
    print(f"full numbers: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
