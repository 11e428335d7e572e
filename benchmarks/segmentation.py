"""Measure ``engine.anatomy.segment``: Dice against reference maps, time and peak memory.

    python -m benchmarks.segmentation [--generated DIR] [--repeats 3] [--ants] [--no-dice] [--no-timing] [--json OUT]

    python -m benchmarks.segmentation --poses [--ants]     # the head-pose and head-shape cases alone

Cases (Dice of the maps thresholded at 0.5 against the reference thresholded at 0.5):
  template-t1      the shipped MNI152 2009 (nilearn's files) 1 mm template vs its own GM/WM maps
  template-t2      the same, intensities inside the brain remapped as 1 - T1 (CSF > GM > WM)
  template-flair   the same, remapped so CSF is dark and GM brighter than WM
  template-head    the T1 template wrapped in a synthetic CSF gap, dark skull and bright scalp (whole-head)
  pose-<c>-<axis><deg>  the T1 (or T2-like) template rotated by 10, 15 and 20 degrees about x, y or z through the
                   brain's centre, its GM/WM maps moved the same way (linear interpolation, then > 0.5)
  shape-<c>-<seed> a head of another shape: the template through a random affine (rotation up to 15 degrees,
                   scale 0.88-1.08, shift up to 6 mm) and a smooth displacement of a few mm, times a bias field of
                   +-20 %, plus 3 % noise; the reference maps moved the same way
  generated        each ``*.nii.gz`` in DIR with ``_label-GM/WM_probseg`` maps beside it (``volsynth generate``
                   with the shipped demo model writes them) vs those maps
Timing: a 256x256x128 volume (the template on a 0.94 x 0.94 x 1.5 mm grid, noise added) and an 80x96x80 one,
each segmented in a fresh process ``--repeats`` times: wall time and the process's peak resident memory.
``--ants`` also runs antspyx (affine registration of the template + Atropos with its priors) on the template
cases and the first generated volume, for the comparison docs/segment.md reports; antspyx is not a dependency.

The machine is shared and noisy: the spread of the repeats is printed with the median.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def _template():
    from engine.anatomy.template import _template_data

    ds = _template_data()
    t1 = ds.load_mni152_template(resolution=1)
    gm = ds.load_mni152_gm_template(resolution=1).get_fdata() > 0.5
    wm = ds.load_mni152_wm_template(resolution=1).get_fdata() > 0.5
    mask = ds.load_mni152_brain_mask(resolution=1).get_fdata() > 0.5
    return np.asarray(t1.get_fdata(), np.float32), np.asarray(t1.affine), gm, wm, mask


def _flair_like(t1: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """FLAIR-like intensities from the T1 template: the template's CSF, GM and WM levels (about 0.1, 0.6 and 0.92)
    sent to 0.1, 0.7 and 0.5, linearly in between: CSF dark, GM brighter than WM."""
    flair = np.interp(t1, [0.0, 0.1, 0.6, 0.92, 1.0], [0.0, 0.1, 0.7, 0.5, 0.5])
    return np.where(mask, flair, 0.0).astype(np.float32)


def _with_head(t1: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The skull-stripped template inside synthetic head layers (1 mm voxels): 2 mm CSF, 5 mm skull, 4 mm scalp."""
    from scipy import ndimage

    outside = ndimage.distance_transform_edt(~mask)
    rng = np.random.default_rng(0)
    head = t1.copy()
    head[(outside > 0) & (outside <= 2)] = 0.15
    head[(outside > 2) & (outside <= 7)] = 0.05
    head[(outside > 7) & (outside <= 11)] = 0.75
    return (head + rng.normal(0, 0.01, head.shape)).astype(np.float32)


def _dice_row(name, maps, gm, wm, seconds, method):
    from engine.anatomy.segment import dice

    return {
        "case": name,
        "method": method,
        "dice_gm": round(dice(maps["GM"] > 0.5, gm), 4),
        "dice_wm": round(dice(maps["WM"] > 0.5, wm), 4),
        "seconds": round(seconds, 2),
    }


def _ours(volume, affine, contrast):
    from engine.anatomy.segment import segment

    start = time.perf_counter()
    maps = segment(volume, affine, contrast).maps
    return maps, time.perf_counter() - start


def _ants(volume, affine, priors_img, contrast):
    """antspyx: affine (mutual information) registration of the template T1 to the volume, its priors warped,
    Atropos with those priors (prior weight 0.25) inside the warped template mask."""
    import ants

    t1, gm, wm, mask, taffine = priors_img
    start = time.perf_counter()

    def to_ants(array, aff):
        # ANTs uses LPS: flip x and y of the RAS affine.
        lps = np.diag([-1.0, -1.0, 1.0, 1.0]) @ aff
        spacing = np.sqrt((lps[:3, :3] ** 2).sum(0))
        return ants.from_numpy(
            np.asarray(array, np.float32),
            origin=tuple(lps[:3, 3]),
            spacing=tuple(spacing),
            direction=lps[:3, :3] / spacing,
        )

    fixed = to_ants(volume, affine)
    moving = to_ants(t1 if contrast == "t1w" else np.where(mask, 1 - t1, 0), taffine)
    reg = ants.registration(fixed=fixed, moving=moving, type_of_transform="Affine")
    warped = [
        ants.apply_transforms(fixed, to_ants(p, taffine), reg["fwdtransforms"])
        for p in (np.clip(mask * (1 - gm - wm), 0, 1), gm, wm, mask.astype(np.float32))
    ]
    amask = ants.threshold_image(warped[3], 0.5, 2.0)
    seg = ants.atropos(a=fixed, x=amask, i=warped[:3], m="[0.1,1x1x1]", c="[5,0]", priorweight=0.25)
    probs = [p.numpy() for p in seg["probabilityimages"]]
    return {"CSF": probs[0], "GM": probs[1], "WM": probs[2]}, time.perf_counter() - start


def _rotation(axis: int, degrees: float) -> np.ndarray:
    from engine.anatomy.register import rotation_matrix

    angles = np.zeros(3)
    angles[axis] = np.deg2rad(degrees)
    return rotation_matrix(angles)


def _moved(arrays, affine: np.ndarray, coords: np.ndarray) -> list[np.ndarray]:
    """Each array read at voxel coordinates ``coords`` (3, x, y, z) of the same grid (linear, 0 outside)."""
    from scipy import ndimage

    return [
        ndimage.map_coordinates(np.asarray(a, np.float32), coords, order=1, mode="constant").astype(
            np.float32
        )
        for a in arrays
    ]


def _pull_coords(shape, affine: np.ndarray, world_to_source: np.ndarray, displacement=None) -> np.ndarray:
    """For each output voxel, the source voxel it reads: world point -> (its displacement added) -> the source's
    world point by ``world_to_source`` (4x4) -> the source voxel (the same grid)."""
    grid = np.indices(shape, dtype=np.float32).reshape(3, -1)
    world = affine[:3, :3] @ grid + affine[:3, 3:4]
    if displacement is not None:
        world = world + displacement.reshape(3, -1)
    source = world_to_source[:3, :3] @ world + world_to_source[:3, 3:4]
    vox = np.linalg.inv(affine)
    return (vox[:3, :3] @ source + vox[:3, 3:4]).reshape(3, *shape)


def _about(centre: np.ndarray, linear: np.ndarray, shift=np.zeros(3)) -> np.ndarray:
    """x -> centre + linear (x - centre) + shift, as 4x4."""
    out = np.eye(4)
    out[:3, :3] = linear
    out[:3, 3] = centre + shift - linear @ centre
    return out


def pose_cases(contrasts=("t1w", "t2w"), degrees=(10, 15, 20)):
    """(name, volume, affine, contrast, gm, wm) of the template rotated through its brain's centre."""
    from engine.anatomy.register import moments

    t1, affine, gm, wm, mask = _template()
    centre, _sd = moments(mask, affine)
    for contrast in contrasts:
        for axis, axis_name in enumerate("xyz"):
            for deg in degrees:
                # the output shows the head rotated by R: it reads the source at R^-1
                coords = _pull_coords(t1.shape, affine, _about(centre, _rotation(axis, deg).T))
                volume, gm_r, wm_r, mask_r = _moved([t1, gm, wm, mask], affine, coords)
                if contrast == "t2w":
                    volume = np.where(mask_r > 0.5, 1.0 - volume, 0.0).astype(np.float32)
                yield f"pose-{contrast}-{axis_name}{deg}", volume, affine, contrast, gm_r > 0.5, wm_r > 0.5


def shape_cases(contrasts=("t1w", "t2w"), seeds=(0, 1)):
    """(name, volume, affine, contrast, gm, wm) of heads of other shapes (see the module's docstring)."""
    from scipy import ndimage

    from engine.anatomy.register import moments, rotation_matrix

    t1, affine, gm, wm, mask = _template()
    centre, _sd = moments(mask, affine)
    for seed in seeds:
        rng = np.random.default_rng(seed)
        rotation = rotation_matrix(rng.uniform(-1, 1, 3) * np.deg2rad(15.0))
        scale = rng.uniform(0.88, 1.08, 3)
        shift = rng.uniform(-6.0, 6.0, 3)
        # the head is the template scaled, rotated and shifted: read the source through the inverse
        forward = _about(centre, rotation @ np.diag(scale), shift)
        # a smooth displacement: noise low-passed at 12 mm, scaled so its largest component is 4 mm
        field = np.stack([ndimage.gaussian_filter(rng.normal(size=t1.shape[:3]), 12.0) for _ in range(3)])
        field *= 4.0 / np.abs(field).max()
        coords = _pull_coords(t1.shape, affine, np.linalg.inv(forward), field.astype(np.float32))
        t1_m, gm_m, wm_m, mask_m = _moved([t1, gm, wm, mask], affine, coords)
        bias = ndimage.gaussian_filter(rng.normal(size=t1.shape), 30.0)
        bias = 1.0 + 0.2 * bias / np.abs(bias).max()
        for contrast in contrasts:
            clean = t1_m if contrast == "t1w" else np.where(mask_m > 0.5, 1.0 - t1_m, 0.0)
            noise = rng.normal(0.0, 0.03 * float(np.percentile(clean[mask_m > 0.5], 99)), t1.shape)
            volume = (clean * bias + noise).astype(np.float32)
            yield f"shape-{contrast}-{seed}", volume, affine, contrast, gm_m > 0.5, wm_m > 0.5


def _ants_priors():
    from engine.anatomy.template import _template_data

    t1, affine, _gm, _wm, mask = _template()
    ds = _template_data()
    gmp = np.clip(ds.load_mni152_gm_template(resolution=1).get_fdata(), 0, 1)
    wmp = np.clip(ds.load_mni152_wm_template(resolution=1).get_fdata(), 0, 1)
    return t1, gmp, wmp, mask, affine


def moved_cases(with_ants: bool, ours: bool = True) -> list[dict]:
    """Dice of the pose and shape cases, with the largest |GM + WM + CSF + background - 1| of each result.
    ``ours`` False runs Atropos alone (antspyx pins an older numpy and scipy: it runs in an environment of its
    own, see docs/segment.md)."""
    from engine.anatomy.partition import partition_error

    rows = []
    priors = _ants_priors() if with_ants else None
    for name, volume, affine, contrast, gm, wm in [*pose_cases(), *shape_cases()]:
        if ours:
            maps, seconds = _ours(volume, affine, contrast)
            row = _dice_row(name, maps, gm, wm, seconds, "volsynth")
            rows.append({**row, "partition_error": partition_error(maps)})
            print(rows[-1], file=sys.stderr, flush=True)
        if priors is not None:
            maps, seconds = _ants(volume, affine, priors, contrast)
            rows.append(_dice_row(name, maps, gm, wm, seconds, "antspyx-atropos"))
            print(rows[-1], file=sys.stderr, flush=True)
    return rows


def dice_cases(generated: Path | None, with_ants: bool) -> list[dict]:
    import nibabel as nib

    t1, affine, gm, wm, mask = _template()
    t2 = np.where(mask, 1.0 - t1, 0.0).astype(np.float32)
    rows = []
    cases = [
        ("template-t1", t1, "t1w"),
        ("template-t2", t2, "t2w"),
        ("template-head", _with_head(t1, mask), "t1w"),
    ]
    for name, volume, contrast in cases:
        maps, seconds = _ours(volume, affine, contrast)
        rows.append(_dice_row(name, maps, gm, wm, seconds, "volsynth"))
        print(rows[-1], file=sys.stderr, flush=True)
    priors = None
    if with_ants:
        priors = _ants_priors()
        for name, volume, contrast in cases[:2]:
            maps, seconds = _ants(volume, affine, priors, contrast)
            rows.append(_dice_row(name, maps, gm, wm, seconds, "antspyx-atropos"))
            print(rows[-1], file=sys.stderr, flush=True)
    if generated:
        images = sorted(p for p in generated.glob("*.nii.gz") if "_probseg" not in p.name)
        for i, path in enumerate(images):
            ref_gm, ref_wm = (
                nib.load(str(path).replace(".nii.gz", f"_label-{k}_probseg.nii.gz")).get_fdata() > 0.5
                for k in ("GM", "WM")
            )
            img = nib.load(str(path))
            volume = np.asarray(img.get_fdata(), np.float32)
            maps, seconds = _ours(volume, img.affine, "t1w")
            rows.append(_dice_row(f"generated:{path.name}", maps, ref_gm, ref_wm, seconds, "volsynth"))
            print(rows[-1], file=sys.stderr, flush=True)
            if priors is not None and i == 0:
                maps, seconds = _ants(volume, img.affine, priors, "t1w")
                rows.append(
                    _dice_row(f"generated:{path.name}", maps, ref_gm, ref_wm, seconds, "antspyx-atropos")
                )
                print(rows[-1], file=sys.stderr, flush=True)
    return rows


def _timing_volume(shape: tuple[int, int, int]) -> tuple[np.ndarray, np.ndarray]:
    """The template resampled onto a grid of ``shape`` covering 240 x 240 x 192 mm (80x96x80: the demo's 2 mm)."""
    from scipy import ndimage

    t1, taffine, _gm, _wm, _mask = _template()
    if shape == (80, 96, 80):
        from engine.anatomy.template import crop_affine

        affine = crop_affine()
    else:
        fov = np.array([240.0, 240.0, 192.0])
        spacing = fov / np.array(shape)
        affine = np.diag([*spacing, 1.0])
        affine[:3, 3] = -fov / 2 + np.array([0.0, -18.0, 10.0])
    vox = np.linalg.inv(taffine) @ affine
    volume = ndimage.affine_transform(t1, vox, output_shape=shape, order=1)
    volume += np.random.default_rng(0).normal(0, 0.01, shape).astype(np.float32)
    return volume.astype(np.float32), affine


def _peak_rss_bytes() -> int:
    """This process's peak resident memory: VmHWM, which starts afresh at exec (ru_maxrss would carry the
    high-water mark of the parent that forked it)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _one(shape_text: str) -> None:
    shape = tuple(int(n) for n in shape_text.split("x"))
    volume, affine = _timing_volume(shape)
    from engine.anatomy.segment import segment

    start = time.perf_counter()
    segment(volume, affine, "t1w")
    seconds = time.perf_counter() - start
    peak = _peak_rss_bytes()
    print(json.dumps({"shape": shape_text, "seconds": round(seconds, 2), "peak_rss_bytes": peak}))


def timing_cases(repeats: int) -> list[dict]:
    rows = []
    for shape in ("256x256x128", "80x96x80"):
        runs = []
        for _ in range(repeats):
            out = subprocess.run(
                [sys.executable, "-m", "benchmarks.segmentation", "--one", shape],
                capture_output=True,
                text=True,
                check=True,
            )
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        seconds = sorted(r["seconds"] for r in runs)
        peak = max(r["peak_rss_bytes"] for r in runs)
        rows.append(
            {
                "shape": shape,
                "seconds_median": seconds[len(seconds) // 2],
                "seconds_min": seconds[0],
                "seconds_max": seconds[-1],
                "peak_rss_gib": round(peak / 2**30, 3),
                "repeats": repeats,
            }
        )
        print(rows[-1], file=sys.stderr, flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.segmentation", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--generated", type=Path, help="folder of generated volumes with their probseg maps")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ants", action="store_true", help="also run antspyx Atropos (if installed)")
    parser.add_argument("--no-timing", action="store_true", help="skip the timing runs")
    parser.add_argument("--no-dice", action="store_true", help="skip the Dice cases")
    parser.add_argument("--poses", action="store_true", help="the head-pose and head-shape cases (alone)")
    parser.add_argument("--ants-only", action="store_true", help="with --poses --ants: Atropos alone")
    parser.add_argument("--json", type=Path, help="write every number here")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # one timing run in this process
    args = parser.parse_args(argv)
    if args.one:
        _one(args.one)
        return 0
    if args.poses:
        rows, timing = moved_cases(args.ants, ours=not args.ants_only), []
    else:
        rows = [] if args.no_dice else dice_cases(args.generated, args.ants)
        timing = [] if args.no_timing else timing_cases(args.repeats)
    print(f"{'case':<34} {'method':<16} {'GM':>6} {'WM':>6} {'s':>6}")
    for r in rows:
        print(
            f"{r['case']:<34} {r['method']:<16} {r['dice_gm']:>6.3f} {r['dice_wm']:>6.3f} {r['seconds']:>6.1f}"
        )
    for t in timing:
        print(
            f"{t['shape']:<12} median {t['seconds_median']:.1f} s (min {t['seconds_min']:.1f}, max "
            f"{t['seconds_max']:.1f}, {t['repeats']} runs), peak RSS {t['peak_rss_gib']:.2f} GiB"
        )
    if args.json:
        args.json.write_text(json.dumps({"dice": rows, "timing": timing}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
