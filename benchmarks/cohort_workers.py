"""Cohort throughput with 1 vs N local workers, and Ray's per-item overhead, measured side by side.

``python -m benchmarks.cohort_workers --model brain-t1-demo --volumes 8 --steps 5`` runs the same cohort once
per worker layout (workers x threads, same total threads) on one local Ray runtime, and reports volumes per
minute (steady state: from the first finished volume to the last, so worker start-up is left out, and with
start-up), whether the layouts gave bit-identical volumes, the load average around each run (these
machines are shared), and the cost of an empty actor call and of moving one volume through Ray.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from engine.cohort.runner import CohortProgress


def _layouts(cpus: int) -> list[tuple[int, int]]:
    out = [(1, cpus)]
    if cpus >= 2:
        out.append((cpus, 1))
    return out


def ray_overhead(calls: int = 200, shape=(80, 96, 80)) -> dict[str, float]:
    import ray

    class Echo:
        def ping(self) -> int:
            return 0

        def volume(self, shape):
            return np.zeros(shape, np.float32)

    echo = ray.remote(num_cpus=0)(Echo).remote()
    ray.get(echo.ping.remote())
    started = time.perf_counter()
    for _ in range(calls):
        ray.get(echo.ping.remote())
    call_ms = 1000 * (time.perf_counter() - started) / calls
    ray.get(echo.volume.remote(shape))
    started = time.perf_counter()
    for _ in range(20):
        ray.get(echo.volume.remote(shape))
    volume_ms = 1000 * (time.perf_counter() - started) / 20
    ray.kill(echo)
    return {"actor_call_ms": call_ms, "volume_return_ms": volume_ms, "volume_mb": 4 * np.prod(shape) / 1e6}


def main(argv: list[str] | None = None) -> int:
    from engine.cohort.runner import run_cohort, start_ray, stop_ray
    from engine.cohort.spec import CohortSpec

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="brain-t1-demo")
    parser.add_argument("--volumes", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--cpus", type=int, default=2, help="CPUs of the local runtime (threads in total)")
    parser.add_argument("--json", default=None, help="write the numbers here too")
    parser.add_argument("--reverse", action="store_true", help="run the many-worker layout first")
    args = parser.parse_args(argv)

    spec = CohortSpec.from_dict(
        {"name": "bench", "model": args.model, "steps": args.steps, "seeds": args.volumes, "sampler": "ddim"}
    )
    start_ray(num_cpus=args.cpus)
    rows = []
    digests = {}
    try:
        overhead = ray_overhead()
        layouts = _layouts(args.cpus)
        for workers, threads in reversed(layouts) if args.reverse else layouts:
            finished: list[float] = []

            def note_done(p: CohortProgress, finished: list[float] = finished) -> None:
                if p.event == "done":
                    finished.append(time.perf_counter())

            load_before = os.getloadavg()[0]
            with tempfile.TemporaryDirectory(prefix="volsynth-cohort-bench-") as tmp:
                summary = run_cohort(
                    spec,
                    Path(tmp) / "out",
                    workers=workers,
                    threads_per_worker=threads,
                    on_progress=note_done,
                )
                manifest = json.loads((Path(tmp) / "out/code/volsynth/manifest.json").read_text())
                digests[(workers, threads)] = {p: e["volume_sha256"] for p, e in manifest["items"].items()}
                seconds = [e["seconds"] for e in manifest["items"].values()]
            steady = 60 * (len(finished) - 1) / (finished[-1] - finished[0]) if len(finished) > 1 else 0.0
            rows.append(
                {
                    "workers": workers,
                    "threads_per_worker": threads,
                    "volumes": summary.done,
                    "volumes_per_min_steady": steady,
                    "volumes_per_min_with_startup": summary.volumes_per_min,
                    "median_worker_s_per_volume": float(np.median(seconds)),
                    "load_before": load_before,
                    "load_after": os.getloadavg()[0],
                }
            )
    finally:
        stop_ray()
    identical = len({json.dumps(d, sort_keys=True) for d in digests.values()}) == 1
    result = {
        "model": args.model,
        "steps": args.steps,
        "cpus": args.cpus,
        "layouts": rows,
        "bit_identical_across_layouts": identical,
        "ray": overhead,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    print(f"cohort bench: {args.volumes} volumes of {args.model}, {args.steps} steps, {args.cpus} CPUs")
    print(
        "workers x threads | vol/min steady | vol/min incl. start-up | s/volume (worker) | load before/after"
    )
    for r in rows:
        print(
            f"{r['workers']:>7} x {r['threads_per_worker']:<7} | {r['volumes_per_min_steady']:14.2f} | "
            f"{r['volumes_per_min_with_startup']:22.2f} | {r['median_worker_s_per_volume']:17.2f} | "
            f"{r['load_before']:.1f} / {r['load_after']:.1f}"
        )
    print(
        f"Ray: empty actor call {overhead['actor_call_ms']:.2f} ms, returning one "
        f"{overhead['volume_mb']:.1f} MB volume {overhead['volume_return_ms']:.1f} ms; "
        f"layouts bit-identical: {identical}"
    )
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
