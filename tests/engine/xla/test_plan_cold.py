"""Cold planning: the compiler's cache is the configured plan cache's (or none), and a plan cut short by the
time limit is the plan an uncut run chooses, with the placement it could price saying so."""

from __future__ import annotations

import pytest

from engine.xla import block_analysis, planner
from engine.xla.plan_cache import PlanCache
from engine.xla.topology import parse_topology


@pytest.mark.slow
def test_the_compilers_cache_is_the_configured_plan_caches_or_none(tmp_path):
    """A JAX cache set elsewhere (the environment, an earlier setup) must not make a cold plan warm. Each case
    runs in a process of its own (child_compile_cache.py): pointing JAX's compilation cache somewhere and back
    is process state that later plans in the same process noticed (a cut-short plan that followed compiled
    nothing on the host)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    child = Path(__file__).with_name("child_compile_cache.py")
    repo = Path(__file__).resolve().parents[3]
    for plan_cache, mode in ((str(tmp_path / "plans"), "on"), ("0", "off")):
        env = {**os.environ, "VOLSYNTH_PLAN_CACHE": plan_cache, "PYTHONPATH": str(repo)}
        done = subprocess.run(
            [sys.executable, str(child), str(tmp_path), mode],
            cwd=repo,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-3000:]


def test_compiled_figures_a_noise_apart_do_not_decide_the_plan():
    """Two plans whose compiled steps differ by less than the tie fraction: the cost model's favourite wins,
    whichever of them the noise made faster."""
    from engine.xla.planner import TIE_FRACTION, Row, _fastest

    def entry(name, est_ms, step_s):
        row = Row(plan=name, kind="mesh", mesh={}, levels=[], status="compiled", est_step_ms=est_ms)
        return (row, [], step_s, step_s, step_s)

    a, b = entry("dp2xd2xh4", 1.0, 1.0e-3), entry("dp2xd2xh4/cut@1", 1.1, 1.0e-3)
    for noise in (-0.4 * TIE_FRACTION, 0.0, 0.4 * TIE_FRACTION):
        b = (b[0], [], *(3 * [1.0e-3 * (1 + noise)]))
        assert _fastest([a, b])[0].plan == "dp2xd2xh4"
        assert _fastest([b, a])[0].plan == "dp2xd2xh4"
    clearly_faster = (b[0], [], *(3 * [1.0e-3 * (1 - 3 * TIE_FRACTION)]))
    assert _fastest([a, clearly_faster])[0].plan == "dp2xd2xh4/cut@1"  # a real difference still counts


@pytest.mark.slow
def test_a_plan_cut_short_at_the_slices_compile_is_the_uncut_plan(tiny_net, tmp_path, monkeypatch):
    """The limit passes during the first unit compiled for the slice (an injected clock, no wall time): the
    plan is the uncut run's, and the output says its placement was priced on host-compiled collectives."""
    from engine.xla.topology import physical_devices

    topology = parse_topology("v5e:2x2")
    uncut = planner.plan(
        tiny_net, topology, compile_top=2, time_limit_s=None, cache=PlanCache(tmp_path / "a")
    )
    tpu = physical_devices(topology)[0].platform
    now = [0.0]
    real = block_analysis.lower_unit

    def compile_then_run_out(unit, network, plan, devices, n):
        work = real(unit, network, plan, devices, n)
        if devices[0].platform != tpu:
            return work

        def compile_past_the_limit():
            now[0] = 1e6
            return work()

        return compile_past_the_limit

    monkeypatch.setattr(block_analysis, "lower_unit", compile_then_run_out)
    cut = planner.plan(
        tiny_net,
        topology,
        compile_top=2,
        time_limit_s=100,
        clock=lambda: now[0],
        cache=PlanCache(tmp_path / "b"),
    )
    assert cut.cut_short and not uncut.cut_short
    assert cut.best["plan"] == uncut.best["plan"]
    assert [r.plan for r in cut.rows if r.status == "compiled"] == [
        r.plan for r in uncut.rows if r.status == "compiled"
    ]
    assert "placed on host-compiled collectives" in cut.cut_reason
    assert "time limit came before the slice's compile" in cut.best["placed_on"]
