"""How long ``volsynth plan`` takes the new way (distinct U-Net blocks, plan cache) and the old way (whole
programs compiled for the slice), and whether both choose the same plan and placement.

    python -m benchmarks.plan_speed --topology v5e:4x4 --topology v5e:2x4 --out plan-speed.json

Per topology, in one process: the block way cold (empty cache: every distinct unit compiled), the block way
warm (the finished plan from the cache), whole programs compiled on host devices (``--host-whole``), then, unless ``--skip-whole``, the whole-compile way with no time
limit (about 35 minutes per topology for the bundle U-Net on a 2-core machine). ``--whole-json`` takes the
whole-compile results from an earlier run of this module (or of ``volsynth plan --whole-compile --json``)
instead, for machines where the slow way ran in the background. Every timing is printed with the load
average next to it, and the JSON holds both results in full.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from engine.xla.planning import BUNDLE_MODEL


def _summary(result: dict, wall_s: float, load: tuple[float, float], cpu_s: float | None = None) -> dict:
    best = result.get("best") or {}
    return {
        "planning_s": result.get("planning_s"),
        "wall_s": round(wall_s, 2),
        # CPU seconds this process used (all threads): on a shared machine, what the wall time would be
        # roughly on an idle one (compiles are mostly single-threaded).
        "cpu_s": None if cpu_s is None else round(cpu_s, 2),
        "timing": result.get("timing", {}),
        "cut_short": result.get("cut_short", False),
        "from_cache": result.get("from_cache", False),
        "best_plan": best.get("plan"),
        "best_placement": best.get("placement"),
        "best_step_ms": best.get("step_ms"),
        "gain": result.get("gain"),
        "compiled": [
            {
                k: r.get(k)
                for k in ("plan", "step_ms", "compute_ms", "comm_ms", "placement", "collectives", "units")
            }
            for r in result.get("rows", [])
            if r.get("status") == "compiled"
        ],
        "loadavg_before": [round(v, 2) for v in load],
        "loadavg_after": [round(v, 2) for v in os.getloadavg()],
    }


def _cpu_seconds() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _timed(say, label: str, **kwargs) -> tuple[dict, dict]:
    from engine.xla.planning import plan_model

    load = os.getloadavg()
    t0, c0 = time.perf_counter(), _cpu_seconds()
    result = plan_model(BUNDLE_MODEL, progress=say, **kwargs).to_dict()
    summary = _summary(result, time.perf_counter() - t0, load, _cpu_seconds() - c0)
    say(
        f"{label}: {summary['planning_s']} s planning ({summary['wall_s']} s wall, {summary['cpu_s']} CPU s), "
        f"best {summary['best_plan']} "
        f"on {summary['best_placement']}, load {summary['loadavg_before']}"
    )
    return summary, result


def run(topologies: list[str], skip_whole: bool, whole_json: Path | None, time_limit: float | None) -> dict:
    def say(msg: str) -> None:
        print(time.strftime("%H:%M:%S"), msg, flush=True)

    earlier = json.loads(whole_json.read_text()) if whole_json else {}
    earlier = earlier.get("topologies", earlier)  # this module's own JSON, or a {topology: result} map
    out: dict = {"machine": os.uname().nodename, "cpus": os.cpu_count(), "topologies": {}}
    for topology in topologies:
        entry: dict = {}
        with tempfile.TemporaryDirectory(prefix="volsynth-plan-cache-") as cache:
            os.environ["VOLSYNTH_PLAN_CACHE"] = cache  # cold: nothing planned or compiled before
            entry["blocks_cold"], full_blocks = _timed(
                say, f"{topology} blocks (cold cache)", topology=topology, time_limit_s=time_limit
            )
            entry["blocks_warm"], _ = _timed(
                say, f"{topology} blocks (warm cache)", topology=topology, time_limit_s=time_limit
            )
        entry["blocks_result"] = full_blocks
        os.environ["VOLSYNTH_PLAN_CACHE"] = "0"
        entry["host_whole"], entry["host_whole_result"] = _timed(
            say, f"{topology} whole programs on host devices", topology=topology, time_limit_s=None,
            analysis="host-whole",
        )  # fmt: skip
        if topology in earlier:
            whole = earlier[topology]
            whole = whole.get("whole_result", whole)
            entry["whole"] = _summary(
                whole, float(whole.get("wall_s", whole.get("planning_s", 0.0))), (0, 0, 0)
            )
            entry["whole"]["source"] = str(whole_json)
            entry["whole_result"] = whole
        elif not skip_whole:
            os.environ["VOLSYNTH_PLAN_CACHE"] = "0"
            entry["whole"], entry["whole_result"] = _timed(
                say, f"{topology} whole compile", topology=topology, time_limit_s=None, whole_compile=True
            )
        if "whole" in entry:
            b, w = entry["blocks_cold"], entry["whole"]
            entry["same_choice"] = (b["best_plan"], b["best_placement"]) == (
                w["best_plan"],
                w["best_placement"],
            )
            entry["speedup_cold"] = round(w["planning_s"] / b["planning_s"], 1) if b["planning_s"] else None
        out["topologies"][topology] = entry
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topology", action="append", help="default: v5e:4x4 and v5e:2x4")
    parser.add_argument("--skip-whole", action="store_true", help="only the block way")
    parser.add_argument("--whole-json", type=Path, help="whole-compile results from an earlier run")
    parser.add_argument("--time-limit", type=float, default=None, help="for the block way (default: none)")
    parser.add_argument("--out", type=Path, help="write the results here as JSON")
    args = parser.parse_args(argv)
    result = run(args.topology or ["v5e:4x4", "v5e:2x4"], args.skip_whole, args.whole_json, args.time_limit)
    for topology, entry in result["topologies"].items():
        b, w = entry["blocks_cold"], entry.get("whole")
        line = f"{topology}: blocks {b['planning_s']} s -> {b['best_plan']} on {b['best_placement']}"
        line += f"; warm {entry['blocks_warm']['planning_s']} s"
        h = entry["host_whole"]
        line += f"; host-whole {h['planning_s']} s -> {h['best_plan']} on {h['best_placement']}"
        if w:
            line += (
                f"; whole {w['planning_s']} s -> {w['best_plan']} on {w['best_placement']}; "
                f"same choice: {entry['same_choice']}"
            )
        print(line)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
