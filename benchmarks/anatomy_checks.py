"""Measure ``engine.anatomy.checks`` on brains that must pass and on volumes that must be flagged.

    python -m benchmarks.anatomy_checks [--seeds 16] [--steps N] [--segment-generated] [--json OUT]

Cases (expected verdict in brackets):
  template-maps       the shipped MNI152 2009 (nilearn's files) maps on the shipped model's 2 mm grid, with its ventricle label [pass]
  template-t1         the MNI152 2009 1 mm T1 template, segmented (``engine.anatomy.segment``) then checked [pass]
  demo seed N         the shipped model's volumes, seeds 0..N-1, checked from their own decoded channels [pass];
                      ``--segment-generated`` also segments each image and checks those maps (agreement)
  enlarged-ventricles the 1 mm T1 template with its ventricles grown by hand (dilated and set to the CSF
                      intensity), segmented then checked [outside range: ventricle volume]
  noise-maps          random probability maps inside the template's brain mask [not brain-like, by evidence]
  maisi-random        a random-weights NV-Generate-MR-Brain (MAISI v2) network at a small size, its T1w output
                      segmented then checked [not brain-like]

The machine is shared and noisy: the load before and after and the spread of the check times are printed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def _row(case: str, expected: str, check, seconds: float, **extra) -> dict:
    status = check.status
    ok = {
        "pass": status == "within",
        "outside": status == "outside",
        "not_brain_like": status == "not_brain_like",
    }
    return {
        "case": case,
        "expected": expected,
        "status": status,
        "as_expected": ok[expected],
        "verdict": check.verdict,
        "measures": {m.name: m.value for m in check.measures},
        "evidence": check.evidence,
        "also_measured": check.extra,
        "check_s": seconds,
        **extra,
    }


def _timed(function, *args, **kwargs):
    started = time.perf_counter()
    value = function(*args, **kwargs)
    return value, time.perf_counter() - started


def _template_1mm_t1():
    from engine.anatomy.template import _template_data

    ds = _template_data()
    img = ds.load_mni152_template(resolution=1)
    mask = np.asarray(ds.load_mni152_brain_mask(resolution=1).get_fdata() > 0.5)
    t1 = np.asarray(img.get_fdata(), np.float32)
    return t1, mask, np.asarray(img.affine, np.float64)


def template_cases() -> list[dict]:
    from engine.anatomy.checks import check_image, check_maps
    from engine.anatomy.template import MNI_SPACE, crop_affine, template_maps

    m = template_maps()
    csf = np.clip(m["mask"] - m["gm"] - m["wm"], 0, 1)
    maps = {"GM": m["gm"], "WM": m["wm"], "CSF": csf, "ventricles": m["ventricles"]}
    rows = []
    check, seconds = _timed(check_maps, maps, crop_affine(), space=MNI_SPACE, maps_from="template maps")
    rows.append(_row("template-maps", "pass", check, seconds))
    t1, _mask, affine = _template_1mm_t1()
    check, seconds = _timed(check_image, t1, affine, "t1w", space=MNI_SPACE)
    rows.append(_row("template-t1", "pass", check, seconds))
    return rows


def enlarged_ventricles_case(grow_mm: float) -> dict:
    """The 1 mm template with its ventricle label dilated by ``grow_mm`` and filled with the CSF intensity."""
    from scipy import ndimage

    from engine.anatomy.checks import check_image
    from engine.anatomy.segment import _dilate
    from engine.anatomy.template import MNI_SPACE, crop_affine, template_maps

    t1, mask, affine = _template_1mm_t1()
    vent_2mm = template_maps()["ventricles"]
    vox = np.linalg.inv(crop_affine()) @ affine  # template 1 mm voxel -> output-grid voxel (same MNI world)
    vent = ndimage.affine_transform(vent_2mm, vox, output_shape=t1.shape, order=1) >= 0.5
    grown = _dilate(vent, np.ones(3), grow_mm) & ndimage.binary_erosion(mask, iterations=6)
    csf_level = float(np.median(t1[vent]))
    edited = np.where(grown, csf_level, t1).astype(np.float32)
    check, seconds = _timed(check_image, edited, affine, "t1w", space=MNI_SPACE)
    return _row(
        f"enlarged-ventricles (+{grow_mm:g} mm)",
        "outside",
        check,
        seconds,
        ventricles_drawn_ml=float(grown.sum()) / 1000.0,
        template_ventricles_ml=float(vent.sum()) / 1000.0,
    )


def noise_case() -> dict:
    from engine.anatomy.checks import check_maps
    from engine.anatomy.template import MNI_SPACE, crop_affine, template_maps

    mask = template_maps()["mask"]
    rng = np.random.default_rng(0)
    noise = rng.random((3, *mask.shape)).astype(np.float32)
    noise /= noise.sum(0)
    maps = {name: noise[k] * mask for k, name in enumerate(("GM", "WM", "CSF"))}
    check, seconds = _timed(check_maps, maps, crop_affine(), space=MNI_SPACE, maps_from="noise")
    return _row("noise-maps", "not_brain_like", check, seconds)


def maisi_case() -> dict:
    from engine.anatomy.checks import check_image
    from engine.api import SamplingRequest, run
    from engine.backends.local import LocalBackend
    from engine.models.registry import ModelRegistry
    from engine.testing import write_maisi_folder

    size, spacing = (32, 32, 32), (7.52, 7.52, 5.44)  # the recommended T1 field of view, few voxels
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_maisi_folder(Path(tmp) / "NV-Generate-CTMR", dim=size, spacing=spacing)
        backend = LocalBackend("cpu", ModelRegistry([Path(tmp)]))
        request = SamplingRequest(model=str(folder), steps=2, seed=0, modality="t1w-skullstripped")
        result = run(backend.sample(request))
    check, seconds = _timed(check_image, result.volume(0), result.affine, "t1w", space=result.space)
    return _row("maisi-random (32^3, 2 steps)", "not_brain_like", check, seconds)


def demo_cases(seeds: int, steps: int | None, segment_too: bool) -> list[dict]:
    from engine.anatomy.checks import check_image, check_maps
    from engine.api import SamplingRequest, run
    from engine.backends.factory import make_backend

    backend = make_backend("cpu")
    rows = []
    for seed in range(seeds):
        request = SamplingRequest(model="brain-t1-demo", seed=seed, **({"steps": steps} if steps else {}))
        result, gen_s = _timed(lambda r=request: run(backend.sample(r)))
        maps = result.tissue_maps(0)
        check, seconds = _timed(
            check_maps, maps, result.affine, space=result.space, maps_from="model channels"
        )
        extra = {"generate_s": gen_s, "conditioning": result.provenance.get("conditioning")}
        if segment_too:
            seg, seg_s = _timed(check_image, result.volume(0), result.affine, "t1w", space=result.space)
            extra.update(
                segmented_status=seg.status,
                segmented_measures={m.name: m.value for m in seg.measures},
                segmented_check_s=seg_s,
            )
        rows.append(_row(f"demo seed {seed}", "pass", check, seconds, **extra))
        print(
            f"demo seed {seed}: {check.summary()} (generated in {gen_s:.0f} s)", file=sys.stderr, flush=True
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    from benchmarks.step_cache import machine

    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.anatomy_checks", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--seeds", type=int, default=16, help="shipped-model volumes, seeds 0..N-1")
    parser.add_argument("--steps", type=int, default=None, help="denoising steps (default: the model's)")
    parser.add_argument("--segment-generated", action="store_true", help="also segment each generated image")
    parser.add_argument("--grow-mm", type=float, default=6.0, help="how far the ventricles are grown by hand")
    parser.add_argument("--json", type=Path, help="write every number here")
    args = parser.parse_args(argv)
    before = machine()
    print(
        f"machine: {before['cpu']}, {before['cores']} cores; load before: {before['uptime']}", file=sys.stderr
    )
    rows = template_cases()
    rows.append(enlarged_ventricles_case(args.grow_mm))
    rows.append(noise_case())
    rows.append(maisi_case())
    for row in rows:
        print(f"{row['case']}: {row['verdict']}", file=sys.stderr, flush=True)
    rows += demo_cases(args.seeds, args.steps, args.segment_generated)
    after = machine()
    print(f"machine: {before['cpu']}, {before['cores']} cores")
    print(f"load before: {before['uptime']}")
    print(f"load after:  {after['uptime']}")
    print(f"{'case':<34} {'expected':<15} {'got':<15} {'ok':<3} {'check s':>7}  verdict")
    for r in rows:
        print(
            f"{r['case']:<34} {r['expected']:<15} {r['status']:<15} {'yes' if r['as_expected'] else 'NO':<3} "
            f"{r['check_s']:>7.1f}  {r['verdict'][:110]}"
        )
    demo = [r for r in rows if r["case"].startswith("demo")]
    if demo:
        names = list(demo[0]["measures"])
        print(f"shipped model, {len(demo)} volumes: {sum(r['as_expected'] for r in demo)} pass")
        for name in names:
            values = [r["measures"][name] for r in demo]
            print(
                f"  {name:<20} min {min(values):.4g}  median {float(np.median(values)):.4g}  max {max(values):.4g}"
            )
        for key in demo[0]["evidence"]:
            values = [r["evidence"][key] for r in demo]
            print(f"  evidence {key:<22} min {min(values):.3f}  max {max(values):.3f}")
        gen = [r["generate_s"] for r in demo]
        print(f"  generation s: min {min(gen):.1f} median {float(np.median(gen)):.1f} max {max(gen):.1f}")
    checks = [r["check_s"] for r in rows]
    print(
        f"check time s (all cases): min {min(checks):.2f} median {float(np.median(checks)):.2f} max {max(checks):.2f}"
    )
    failed = [r["case"] for r in rows if not r["as_expected"]]
    print("all as expected" if not failed else f"NOT as expected: {', '.join(failed)}")
    if args.json:
        args.json.write_text(
            json.dumps({"machine": [before, after], "rows": rows}, indent=2, default=float) + "\n"
        )
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
