"""Phantom cohorts for the quality report's tests: two-compartment "brains" whose sizes vary with the seed."""

from __future__ import annotations

import numpy as np

SHAPE = (16, 24, 16)
VOXEL_ML = 0.008


def phantom(seed: int, *, brighter: float = 0.0, noise: float = 0.0, gm_ml: float = 0.0):
    """A two-compartment "brain" whose sizes vary with the seed, and its tissue volumes in mL."""
    rng = np.random.default_rng(seed)
    x, y, z = np.meshgrid(*[np.linspace(-1, 1, s) for s in SHAPE], indexing="ij")
    r2 = x**2 + y**2 + z**2
    outer, inner = 0.8 + 0.04 * rng.standard_normal(), 0.5 + 0.04 * rng.standard_normal()
    brain, core = r2 < outer**2, r2 < inner**2
    volume = 0.6 * brain + 0.3 * core + 0.02 * rng.standard_normal(SHAPE)
    volume = volume + brighter * brain + noise * rng.standard_normal(SHAPE)
    tissue = {
        "GM": float((brain & ~core).sum() * VOXEL_ML) + gm_ml,
        "WM": float(core.sum() * VOXEL_ML),
        "CSF": 2.0 + 0.1 * rng.standard_normal(),
    }
    return volume.astype(np.float32), tissue


def phantom_set(seeds, **kw):
    made = [phantom(s, **kw) for s in seeds]
    return [v for v, _ in made], [t for _, t in made]


def phantom_run():
    """A ``QualityRun`` over phantoms, as ``quality_run`` returns it: 8 seeds a set, every fp32 volume passing its
    anatomy check; "brighter" moves the images (and passes its checks), "less GM" moves the tissue volumes and
    half of its volumes fail their anatomy checks."""
    from engine.quality import noise_floor, quality_report
    from engine.quality.run import QualityRun

    seeds_a, seeds_b = list(range(8)), list(range(100, 108))
    a, ta = phantom_set(seeds_a)
    b, tb = phantom_set(seeds_b)
    passing = ["within"] * 8
    floor = noise_floor(
        a,
        b,
        tissue_a=ta,
        tissue_b=tb,
        voxel_ml=VOXEL_ML,
        tissue_source="model",
        checks_a=passing,
        checks_b=passing,
    )
    common = {"voxel_ml": VOXEL_ML, "seeds": seeds_a, "noise_seeds": seeds_b, "reference_checks": passing}
    noise_check = quality_report(
        a,
        b,
        floor,
        reference_tissue=ta,
        candidate_tissue=tb,
        label="fp32, seeds B",
        candidate_checks=passing,
        **common,
    )
    settings = {
        "brighter": ({"brighter": 0.15}, passing),
        "less GM": ({"gm_ml": -20.0}, ["within", "outside"] * 4),
    }
    reports = {}
    for label, (change, checks) in settings.items():
        c, tc = phantom_set(seeds_a, **change)
        reports[label] = quality_report(
            a,
            c,
            floor,
            reference_tissue=ta,
            candidate_tissue=tc,
            label=label,
            candidate_checks=checks,
            **common,
        )
    return QualityRun(
        reports=reports,
        seeds=seeds_a,
        noise_seeds=seeds_b,
        tissue_source="model",
        noise_check=noise_check,
        space="MNI152NLin2009aSym",
    )
