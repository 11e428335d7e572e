"""Planning in seconds: block-level analysis against the whole-program compile, the plan cache, the
planning-time limit and the timing split. Tiny U-Nets on 8 fake host devices; compiled results shared."""

from __future__ import annotations

import json

import pytest

from engine.testing import tiny_spec
from engine.xla import block_analysis, plan_report, planner
from engine.xla.plan_cache import PlanCache, plan_key
from engine.xla.planner import network_from_definition
from engine.xla.topology import parse_topology

jax = None  # bound by the first test that runs here (tests/engine/xla/conftest.py)
pytestmark = pytest.mark.usefixtures("eight_host_devices")


@pytest.fixture(scope="module")
def plans(tiny_net):
    return {p.name: p for p, _m, _r in planner.enumerate_plans(tiny_net, 8) if p is not None}


class _CountingCompiles:
    def __init__(self, monkeypatch, advance=None):
        self.labels: list[str] = []
        real = block_analysis.lower_unit

        def counted(unit, *args, **kwargs):
            self.labels.append(unit.label)
            work = real(unit, *args, **kwargs)
            if advance is None:
                return work

            def compile_advancing_the_clock():
                advance()
                return work()

            return compile_advancing_the_clock

        monkeypatch.setattr(block_analysis, "lower_unit", counted)


@pytest.mark.slow
def test_identical_blocks_share_one_signature_and_the_units_follow_the_step():
    spec = tiny_spec(output_xyz=(32, 32, 32))
    definition = dict(spec.networks["unet"], num_res_blocks=2)
    net = network_from_definition("tiny2", definition, spec.latent_shape[1:], batch=1, cfg=True)
    units = block_analysis.unet_units(net)
    labels = [u.label for u in units]
    assert labels[0] == "stem" and labels[-1] == "head" and "mid.res0" in labels
    by_label = {u.label: u for u in units}
    # Level 0 keeps 8 channels: its two resblocks compute the same thing on the same shapes.
    assert by_label["down0.res0"].signature == by_label["down0.res1"].signature
    assert by_label["down0.res0"].params != by_label["down0.res1"].params
    assert by_label["down0.res0"].signature != by_label["up0.res0"].signature  # a concatenated skip
    assert len({u.signature for u in units}) < len(units)
    # Every parameter is read by exactly one unit.
    read = [k for u in units for k in u.params]
    assert sorted(read) == sorted(net.params)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "levels"), [("dp2xd2xh2", ["dh", "dh"]), ("dp2xd4/cut@1", ["d", "-"])])
def test_blocks_agree_with_the_whole_program_compile(tiny_net, plans, name, levels):
    """Same backend (host devices): the same collectives, FLOPs and (within fusion at the unit edges) bytes
    as the whole program, for a plan that splits batch, depth and height at every level and for one that
    keeps its deep level whole ("cut"), which the whole program honours because every block is pinned."""
    p = plans[name]
    assert p.level_labels() == levels
    cpus = jax.devices("cpu")[:8]
    composed = block_analysis.analyse_plan(tiny_net, p, cpus)
    jitted, _ = planner.build_program(tiny_net, p, cpus)
    whole = jitted.lower(tiny_net.params, *tiny_net.abstract_inputs()).compile()
    cost = whole.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    reference = planner._collective_summary(planner.parse_hlo_collectives(whole.as_text(), 8))
    got = planner._collective_summary(composed.collectives)
    assert set(got) == set(reference) and {"collective-permute", "all-reduce", "all-gather"} <= set(got)
    for kind, entry in reference.items():
        assert got[kind]["count"] == entry["count"], kind
        assert got[kind]["bytes"] == pytest.approx(entry["bytes"], rel=0.01), kind
    assert composed.flops == pytest.approx(cost["flops"], rel=0.02)
    # Fusion stops at unit edges: each unit reads its input and writes its output once more.
    assert composed.bytes_accessed == pytest.approx(cost["bytes accessed"], rel=0.15)
    assert composed.distinct <= composed.units


def _both_ways(network, topology_name: str) -> dict:
    """The plan by blocks (the default) and by whole programs, compile_top 2, no time limit."""
    topology = parse_topology(topology_name)
    return {
        analysis: planner.plan(network, topology, compile_top=2, analysis=analysis, time_limit_s=None)
        for analysis in ("blocks", "whole")
    }


@pytest.fixture(scope="module")
def gpu_box_results(tiny_net):
    """Both ways on a GPU box (host devices for both, so the backends agree)."""
    return _both_ways(tiny_net, "8xH100-nvlink")


@pytest.mark.slow
def test_blocks_choose_the_same_best_plan_as_whole_compiles(gpu_box_results):
    blocks, whole = gpu_box_results["blocks"], gpu_box_results["whole"]
    assert blocks.compiled == whole.compiled >= 2
    assert (blocks.best["plan"], blocks.best["placement"]) == (whole.best["plan"], whole.best["placement"])
    assert blocks.best["from"] == "blocks" and whole.best["from"] == "whole"
    rows = [r for r in blocks.rows if r.status == "compiled"]
    assert all(r.analysis == "blocks" and "distinct" in r.units for r in rows)


@pytest.mark.slow
def test_the_step_on_one_chip_is_the_unsplit_programs_and_says_when_splitting_does_not_pay(
    tiny_net, gpu_box_results
):
    blocks, whole = gpu_box_results["blocks"], gpu_box_results["whole"]
    one = blocks.one_device
    assert one["from"] == "blocks" and one["fits"] and whole.one_device["from"] == "estimate"
    # The unsplit step compiled whole on one host device: the compute its composed blocks give.
    single = planner.Plan(1, 1, 1, ((False, False),) * tiny_net.levels)
    jitted, _ = planner.build_program(tiny_net, single, jax.devices("cpu")[:1])
    cost = jitted.lower(tiny_net.params, *tiny_net.abstract_inputs()).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    chip = parse_topology("8xH100-nvlink").chip
    unsplit_ms = 1e3 * max(cost["flops"] / chip.peak_flops, cost["bytes accessed"] / chip.hbm_bandwidth)
    assert one["step_ms"] == pytest.approx(unsplit_ms, rel=0.15)  # fusion stops at unit edges (bytes)
    # On 8 devices the tiny U-Net's step is mostly communication: one chip alone is faster, and the plan says so.
    assert blocks.speedup == pytest.approx(one["step_ms"] / blocks.best["step_ms"], rel=1e-3)
    assert blocks.speedup < 1
    text = plan_report.format_table(blocks)
    assert f"one chip, unsplit: {one['step_ms']:.4g} ms/step (its host-compiled blocks)" in text
    assert f"SPLITTING DOES NOT PAY: one chip alone is {1 / blocks.speedup:.2f}x faster" in text
    assert planner.PlanResult.from_dict(blocks.to_dict()).one_device == one  # kept in the plan cache too


def test_planning_time_is_split_into_phases_that_sum_to_the_total(gpu_box_results):
    for result in gpu_box_results.values():
        t = result.timing
        phases = ("tracing_s", "estimating_s", "compiling_s", "placement_s", "other_s")
        assert all(t[k] >= 0 for k in phases) and t["compiling_s"] > 0 and t["tracing_s"] > 0
        assert sum(t[k] for k in phases) == pytest.approx(t["total_s"], rel=1e-6)
        assert t["other_s"] <= 0.05 * t["total_s"] + 0.05  # the phases account for the time
        assert result.planning_s == pytest.approx(t["total_s"])
        data = json.loads(json.dumps(result.to_dict()))
        assert set(data["timing"]) >= set(phases)
        text = plan_report.format_table(result)
        assert "tracing" in text and "compiling" in text and "placement" in text


@pytest.mark.slow
def test_the_cache_returns_a_finished_plan_without_compiling_and_misses_when_the_key_changes(
    tiny_net, tmp_path, monkeypatch
):
    compiles = _CountingCompiles(monkeypatch)
    cache = PlanCache(tmp_path)
    topology = parse_topology("v5e:2x2")
    first = planner.plan(tiny_net, topology, compile_top=1, cache=cache, time_limit_s=None)
    assert compiles.labels and not first.from_cache and first.best
    n_first = len(compiles.labels)

    again = planner.plan(tiny_net, topology, compile_top=1, cache=cache, time_limit_s=None)
    assert len(compiles.labels) == n_first  # nothing compiled the second time
    assert again.from_cache and again.cache_key == first.cache_key
    assert (again.best, again.gain) == (first.best, first.gain)
    assert [r.to_dict() for r in again.rows] == [r.to_dict() for r in first.rows]
    assert "from the plan cache" in plan_report.format_table(again)

    # A new planner version misses the finished plan but finds its compiled units.
    monkeypatch.setattr(planner, "PLANNER_VERSION", "test-next")
    newer = planner.plan(tiny_net, topology, compile_top=1, cache=cache, time_limit_s=None)
    assert not newer.from_cache and newer.cache_key != first.cache_key
    assert len(compiles.labels) == n_first and newer.best == first.best

    # Another batch, topology, CFG or precision: another key.
    spec = tiny_spec(output_xyz=(32, 32, 32))
    unet, latent = spec.networks["unet"], spec.latent_shape[1:]
    facts = {"compile_top": 1, "planner": planner.PLANNER_VERSION}
    key = plan_key(tiny_net, topology, facts)
    others = [
        plan_key(network_from_definition("tiny", unet, latent, batch=2, cfg=True), topology, facts),
        plan_key(network_from_definition("tiny", unet, latent, batch=1, cfg=False), topology, facts),
        plan_key(network_from_definition("tiny", unet, latent, precision="highest"), topology, facts),
        plan_key(tiny_net, parse_topology("v5e:2x4"), facts),
        plan_key(tiny_net, topology, {**facts, "planner": "other"}),
    ]
    assert key == plan_key(tiny_net, topology, dict(facts)) and len({key, *others}) == 1 + len(others)


@pytest.mark.slow
def test_a_time_limit_of_zero_returns_the_best_estimate_marked_cut_short(tiny_net, monkeypatch):
    compiles = _CountingCompiles(monkeypatch)
    result = planner.plan(tiny_net, parse_topology("v5e:2x4"), compile_top=2, time_limit_s=0)
    assert compiles.labels == [] and result.compiled == 0
    assert result.cut_short and "planning-time limit of 0 s" in result.cut_reason
    assert result.best and result.best["from"] == "estimate" and result.gain is not None
    best_estimate = min(
        (r for r in result.rows if r.est_step_ms is not None and not r.reason.startswith("memory")),
        key=lambda r: r.est_step_ms,
    )
    assert result.best["plan"] == best_estimate.plan
    assert any(r.reason.startswith("not compiled: planning-time limit") for r in result.rows)
    data = result.to_dict()
    assert data["cut_short"] and data["time_limit_s"] == 0
    text = plan_report.format_table(result)
    assert "CUT SHORT" in text and "best plan so far" in text


@pytest.mark.slow
def test_the_limit_stops_between_unit_compiles_on_an_injected_clock(tiny_net, tmp_path, monkeypatch):
    """Each compile 'takes' 100 s on the fake clock: a 250 s limit lets three start, then cuts."""
    now = [0.0]

    def advance():
        now[0] += 100.0

    compiles = _CountingCompiles(monkeypatch, advance=advance)
    cache = PlanCache(tmp_path)
    result = planner.plan(
        tiny_net,
        parse_topology("v5e:2x4"),
        compile_top=2,
        time_limit_s=250,
        clock=lambda: now[0],
        cache=cache,
    )
    assert len(compiles.labels) == 3 and result.cut_short and result.compiled == 0
    assert result.best["from"] == "estimate"
    assert result.timing["total_s"] == pytest.approx(300.0)
    assert not list((tmp_path / "results").glob("*.json"))  # a cut-short plan is not kept...
    assert len(list((tmp_path / "units").glob("*.json"))) == 3  # ...the units compiled before the cut are


@pytest.mark.slow
def test_the_plan_command_takes_a_time_limit_and_the_server_schema_checks_it(tmp_path, monkeypatch, capsys):
    from pydantic import ValidationError

    from engine.cli import main
    from engine.server.schemas import PlanRequest
    from engine.testing import make_tiny_model

    make_tiny_model(tmp_path / "tiny")
    monkeypatch.setenv("VOLSYNTH_MODEL_PATH", str(tmp_path))
    monkeypatch.setenv("VOLSYNTH_PLAN_CACHE", "0")
    assert main(["plan", "--model", "tiny-latent", "--topology", "v5e:2x2", "--time-limit", "0"]) == 0
    out = capsys.readouterr().out
    assert "CUT SHORT: planning-time limit of 0 s reached" in out and "best plan so far" in out
    assert main(["plan", "--topology", "v5e:2x2", "--time-limit", "-1"]) == 2
    assert "planning-time limit must be 0 s or more" in capsys.readouterr().err
    assert PlanRequest(topology="v5e:2x2").time_limit_s == 120.0
    assert PlanRequest(topology="v5e:2x2", time_limit_s=5, whole_compile=True).whole_compile
    with pytest.raises(ValidationError):
        PlanRequest(topology="v5e:2x2", time_limit_s=-1)


def test_the_plan_command_finishes_a_compile_left_under_way_into_the_cache_before_it_exits(monkeypatch):
    """A daemon thread's compile would die with the process, and a block longer than the limit would never be
    compiled: after printing, ``volsynth plan`` says so and waits for it."""
    import threading

    from engine.cli import plan as plan_command
    from engine.xla import bounded_compile

    released, kept, said = threading.Event(), [], []
    with pytest.raises(bounded_compile.OutOfTime):  # the limit stops waiting for it at once
        bounded_compile.compile_within(
            "a-slow-block", lambda: released.wait(60) and "compiled", 0, kept.append
        )
    assert bounded_compile.in_flight() == ["a-slow-block"] and not kept

    def print_and_let_it_finish(*args, **kwargs):
        said.append(" ".join(map(str, args)))
        released.set()

    monkeypatch.setattr(plan_command, "print", print_and_let_it_finish, raising=False)
    plan_command._finish_compiles_under_way()
    assert kept == ["compiled"] and not bounded_compile.in_flight()
    assert said and "finishing the compile that was under way at the limit, into the plan cache" in said[0]
    said.clear()
    plan_command._finish_compiles_under_way()  # nothing under way: nothing said
    assert not said


@pytest.mark.slow
def test_host_whole_compiles_the_whole_step_on_host_devices_for_a_tpu_slice(tiny_net):
    result = planner.plan(
        tiny_net, parse_topology("v5e:2x2"), compile_top=1, analysis="host-whole", time_limit_s=None
    )
    compiled = [r for r in result.rows if r.status == "compiled"]
    assert compiled and all(r.analysis == "host-whole" and r.collectives for r in compiled)
    assert result.best["from"] == "host-whole" and "on host devices" in plan_report.format_table(result)


@pytest.fixture(scope="module")
def slice_results(tiny_net):
    """Both ways on a TPU slice: the whole programs compiled for it."""
    return _both_ways(tiny_net, "v5e:2x4")


@pytest.mark.slow
def test_units_compiled_for_the_slice_give_its_whole_programs_collectives_and_placement(tiny_net, plans):
    """XLA's TPU passes exchange bf16 halos and reduce the statistics over both spatial axes at once, so
    host-compiled units rank the placements wrongly for a slice (dp2xd2xh2 on v5e:2x4: JAX's id order
    first, where the TPU's own compile puts snake-xy first). The communicating units compiled again for
    the slice give the whole step's collectives for it and its ranking of the placements."""
    from engine.xla.topology import physical_devices, placements, program_comm_time

    p = plans["dp2xd2xh2"]
    topology = parse_topology("v5e:2x4")
    slice_devices = physical_devices(topology)
    orders = placements(topology, slice_devices)
    cpus = jax.devices("cpu")[:8]
    on_host = block_analysis.analyse_plan(tiny_net, p, cpus)
    placed = block_analysis.analyse_plan(tiny_net, p, cpus, collective_devices=slice_devices)
    jitted, _ = planner.build_program(tiny_net, p, slice_devices)
    whole = planner.parse_hlo_collectives(
        jitted.lower(tiny_net.params, *tiny_net.abstract_inputs()).compile().as_text(), 8
    )

    def comm(collectives):
        return {name: program_comm_time(topology, collectives, order) for name, order in orders.items()}

    got, reference = planner._collective_summary(placed.collectives), planner._collective_summary(whole)
    assert set(got) == set(reference) == {"collective-permute", "all-reduce", "all-gather"}
    for kind, entry in reference.items():
        assert got[kind]["count"] == entry["count"], kind
        # A few halos sit next to a unit edge, where the whole program converts to bf16 after them.
        assert got[kind]["bytes"] == pytest.approx(entry["bytes"], rel=0.06), kind
    placed_comm, whole_comm, host_comm = comm(placed.collectives), comm(whole), comm(on_host.collectives)
    for name, seconds in whole_comm.items():
        assert placed_comm[name] == pytest.approx(seconds, rel=0.01), name
    best = min(whole_comm, key=whole_comm.get)
    assert min(placed_comm, key=placed_comm.get) == best == "snake-xy"
    assert min(host_comm, key=host_comm.get) == "id-order"  # what the host's collectives alone would pick
    assert placed.collectives_platform.startswith("tpu") and placed.retargeted > 0
    # FLOPs, bytes and memory stay the host's: one model for every plan's ranking.
    assert (placed.flops, placed.bytes_accessed, placed.memory_bytes) == (
        on_host.flops,
        on_host.bytes_accessed,
        on_host.memory_bytes,
    )


@pytest.mark.slow
def test_the_chosen_plan_is_placed_as_the_whole_compile_for_the_slice_places_it(slice_results):
    """(The tiny model's two survivors are mirror images that tie; which one wins is not the point here.
    The bundle U-Net's choice against the whole compile is in benchmarks.plan_speed.)"""
    blocks, whole = slice_results["blocks"], slice_results["whole"]
    chosen = next(r for r in blocks.rows if r.plan == blocks.best["plan"])
    others = [r for r in blocks.rows if r.status == "compiled" and r is not chosen]
    assert chosen.placed_on.endswith("communicating blocks compiled for the TPU v5 lite") and set(
        chosen.host
    ) == {"step_ms", "comm_ms", "placement"}
    assert blocks.best["placed_on"] == chosen.placed_on and blocks.best["step_ms"] == chosen.step_ms
    # The slice's placement and comm are the whole program's for the same plan; the others stay
    # host-priced, as they were ranked.
    reference = next(r for r in whole.rows if r.plan == chosen.plan)
    assert blocks.best["placement"] == chosen.placement == reference.placement
    assert chosen.comm_ms == pytest.approx(reference.comm_ms, rel=0.01)
    assert others and all(not r.host and not r.placed_on for r in others)
    text = plan_report.format_table(blocks)
    assert f"placed on {chosen.placed_on}" in text and "ranked among the plans on host-compiled units" in text
    assert blocks.rows[0] is chosen  # rows stay in the order the plans were ranked in


@pytest.mark.slow
def test_a_compile_still_running_at_the_limit_is_not_waited_for_and_lands_in_the_plan_cache(
    tiny_net, tmp_path, monkeypatch
):
    """The first compile for the slice runs past the limit (it waits for the test to let it go): planning
    returns on the limit, cut short, with the host placement; the compile finishes in the background into
    the plan cache, so planning again does not compile that block again and places the plan on the slice."""
    import threading
    import time

    from engine.xla import bounded_compile
    from engine.xla.topology import physical_devices

    topology = parse_topology("v5e:2x4")
    tpu = physical_devices(topology)[0].platform
    now, slow, released = [0.0], [], threading.Event()
    real = block_analysis.lower_unit

    def first_slice_compile_runs_long(unit, network, plan, devices, n):
        work = real(unit, network, plan, devices, n)
        if devices[0].platform != tpu or slow:
            return work
        slow.append(unit.label)
        now[0] = 99.5  # half a second of the 100 s limit is left as this compile starts

        def compile_once_let_go():
            released.wait(120)
            return work()

        return compile_once_let_go

    monkeypatch.setattr(block_analysis, "lower_unit", first_slice_compile_runs_long)
    cache = PlanCache(tmp_path)
    result = planner.plan(
        tiny_net, topology, compile_top=2, time_limit_s=100, clock=lambda: now[0], cache=cache
    )
    assert slow and result.cut_short and result.best["from"] == "blocks"
    assert f"while {slow[0]} for tpu compiled (it finishes in the background" in result.cut_reason
    chosen = next(r for r in result.rows if r.plan == result.best["plan"])
    assert not chosen.host and "time limit came before the slice's compile" in chosen.placed_on
    # Returned without it. A real compile that was under way when the limit came is not waited for either: on
    # a busy machine it may take longer than the half second left, and is then left running beside the held one.
    left_running = len(bounded_compile.in_flight())
    assert left_running >= 1
    units_before = len(list((tmp_path / "units").glob("*.json")))
    released.set()
    for _ in range(1200):  # the compile, let go, finishes in the background: a few seconds here
        if not bounded_compile.in_flight():
            break
        time.sleep(0.1)
    assert not bounded_compile.in_flight()
    # each compile left running is kept in the plan cache when it ends
    assert len(list((tmp_path / "units").glob("*.json"))) == units_before + left_running

    compiles = _CountingCompiles(monkeypatch)
    again = planner.plan(tiny_net, topology, compile_top=2, time_limit_s=None, cache=cache)
    chosen = next(r for r in again.rows if r.plan == again.best["plan"])
    assert not again.cut_short and chosen.placed_on.endswith("compiled for the TPU v5 lite")
    assert again.best["plan"] == result.best["plan"] and slow[0] not in compiles.labels


@pytest.mark.slow
def test_a_limit_reached_before_the_slices_compile_keeps_the_host_placement_and_says_so(
    tiny_net, monkeypatch
):
    """The host units are compiled within the limit; it passes during the first compile for the slice, so
    the next one never starts."""
    from engine.xla.topology import physical_devices

    tpu = physical_devices(parse_topology("v5e:2x4"))[0].platform
    now = [0.0]
    real = block_analysis.lower_unit

    def compile_then_maybe_run_out(unit, network, plan, devices, n):
        work = real(unit, network, plan, devices, n)
        if devices[0].platform != tpu:
            return work

        def compile_past_the_limit():  # the limit passes while this compile runs: it still finishes
            now[0] = 1e6
            return work()

        return compile_past_the_limit

    monkeypatch.setattr(block_analysis, "lower_unit", compile_then_maybe_run_out)
    result = planner.plan(
        tiny_net, parse_topology("v5e:2x4"), compile_top=2, time_limit_s=100, clock=lambda: now[0]
    )
    assert result.compiled >= 2 and result.best["from"] == "blocks"
    assert result.cut_short and "placed on host-compiled collectives" in result.cut_reason
    chosen = next(r for r in result.rows if r.plan == result.best["plan"])
    assert not chosen.host and "time limit came before the slice's compile" in chosen.placed_on
