"""Whole default generations, as a user runs them: ``volsynth generate`` per setting, in fresh processes.

``python -m benchmarks.generation --settings fp32,fastest-here --repeats 3 --out DIR`` runs the shipped
model's default generation (its default steps and guidance, the whole process: start-up, imports, load,
preparation, sampling, decode, writing) once per setting to fill the one-off caches (int8 calibration),
reported apart, then ``--repeats`` times interleaved (the order rotates), and judges each setting against
the first by the noise rule (engine.metrics.speed_verdict) on the whole-process wall times. It writes
``generation.json`` (with the machine's probe) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np


def _run(setting: str, model: str, folder: Path, seed: int) -> dict:
    out = folder / f"{uuid.uuid4().hex[:12]}.nii.gz"
    cmd = [
        sys.executable,
        "-m",
        "engine",
        "generate",
        "--settings",
        setting,
        "--seed",
        str(seed),
        "--out",
        str(out),
    ]
    if model:
        cmd += ["--model", model]
    started = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ})
    wall = time.perf_counter() - started
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["no output"])[-1][:300], "wall_s": wall}
    sidecar = json.loads(out.with_suffix("").with_suffix(".json").read_text())
    import nibabel

    volume = np.asarray(nibabel.load(str(out)).dataobj, dtype=np.float32)
    for path in folder.glob(out.name.split(".")[0] + "*"):
        path.unlink()
    return {
        "wall_s": wall,
        "timings": sidecar["timings"],
        "report": sidecar["optimization"]["report"],
        "volume": volume,
    }


def main(argv: list[str] | None = None) -> int:
    from engine.machine.probe import probe_machine
    from engine.measure.harness import interleaved, median_iqr, speed_verdict
    from engine.metrics.image import compare

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--settings", default="fp32,fastest-here", help="comma-separated; the first is the reference"
    )
    parser.add_argument("--model", default="")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="build/generation-bench")
    args = parser.parse_args(argv)
    settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="volsynth-genbench-"))
    probe = probe_machine()
    load = [os.getloadavg()[0]]
    first = {s: _run(s, args.model, scratch, args.seed) for s in settings}  # fills the one-off caches
    runs: dict[str, list[dict]] = {s: [] for s in settings}
    for repeat, setting in interleaved(settings, args.repeats):
        print(f"[repeat {repeat + 1}/{args.repeats}] {setting}", flush=True)
        runs[setting].append(_run(setting, args.model, scratch, args.seed))
        load.append(os.getloadavg()[0])
    reference = settings[0]
    ref_walls = [r["wall_s"] for r in runs[reference] if "error" not in r]
    ref_volume = next(r["volume"] for r in runs[reference] if "volume" in r)
    rows = []
    for setting in settings:
        ok = [r for r in runs[setting] if "error" not in r]
        if not ok:
            rows.append({"setting": setting, "error": runs[setting][0]["error"]})
            continue
        walls = [r["wall_s"] for r in ok]
        verdict = speed_verdict(ref_walls, walls)
        wall_median, wall_iqr = median_iqr(walls)
        rows.append(
            {
                "setting": setting,
                "wall_s_median": wall_median,
                "wall_s_iqr": wall_iqr,
                "wall_s_all": walls,
                "first_run_s": first[setting].get("wall_s"),
                "one_off_s": first[setting].get("wall_s", 0.0) - wall_median,
                "load_s_median": float(np.median([r["timings"].get("load_s", 0.0) for r in ok])),
                "decode_s_median": float(np.median([r["timings"].get("decode_s", 0.0) for r in ok])),
                "speedup": float(np.median(ref_walls) / np.median(walls)),
                "verdict": {"verdict": "reference"}
                if setting == reference
                else verdict.to_dict(setting, reference),
                "applied": sorted(k for k, e in ok[0]["report"].items() if e.get("applied")),
                **{k: v for k, v in compare(ref_volume, ok[0]["volume"]).items()},
            }
        )
    summary = {
        "machine": probe.to_dict(),
        "machine_words": probe.describe(),
        "model": args.model or "brain-t1-demo (shipped)",
        "repeats": args.repeats,
        "load_average_1min": {"min": min(load), "max": max(load)},
        "method": "whole `volsynth generate` processes at the model's defaults, one warm-up run per setting "
        "(fills the calibration cache; its extra time is one_off_s), then interleaved repeats",
        "rows": rows,
    }
    (out / "generation.json").write_text(json.dumps(summary, indent=2, default=str))
    print(f"{probe.describe()}; load average {min(load):.1f}-{max(load):.1f}")
    print(
        f"{'setting':22s} {'wall s':>7s} {'IQR':>5s} {'x ref':>6s} {'verdict':>9s} {'PSNR dB':>8s} {'one-off s':>9s}"
    )
    for row in rows:
        if "error" in row:
            print(f"{row['setting']:22s} ERROR {row['error']}")
            continue
        psnr = "exact" if np.isinf(row["psnr_db"]) else f"{row['psnr_db']:.1f}"
        print(
            f"{row['setting']:22s} {row['wall_s_median']:7.1f} {row['wall_s_iqr']:5.1f} {row['speedup']:6.2f} "
            f"{row['verdict']['verdict']:>9s} {psnr:>8s} {row['one_off_s']:9.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
