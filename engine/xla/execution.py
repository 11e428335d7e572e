"""Run one U-Net step sharded over a server's devices as a plan says: plan names, plan resolution, the program.

A request names a plan (``SamplingRequest.xla_plan``): ``best`` (the planner's choice for this server's
topology) or a name as ``volsynth plan`` prints it (``dp2``, ``d2xh2``, ``dp2xd2/cut@2``). A plan may use
all of the server's devices or a divisor of them (``dp2`` on 8 devices runs on 2). Resolution turns the
name into the planner's :class:`~engine.xla.planner.Plan`, a *placement* (which device plays which logical
mesh position) and the predicted step time, and is cached by the backend per model, latent shape, batch
and CFG, so ``best`` is planned once.

Placement: the planner costs logical -> physical device orders of the topology (``id-order``, ``row-xy``,
``snake-yx``...); the mesh is built from the devices in the chosen order. On a TPU slice a device's
physical index comes from its coordinates; fake host CPU devices stand in for the topology's devices in
index order (they prove the sharded program right, not its speed).

The program is :func:`engine.xla.planner.build_program` (``with_sharding_constraint`` per level, inputs
sharded per the plan, weights replicated), compiled once per input shape.
"""

from __future__ import annotations

import dataclasses
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.errors import InvalidRequest
from engine.xla.planner import PLANNED_PRECISION, Network, Plan, build_program, enumerate_plans

_NAME = re.compile(r"^(?:dp(\d+))?x?(?:d(\d+))?x?(?:h(\d+))?(?:/(cut@\d+))?$")


def mesh_of_name(name: str) -> tuple[int, int, int]:
    """The (data, depth, height) mesh a plan name asks for: ``dp2xd2/cut@2`` -> (2, 2, 1)."""
    if name.split("/")[0] == "single":
        return (1, 1, 1)
    match = _NAME.match(name)
    if not match or not any(match.groups()[:3]):
        raise InvalidRequest(f"xla_plan {name!r} is not a plan name such as dp2, d2xh2 or dp2xd2/cut@2")
    return tuple(int(v) if v else 1 for v in match.groups()[:3])  # type: ignore[return-value]


def device_counts(n_devices: int) -> list[int]:
    """The device counts a plan may use on ``n_devices``: every divisor (a plan on a sub-group)."""
    return [k for k in range(1, n_devices + 1) if n_devices % k == 0]


def mesh_names(n_devices: int) -> list[str]:
    """The plans' mesh names a server of ``n_devices`` can run (per model, ``/cut@K`` variants add more)."""
    names = []
    for k in device_counts(n_devices):
        for data in range(1, k + 1):
            for depth in range(1, k // data + 1):
                if k % (data * depth) == 0:
                    names.append(Plan(data, depth, k // (data * depth), ()).name)
    return list(dict.fromkeys(names))


def effective_batch(batch_size: int, guidance_scale: float) -> int:
    """The batch the U-Net sees: classifier-free guidance doubles it (one loop call with both halves)."""
    return batch_size * (2 if guidance_scale != 1.0 else 1)


def check_batch(name: str, batch_size: int, guidance_scale: float) -> None:
    """Refuse, before any load, a plan whose data axis does not divide the batch the U-Net sees."""
    if name == "best":
        return
    data = mesh_of_name(name)[0]
    batch = effective_batch(batch_size, guidance_scale)
    if batch % data:
        halves = " (batch size x 2 CFG halves)" if batch != batch_size else ""
        raise InvalidRequest(
            f"plan {name} splits the batch {data} ways, but the U-Net sees a batch of {batch}{halves}; "
            f"use a batch size that makes it a multiple of {data}, or a plan with a smaller data axis"
        )


def run_network(arch, params: dict, spatial: Sequence[int], batch: int, cfg: bool, precision: str, name: str):
    """The planner's view of a loaded model's U-Net for one run (``batch``: what the U-Net sees)."""
    import jax

    from engine.xla.nets import unet_apply

    return Network(
        name=name,
        arch=arch,
        params={k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in params.items()},
        apply=unet_apply,
        spatial=tuple(int(s) for s in spatial),
        in_channels=int(arch.in_channels),
        context_dim=arch.context_dim,
        batch=int(batch),
        levels=int(arch.levels),
        precision=precision,
        cfg=cfg,
    )


def plans_by_name(network: Network, n_devices: int) -> tuple[dict[str, Plan], dict[str, str]]:
    """The runnable plans of ``network`` on ``n_devices`` (or a divisor of it) by name, and the refused
    meshes with their reasons (indivisible batch or extents)."""
    runnable: dict[str, Plan] = {}
    refused: dict[str, str] = {}
    for k in device_counts(n_devices):
        for plan, mesh, reason in enumerate_plans(network, k):
            if plan is not None:
                runnable.setdefault(plan.name, plan)
            else:
                refused.setdefault(Plan(mesh["data"], mesh["depth"], mesh["height"], ()).name, reason or "")
    return runnable, refused


@dataclass(frozen=True)
class ResolvedPlan:
    """A request's plan made concrete for one server: the plan, where its logical devices go, what it costs."""

    requested: str  # what the request said: "best" or the name
    plan: Plan
    placement: str  # the planner's placement name ("id-order" when there is no topology to cost)
    order: tuple[int, ...]  # logical mesh position -> index into the server's devices
    topology: str | None
    predicted_step_ms: float | None
    prediction: str  # where the prediction comes from
    planning_s: float

    @property
    def n_devices(self) -> int:
        return self.plan.data * self.plan.depth * self.plan.height


def resolve_plan(
    requested: str,
    network: Network,
    n_devices: int,
    topology=None,
    compile_top: int = 3,
) -> ResolvedPlan:
    """``best`` or a plan name -> a :class:`ResolvedPlan` for a server of ``n_devices`` on ``topology``
    (a :class:`~engine.xla.topology.Topology`, or None when there is nothing to cost against)."""
    started = time.perf_counter()
    runnable, refused = plans_by_name(network, n_devices)
    # Priced as the Plan view prices it: at the precision plans are predicted for, whatever this server
    # computes at, so that the view's plan and compiled blocks in the plan cache are the run's too.
    priced = dataclasses.replace(network, precision=PLANNED_PRECISION)
    if requested == "best":
        return _resolve_best(priced, topology, runnable, compile_top, started)
    wanted = mesh_of_name(requested)
    if int(np.prod(wanted)) > n_devices:
        raise InvalidRequest(
            f"plan {requested} needs {int(np.prod(wanted))} devices; this server has {n_devices}"
        )
    plan = runnable.get(requested)
    if plan is None:
        mesh_name = requested.split("/")[0]
        why = f" ({refused[mesh_name]})" if mesh_name in refused else ""
        raise InvalidRequest(
            f"plan {requested!r} cannot run {network.name} here{why}; plans this server can run for it: "
            f"{', '.join(sorted(runnable, key=_plan_sort_key))}"
        )
    if topology is None:
        order = tuple(range(n_devices))
        return ResolvedPlan(
            requested, plan, "id-order", order, None, None, "none: no topology to cost against",
            time.perf_counter() - started,
        )  # fmt: skip
    placement, order, step_ms, prediction = _priced_placement(plan, priced, topology)
    return ResolvedPlan(
        requested, plan, placement, order, topology.name, step_ms, prediction, time.perf_counter() - started,
    )  # fmt: skip


def _plan_sort_key(name: str) -> tuple:
    return (int(np.prod(mesh_of_name(name))), name)


# How the planner priced its best plan (PlanResult.best["from"]), for provenance.
_PREDICTED_BY = {
    "blocks": "planner: its compiled blocks (host devices), XLA cost analysis + alpha-beta collectives",
    "whole": "planner: compiled whole for the topology, XLA cost analysis + alpha-beta collectives",
    "host-whole": "planner: compiled whole on host devices, XLA cost analysis + alpha-beta collectives",
    "estimate": "planner: its cheap estimate (planning-time limit reached before a compile)",
}


def _prediction_label(source: str | None, placed_on: str) -> str:
    label = _PREDICTED_BY.get(source or "", "planner")
    return f"{label}; placed on {placed_on}" if placed_on else label


def _resolve_best(network, topology, runnable, compile_top, started) -> ResolvedPlan:
    from engine.xla.planner import plan as run_planner
    from engine.xla.topology import physical_devices, placements

    if topology is None:
        raise InvalidRequest(
            "xla_plan 'best' needs a topology to cost plans against, and this server has none: start it "
            "with --xla-topology (e.g. v5e:2x4), or name a plan such as "
            f"{', '.join(sorted(runnable, key=_plan_sort_key)[-3:])}"
        )
    from engine.xla.plan_cache import default_cache

    # The planner's own limit (120 s) and its cache: a server restarted for the same model plans at once.
    result = run_planner(network, topology, compile_top=compile_top, cache=default_cache())
    if result.best is None:
        raise InvalidRequest(f"the planner compiled no plan of {network.name} for {topology.name}")
    name = result.best["plan"]
    plan = runnable.get(name)
    if plan is None:  # the planner plans over all of the topology's devices, which the server has
        raise InvalidRequest(f"the planner's best plan {name} is not one this server can run")
    orders = placements(topology, physical_devices(topology))
    return ResolvedPlan(
        "best", plan, result.best["placement"], tuple(orders[result.best["placement"]]), topology.name,
        result.best["step_ms"], _prediction_label(result.best.get("from"), result.best.get("placed_on", "")),
        time.perf_counter() - started,
    )  # fmt: skip


def _priced_placement(plan: Plan, network: Network, topology) -> tuple[str, tuple[int, ...], float, str]:
    """A named plan's best placement, its order, predicted ms and where the prediction comes from: its
    compiled blocks, as the Plan view prices its compiled rows (the units come from the plan cache when the
    view or an earlier run compiled them), or the planner's cheap estimate when XLA refuses a unit or the
    compiles pass the planning-time limit."""
    from engine.xla.plan_cache import default_cache
    from engine.xla.planner import measure_plan
    from engine.xla.topology import physical_devices, placements

    orders = placements(topology, physical_devices(topology))
    row = measure_plan(network, topology, plan, cache=default_cache())
    if row is not None and row.step_ms is not None:
        return (
            row.placement,
            tuple(orders[row.placement]),
            row.step_ms,
            _prediction_label("blocks", row.placed_on),
        )
    placement, order, step_ms = _estimated_placement(plan, network, topology, orders)
    return placement, order, step_ms, "planner's cheap estimate (jaxpr trace, not compiled)"


def _estimated_placement(
    plan: Plan, network: Network, topology, orders
) -> tuple[str, tuple[int, ...], float]:
    """The best placement of ``plan`` by the planner's cheap estimate, its order and predicted ms."""
    from engine.xla.planner import estimate_plan, trace_network
    from engine.xla.topology import program_comm_time

    est = estimate_plan(plan, trace_network(network), network, topology)
    timed = {
        name: program_comm_time(topology, est.collectives, order, aware=True)
        for name, order in orders.items()
    }
    best = min(timed, key=lambda k: (timed[k], k != "id-order"))
    return best, tuple(orders[best]), round((est.compute_s + timed[best]) * 1e3, 4)


# ------------------------------------------------------------------------------------------- program


@dataclass
class ShardedUNet:
    """The U-Net compiled for one plan over a mesh of devices, with the weights replicated on it."""

    network: Network
    plan: Plan
    devices: list  # in logical mesh order
    params: Any = None  # replicated on the mesh
    compile_s: float = 0.0
    collectives: dict = field(default_factory=dict)  # per device, of the last compiled shape's program
    _jitted: Any = None
    _shardings: tuple = ()
    _compiled: dict = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def build(cls, network: Network, plan: Plan, devices: Sequence, params: dict) -> ShardedUNet:
        import jax

        jitted, shardings = build_program(network, plan, list(devices))
        unet = cls(network, plan, list(devices), _jitted=jitted, _shardings=shardings)
        unet.params = jax.device_put(params, shardings[0])
        return unet

    @property
    def mesh_shape(self) -> dict[str, int]:
        return {"data": self.plan.data, "depth": self.plan.depth, "height": self.plan.height}

    def _compiled_for(self, *args):
        """The program for these arguments' shapes (arrays or ShapeDtypeStructs), compiled on first use."""
        from engine.xla.sharded_decode import collective_summary

        key = tuple(None if a is None else (tuple(a.shape), str(a.dtype)) for a in args)
        with self._lock:
            compiled = self._compiled.get(key)
            if compiled is None:
                started = time.perf_counter()
                compiled = self._jitted.lower(self.params, *args).compile()
                self.compile_s += time.perf_counter() - started
                self._compiled[key] = compiled
                self.collectives = collective_summary(compiled, len(self.devices))
        return compiled

    def compile_for(self, batch: int) -> None:
        """Compile for the loop's input shapes now, so the first step's time is a step, not a compile."""
        import jax

        net = self.network
        x = jax.ShapeDtypeStruct((batch, *net.spatial, net.in_channels), np.float32)
        t = jax.ShapeDtypeStruct((batch,), np.float32)
        ctx = (
            None if net.context_dim is None else jax.ShapeDtypeStruct((batch, 1, net.context_dim), np.float32)
        )
        self._compiled_for(x, t, ctx)

    def __call__(self, x: np.ndarray, t: np.ndarray, context: np.ndarray | None) -> np.ndarray:
        """Channels-last host arrays in; the gathered channels-last output on the host."""
        import jax

        if x.shape[0] % self.plan.data:
            raise InvalidRequest(
                f"plan {self.plan.name} splits the batch {self.plan.data} ways; the U-Net got a batch of "
                f"{x.shape[0]}"
            )
        args = [
            None if a is None else jax.device_put(a, s)
            for a, s in zip((x, t, context), self._shardings[1:], strict=True)
        ]
        return np.asarray(self._compiled_for(*args)(self.params, *args))


@dataclass
class SplitDecoder:
    """The decoder split spatially over a plan's devices (``engine.xla.sharded_decode``: slabs with halos and
    global GroupNorm statistics), weights replicated, compiled once per latent shape."""

    program: Any  # engine.xla.sharded_decode.ShardedDecoder
    devices: list
    params: Any
    compile_s: float = 0.0
    memory: dict = field(default_factory=dict)  # XLA's memory analysis per device, last compiled shape
    collectives: dict = field(default_factory=dict)  # per device, of the last compiled shape's program
    _compiled: dict = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def build(cls, arch, params: dict, devices: Sequence, precision: str, latent_shape) -> SplitDecoder:
        """For a channels-last latent shape (B, D, H, W, C); refuses (InvalidRequest) one that does not split."""
        import jax

        from engine.xla.sharded_decode import sharded_decoder_program, split_for

        axes, mesh_shape = split_for(latent_shape, len(devices))
        program, shardings = sharded_decoder_program(arch, list(devices), precision, axes, mesh_shape)
        return cls(program, list(devices), jax.device_put(params, shardings[0]))

    @property
    def split(self) -> dict[str, Any]:
        return {"axes": list(self.program.axes), "mesh": list(self.program.mesh_shape)}

    def __call__(self, z: np.ndarray) -> np.ndarray:
        """A channels-last host latent in; the gathered channels-last image on the host."""
        import jax

        self.program.check(z.shape)  # a one-line refusal, not a partitioner error
        latent = jax.device_put(z, self.program.latent_sharding)
        return np.asarray(self._compiled_for(latent)(self.params, latent))

    def _compiled_for(self, latent):
        from engine.xla.sharded_decode import collective_summary, memory_record

        self.program.check(latent.shape)
        key = (tuple(latent.shape), str(latent.dtype))
        with self._lock:
            compiled = self._compiled.get(key)
            if compiled is None:
                started = time.perf_counter()
                compiled = self.program.lower(self.params, latent).compile()
                self.compile_s += time.perf_counter() - started
                self._compiled[key] = compiled
                self.memory = memory_record(compiled)
                self.collectives = collective_summary(compiled, len(self.devices))
        return compiled

    def compile_for(self, latent_shape) -> None:
        """Compile for a channels-last latent shape now, so the first decode is not its compile."""
        import jax

        self._compiled_for(jax.ShapeDtypeStruct(tuple(latent_shape), np.float32))
