"""Where placement matters: the predicted gain of the topology-aware plan over the topology-unaware one.

    python -m benchmarks.plan_gains --out gains.json                     # estimates, a few minutes
    python -m benchmarks.plan_gains --out gains.json --compiled a.json   # plus `volsynth plan --json` runs

For each workload (a ``volsynth plan --model`` name with its batch and guidance) and topology, every plan the
planner enumerates gets its cheap estimate (``engine.xla.planner.estimate_plan``: FLOPs and bytes per
device from one jaxpr trace, the halo / statistics / gather collectives XLA's partitioner is expected to
insert), costed on every placement with the alpha-beta model of ``engine.xla.topology``:

* the *aware* choice: the plan and placement with the lowest predicted step (compute + communication);
* the *unaware* choice: the plan a model that ignores hops and link sharing picks, on JAX's device order,
  timed with the aware model. Plans the unaware model cannot tell apart (within ``TIE``) are listed: which
  of them it picks is arbitrary, so the gain is given for each (``gain_range``).

The estimates are what the planner ranks with before it compiles; ``--compiled`` adds the rows of
``volsynth plan --json`` runs (XLA's cost analysis and the collectives of the compiled HLO) beside them. No
accelerator is used; compute is predicted from the chip's bf16 peak and HBM bandwidth.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

TIE = 0.005  # unaware-model times within 0.5 % of its favourite are a tie for it
DEFAULT_WORKLOADS = (  # model, batch, classifier-free guidance
    ("med-ddpm-128", 1, False),  # Med-DDPM conditions by concatenating the mask: no guidance
    ("med-ddpm-128", 2, False),
    ("med-ddpm-128", 1, True),
    ("maisi-v2-brain", 1, True),  # NV-Generate's MAISI inference uses guidance (scale 2)
    ("maisi-v2-brain", 1, False),
    ("maisi-v2-brain", 2, True),
)
DEFAULT_TOPOLOGIES = ("v5e:2x4", "v5e:4x4", "v5e:4x8", "8xH100-pcie")


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 4)


def _collective_bytes(collectives) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in collectives:
        out[c.kind] = out.get(c.kind, 0) + c.count * c.nbytes
    return out


def gain_case(network, stats, topology, hbm_scale: float = 1.0) -> dict[str, Any]:
    """Every enumerated plan of ``network`` on ``topology`` estimated and placed; the two choices and the
    gain. ``hbm_scale`` multiplies the estimate's HBM bytes (its convolution and matmul operands only):
    a compiled program's cost analysis also counts the normalisations, activations, concatenations and
    halo copies, and ``calibrations`` measures the ratio on the plans that were compiled."""
    from engine.xla.planner import enumerate_plans, estimate_plan
    from engine.xla.topology import physical_devices, placements, program_comm_time

    devices = physical_devices(topology)
    orders = placements(topology, devices)
    default = orders["id-order"]
    rows, unusable = [], []
    for plan, mesh, reason in enumerate_plans(network, topology.n_devices):
        if plan is None:
            unusable.append({"mesh": mesh, "reason": reason})
            continue
        est = estimate_plan(plan, stats, network, topology)
        flop_s = est.flops / topology.chip.peak_flops
        hbm_s = hbm_scale * _io_bytes(plan, stats) / topology.chip.hbm_bandwidth
        compute_s = max(flop_s, hbm_s)
        by_placement = {
            name: program_comm_time(topology, est.collectives, order, aware=True)
            for name, order in orders.items()
        }
        placement = min(by_placement, key=lambda k: (by_placement[k], k != "id-order"))
        unaware_comm = program_comm_time(topology, est.collectives, default, aware=False)
        rows.append(
            {
                "plan": plan.name,
                "kind": plan.kind,
                "mesh": mesh,
                "levels": plan.level_labels(),
                "fits": est.memory_bytes <= topology.chip.hbm_bytes,
                "memory_gb": round(est.memory_bytes / 1e9, 3),
                "tflop_per_device": round(est.flops / 1e12, 4),
                "flop_ms": _ms(flop_s),
                "hbm_ms": _ms(hbm_s),
                "compute_ms": _ms(compute_s),
                "comm_ms": _ms(by_placement[placement]),
                "step_ms": _ms(compute_s + by_placement[placement]),
                "placement": placement,
                "comm_id_order_ms": _ms(by_placement["id-order"]),
                "step_id_order_ms": _ms(compute_s + by_placement["id-order"]),
                "unaware_model_ms": _ms(compute_s + unaware_comm),
                "bytes_per_device": _collective_bytes(est.collectives),
                "_aware_s": compute_s + by_placement[placement],
                "_unaware_s": compute_s + unaware_comm,
                "_id_order_s": compute_s + by_placement["id-order"],
            }
        )
    fitting = [r for r in rows if r["fits"]]
    if not fitting:
        return {"topology": topology.name, "rows": _public(rows), "unusable": unusable, "gain": None}
    aware = min(fitting, key=lambda r: r["_aware_s"])
    unaware = min(fitting, key=lambda r: r["_unaware_s"])
    ties = [r for r in fitting if r["_unaware_s"] <= unaware["_unaware_s"] * (1 + TIE)]
    gains = [r["_id_order_s"] / aware["_aware_s"] for r in ties]
    rows.sort(key=lambda r: r["_aware_s"])
    # What one device would take: the floor every plan is measured against.
    single_compute = stats_compute_s(stats, topology, hbm_scale)
    return {
        "topology": topology.name,
        "devices": topology.n_devices,
        "hbm_scale": hbm_scale,
        "aware_choice": {"plan": aware["plan"], "placement": aware["placement"], "step_ms": aware["step_ms"]},
        "unaware_choice": {
            "plan": unaware["plan"],
            "placement": "id-order",
            "unaware_model_ms": unaware["unaware_model_ms"],
            "step_ms": unaware["step_id_order_ms"],
        },
        "gain": round(unaware["_id_order_s"] / aware["_aware_s"], 4),
        "unaware_ties": [r["plan"] for r in ties],
        "gain_range": [round(min(gains), 4), round(max(gains), 4)],
        "comm_share_of_aware_step": round(aware["comm_ms"] / aware["step_ms"], 3)
        if aware["step_ms"]
        else None,
        "one_device_compute_ms": _ms(single_compute),
        "speedup_over_one_device": round(single_compute / aware["_aware_s"], 2),
        "rows": _public(rows),
        "unusable": unusable,
    }


def stats_compute_s(stats, topology, hbm_scale: float = 1.0) -> float:
    flops = sum(stats.level_flops.values())
    io = hbm_scale * sum(stats.level_io_bytes.values())
    return topology.chip.compute_s(flops, io)


def _io_bytes(plan, stats) -> float:
    """Per-device HBM bytes of the convolutions and matmuls, as ``engine.xla.planner.estimate_plan`` counts."""
    return sum(b / (plan.data if lv < 0 else plan.shards(lv)) for lv, b in stats.level_io_bytes.items())


def calibrations(cases: list[dict], compiled: list[dict]) -> list[dict]:
    """Per compiled plan: its compute from XLA's cost analysis against the estimate's FLOP and HBM times for
    the same plan; ``hbm_scale`` is their ratio where the compiled program is bandwidth-bound."""
    out = []
    for run in compiled:
        for row in run["compiled_rows"]:
            for case in cases:
                effective = case["batch"] * (2 if case["cfg"] else 1)
                if (case["model"], effective, case["topology"]) != (
                    run["model"],
                    run["batch"],
                    run["topology"],
                ):
                    continue
                est = next((r for r in case["rows"] if r["plan"] == row["plan"]), None)
                if est is None or not est["hbm_ms"]:
                    continue
                bound = "hbm" if row["compute_ms"] > 1.01 * est["flop_ms"] else "flops"
                out.append(
                    {
                        "model": run["model"],
                        "topology": run["topology"],
                        "plan": row["plan"],
                        "compiled_compute_ms": row["compute_ms"],
                        "compiled_comm_ms": row["comm_ms"],
                        "estimated_flop_ms": est["flop_ms"],
                        "estimated_hbm_ms": est["hbm_ms"],
                        "estimated_comm_ms": est["comm_ms"],
                        "compiled_bound": bound,
                        "hbm_scale": round(row["compute_ms"] / est["hbm_ms"], 3) if bound == "hbm" else None,
                    }
                )
                break
    return out


def _public(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows]


def compiled_summary(path: Path) -> dict[str, Any]:
    """The compiled rows and choices of one ``volsynth plan --json`` output."""
    data = json.loads(path.read_text())
    rows = [
        {
            k: r.get(k)
            for k in (
                "plan",
                "kind",
                "levels",
                "compute_ms",
                "comm_ms",
                "step_ms",
                "unaware_step_ms",
                "placement",
                "memory_gb",
                "collectives",
                "compile_s",
            )
        }
        for r in data["rows"]
        if r["status"] == "compiled"
    ]
    return {
        "file": str(path),
        "model": data["model"],
        "topology": data["topology"]["name"],
        "batch": data["batch"],
        "cfg": data["cfg"],
        "planning_s": data["planning_s"],
        "best": data["best"],
        "unaware_choice": data["unaware_choice"],
        "gain": data["gain"],
        "compiled_rows": rows,
    }


def run(workloads, topologies, compiled: list[Path], log=print) -> dict[str, Any]:
    """The estimate table for every workload and topology; with compiled runs, their rows, the calibration
    of the estimate's HBM bytes they give, and the table again with each model's calibration."""
    from engine.xla.planner import trace_network
    from engine.xla.planning import network_for_model

    started = time.perf_counter()
    results: dict[str, Any] = {
        "machine": "AMD EPYC Zen 5, 2 cores (shared); planning only, no accelerator used",
        "load_average_start": os.getloadavg(),
        "tie": TIE,
        "cases": [],
    }
    traced = {}
    for model, batch, cfg in workloads:
        network = network_for_model(model, batch, cfg)
        t0 = time.perf_counter()
        traced[(model, batch, cfg)] = network, trace_network(network), round(time.perf_counter() - t0, 1)
    results["cases"] = _cases(traced, topologies, {}, log)
    results["compiled"], results["compiled_missing"] = [], []
    for path in compiled:
        try:
            results["compiled"].append(compiled_summary(path))
        except (OSError, ValueError, KeyError) as exc:  # a run still going, killed, or never started
            results["compiled_missing"].append(f"{path}: {type(exc).__name__}: {exc}"[:200])
    results["calibrations"] = calibrations(results["cases"], results["compiled"])
    scales: dict[str, list[float]] = {}
    for c in results["calibrations"]:
        if c["hbm_scale"]:
            scales.setdefault(c["model"], []).append(c["hbm_scale"])
    if scales:
        mean = {m: sum(v) / len(v) for m, v in scales.items()}
        log(f"calibrated HBM bytes x {', '.join(f'{m} {s:.2f}' for m, s in mean.items())}")
        calibrated = {k: v for k, v in traced.items() if k[0] in mean}
        results["calibrated_cases"] = _cases(calibrated, topologies, mean, log)
    results["total_s"] = round(time.perf_counter() - started, 1)
    results["load_average_end"] = os.getloadavg()
    return results


def _cases(traced: dict, topologies, scales: dict[str, float], log) -> list[dict]:
    from engine.xla.topology import parse_topology

    cases = []
    for (model, batch, cfg), (network, stats, trace_s) in traced.items():
        for name in topologies:
            topology = parse_topology(name)
            case = {"model": model, "batch": batch, "cfg": cfg, "trace_s": trace_s}
            case.update(gain_case(network, stats, topology, scales.get(model, 1.0)))
            cases.append(case)
            if case["gain"] is None:
                log(f"{model:15s} batch {batch} {name:12s}: no plan fits")
                continue
            log(
                f"{model:15s} batch {batch} {'cfg' if cfg else 'no-cfg':6s} {name:12s} aware "
                f"{case['aware_choice']['plan']}@{case['aware_choice']['placement']} "
                f"{case['aware_choice']['step_ms']:.3f} ms, unaware {case['unaware_choice']['plan']} "
                f"{case['unaware_choice']['step_ms']:.3f} ms: gain {case['gain']:.3f}x "
                f"(ties {case['gain_range'][0]:.3f}-{case['gain_range'][1]:.3f}), comm share "
                f"{case['comm_share_of_aware_step']:.2f}, HBM x{case['hbm_scale']:.2f}"
            )
    return cases


def _workload(text: str) -> tuple[str, int, bool]:
    model, batch, guidance = text.split(":")
    return model, int(batch), guidance == "cfg"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument(
        "--workload",
        action="append",
        type=_workload,
        help="model:batch:cfg|no-cfg (repeatable; default: the Med-DDPM and MAISI set)",
    )
    parser.add_argument(
        "--topology", action="append", help=f"repeatable; default {', '.join(DEFAULT_TOPOLOGIES)}"
    )
    parser.add_argument(
        "--compiled", action="append", type=Path, default=[], help="volsynth plan --json output"
    )
    args = parser.parse_args(argv)
    from engine.xla.runtime import configure_jax

    topologies = args.topology or list(DEFAULT_TOPOLOGIES)
    configure_jax(8)  # GPU boxes of up to 8 devices are placed on fake host devices
    results = run(args.workload or DEFAULT_WORKLOADS, topologies, args.compiled)
    Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
