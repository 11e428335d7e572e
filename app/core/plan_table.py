"""Qt-free side of the Plan view: an engine server's XLA devices and ``volsynth plan`` results as display text.

The engine server's ``POST /plan`` answers with ``engine.xla.planner.PlanResult.to_dict()``; the functions
here turn that dict into the strings, sort keys and tooltips the Plan dialog's table shows, and the summary
line above it. A server of another version may leave keys out: everything reads with defaults.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from engine.formatting import format_bytes, significant
from engine.xla.planning import BUNDLE_MODEL  # the module imports JAX only when it plans

LIST_LIMIT = 8  # devices named one by one in a status line; the rest are counted

STATUS_RANK = {"compiled": 1, "failed": 2, "pruned": 3}  # the best row ranks 0


@dataclass(frozen=True)
class Column:
    key: str
    header: str
    tooltip: str
    numeric: bool = False


COLUMNS: tuple[Column, ...] = (
    Column(
        "plan",
        "Plan",
        "How the step is split: dp = data parallel over the batch, d / h = the depth / "
        "height axis split over that many devices; /cut@N = spatial splitting stops at level N",
    ),
    Column(
        "kind",
        "Kind",
        "batch (data parallel only), spatial (depth/height split) or 2-D (both, or "
        "depth and height together)",
    ),
    Column(
        "levels",
        "Levels",
        "The axes split at each U-Net level, full resolution first: d = depth, "
        "h = height, dh = both, \u2013 = not split (replicated)",
    ),
    Column(
        "status",
        "Status",
        "compiled: XLA compiled the plan for the topology and its costs come from the "
        "compiled program; pruned: dropped before compiling (see the reason); failed: XLA refused it",
    ),
    Column(
        "step",
        "Step",
        "Predicted time of one denoising step = compute + communication (no overlap "
        "assumed: an upper bound). ~ marks a cheap estimate from the traced program (not compiled)",
        True,
    ),
    Column(
        "compute", "Compute", "Per device: the larger of FLOPs / peak FLOP/s and bytes / HBM bandwidth", True
    ),
    Column(
        "comm",
        "Comm",
        "Time of the collectives (halo exchanges, all-reduces, gathers) on this topology's "
        "links, for the best placement",
        True,
    ),
    Column(
        "memory",
        "Memory / device",
        "Device memory one device needs for the step (arguments, outputs "
        "and temporaries); over the chip's HBM the plan is pruned",
        True,
    ),
    Column(
        "placement",
        "Placement",
        "Which physical chip plays which logical mesh position (id-order = "
        "JAX's default order; snake-* = orders that keep neighbours one hop apart)",
    ),
    Column(
        "note",
        "Reason / collectives",
        "Why a plan was pruned or failed; for a compiled plan, the "
        "collectives XLA inserted (count, and bytes per device summed over them)",
    ),
)
COLUMN_INDEX = {c.key: i for i, c in enumerate(COLUMNS)}


@dataclass(frozen=True)
class DisplayRow:
    """One plan as the table shows it: a text, a sort key and a tooltip per column."""

    cells: tuple[str, ...]
    sort_keys: tuple[
        Any, ...
    ]  # floats for the numeric columns (inf when absent), strings or tuples otherwise
    tooltips: tuple[str, ...]
    status: str  # "compiled", "pruned", "failed"
    best: bool
    estimated: bool  # the numbers are the planner's cheap estimates, not the compiled program's


# -- units -----------------------------------------------------------------------------------------------


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def format_duration_ms(ms: Any) -> str:
    """A time given in milliseconds with a readable unit: ``0.103`` -> ``103 µs``, ``2400`` -> ``2.40 s``."""
    value = _number(ms)
    if value is None:
        return "\u2013"
    if value == 0:
        return "0 \u00b5s"
    if abs(value) < 1e-3:
        return f"{significant(value * 1e6)} ns"
    if abs(value) < 1.0:
        return f"{significant(value * 1e3)} \u00b5s"
    if abs(value) < 1e3:
        return f"{significant(value)} ms"
    return f"{significant(value / 1e3)} s"


def format_memory_gb(gb: Any) -> str:
    """Device memory given in GB (decimal, rounded to 1 MB by the planner): ``0.013`` -> ``13 MB``."""
    value = _number(gb)
    if value is None:
        return "\u2013"
    if value < 0.0005:
        return "< 1 MB"
    if value < 1.0:
        return f"{value * 1e3:.0f} MB"
    return f"{significant(value)} GB"


# -- rows ------------------------------------------------------------------------------------------------


def _is_best(row: dict, best: dict | None) -> bool:
    return bool(
        best
        and row.get("status") == "compiled"
        and row.get("plan") == best.get("plan")
        and (not best.get("placement") or row.get("placement") == best.get("placement"))
    )


def _levels_text(levels: Sequence[str]) -> tuple[str, str]:
    if not levels:
        return "\u2013", "no per-level choice (the plan was pruned before its levels were chosen)"
    names = {"d": "depth split", "h": "height split", "dh": "depth and height split", "-": "replicated"}
    text = " \u00b7 ".join("\u2013" if lv == "-" else str(lv) for lv in levels)
    # Counted from 0 (full resolution), as the planner's cut@N names count them.
    tip = "; ".join(f"level {i}: {names.get(str(lv), str(lv))}" for i, lv in enumerate(levels))
    return text, tip


def collectives_text(collectives: dict | None) -> str:
    """``{"all-reduce": {"count": 14, "bytes": 640}, ...}`` -> ``all-reduce 14× (640 B), ...``; ``none``."""
    if not collectives:
        return "none"
    parts = []
    for kind, entry in collectives.items():
        entry = entry if isinstance(entry, dict) else {}
        size = format_bytes(
            _number(entry.get("bytes", 0)) or 0.0, decimal=True, sep="\u00a0"
        )  # no-break space
        parts.append(f"{kind} {int(entry.get('count', 0))}\u00d7 ({size})")
    return ", ".join(parts)


def display_rows(result: dict) -> list[DisplayRow]:
    """The result's rows, in the server's order (compiled by step time, failed, then pruned)."""
    best = result.get("best") if isinstance(result.get("best"), dict) else None
    rows = [r for r in result.get("rows") or [] if isinstance(r, dict)]
    out = []
    for index, row in enumerate(rows):
        status = str(row.get("status", "")) or "pruned"
        compiled = status == "compiled"
        prefix = "" if compiled else "est_"
        step, compute, comm, memory = (
            _number(row.get(prefix + key)) for key in ("step_ms", "compute_ms", "comm_ms", "memory_gb")
        )
        estimated = not compiled and step is not None
        is_best = _is_best(row, best)
        tilde = "~" if estimated else ""
        levels, levels_tip = _levels_text([str(v) for v in row.get("levels") or []])
        if compiled:
            note = collectives_text(row.get("collectives"))
            compile_s = _number(row.get("compile_s"))
            note_tip = f"Collectives in the compiled program: {note}" + (
                f". Compiling took {compile_s:.1f} s on the server." if compile_s is not None else ""
            )
            host = row.get("host") if isinstance(row.get("host"), dict) else {}
            if row.get("placed_on") and host:
                note_tip += (
                    f" Placement and communication from {row['placed_on']} (the slice's own compiler); "
                    f"ranked among the plans on host-compiled units: {format_duration_ms(host.get('step_ms'))} "
                    f"per step on {host.get('placement')}, as the other rows are."
                )
        else:
            note = str(row.get("reason") or "")
            note_tip = note
        status_text = "compiled \u2605 best" if is_best else status
        mesh = row.get("mesh") if isinstance(row.get("mesh"), dict) else {}
        mesh_tip = ", ".join(f"{k} {v}" for k, v in mesh.items()) if mesh else ""
        numbers = (step, compute, comm)
        source = "compiled program" if compiled else "estimate from the traced program (not compiled)"
        cells = (
            str(row.get("plan", "")),
            "\u2013" if str(row.get("kind", "-")) in ("", "-") else str(row["kind"]),
            levels,
            status_text,
            *(tilde + format_duration_ms(v) if v is not None else "\u2013" for v in numbers),
            (tilde + format_memory_gb(memory)) if memory is not None else "\u2013",
            str(row.get("placement") or "\u2013"),
            note,
        )
        inf = math.inf
        sort_keys = (
            str(row.get("plan", "")),
            str(row.get("kind", "")),
            levels,
            (0 if is_best else STATUS_RANK.get(status, 4), step if step is not None else inf, index),
            *(v if v is not None else inf for v in numbers),
            memory if memory is not None else inf,
            str(row.get("placement") or "~"),
            note,
        )

        def exact(value: float | None, unit: str, source: str = source) -> str:
            return "" if value is None else f"{value:g} {unit} ({source})"

        tooltips = (
            f"Logical mesh: {mesh_tip}" if mesh_tip else "",
            "",
            levels_tip,
            "The fastest compiled plan" if is_best else "",
            exact(step, "ms"),
            exact(compute, "ms"),
            exact(comm, "ms"),
            exact(memory, "GB"),
            "",
            note_tip,
        )
        out.append(DisplayRow(cells, sort_keys, tooltips, status, is_best, estimated))
    return out


# -- summary ---------------------------------------------------------------------------------------------


def topology_text(topology: dict | None) -> str:
    """``v5e:2x2 (4 × TPU v5e, torus with wraparound)``."""
    if not isinstance(topology, dict) or not topology.get("name"):
        return "?"
    network = str(topology.get("network", ""))
    if topology.get("wraparound"):
        network += " with wraparound"
    inner = ", ".join(
        p for p in (f"{topology.get('devices', '?')} \u00d7 {topology.get('chip', '?')}", network) if p
    )
    return f"{topology['name']} ({inner})"


def gain_text(gain: Any) -> str:
    value = _number(gain)
    return "\u2013" if value is None else f"x{value:.2f}"


def summary_lines(result: dict) -> list[str]:
    """What was planned; the counts and planning time; when the time limit cut planning short, why and what
    to do; the best plan (so far) and its gain."""
    counts = result.get("counts")
    if not isinstance(counts, dict):  # an older server, or a cut-short result, sends no counts
        counts = {}
    batch = result.get("batch", "?")
    cfg = bool(result.get("cfg"))
    halves = f" (batch {batch // 2} \u00d7 2 CFG halves)" if cfg and isinstance(batch, int) else ""
    first = f"{result.get('model', '?')} on {topology_text(result.get('topology'))}, effective batch {batch}{halves}"
    planning = _number(result.get("planning_s"))
    second = (
        f"{counts.get('enumerated', 0)} plans enumerated: {counts.get('pruned', 0)} pruned, "
        f"{counts.get('compiled', 0)} compiled, {counts.get('failed', 0)} failed"
        + (f"; planning took {planning:.1f} s on the server" if planning is not None else "")
        + (
            f"; compute predicted at XLA precision '{result['precision']}' (bf16 peak)"
            if result.get("precision")
            else ""
        )
    )
    best = result.get("best") if isinstance(result.get("best"), dict) else None
    if best is None:
        third = (
            "No plan compiled: see the reasons in the table (a larger topology, or a smaller batch, may fit)"
        )
    else:
        third = (
            f"Best{' so far' if result.get('cut_short') else ''}: {best.get('plan')} on placement "
            f"{best.get('placement')}, predicted "
            f"{format_duration_ms(best.get('step_ms'))} per step"
            + (f", placed on {best['placed_on']}" if best.get("placed_on") else "")
        )
        unaware = result.get("unaware_choice") if isinstance(result.get("unaware_choice"), dict) else None
        same = unaware is not None and (unaware.get("plan"), unaware.get("placement")) == (
            best.get("plan"),
            best.get("placement"),
        )
        if same:
            third += f"; {gain_text(result.get('gain'))}: the topology-unaware choice is the same plan"
        elif unaware is not None:
            third += (
                f"; {gain_text(result.get('gain'))} over the topology-unaware choice "
                f"({unaware.get('plan')} on {unaware.get('placement')}: "
                f"{format_duration_ms(unaware.get('step_ms'))})"
            )
    lines = [first, second]
    if result.get("cut_short"):
        reason = str(result.get("cut_reason") or "the planning-time limit was reached")
        lines.append(
            f"Cut short: {reason[0].upper()}{reason[1:]}. Plan again to go on from there: the blocks compiled "
            "so far are kept on the server."
        )
    if best is not None:
        lines.extend(_one_device_lines(result))
    return [*lines, third]


def _one_device(result: dict | None) -> tuple[dict, float] | None:
    """The step unsplit on one chip and the best plan's speed-up over it, when the planner gave them."""
    one = (result or {}).get("one_device")
    speedup = _number((result or {}).get("speedup"))
    return (one, speedup) if isinstance(one, dict) and speedup is not None else None


def _one_chip_is_faster(result: dict | None) -> float | None:
    """How many times faster one chip unsplit is than the best plan, when it is (and the model fits on it)."""
    found = _one_device(result)
    if found is None or found[1] >= 1 or not found[0].get("fits", True):
        return None
    return 1 / found[1]


def _one_device_lines(result: dict) -> list[str]:
    """What splitting is measured against: the step unsplit on one chip of the slice."""
    found = _one_device(result)
    if found is None:
        return []
    one, speedup = found
    step = format_duration_ms(one.get("step_ms"))
    memory = format_memory_gb(one.get("memory_gb"))
    source = "" if one.get("from") == "blocks" else ", estimated"
    if not one.get("fits", True):
        return [f"One chip unsplit: {memory}{source}, more than its memory: this model needs splitting."]
    faster = _one_chip_is_faster(result)
    if faster is not None:
        return [
            f"One chip unsplit: {step} per step{source}, {faster:.1f}\u00d7 faster than the best plan "
            "below. Splitting does not pay for this model here: communication outweighs the compute each chip "
            "saves, so run it without a plan (on one chip)."
        ]
    return [f"One chip unsplit: {step} per step{source}; the best plan below is {speedup:.2f}\u00d7 faster."]


def precision_note(result: dict, details: dict | None) -> str:
    """Which XLA precision the server's runs use, against the one the plan was predicted at ("" when the
    server does not say): a plan costed at 'default' (bf16 peak) runs slower on a server at 'highest'."""
    running = (details or {}).get("xla_precision")
    predicted = result.get("precision")
    if not running:
        return ""
    if not predicted or predicted == running:
        return f"Runs at XLA precision '{running}' (the server's --xla-precision), as predicted."
    return (
        f"This server runs at XLA precision '{running}' (its --xla-precision), not the '{predicted}' the steps "
        "were predicted at: expect its steps to take longer than predicted."
    )


def summary_text(result: dict) -> str:
    return "\n".join(summary_lines(result))


# -- the server's devices --------------------------------------------------------------------------------


def xla_devices_of(details: dict | None) -> list[dict]:
    """The ``xla_devices`` a server's ``GET /info`` details list (empty for a torch server)."""
    devices = (details or {}).get("xla_devices")
    if not isinstance(devices, list):
        return []
    return [d for d in devices if isinstance(d, dict)]


def xla_device_summary(devices: Iterable[dict], topology: str | None = None) -> str:
    """``xla:tpu TPU v5 lite ×8 (v5e:2x4)``, ``xla:cpu cpu``; empty for no devices."""
    groups: dict[tuple[str, str], int] = {}
    for device in devices:
        key = (str(device.get("platform", "?")), str(device.get("kind", "?")))
        groups[key] = groups.get(key, 0) + 1
    if not groups:
        return ""
    parts = [
        f"xla:{platform} {kind}" + (f" \u00d7{n}" if n > 1 else "") for (platform, kind), n in groups.items()
    ]
    return ", ".join(parts) + (f" ({topology})" if topology else "")


def xla_device_text(device: dict) -> str:
    """``#3 TPU v5 lite at (1, 1, 0)`` (the spaces after "at" and in the coordinates do not break)."""
    coords = device.get("coords")
    # No-break spaces: a wrapped device list never splits one device's coordinates.
    nbsp = "\u00a0"
    at = (
        f" at{nbsp}({(',' + nbsp).join(str(c) for c in coords)})"
        if isinstance(coords, list) and coords
        else ""
    )
    return f"#{device.get('id', '?')} {device.get('kind', '?')}{at}"


def xla_device_list(devices: Sequence[dict], limit: int = LIST_LIMIT) -> str:
    """The devices one by one (ids, kinds, coordinates), the first ``limit`` of them and a count of the rest."""
    shown = "; ".join(xla_device_text(d) for d in devices[:limit])
    rest = len(devices) - limit
    return shown + (f"; and {rest} more" if rest > 0 else "")


# The slice the planning examples of docs/xla-tpu.md use: proposed first when the server has no slice of its own.
README_TOPOLOGY = "v5e:2x4"


def topology_choices(
    server_topology: str | None, known: Iterable[str], default: str = README_TOPOLOGY
) -> list[str]:
    """The server's own slice first (when it is one), else ``default`` (when known), then the other known
    topologies, without repeats."""
    known = list(known)
    out = [server_topology] if server_topology else ([default] if default in known else [])
    out += [t for t in known if t not in out]
    return out


def plan_models(model_ids: Iterable[str]) -> list[str]:
    """What the Plan view offers: the server's models, then MONAI's brain LDM bundle (by architecture)."""
    out = [m for m in model_ids if m]
    return out + ([BUNDLE_MODEL] if BUNDLE_MODEL not in out else [])


def request_plan(
    url: str,
    token: str | None,
    fingerprint: str | None,
    model: str,
    topology: str,
    batch: int,
    cfg: bool,
    compile_top: int,
    time_limit_s: float,
) -> dict:
    """Ask the server to plan (worker thread: it waits, for minutes with a full-size model)."""
    from engine.backends import connect_server

    backend = connect_server(url, token=token, fingerprint=fingerprint)
    try:
        return backend.plan(
            model, topology, batch=batch, cfg=cfg, compile_top=compile_top, time_limit_s=time_limit_s
        )
    finally:
        backend.close()


def plan_error_text(message: str, topology: str) -> str:
    """The status line for a refused plan: the server's message, with the accepted name forms when the
    server's schema refused the topology's spelling (its message then quotes a regular expression)."""
    text = f"The server could not plan: {message}"
    if "topology" in message and "pattern" in message:
        text += (
            f" \u2013 {topology!r} is not a topology name this server accepts: use <family>:<shape> for a TPU "
            "slice (v5e:2x4, v5p:2x2x2) or <N>xH100-nvlink / <N>xH100-pcie for a GPU box"
        )
    return text


# -- "Use this plan for the next run" ------------------------------------------------------------------


def xla_device_count(details: dict | None) -> int:
    """How many XLA devices a server's plans may use: ``xla_device_count`` of ``GET /info``, else the
    length of its ``xla_devices`` list (a server of an older version lists the devices jobs run on)."""
    count = (details or {}).get("xla_device_count")
    if isinstance(count, int) and not isinstance(count, bool) and count >= 0:
        return count
    return len(xla_devices_of(details))


def use_plan_problem(details: dict | None, row: dict | None) -> str:
    """Why the Plan view cannot offer ``row`` (one of a plan result's rows) for the next run on the server
    whose ``GET /info`` details these are, or "" when it can."""
    from engine.cohort.xla_groups import plan_devices
    from engine.errors import InvalidRequest

    devices = xla_device_count(details)
    if not xla_devices_of(details) and not devices:
        return (
            "This server runs torch, not XLA: plans run on an XLA engine server (volsynth serve --device xla)"
        )
    if devices < 2:
        return (
            f"This XLA server has {devices} device; a plan needs several "
            "(volsynth serve --device xla --xla-devices N)"
        )
    if row is None:
        return "Select a plan in the table"
    name = str(row.get("plan", ""))
    if row.get("status") != "compiled":
        return f"{name} was {row.get('status', 'not compiled')}: only a compiled plan can run"
    try:
        needed = plan_devices(name)
    except InvalidRequest:  # a name this version cannot read is not offered
        return f"{name!r} is not a plan name this app can run"
    if needed is not None and needed > devices:
        return f"{name} needs {needed} devices; this server has {devices}"
    listed = (details or {}).get("xla_plans")
    if isinstance(listed, list) and listed and name.split("/")[0] not in listed:
        return f"this server does not offer {name} (it offers {', '.join(map(str, listed[:8]))})"
    return ""


def slower_than_one_chip_text(result: dict | None) -> str:
    """A warning (with a leading space) when one chip unsplit is faster than the plan result's best; ""
    otherwise."""
    faster = _one_chip_is_faster(result)
    if faster is None:
        return ""
    return (
        f" One chip unsplit is {faster:.1f}\u00d7 faster than the best plan for this model: \u00d7 in the "
        "Plan line clears the plan and runs it on one chip."
    )


def batch_mismatch_text(result: dict | None, next_batch: int) -> str:
    """A warning (with a leading space) when the next run's U-Net batch is not the batch planned for: a
    data-parallel axis that does not divide it is refused by the server; "" when they agree."""
    planned = (result or {}).get("batch")
    if not isinstance(planned, int) or planned == next_batch:
        return ""
    return (
        f" Planned for a U-Net batch of {planned}; the next run's is {next_batch} (batch x 2 with guidance "
        "other than 1): a plan's data axis must divide it, so set the batch or guidance to match, or plan again."
    )
