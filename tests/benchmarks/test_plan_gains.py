"""The gain table of ``benchmarks.plan_gains`` on a tiny U-Net: choices, ties and the gain agree."""

from __future__ import annotations

import pytest

from engine.testing import tiny_spec
from engine.xla.runtime import configure_jax


@pytest.fixture(scope="module")
def tiny_case():
    configure_jax(8)
    from benchmarks.plan_gains import gain_case
    from engine.xla.planner import network_from_definition, trace_network
    from engine.xla.topology import parse_topology

    spec = tiny_spec(output_xyz=(32, 32, 32))
    network = network_from_definition("tiny", spec.networks["unet"], spec.latent_shape[1:], batch=1, cfg=True)
    return gain_case(network, trace_network(network), parse_topology("v5e:2x4"))


def test_the_aware_choice_is_the_fastest_placed_plan_and_the_gain_compares_it_with_the_unaware_one(tiny_case):
    rows = {r["plan"]: r for r in tiny_case["rows"]}
    fitting = [r for r in rows.values() if r["fits"]]
    aware = tiny_case["aware_choice"]
    assert aware["step_ms"] == min(r["step_ms"] for r in fitting)
    assert rows[aware["plan"]]["placement"] == aware["placement"]
    unaware = rows[tiny_case["unaware_choice"]["plan"]]
    assert unaware["unaware_model_ms"] == min(r["unaware_model_ms"] for r in fitting)
    assert tiny_case["unaware_choice"]["step_ms"] == unaware["step_id_order_ms"]
    assert tiny_case["gain"] == pytest.approx(unaware["step_id_order_ms"] / aware["step_ms"], rel=1e-3)
    assert tiny_case["gain"] >= 1.0
    low, high = tiny_case["gain_range"]
    assert low <= tiny_case["gain"] <= high and unaware["plan"] in tiny_case["unaware_ties"]
    for r in fitting:  # every plan's best placement is no worse than JAX's device order
        assert r["comm_ms"] <= r["comm_id_order_ms"] + 1e-9
        assert r["step_ms"] == pytest.approx(r["compute_ms"] + r["comm_ms"], abs=1e-3)


def test_a_bandwidth_bound_compiled_plan_calibrates_the_hbm_bytes(tiny_case):
    from benchmarks.plan_gains import calibrations

    case = dict(tiny_case, model="tiny", batch=1, cfg=True)
    row = max(case["rows"], key=lambda r: r["hbm_ms"])
    compiled_ms = 3 * max(row["hbm_ms"], row["flop_ms"])  # what XLA's cost analysis says, bandwidth-bound
    run = {
        "model": "tiny",
        "batch": 2,  # effective: batch 1 x 2 CFG halves
        "topology": "v5e:2x4",
        "compiled_rows": [{"plan": row["plan"], "compute_ms": compiled_ms, "comm_ms": 0.0}],
    }
    (found,) = calibrations([case], [run])
    assert found["compiled_bound"] == "hbm"
    assert found["hbm_scale"] == pytest.approx(compiled_ms / row["hbm_ms"], rel=1e-3)
    assert calibrations([case], [dict(run, topology="v5e:4x4")]) == []  # another topology: no match
