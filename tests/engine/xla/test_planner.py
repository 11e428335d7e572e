"""The topology-aware planner: topologies and cost formulas, enumeration and pruning, HLO parsing, ranking, and
that every plan kind computes the single-device result on 8 fake host devices. Tiny models only."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from engine.testing import tiny_spec
from engine.xla import plan_report, planner
from engine.xla.planner import Plan, network_from_definition
from engine.xla.topology import (
    Collective,
    UnknownTopology,
    collective_time,
    parse_topology,
    placements,
    program_comm_time,
)

# Bound by the first test that runs here, not at collection (tests/engine/xla/conftest.py).
jax = jnp = None


@pytest.fixture(autouse=True)
def _no_plan_cache(monkeypatch):
    # plan_model's default cache would let one test's plan answer another's (test_plan_fast.py tests it).
    monkeypatch.setenv("VOLSYNTH_PLAN_CACHE", "0")


def test_topology_names_parse_and_unknown_ones_list_the_known():
    t = parse_topology("v5e:2x4")
    assert (t.family, t.network, t.shape, t.n_devices) == ("v5e", "torus", (2, 4), 8)
    assert parse_topology("v5p:2x2x2").shape == (2, 2, 2)
    gpu = parse_topology("8xH100-nvlink")
    assert (gpu.network, gpu.n_devices) == ("nvswitch", 8)
    with pytest.raises(UnknownTopology, match="known: .*v5e:4x4"):
        parse_topology("v6e:2x4")
    with pytest.raises(UnknownTopology, match="2-D"):
        parse_topology("v5e:2x2x2")


def test_hop_distances_use_the_wraparound_links():
    t = parse_topology("v5e:4x4")
    assert t.hops(t.index((0, 0)), t.index((3, 0))) == 1  # wraparound on x
    assert t.hops(t.index((0, 0)), t.index((2, 2))) == 4
    assert t.hops(t.index((0, 0)), t.index((3, 3))) == 2
    mesh = dataclasses.replace(t, wraparound=False)
    assert mesh.hops(mesh.index((0, 0)), mesh.index((3, 0))) == 3
    assert len(t.route(0, t.index((3, 3)))) == 2
    pcie = parse_topology("8xH100-pcie")
    assert (pcie.hops(0, 3), pcie.hops(0, 4)) == (1, 3)


def test_alpha_beta_costs_match_hand_computed_values():
    t = parse_topology("v5e:4x4")
    a, h, bw = t.step_latency, t.hop_latency, t.link_bandwidth
    n = 1e6
    ring = [t.index((x, 0)) for x in range(4)]  # a closed ring of 1-hop neighbours thanks to wraparound
    # Ring all-reduce: 2(p-1) steps of n/p bytes, each over one link.
    expected = 2 * 3 * (a + h + (n / 4) / bw)
    assert collective_time(t, "all-reduce", n, [ring]) == pytest.approx(expected)
    assert collective_time(t, "all-reduce", n, [ring], aware=False) == pytest.approx(expected)
    assert collective_time(t, "all-gather", n, [ring]) == pytest.approx(3 * (a + h + (n / 4) / bw))
    assert collective_time(t, "reduce-scatter", n, [ring]) == pytest.approx(3 * (a + h + (n / 4) / bw))
    # Group listed out of ring order: 0 -> 2 is 2 hops and shares links with 3 -> 1 -> ... in the aware model.
    scrambled = [ring[0], ring[2], ring[1], ring[3]]
    assert collective_time(t, "all-gather", n, [scrambled]) > collective_time(t, "all-gather", n, [ring])
    assert collective_time(t, "all-gather", n, [scrambled], aware=False) == pytest.approx(
        collective_time(t, "all-gather", n, [ring], aware=False)
    )
    # Two transfers through the same link: the link carries 2n, latency of the longest (2-hop) route.
    far, mid = t.index((2, 0)), t.index((1, 0))
    both = collective_time(t, "collective-permute", n, pairs=[(ring[0], far), (ring[0], mid)])
    assert both == pytest.approx(a + 2 * h + 2 * n / bw)
    assert collective_time(t, "collective-permute", n, pairs=[(0, far)], aware=False) == pytest.approx(
        a + h + n / bw
    )
    # All-to-all: p-1 shifted steps of n/p.
    assert collective_time(t, "all-to-all", n, [ring], aware=False) == pytest.approx(
        3 * (a + h + (n / 4) / bw)
    )
    assert collective_time(t, "all-reduce", n, [[5]]) == 0.0


def test_enumeration_covers_batch_spatial_and_2d_with_per_level_fallbacks(tiny_net):
    rows = planner.enumerate_plans(tiny_net, 8)
    assert len(rows) == len(planner._factorisations(8)) + sum(
        1 for p, _m, _r in rows if p is not None and p.variant != "auto"
    )
    reasons = [r for p, _m, r in rows if p is None]
    assert any("batch x CFG = 2 not divisible by data 4" in r for r in reasons)
    plans = {p.name: p for p, _m, _r in rows if p is not None}
    assert {"dp2xd4", "d8", "d2xh4"} <= set(plans)
    # Level 1 is 4 planes deep: it cannot be split 8 ways, so d8 falls back to replicated there.
    assert plans["d8"].levels == ((True, False), (False, False))
    assert plans["dp2xd4/cut@1"].levels == ((True, False), (False, False))
    assert plans["dp2xd4"].levels == ((True, False), (True, False))
    assert {p.kind for p in plans.values()} == {"spatial", "2-D"}


def test_estimates_and_pruning_reasons(tiny_net):
    topo = parse_topology("v5e:2x4")
    stats = planner.trace_network(tiny_net)
    assert stats.level_flops[0] > 0 and stats.level_flops[1] > 0
    assert [lv for lv, _s, _b in stats.markers][:2] == [0, 0] and stats.reductions and stats.gathers
    p = Plan(2, 4, 1, ((True, False), (True, False)))
    est = planner.estimate_plan(p, stats, tiny_net, topo)
    kinds = {c.kind for c in est.collectives}
    assert {"collective-permute", "all-reduce", "all-gather"} <= kinds
    single = planner.estimate_plan(Plan(1, 1, 1, ((False, False), (False, False))), stats, tiny_net, topo)
    assert single.flops > 7 * est.flops and not single.collectives
    # A chip with almost no memory prunes every usable plan for memory, before anything compiles.
    tiny_hbm = dataclasses.replace(topo, chip=dataclasses.replace(topo.chip, hbm_bytes=1.0))
    result = planner.plan(tiny_net, tiny_hbm, compile_top=2)
    assert result.compiled == 0 and result.best is None
    assert all(r.reason.startswith(("memory", "indivisible")) for r in result.rows)


def test_hlo_collectives_are_read_from_a_compiled_program():
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    devices = jax.devices("cpu")[:8]
    mesh = Mesh(np.array(devices).reshape(2, 4), ("b", "d"))

    def f(x, w):
        y = jax.lax.conv_general_dilated(
            x, w, (1, 1, 1), "SAME", dimension_numbers=("NDHWC", "DHWIO", "NDHWC")
        )
        return y - y.mean(axis=(1, 2, 3), keepdims=True)

    x = jax.ShapeDtypeStruct((2, 16, 8, 8, 4), jnp.float32)
    w = jax.ShapeDtypeStruct((3, 3, 3, 4, 4), jnp.float32)
    sharded = NamedSharding(mesh, P("b", "d"))
    compiled = (
        jax.jit(f, in_shardings=(sharded, NamedSharding(mesh, P())), out_shardings=sharded)
        .lower(x, w)
        .compile()
    )
    found = planner.parse_hlo_collectives(compiled.as_text(), 8)
    permutes = [c for c in found if c.kind == "collective-permute"]
    assert permutes, compiled.as_text()
    # Halo: one plane of the local block (1 x 1 x 8 x 8 x 4 float32) between depth neighbours only.
    assert all(c.nbytes == 8 * 8 * 4 * 4 for c in permutes)
    assert all(abs(a - b) == 1 and a // 4 == b // 4 for c in permutes for a, b in c.pairs)
    reduces = [c for c in found if c.kind == "all-reduce"]
    assert reduces and all(sorted(map(sorted, c.groups)) == [[0, 1, 2, 3], [4, 5, 6, 7]] for c in reduces)


def test_replica_group_syntaxes():
    line = "%a = f32[8]{0} all-reduce(%x), replica_groups={{0,2},{1,3}}, to_apply=%add"
    assert planner.parse_hlo_collectives(line, 4)[0].groups == ((0, 2), (1, 3))
    line = "%a = f32[8]{0} all-reduce(%x), replica_groups=[2,4]<=[4,2]T(1,0), to_apply=%add"
    assert planner.parse_hlo_collectives(line, 8)[0].groups == ((0, 2, 4, 6), (1, 3, 5, 7))
    line = "%a = f32[1,8]{1,0} all-reduce(%x), replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_0'}, to_apply=%r"
    got = planner.parse_hlo_collectives(line, 8)[0]
    assert got.groups == ((0, 4), (1, 5), (2, 6), (3, 7)) and got.nbytes == 32
    line = "%g = (bf16[1,4]{1,0}, bf16[4,4]{1,0}) all-gather-start(%x), replica_groups=[2,4]<=[8], dimensions={0}"
    got = planner.parse_hlo_collectives(line, 8)[0]
    assert (got.kind, got.nbytes, got.groups[1]) == ("all-gather", 32, (4, 5, 6, 7))


def test_aware_placement_beats_the_default_order_when_hops_differ():
    topo = parse_topology("v5e:2x4")
    # A logical chain of 8 (spatial sharding 8 ways): halos between logical neighbours in both directions.
    halos = [
        Collective("collective-permute", 1 << 20, pairs=tuple((i, i + 1) for i in range(7))),
        Collective("collective-permute", 1 << 20, pairs=tuple((i + 1, i) for i in range(7))),
    ]
    orders = placements(topo)
    default = program_comm_time(topo, halos, orders["id-order"])
    best = min(program_comm_time(topo, halos, order) for order in orders.values())
    assert best < default  # row-major jumps (1,0) -> (0,1) are 2 hops; the snake order is all 1 hop
    unaware = {name: program_comm_time(topo, halos, o, aware=False) for name, o in orders.items()}
    assert len(set(unaware.values())) == 1  # the unaware model cannot tell placements apart


@pytest.mark.slow
def test_plan_on_a_tpu_slice_ranks_compiled_plans_and_is_json(tiny_net):
    result = planner.plan(tiny_net, parse_topology("v5e:2x4"), compile_top=2, time_limit_s=None)
    data = json.loads(json.dumps(result.to_dict()))
    assert data["counts"]["enumerated"] == len(result.rows)
    assert data["counts"]["compiled"] >= 2 and data["best"] and data["gain"] >= 1.0
    compiled = [r for r in data["rows"] if r["status"] == "compiled"]
    assert all(r["step_ms"] == pytest.approx(r["compute_ms"] + r["comm_ms"], abs=1e-3) for r in compiled)
    assert all(r["memory_gb"] > 0 and r["collectives"] for r in compiled)
    pruned = [r for r in data["rows"] if r["status"] == "pruned"]
    assert pruned and all(r["reason"] for r in pruned)
    text = plan_report.format_table(result)
    assert "predicted gain" in text and "enumerated" in text


@pytest.mark.slow
@pytest.mark.usefixtures("eight_host_devices")
def test_plan_on_a_gpu_box_uses_host_devices(tiny_net):
    result = planner.plan(tiny_net, parse_topology("8xH100-nvlink"), compile_top=1, time_limit_s=None)
    assert result.compiled >= 1 and result.best is not None


def _random_params(network, seed=0):
    rng = np.random.default_rng(seed)
    return {
        k: jnp.asarray(rng.normal(0.0, 0.2, s.shape).astype(np.float32)) for k, s in network.params.items()
    }


@pytest.mark.usefixtures("eight_host_devices")
@pytest.mark.parametrize(
    ("batch", "mesh", "levels", "kind"),
    [
        (4, (8, 1, 1), ((False, False), (False, False)), "batch"),
        # Level 1 (4 planes) cannot be split 8 ways: the per-level fallback gathers it.
        (1, (1, 8, 1), ((True, False), (False, False)), "spatial"),
        (1, (1, 2, 4), ((True, True), (True, True)), "2-D"),
        (2, (2, 2, 2), ((True, True), (False, True)), "2-D"),
    ],
)
@pytest.mark.slow
def test_sharded_program_equals_single_device(batch, mesh, levels, kind):
    spec = tiny_spec(output_xyz=(32, 32, 32))
    net = network_from_definition(
        "tiny", spec.networks["unet"], spec.latent_shape[1:], batch=batch, cfg=True, precision="highest"
    )
    plan = Plan(*mesh, levels)
    assert plan.kind == kind
    params = _random_params(net)
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=(net.batch, *net.spatial, net.in_channels)).astype(np.float32))
    t = jnp.asarray(rng.integers(0, 1000, size=net.batch).astype(np.float32))
    ctx = jnp.asarray(rng.normal(size=(net.batch, 1, net.context_dim)).astype(np.float32))

    cpu = jax.devices("cpu")
    on_one = jax.device_put((params, x, t, ctx), cpu[0])
    reference = jax.jit(lambda p, x, t, c: net.apply(net.arch, p, x, t, c, precision="highest"))(*on_one)
    jitted, shardings = planner.build_program(net, plan, cpu[:8])
    args = [jax.device_put(a, s) for a, s in zip((params, x, t, ctx), shardings, strict=True)]
    out = jitted(*args)
    assert len(out.sharding.device_set) == 8
    ref = np.asarray(reference)
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-5, atol=1e-5 * float(np.abs(ref).max()))


@pytest.mark.slow
def test_the_plan_command_prints_json_and_refuses_bad_input_in_one_line(tmp_path, monkeypatch, capsys):
    from engine.cli import main
    from engine.testing import make_tiny_model

    make_tiny_model(tmp_path / "tiny")
    monkeypatch.setenv("VOLSYNTH_MODEL_PATH", str(tmp_path))
    assert (
        main(
            [
                "plan",
                "--model",
                "tiny-latent",
                "--topology",
                "v5e:2x2",
                "--compile-top",
                "1",
                "--no-time-limit",
                "--json",
            ]
        )
        == 0
    )
    result = json.loads(capsys.readouterr().out)
    assert result["model"] == "tiny-latent" and result["counts"]["compiled"] == 1
    assert main(["plan", "--topology", "v7q:2x2"]) == 2
    err = capsys.readouterr().err
    assert "unknown topology 'v7q:2x2'" in err and "v5e:2x4" in err and "Traceback" not in err
    assert main(["plan", "--topology", "v5e:2x2", "--batch", "0"]) == 2
    assert "batch must be at least 1" in capsys.readouterr().err


def test_planning_without_jax_says_what_to_install(monkeypatch):
    from engine.errors import BackendUnavailable
    from engine.xla import planning, runtime

    def no_jax(*_args):
        raise ModuleNotFoundError("No module named 'jax'", name="jax")

    monkeypatch.setattr(runtime, "configure_jax", no_jax)
    with pytest.raises(BackendUnavailable, match=r"jax is missing.*pip install 'volsynth-studio\[xla\]'"):
        planning.plan_model("", "v5e:2x2")


@pytest.mark.parametrize("name", ["v5e:4x4", "v5p:2x2x2", "v5p:2x4x4", "v5p:4x4x4"])
def test_snake_placements_step_one_hop_at_a_time(name):
    topology = dataclasses.replace(parse_topology(name), wraparound=False)
    for label, order in placements(topology).items():
        if label.startswith("snake"):
            assert sorted(order) == list(range(topology.n_devices))
            assert all(topology.hops(a, b) == 1 for a, b in zip(order, order[1:], strict=False)), label


def test_v5p_slices_have_wraparound_only_as_whole_cubes():
    assert not parse_topology("v5p:2x2x2").wraparound and not parse_topology("v5p:2x4x4").wraparound
    cube = parse_topology("v5p:4x4x4")
    assert cube.wraparound and cube.hops(0, cube.index((3, 0, 0))) == 1
    assert parse_topology("v5p:2x4x4").hops(0, parse_topology("v5p:2x4x4").index((0, 3, 0))) == 3
