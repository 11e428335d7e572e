"""app.core.plan_table: volsynth plan results and a server's XLA devices as display text (no Qt, no server)."""

from __future__ import annotations

import math

import pytest

from app.core import plan_table
from app.core.plan_table import COLUMN_INDEX, COLUMNS
from app.core.remote_connection import ServerConnection

STATUS, STEP, MEMORY, NOTE = (COLUMN_INDEX[k] for k in ("status", "step", "memory", "note"))


def _row(plan, status, **values):
    row = {
        "plan": plan,
        "kind": "2-D",
        "mesh": {"data": 2, "depth": 1, "height": 2},
        "levels": ["h", "-"],
        "status": status,
        "reason": "",
        "est_step_ms": None,
        "est_compute_ms": None,
        "est_comm_ms": None,
        "est_memory_gb": None,
        "step_ms": None,
        "compute_ms": None,
        "comm_ms": None,
        "memory_gb": None,
        "unaware_step_ms": None,
        "placement": "",
        "collectives": {},
        "compile_s": None,
    }
    row.update(values)
    return row


# What POST /plan answered for the tiny test model on v5e:2x4 (compile top 3), cut to four rows.
RESULT = {
    "model": "tiny-latent",
    "topology": {
        "name": "v5e:2x4",
        "chip": "TPU v5e",
        "devices": 8,
        "network": "torus",
        "shape": [2, 4],
        "wraparound": True,
    },
    "batch": 2,
    "cfg": True,
    "counts": {"enumerated": 4, "pruned": 2, "compiled": 2, "failed": 0},
    "planning_s": 10.92,
    "best": {"plan": "dp2xd4", "placement": "snake-xy", "step_ms": 0.3018},
    "unaware_choice": {
        "plan": "dp2xd4",
        "placement": "id-order",
        "unaware_model_ms": 0.2888,
        "step_ms": 0.3593,
    },
    "gain": 1.1905,
    "rows": [
        _row(
            "dp2xd4",
            "compiled",
            levels=["d", "-"],
            est_step_ms=0.158,
            step_ms=0.3018,
            compute_ms=0.0342,
            comm_ms=0.2676,
            memory_gb=0.013,
            placement="snake-xy",
            collectives={
                "all-reduce": {"count": 26, "bytes": 4800},
                "all-to-all": {"count": 2, "bytes": 768},
            },
            compile_s=3.9,
        ),
        _row(
            "dp2xd2xh2/cut@1",
            "compiled",
            levels=["dh", "-"],
            step_ms=0.34,
            compute_ms=0.0361,
            comm_ms=0.304,
            memory_gb=0.014,
            placement="snake-xy",
        ),
        _row(
            "d4xh2",
            "pruned",
            levels=["dh", "-"],
            reason="dominated: estimate 0.369 ms > 2x best 0.158 ms",
            est_step_ms=0.369,
            est_compute_ms=0.001,
            est_comm_ms=0.368,
            est_memory_gb=0.001,
        ),
        _row("h8", "pruned", kind="-", levels=[], reason="indivisible: height 6 not divisible by 8"),
    ],
}


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0.1034, "103 \u00b5s"),
        (0.0005, "500 ns"),
        (0.0326, "32.6 \u00b5s"),
        (0.001, "1 \u00b5s"),
        (2.5, "2.5 ms"),
        (123.456, "123 ms"),
        (2400.0, "2.4 s"),
        (0, "0 \u00b5s"),
        (None, "\u2013"),
        (math.nan, "\u2013"),
    ],
)
def test_durations_get_a_readable_unit(ms, text):
    assert plan_table.format_duration_ms(ms) == text


@pytest.mark.parametrize(
    ("gb", "text"),
    [(0.013, "13 MB"), (0.0, "< 1 MB"), (1.25, "1.25 GB"), (15.999, "16 GB"), (None, "\u2013")],
)
def test_memory_gets_a_readable_unit(gb, text):
    assert plan_table.format_memory_gb(gb) == text


def test_rows_show_compiled_costs_estimates_and_reasons():
    rows = plan_table.display_rows(RESULT)
    assert [len(r.cells) for r in rows] == [len(COLUMNS)] * 4
    best, second, dominated, indivisible = rows
    assert best.best and not second.best and best.cells[STATUS] == "compiled \u2605 best"
    assert best.cells[:3] == ("dp2xd4", "2-D", "d \u00b7 \u2013")
    assert best.cells[STEP] == "302 \u00b5s" and best.cells[MEMORY] == "13 MB" and not best.estimated
    assert best.cells[NOTE] == "all-reduce 26\u00d7 (4.8\u00a0kB), all-to-all 2\u00d7 (768\u00a0B)"
    assert "Compiling took 3.9 s" in best.tooltips[NOTE]
    assert best.tooltips[COLUMN_INDEX["levels"]] == "level 0: depth split; level 1: replicated"
    assert best.tooltips[STEP] == "0.3018 ms (compiled program)"
    # Pruned rows show the planner's estimates, marked with ~, and why they were dropped.
    assert (
        dominated.estimated
        and dominated.cells[STEP] == "~369 \u00b5s"
        and dominated.cells[STATUS] == "pruned"
    )
    assert dominated.cells[NOTE].startswith("dominated:") and "not compiled" in dominated.tooltips[STEP]
    assert not indivisible.estimated and indivisible.cells[STEP] == indivisible.cells[1] == "\u2013"
    assert indivisible.cells[COLUMN_INDEX["levels"]] == "\u2013" and indivisible.cells[NOTE].startswith(
        "indivis"
    )


def test_sort_keys_order_numbers_as_numbers_with_absent_values_last():
    rows = plan_table.display_rows(RESULT)
    by_step = sorted(rows, key=lambda r: r.sort_keys[STEP])
    assert [r.cells[0] for r in by_step] == ["dp2xd4", "dp2xd2xh2/cut@1", "d4xh2", "h8"]
    assert by_step[-1].sort_keys[STEP] == math.inf
    by_status = sorted(rows, key=lambda r: r.sort_keys[STATUS])
    assert by_status[0].best and by_status[-1].cells[0] == "h8"


def test_summary_has_counts_time_best_and_gain():
    first, counts, best = plan_table.summary_lines(RESULT)
    assert first == (
        "tiny-latent on v5e:2x4 (8 \u00d7 TPU v5e, torus with wraparound), effective batch 2 "
        "(batch 1 \u00d7 2 CFG halves)"
    )
    assert counts == "4 plans enumerated: 2 pruned, 2 compiled, 0 failed; planning took 10.9 s on the server"
    assert best == (
        "Best: dp2xd4 on placement snake-xy, predicted 302 \u00b5s per step; x1.19 over the "
        "topology-unaware choice (dp2xd4 on id-order: 359 \u00b5s)"
    )
    same = {**RESULT, "unaware_choice": {**RESULT["unaware_choice"], "placement": "snake-xy"}, "gain": 1.0}
    assert plan_table.summary_lines(same)[2].endswith("x1.00: the topology-unaware choice is the same plan")


def test_the_plan_placed_on_the_slices_own_compile_says_so_and_what_it_was_ranked_on():
    placed_on = "7 communicating blocks compiled for the TPU v5 lite"
    host = {"step_ms": 0.2801, "comm_ms": 0.2459, "placement": "id-order"}
    rows = [dict(RESULT["rows"][0], placed_on=placed_on, host=host), *RESULT["rows"][1:]]
    result = {**RESULT, "rows": rows, "best": {**RESULT["best"], "placed_on": placed_on}}
    shown = plan_table.display_rows(result)
    tip = shown[0].tooltips[NOTE]
    assert f"Placement and communication from {placed_on}" in tip
    assert "ranked among the plans on host-compiled units: 280 \u00b5s per step on id-order" in tip
    assert "Placement and communication" not in shown[1].tooltips[NOTE]  # a host-priced row
    assert f"per step, placed on {placed_on}; x1.19" in plan_table.summary_lines(result)[2]
    assert "placed on" not in plan_table.summary_lines(RESULT)[2]


def test_a_plan_cut_short_by_the_time_limit_says_so_why_and_what_to_do():
    reason = (
        "planning-time limit of 120 s reached while head for tpu compiled (it finishes in the background, "
        "into the plan cache): dp2xd4 is placed on host-compiled collectives, not the slice's"
    )
    lines = plan_table.summary_lines({**RESULT, "cut_short": True, "cut_reason": reason})
    assert len(lines) == 4 and lines[2] == (
        f"Cut short: P{reason[1:]}. Plan again to go on from there: the blocks compiled so far are kept on the "
        "server."
    )
    assert lines[3].startswith("Best so far: dp2xd4 on placement snake-xy")
    assert len(plan_table.summary_lines(RESULT)) == 3 and "so far" not in plan_table.summary_text(RESULT)


def test_the_summary_measures_the_best_plan_against_one_chip_unsplit():
    def lines(one, speedup):
        return plan_table.summary_lines({**RESULT, "one_device": one, "speedup": speedup})

    one = {"step_ms": 14.67, "memory_gb": 2.55, "fits": True, "from": "blocks"}
    shown = lines(one, 2.013)
    assert shown[2] == "One chip unsplit: 14.7 ms per step; the best plan below is 2.01\u00d7 faster."
    assert shown[3].startswith("Best: ")  # the best plan stays last (shown in bold)
    small = lines({**one, "step_ms": 0.0122, "from": "estimate"}, 0.074)[2]
    assert small.startswith(
        "One chip unsplit: 12.2 \u00b5s per step, estimated, 13.5\u00d7 faster than the best"
    )
    assert "Splitting does not pay for this model here" in small
    big = lines({**one, "memory_gb": 41.0, "fits": False}, 3.0)[2]
    assert big == "One chip unsplit: 41 GB, more than its memory: this model needs splitting."
    assert len(plan_table.summary_lines(RESULT)) == 3  # a result planned before this reference: unchanged


def test_a_result_with_no_compiled_plan_or_missing_keys_still_reads():
    nothing = {"model": "big", "counts": {"enumerated": 1, "pruned": 1}, "rows": [_row("dp8", "pruned")]}
    lines = plan_table.summary_lines({**nothing, "best": None})
    assert lines[1].startswith("1 plans enumerated: 1 pruned, 0 compiled, 0 failed")
    assert lines[2].startswith("No plan compiled")
    assert plan_table.display_rows({"rows": [{"status": "failed", "reason": "compile failed: X"}, "junk"]})[
        0
    ].cells[NOTE] == ("compile failed: X")
    assert plan_table.display_rows({}) == []


TPU_DEVICES = [
    {"id": i, "platform": "tpu", "kind": "TPU v5 lite", "coords": [i % 2, i // 2, 0]} for i in range(8)
]


def test_xla_devices_are_summarised_and_listed():
    assert plan_table.xla_device_summary(TPU_DEVICES, "v5e:2x4") == "xla:tpu TPU v5 lite \u00d78 (v5e:2x4)"
    cpu = [{"id": 0, "platform": "cpu", "kind": "cpu"}]
    assert plan_table.xla_device_summary(cpu) == "xla:cpu cpu"
    assert plan_table.xla_device_summary([]) == ""
    listed = plan_table.xla_device_list(TPU_DEVICES, limit=3).replace("\u00a0", " ")
    assert listed == (
        "#0 TPU v5 lite at (0, 0, 0); #1 TPU v5 lite at (1, 0, 0); #2 TPU v5 lite at (0, 1, 0); and 5 more"
    )
    assert plan_table.xla_device_list(cpu) == "#0 cpu"


def test_a_connection_labels_an_xla_server_by_its_devices():
    xla = ServerConnection(
        "http://tpu-vm:8765",
        None,
        "xla:tpu",
        "TPU v5 lite (XLA)",
        details={"xla_devices": TPU_DEVICES, "xla_topology": "v5e:2x4", "xla_precision": "highest"},
    )
    assert xla.label == "tpu-vm:8765  \u2013  xla:tpu TPU v5 lite \u00d78 (v5e:2x4)"
    assert xla.xla_topology == "v5e:2x4" and len(xla.xla_devices) == 8
    torch = ServerConnection("http://gpu:8765", None, "cuda:0", "NVIDIA H100", details={"torch": "2.5"})
    assert torch.label == "gpu:8765  \u2013  cuda:0 NVIDIA H100"
    assert torch.xla_devices == [] and torch.xla_topology is None


def test_choices_for_the_form():
    assert plan_table.topology_choices("v5e:2x4", ["v5e:2x2", "v5e:2x4", "8xH100-nvlink"]) == [
        "v5e:2x4",
        "v5e:2x2",
        "8xH100-nvlink",
    ]
    assert plan_table.topology_choices(None, ["v5e:2x2"]) == ["v5e:2x2"]
    # No slice of its own: the README's example slice first, as the Plan view proposes it.
    assert plan_table.topology_choices(None, ["v5e:2x2", "v5e:2x4"]) == ["v5e:2x4", "v5e:2x2"]
    assert plan_table.plan_models(["tiny-latent", ""]) == ["tiny-latent", "brain-ldm-bundle"]


def test_a_refused_topology_spelling_gets_the_accepted_forms():
    refused = "malformed request: topology: String should match pattern '^(v5e:...)$'"
    text = plan_table.plan_error_text(refused, "v9z:3x3")
    assert text.startswith(f"The server could not plan: {refused}") and "'v9z:3x3' is not a topology" in text
    other = plan_table.plan_error_text("the engine server is planning already", "v5e:2x2")
    assert other == "The server could not plan: the engine server is planning already"
