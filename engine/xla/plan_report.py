"""``volsynth plan``'s result as text: the table of plans, the best one, what it was ranked and placed on, the
topology-unaware choice, and the step on one chip unsplit (``engine.xla.planner`` computes them)."""

from __future__ import annotations

from engine.formatting import count_of
from engine.xla.planner import PlanResult


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def _analysis_label(analysis: str) -> str:
    return {
        "blocks": "compiled as distinct U-Net blocks",
        "whole": "compiled as whole programs",
        "host-whole": "compiled as whole programs on host devices",
    }.get(analysis, analysis)


def _timing_label(result: PlanResult) -> str:
    t = result.timing
    if result.from_cache:
        before = result.cached_planning_s
        return f" (from the plan cache{f'; planned in {before:.1f} s' if before is not None else ''})"
    if not t:
        return ""
    parts = ("tracing", "estimating", "compiling", "placement")
    return (
        " ("
        + ", ".join(f"{k} {t.get(f'{k}_s', 0.0):.1f}" for k in parts)
        + f", other {t.get('other_s', 0.0):.1f})"
    )


def _limit_lines(result: PlanResult) -> list[str]:
    if not result.cut_short:
        return []
    compiled = sum(r.status == "compiled" for r in result.rows)
    return [
        f"CUT SHORT: {result.cut_reason}; {count_of(compiled, 'plan')} compiled, the others ranked on estimates; "
        "the best plan below is the best so far (raise --time-limit, or plan again: the compiled units are cached)"
    ]


def format_table(result: PlanResult) -> str:
    """The plans as a text table, compiled first, then the pruned ones with their reasons."""
    topo = result.topology
    lines = [
        f"model {result.model}  topology {topo['name']} ({topo['devices']} x {topo['chip']}, {topo['network']}"
        f"{' with wraparound' if topo.get('wraparound') else ''})  effective batch {result.batch}"
        f"{' (batch x 2 CFG halves)' if result.cfg else ''}",
        f"plans: {result.enumerated} enumerated, {result.pruned} pruned, {result.compiled} compiled"
        f"{f', {result.failed} failed' if result.failed else ''} ({_analysis_label(result.analysis)}); "
        f"planning took {result.planning_s:.1f} s{_timing_label(result)}",
        *_limit_lines(result),
        f"compute predicted at XLA precision '{result.precision}' from the chip's bf16 peak; collective bytes "
        "are per device",
        "",
        f"{'plan':<18} {'kind':<7} {'levels':<10} {'status':<9} {'step ms':>9} {'compute':>9} {'comm':>9} "
        f"{'GB/dev':>7} {'placement':<10} collectives / reason",
    ]
    for r in result.rows:
        if r.status == "compiled":
            step, compute, comm, mem = r.step_ms, r.compute_ms, r.comm_ms, r.memory_gb
            coll = (
                ", ".join(f"{k} {v['count']}x {v['bytes'] / 1e6:.2f}MB" for k, v in r.collectives.items())
                or "none"
            )
            tail = coll + (" [placed on the slice's compile]" if r.host else "")
        else:
            step, compute, comm, mem = r.est_step_ms, r.est_compute_ms, r.est_comm_ms, r.est_memory_gb
            tail = r.reason
        est = "" if r.status == "compiled" or step is None else "~"
        lines.append(
            f"{r.plan:<18} {r.kind:<7} {' '.join(r.levels) or '-':<10} {r.status:<9} "
            f"{est + _fmt(step):>9} {_fmt(compute):>9} {_fmt(comm):>9} {_fmt(mem):>7} {r.placement or '-':<10} {tail}"
        )
    lines.append("")
    lines.append(
        "~ = cheap estimate from the jaxpr (not compiled); compiled rows use XLA's cost and memory analysis"
    )
    if result.best:
        source = (
            " (from the estimates: nothing compiled in time)" if result.best.get("from") == "estimate" else ""
        )
        lines.append(
            f"best plan{' so far' if result.cut_short else ''}: {result.best['plan']} on placement "
            f"{result.best['placement']}: {result.best['step_ms']:.4g} ms/step{source}"
        )
        chosen = next((r for r in result.rows if r.plan == result.best["plan"] and r.host), None)
        if chosen is not None:
            lines.append(
                f"  placed on {chosen.placed_on}; ranked among the plans on host-compiled units "
                f"({chosen.host['step_ms']:.4g} ms/step on {chosen.host['placement']}), which the other rows show"
            )
        u = result.unaware_choice
        if u is not None:  # set with best
            lines.append(
                f"topology-unaware choice: {u['plan']} on {u['placement']} (its model: {u['unaware_model_ms']:.4g} ms; "
                f"aware model: {u['step_ms']:.4g} ms)"
            )
        lines.append(f"predicted gain of the topology-aware plan: {result.gain:.3f}x")
        lines.extend(_one_device_lines(result))
    else:
        lines.append("no plan compiled")
    return "\n".join(lines)


def _one_device_lines(result: PlanResult) -> list[str]:
    one = result.one_device
    if not one or not result.speedup:
        return []
    source = "its host-compiled blocks" if one["from"] == "blocks" else "the estimate"
    line = f"one chip, unsplit: {one['step_ms']:.4g} ms/step ({source}), {one['memory_gb']:.3g} GB"
    if not one["fits"]:
        return [f"{line}: more than one chip's HBM, so the model needs splitting"]
    if result.speedup < 1:
        return [
            f"{line}; SPLITTING DOES NOT PAY: one chip alone is {1 / result.speedup:.2f}x faster than the best "
            "plan (communication outweighs the compute each device saves): run it without a plan"
        ]
    return [f"{line}; the best plan is {result.speedup:.2f}x faster"]
