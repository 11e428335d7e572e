"""Topology-aware multi-device plans for one U-Net step (``volsynth plan``).

A *plan* splits one denoising step (batch x CFG halves) over a slice's devices with a 3-axis logical mesh
``(data, depth, height)``: data parallel over the batch, spatial sharding of the depth / height axes of the
channels-last activations (XLA inserts halo exchanges for the 3x3x3 convolutions and all-reduces for the
GroupNorm statistics), with a per-level choice of which spatial axes stay sharded (a level whose extent does
not divide falls back to replicated, i.e. an all-gather on the way down).

Pipeline: enumerate plans -> cheap estimates from one jaxpr trace (FLOPs of conv/dot equations per level,
activation bytes, synthesised halo / statistics / gather collectives) -> prune (indivisible, over HBM,
dominated, not in the top N) -> compile the survivors: by default their distinct U-Net blocks on fake host
devices (``engine.xla.block_analysis``: seconds per block, identical blocks compiled once), or with
``analysis="whole"`` the whole step for the real topology (compile-only TPU devices from libtpu, fake host
devices for GPU boxes; 10-17 minutes per full-size plan on 2 cores) -> read collectives and bytes from the
compiled HLO -> cost every
placement of the logical mesh onto the physical devices with the alpha-beta model of
``engine.xla.topology`` and keep the best. The *topology-unaware* choice is the plan that a model ignoring
hops and link sharing would pick, on JAX's default device order; the gain is its time under the aware model
over the best plan's.

Planning returns at ``time_limit_s`` with the best plan so far, marked cut short: it starts no compile after
it and waits no longer for one under way (with blocks: that compile finishes in the background, into the plan
cache; ``engine.xla.bounded_compile``); finished plans and compiled blocks are kept in
``engine.xla.plan_cache``; the result reports its time per phase (tracing, estimating, compiling, placement
costing).

Predicted step time = compute + communication (no overlap assumed, so it is an upper bound on a good
schedule); compute = max(FLOPs / peak, bytes accessed / HBM bandwidth) per device.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar, cast

import numpy as np

from engine.xla.hlo import parse_hlo_collectives
from engine.xla.topology import AXES, Collective, Topology, placements, program_comm_time

if TYPE_CHECKING:
    from engine.xla.block_analysis import Unit

# What a TPU runs float32 at by default (bf16 passes), and so what plans are predicted for.
PLANNED_PRECISION = "default"
DOMINATED_FACTOR = 2.0  # prune a plan whose estimate is over this many times the best estimate
DEFAULT_COMPILE_TOP = 3
# Planning stops starting compiles after this many seconds and returns the best plan so far, saying so.
DEFAULT_TIME_LIMIT_S = 120.0
# Part of every finished-plan cache key: bump it when what the planner computes for a network changes.
PLANNER_VERSION = "5"
# Compiled plans whose host-priced steps are this close count as tied: the tie goes to the plan the cost
# model ranked first (it is computed from the jaxpr before anything compiles, so it is the same in every run).
# Two plans of the bundle U-Net came within 0.1% of each other, and which one won changed between runs.
TIE_FRACTION = 0.005
# blocks: distinct U-Net units on host devices; whole: the whole step for the topology (TPU compile-only
# devices for slices); host-whole: the whole step on host devices (same SPMD partitioning, no TPU backend).
ANALYSES = ("blocks", "whole", "host-whole")
MAISI_CONTEXT_DIM = 4  # class label, spacing x 100 on three axes (engine.models.maisi.maisi_denoiser)
# Live activations on top of the skips: the block's input, output and the norm / attention temporaries.
_WORKING_SET_FACTOR = 4


@dataclass(frozen=True)
class Network:
    """What is planned: one U-Net evaluation on an effective batch (batch x CFG halves)."""

    name: str
    arch: Any
    params: dict  # name -> jax.ShapeDtypeStruct
    apply: Callable  # unet_apply(arch, params, x, t, context, constrain=..., precision=...)
    spatial: tuple[int, ...]  # latent D, H, W
    in_channels: int
    context_dim: int | None
    batch: int  # effective batch: requested batch x 2 with CFG
    levels: int
    precision: str = PLANNED_PRECISION
    cfg: bool = False  # the batch holds the conditioned and unconditioned halves

    @property
    def params_bytes(self) -> int:
        return sum(int(np.prod(s.shape)) * np.dtype(s.dtype).itemsize for s in self.params.values())

    def abstract_inputs(self):
        import jax
        import jax.numpy as jnp

        x = jax.ShapeDtypeStruct((self.batch, *self.spatial, self.in_channels), jnp.float32)
        t = jax.ShapeDtypeStruct((self.batch,), jnp.float32)
        ctx = (
            None
            if self.context_dim is None
            else jax.ShapeDtypeStruct((self.batch, 1, self.context_dim), jnp.float32)
        )
        return x, t, ctx

    def level_extents(self) -> list[tuple[int, ...]]:
        # Stride-2 convolutions (padding 1) give ceil(previous / 2); resblock_updown's pooling gives the same
        # for the even extents the planner can shard.
        out = [tuple(self.spatial)]
        for _ in range(self.levels - 1):
            out.append(tuple(-(-s // 2) for s in out[-1]))
        return out


def network_from_definition(
    name: str,
    definition: dict,
    latent_spatial: Sequence[int],
    batch: int = 1,
    cfg: bool = True,
    precision: str = "default",
) -> Network:
    """Build the planning view of a MONAI DiffusionModelUNet or MAISI v2 DiffusionModelUNetMaisi definition
    (on torch's meta device: no memory). A MAISI U-Net is called as every denoiser is, its context the packed
    class label and spacing (``engine.xla.nets.maisi_denoiser_apply``)."""
    from engine.models.networks import short_target
    from engine.xla.convert import abstract_params, maisi_unet_arch, meta_network, unet_arch
    from engine.xla.nets import maisi_denoiser_apply, unet_apply

    module = meta_network(definition)
    maisi = short_target(definition.get("_target_", "")) == "DiffusionModelUNetMaisi"
    arch = (maisi_unet_arch if maisi else unet_arch)(module)
    return Network(
        name=name,
        arch=arch,
        params=abstract_params(module),
        apply=maisi_denoiser_apply if maisi else unet_apply,
        spatial=tuple(int(s) for s in latent_spatial),
        in_channels=int(arch.in_channels),
        context_dim=MAISI_CONTEXT_DIM if maisi else arch.context_dim,
        batch=batch * (2 if cfg else 1),
        levels=int(arch.levels),
        precision=precision,
        cfg=cfg,
    )


# ---------------------------------------------------------------------------------------------- plans


@dataclass(frozen=True)
class Plan:
    data: int
    depth: int
    height: int
    # Per level: (depth sharded, height sharded).
    levels: tuple[tuple[bool, bool], ...]
    variant: str = "auto"

    @property
    def mesh_shape(self) -> tuple[int, int, int]:
        return (self.data, self.depth, self.height)

    @property
    def kind(self) -> str:
        spatial = self.depth > 1 or self.height > 1
        if self.data > 1 and spatial or self.depth > 1 and self.height > 1:
            return "2-D"
        return "spatial" if spatial else "batch"

    @property
    def name(self) -> str:
        parts = [f"{a}{n}" for a, n in zip(("dp", "d", "h"), self.mesh_shape, strict=True) if n > 1] or [
            "single"
        ]
        label = "x".join(parts)
        return label if self.variant == "auto" else f"{label}/{self.variant}"

    def level_labels(self) -> list[str]:
        return [("d" if d else "") + ("h" if h else "") or "-" for d, h in self.levels]

    def shards(self, level: int) -> int:
        d, h = self.levels[level]
        return self.data * (self.depth if d else 1) * (self.height if h else 1)

    def spec(self, level: int):
        from jax.sharding import PartitionSpec

        d, h = self.levels[level] if level >= 0 else (False, False)
        return PartitionSpec(
            "data" if self.data > 1 else None,
            "depth" if d and self.depth > 1 else None,
            "height" if h and self.height > 1 else None,
            None,
            None,
        )


def _factorisations(n: int) -> list[tuple[int, int, int]]:
    return [
        (a, b, n // (a * b))
        for a in range(1, n + 1)
        if n % a == 0
        for b in range(1, n // a + 1)
        if (n // a) % b == 0
    ]


def enumerate_plans(network: Network, n_devices: int) -> list[tuple[Plan | None, dict, str | None]]:
    """Every (data, depth, height) factorisation of the device count with its per-level variants.

    Returns (plan, mesh dict, reason) triples; ``reason`` is set (and plan may be None) when the mesh cannot
    be used at all (indivisible batch, or a spatial axis that no level can be split over).
    """
    extents = network.level_extents()
    out: list[tuple[Plan | None, dict, str | None]] = []
    for data, depth, height in _factorisations(n_devices):
        mesh = {"data": data, "depth": depth, "height": height}
        if network.batch % data:
            out.append(
                (None, mesh, f"indivisible: batch x CFG = {network.batch} not divisible by data {data}")
            )
            continue

        def splits(extent: int, n: int) -> bool:
            # Only even splits: XLA would pad an uneven one, and the halo logic assumes equal shards.
            return n > 1 and extent % n == 0

        auto = tuple((splits(e[0], depth), splits(e[1], height)) for e in extents)
        reason = None
        if depth > 1 and not auto[0][0]:
            reason = f"indivisible: depth {extents[0][0]} not divisible by {depth}"
        elif height > 1 and not auto[0][1]:
            reason = f"indivisible: height {extents[0][1]} not divisible by {height}"
        if reason:
            out.append((None, mesh, reason))
            continue
        variants = {"auto": auto}
        if depth > 1 or height > 1:
            # Per-level choices: stop sharding from level k on (the small deep levels pay more in halos and
            # statistics than they save in compute).
            for k in range(1, network.levels):
                cut = tuple(auto[level] if level < k else (False, False) for level in range(network.levels))
                if cut not in variants.values():
                    variants[f"cut@{k}"] = cut
        for variant, levels in variants.items():
            out.append((Plan(data, depth, height, levels, variant), mesh, None))
    return out


# ------------------------------------------------------------------------------------------ estimates


_Key = TypeVar("_Key")


def _float_counts() -> dict[_Key, float]:
    # A Counter: a key not yet seen reads as 0. Its typeshed type counts in int; these sums are float.
    return cast("dict[_Key, float]", Counter())


@dataclass
class TraceStats:
    """What the cheap estimates need from one jaxpr of the global (unsharded) program."""

    level_flops: dict[int, float] = field(default_factory=_float_counts)
    level_io_bytes: dict[int, float] = field(default_factory=_float_counts)
    level_max_bytes: dict[int, float] = field(default_factory=_float_counts)
    convs: list[tuple[int, tuple[int, ...], tuple[int, ...], int]] = field(
        default_factory=list
    )  # level, in shape, kernel, itemsize
    reductions: list[tuple[int, int]] = field(default_factory=list)  # level, output bytes
    gathers: list[tuple[int, int]] = field(default_factory=list)  # level, operand bytes (attention K/V)
    markers: list[tuple[int, tuple[int, ...], int]] = field(default_factory=list)  # level, shape, bytes


def _nbytes(aval) -> int:
    return int(np.prod(aval.shape)) * np.dtype(aval.dtype).itemsize


def trace_network(network: Network) -> TraceStats:
    """Trace the program once with ``optimization_barrier`` markers at every level entry, then walk the jaxpr
    attributing each equation to the level of the last marker."""
    import jax

    sequence: list[int] = []

    def mark(level: int, h):
        sequence.append(level)
        return jax.lax.optimization_barrier(h)

    x, t, ctx = network.abstract_inputs()

    def program(params, x, t, ctx):
        return network.apply(network.arch, params, x, t, ctx, constrain=mark, precision=network.precision)

    closed = jax.make_jaxpr(program)(network.params, x, t, ctx)
    stats = TraceStats()
    tokens = {e[0] * e[1] * e[2]: level for level, e in enumerate(network.level_extents())}
    state = {"marker": 0, "level": -1}

    def walk(jaxpr, repeat: int) -> None:
        for eqn in jaxpr.eqns:
            name = eqn.primitive.name
            if name == "optimization_barrier" and state["marker"] < len(sequence):
                level = sequence[state["marker"]]
                state["marker"] += 1
                state["level"] = level
                aval = eqn.outvars[0].aval
                stats.markers.append((level, tuple(aval.shape), _nbytes(aval)))
                continue
            level = state["level"]
            subs = [v for v in eqn.params.values() if hasattr(v, "eqns") or hasattr(v, "jaxpr")]
            for sub in subs:
                walk(getattr(sub, "jaxpr", sub), repeat * int(eqn.params.get("length", 1)))
            if subs:
                continue
            outs = [v.aval for v in eqn.outvars if hasattr(v.aval, "shape")]
            out_bytes = sum(_nbytes(a) for a in outs)
            stats.level_max_bytes[level] = max(stats.level_max_bytes[level], out_bytes)
            if name == "conv_general_dilated":
                lhs, rhs = (v.aval for v in eqn.invars[:2])
                dn = eqn.params["dimension_numbers"]
                kernel = tuple(rhs.shape[i] for i in dn.rhs_spec[2:])
                in_features = rhs.shape[dn.rhs_spec[1]]
                stats.level_flops[level] += (
                    repeat * 2.0 * np.prod(outs[0].shape) * np.prod(kernel) * in_features
                )
                stats.level_io_bytes[level] += repeat * (_nbytes(lhs) + _nbytes(rhs) + out_bytes)
                stats.convs.append((level, tuple(lhs.shape), kernel, np.dtype(lhs.dtype).itemsize))
            elif name == "dot_general":
                lhs, rhs = (v.aval for v in eqn.invars[:2])
                (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
                contracted = np.prod([lhs.shape[i] for i in lc]) if lc else 1
                stats.level_flops[level] += repeat * 2.0 * np.prod(outs[0].shape) * contracted
                stats.level_io_bytes[level] += repeat * (_nbytes(lhs) + _nbytes(rhs) + out_bytes)
                # Attention over the tokens of a level: the key/value operand (rhs) carries the token axis
                # outside its batch dims; a spatially split level must gather it from every shard.
                rhs_tokens = [i for i, s in enumerate(rhs.shape) if s in tokens and i not in rb]
                lhs_tokens = [s for i, s in enumerate(lhs.shape) if s in tokens and i not in lb]
                if rhs_tokens and lhs_tokens and len(rhs.shape) >= 3:
                    stats.gathers.append((level, _nbytes(rhs)))
            elif name in ("reduce_sum", "reduce_max", "reduce_min", "argmax"):
                operand = eqn.invars[0].aval
                axes = eqn.params.get("axes", ())
                if len(operand.shape) >= 5 and 1 in axes:
                    stats.reductions.append((level, out_bytes))

    walk(closed.jaxpr, 1)
    return stats


def _axis_groups(plan: Plan, axes: Sequence[str]) -> tuple[tuple[int, ...], ...]:
    """Logical-id groups that vary over ``axes`` of the plan's (data, depth, height) mesh."""
    ids = np.arange(plan.data * plan.depth * plan.height).reshape(plan.mesh_shape)
    varying = [AXES.index(a) for a in axes]
    fixed = [i for i in range(3) if i not in varying]
    moved = ids.transpose(fixed + varying).reshape(-1, int(np.prod([plan.mesh_shape[i] for i in varying])))
    return tuple(tuple(int(v) for v in row) for row in moved)


def _neighbour_pairs(plan: Plan, axis: str, step: int) -> tuple[tuple[int, int], ...]:
    pairs = []
    for group in _axis_groups(plan, [axis]):
        for i in range(len(group)):
            j = i + step
            if 0 <= j < len(group):
                pairs.append((group[i], group[j]))
    return tuple(pairs)


def estimate_collectives(plan: Plan, stats: TraceStats) -> list[Collective]:
    """The collectives XLA's SPMD partitioner is expected to insert, from the trace (cheap, approximate)."""
    found: Counter = Counter()
    mesh = {"depth": plan.depth, "height": plan.height}

    def sharded_axes(level: int) -> list[str]:
        if level < 0:
            return []
        d, h = plan.levels[level]
        return [a for a, on in (("depth", d), ("height", h)) if on and mesh[a] > 1]

    for level, shape, kernel, itemsize in stats.convs:
        axes = sharded_axes(level)
        if not axes:
            continue
        local = int(np.prod(shape)) * itemsize / plan.shards(level)
        for axis in axes:
            dim = 1 if axis == "depth" else 2
            halo = kernel[dim - 1] // 2
            if halo == 0:
                continue
            slab = int(local / (shape[dim] / mesh[axis]) * halo)
            for step in (1, -1):
                found[("collective-permute", slab, (), _neighbour_pairs(plan, axis, step))] += 1
    for level, out_bytes in stats.reductions:
        axes = sharded_axes(level)
        if axes:
            found[("all-reduce", max(4, out_bytes // plan.data), _axis_groups(plan, axes), ())] += 1
    for level, operand in stats.gathers:
        axes = sharded_axes(level)
        if axes:
            found[("all-gather", operand // plan.data, _axis_groups(plan, axes), ())] += 1
    previous: list[str] = []
    for level, _shape, nbytes in stats.markers:
        now = sharded_axes(level)
        lost = [a for a in previous if a not in now]
        if lost:
            # Leaving a sharded level for a replicated one: every shard gathers the whole activation.
            found[("all-gather", nbytes // plan.data, _axis_groups(plan, lost), ())] += 1
        previous = now
    return [Collective(k, int(b), g, p, n) for (k, b, g, p), n in found.items()]


@dataclass
class Estimate:
    flops: float
    compute_s: float
    memory_bytes: float
    collectives: list[Collective]


def estimate_plan(plan: Plan, stats: TraceStats, network: Network, topology: Topology) -> Estimate:
    flops = sum(f / (plan.data if lv < 0 else plan.shards(lv)) for lv, f in stats.level_flops.items())
    io = sum(b / (plan.data if lv < 0 else plan.shards(lv)) for lv, b in stats.level_io_bytes.items())
    compute = topology.chip.compute_s(flops, io)
    skips = sum(b / plan.shards(lv) for lv, _s, b in stats.markers if lv >= 0)
    working = max(
        (b / (plan.data if lv < 0 else plan.shards(lv)) for lv, b in stats.level_max_bytes.items()), default=0
    )
    memory = network.params_bytes + skips + _WORKING_SET_FACTOR * working
    return Estimate(flops, compute, memory, estimate_collectives(plan, stats))


# ------------------------------------------------------------------------------------- compile + rank


def build_program(network: Network, plan: Plan, devices: Sequence):
    """The jitted, sharded step for ``plan`` on ``devices`` (logical mesh order), with its input shardings."""
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(np.array(list(devices), dtype=object).reshape(plan.mesh_shape), AXES)

    class Constrain:
        every_block = True  # the program runs the plan as it says, cut levels whole (nets.unet_body)

        def __call__(self, level: int, h):
            return jax.lax.with_sharding_constraint(h, NamedSharding(mesh, plan.spec(level)))

    constrain = Constrain()

    def program(params, x, t, ctx):
        return network.apply(
            network.arch, params, x, t, ctx, constrain=constrain, precision=network.precision
        )

    data = PartitionSpec("data" if plan.data > 1 else None)
    replicated = NamedSharding(mesh, PartitionSpec())
    x_sharding = NamedSharding(mesh, plan.spec(0))
    in_shardings = (
        jax.tree_util.tree_map(lambda _: replicated, network.params),
        x_sharding,
        NamedSharding(mesh, data),
        None if network.context_dim is None else NamedSharding(mesh, data),
    )
    return jax.jit(program, in_shardings=in_shardings, out_shardings=x_sharding), in_shardings


@dataclass
class Row:
    plan: str
    kind: str
    mesh: dict
    levels: list[str]
    status: str  # "compiled", "pruned", "failed"
    reason: str = ""
    est_step_ms: float | None = None
    est_compute_ms: float | None = None
    est_comm_ms: float | None = None
    est_memory_gb: float | None = None
    step_ms: float | None = None
    compute_ms: float | None = None
    comm_ms: float | None = None
    memory_gb: float | None = None
    unaware_step_ms: float | None = None
    placement: str = ""
    collectives: dict = field(default_factory=dict)
    compile_s: float | None = None
    analysis: str = ""  # compiled rows: "whole" (one program) or "blocks" (composed from compiled units)
    units: str = ""  # blocks: "distinct programs / units of the step, compiled now"
    # blocks on a TPU slice, the chosen plan: where its collectives came from ("7 communicating blocks
    # compiled for the TPU v5 lite"), and its host-compiled step, comm and placement it was ranked on.
    placed_on: str = ""
    host: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, data: dict) -> Row:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass
class PlanResult:
    model: str
    topology: dict
    batch: int
    cfg: bool
    rows: list[Row]
    enumerated: int
    pruned: int
    compiled: int
    failed: int
    planning_s: float
    precision: str
    best: dict | None
    unaware_choice: dict | None
    gain: float | None
    analysis: str = "whole"
    # Seconds per phase: tracing (jaxpr, units, devices), estimating, compiling, placement costing, other.
    timing: dict = field(default_factory=dict)
    time_limit_s: float | None = None
    cut_short: bool = False  # the time limit stopped compiling: ``best`` is the best plan so far
    cut_reason: str = ""
    from_cache: bool = False  # read from the plan cache; ``timing`` and ``planning_s`` are the lookup's
    cached_planning_s: float | None = None  # what planning it took when it was computed
    cache_key: str = ""
    # The step unsplit on one chip of the slice, what splitting is measured against: step_ms, memory_gb, fits
    # (in one chip's HBM) and from ("blocks": its host-compiled blocks; "estimate"); ``speedup`` is its step
    # over the best plan's (below 1: one chip alone is faster).
    one_device: dict | None = None
    speedup: float | None = None

    def to_dict(self) -> dict:
        return {
            "model": self.model,
            "topology": self.topology,
            "batch": self.batch,
            "cfg": self.cfg,
            "counts": {
                "enumerated": self.enumerated,
                "pruned": self.pruned,
                "compiled": self.compiled,
                "failed": self.failed,
            },
            "planning_s": round(self.planning_s, 2),
            # Compute is predicted from the chip's bf16 peak: what precision "default" runs at on a TPU.
            "precision": self.precision,
            "best": self.best,
            "unaware_choice": self.unaware_choice,
            "gain": self.gain,
            "one_device": self.one_device,
            "speedup": self.speedup,
            "analysis": self.analysis,
            "timing": {k: round(v, 3) for k, v in self.timing.items()},
            "time_limit_s": self.time_limit_s,
            "cut_short": self.cut_short,
            "cut_reason": self.cut_reason,
            "from_cache": self.from_cache,
            "cached_planning_s": self.cached_planning_s,
            "cache_key": self.cache_key,
            "rows": [r.to_dict() for r in self.rows],
        }

    @classmethod
    def from_dict(cls, data: dict) -> PlanResult:
        counts = data["counts"]
        return cls(
            model=data["model"],
            topology=data["topology"],
            batch=data["batch"],
            cfg=data["cfg"],
            rows=[Row.from_dict(r) for r in data["rows"]],
            enumerated=counts["enumerated"],
            pruned=counts["pruned"],
            compiled=counts["compiled"],
            failed=counts["failed"],
            planning_s=data["planning_s"],
            precision=data["precision"],
            best=data["best"],
            unaware_choice=data["unaware_choice"],
            gain=data["gain"],
            one_device=data.get("one_device"),
            speedup=data.get("speedup"),
            analysis=data.get("analysis", "whole"),
            timing=dict(data.get("timing", {})),
            time_limit_s=data.get("time_limit_s"),
            cut_short=bool(data.get("cut_short", False)),
            cut_reason=data.get("cut_reason", ""),
            from_cache=bool(data.get("from_cache", False)),
            cached_planning_s=data.get("cached_planning_s"),
            cache_key=data.get("cache_key", ""),
        )


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 4)


def _collective_summary(collectives: Sequence[Collective]) -> dict:
    out: dict[str, dict] = {}
    for c in collectives:
        entry = out.setdefault(c.kind, {"count": 0, "bytes": 0})
        entry["count"] += c.count
        entry["bytes"] += c.count * c.nbytes
    return out


def _best_placement(topology: Topology, collectives, orders: dict[str, list[int]]) -> tuple[str, float]:
    timed = {
        name: program_comm_time(topology, collectives, order, aware=True) for name, order in orders.items()
    }
    name = min(timed, key=lambda k: (timed[k], k != "id-order"))
    return name, timed[name]


class _Phases:
    """Wall time per planning phase; time spent in a nested phase is not counted again in the outer one."""

    def __init__(self, clock: Callable[[], float]):
        self.clock = clock
        self.started = clock()
        self.spent: dict[str, float] = _float_counts()
        self._inner: list[float] = []

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t0 = self.clock()
        self._inner.append(0.0)
        try:
            yield
        finally:
            took = self.clock() - t0
            self.spent[name] += took - self._inner.pop()
            if self._inner:
                self._inner[-1] += took

    def elapsed(self) -> float:
        return self.clock() - self.started

    def report(self) -> dict[str, float]:
        total = self.elapsed()
        out: dict[str, float] = {
            f"{k}_s": self.spent[k] for k in ("tracing", "estimating", "compiling", "placement")
        }
        out["other_s"] = max(0.0, total - sum(out.values()))
        out["total_s"] = total
        return out


class _Limit:
    """The planning-time limit: ``check()`` raises OutOfTime once ``limit_s`` have passed on the clock;
    ``remaining()`` is how long a compile under way may still be waited for."""

    def __init__(self, phases: _Phases, limit_s: float | None):
        self.phases, self.limit_s = phases, limit_s
        self.message = "" if limit_s is None else f"planning-time limit of {limit_s:g} s reached"

    def remaining(self) -> float | None:
        return None if self.limit_s is None else self.limit_s - self.phases.elapsed()

    def check(self) -> None:
        from engine.xla.block_analysis import OutOfTime

        left = self.remaining()
        if left is not None and left <= 0:
            raise OutOfTime(self.message)


def plan(
    network: Network,
    topology: Topology,
    compile_top: int = DEFAULT_COMPILE_TOP,
    dominated_factor: float = DOMINATED_FACTOR,
    progress: Callable[[str], None] | None = None,
    *,
    analysis: str = "blocks",
    time_limit_s: float | None = DEFAULT_TIME_LIMIT_S,
    cache=None,
    clock: Callable[[], float] = time.perf_counter,
    unit_devices: Sequence | None = None,
) -> PlanResult:
    """Enumerate, estimate, prune, compile and rank; see the module docstring.

    ``analysis`` "blocks" composes each survivor's costs from its compiled U-Net units
    (``engine.xla.block_analysis``, on ``unit_devices``: by default host CPU devices when there are enough,
    else the topology's own); "whole" compiles the whole step for the topology (the slow reference).
    ``time_limit_s`` (None: none) returns the best plan so far once passed, marked ``cut_short``: a block's
    compile under way then finishes in the background (a whole program's compile finishes first).
    ``cache`` (an ``engine.xla.plan_cache.PlanCache``) returns a finished plan planned before and keeps unit
    analyses.
    """
    if analysis not in ANALYSES:
        raise ValueError(f"analysis must be one of {ANALYSES}, got {analysis!r}")
    say = progress or (lambda _msg: None)
    phases = _Phases(clock)
    with phases("tracing"):
        devices, unit_devices, whole_devices = _planning_devices(topology, analysis, unit_devices)
        orders = placements(topology, devices)
    default = "id-order"
    key = ""
    if cache is not None:
        from engine.xla.plan_cache import plan_key

        facts = {
            "compile_top": compile_top,
            "dominated_factor": dominated_factor,
            "analysis": analysis,
            "unit_platform": unit_devices[0].platform if unit_devices else "",
            "planner": PLANNER_VERSION,
        }
        key = plan_key(network, topology, facts)
        stored = cache.load_result(key)
        if stored is not None:
            result = PlanResult.from_dict(stored)
            result.from_cache, result.cache_key = True, key
            result.cached_planning_s = stored.get("planning_s")
            result.timing = phases.report()
            result.planning_s = result.timing["total_s"]  # one clock reading for both
            say(f"{network.name} on {topology.name}: from the plan cache")
            return result

    say(f"tracing {network.name} ...")
    with phases("tracing"):
        stats = trace_network(network)
    with phases("estimating"):
        enumerated = enumerate_plans(network, topology.n_devices)
        rows, candidates = _estimate_plans(enumerated, stats, network, topology, orders, phases)
        survivors = _select_for_compile(candidates, topology, orders[default], compile_top, dominated_factor)
    limit = _Limit(phases, time_limit_s)
    blocks = _BlockRun(network, unit_devices, cache, limit, say) if analysis == "blocks" else None
    measure = blocks.measure if blocks else _WholeRun(network, whole_devices, limit, say).measure
    compiled, cut_reason = _compile_survivors(survivors, measure, topology, orders, default, phases)
    on_slice: dict[int, tuple] = {}
    if blocks and compiled and _compiles_elsewhere(unit_devices, devices):
        on_slice, slice_cut = _place_chosen_on_slice(
            blocks, compiled, survivors, topology, devices, orders, phases
        )
        cut_reason = cut_reason or slice_cut
    with phases("placement"):
        best, unaware_choice, gain = _choose(compiled, topology, orders, default, on_slice)
        if best is not None:
            best["from"] = analysis
        elif cut_reason and candidates:
            best, unaware_choice, gain = _choose_from_estimates(candidates, topology, orders, default)
    one_device = _one_device(network, topology, stats, blocks, phases) if best is not None else None
    speedup = None
    if one_device and best is not None and best["step_ms"]:
        speedup = float(f"{one_device['step_ms'] / best['step_ms']:.4g}")

    chosen = best["plan"] if best else None
    rows.sort(  # the order plans were ranked in: the chosen one first (it won any tie), then by step
        key=lambda r: (
            {"compiled": 0, "failed": 1, "pruned": 2}[r.status],
            r.plan != chosen,
            r.host.get("step_ms") or r.step_ms or r.est_step_ms or math.inf,
        )
    )
    result = PlanResult(
        model=network.name,
        topology=topology.summary(),
        batch=network.batch,
        cfg=network.cfg,
        rows=rows,
        enumerated=len(enumerated),
        pruned=sum(r.status == "pruned" for r in rows),
        compiled=sum(r.status == "compiled" for r in rows),
        failed=sum(r.status == "failed" for r in rows),
        planning_s=0.0,
        precision=network.precision,
        best=best,
        unaware_choice=unaware_choice,
        gain=gain,
        analysis=analysis,
        time_limit_s=time_limit_s,
        cut_short=bool(cut_reason),
        cut_reason=cut_reason,
        cache_key=key,
        one_device=one_device,
        speedup=speedup,
    )
    result.timing = phases.report()
    result.planning_s = result.timing["total_s"]  # one clock reading for both
    if cache is not None and not result.cut_short:
        cache.save_result(key, result.to_dict())
    return result


def measure_plan(
    network: Network,
    topology: Topology,
    p: Plan,
    cache=None,
    time_limit_s: float | None = DEFAULT_TIME_LIMIT_S,
) -> Row | None:
    """One plan's row priced as :func:`plan` priced it, so a run of a plan named in the Plan view predicts
    what that view showed: by blocks on host devices, best placement on ``topology``, and on a TPU slice
    placed on the slice's own collectives when its blocks compiled for the slice are in ``cache`` (the
    planner put them there when it placed the plan). A run does not compile for the slice itself: 2-290 s a
    block here.

    The plan may use fewer devices than the topology has (a sub-mesh, e.g. dp2 on v5e:2x4): its logical
    devices go on the first ones of each placement. Units compiled before come from ``cache``. Returns None
    when XLA refuses a unit, the plan does not fit in HBM (the row says why) or the units take longer than
    ``time_limit_s`` to compile (a TPU host compiles them on its chips).
    """
    from engine.xla.block_analysis import OutOfTime

    phases = _Phases(time.perf_counter)
    devices, unit_devices, _whole = _planning_devices(topology, "blocks", None)
    orders = placements(topology, devices)
    n = p.data * p.depth * p.height
    mesh = {"data": p.data, "depth": p.depth, "height": p.height}
    row = Row(p.name, p.kind, mesh, p.level_labels(), "pruned")
    run = _BlockRun(network, list(unit_devices)[:n], cache, _Limit(phases, time_limit_s), lambda _msg: None)
    try:
        measured = run.measure(p, row, topology, orders, "id-order", phases)
    except OutOfTime:
        return None
    if measured is None:
        return None
    if _compiles_elsewhere(unit_devices, devices):
        run.place_on_slice(p, row, topology, list(devices)[:n], orders, "id-order", phases, cached_only=True)
    return row


def _planning_devices(topology: Topology, analysis: str, unit_devices: Sequence | None):
    """The topology's devices (placements are costed on them), those the units compile on (blocks), and
    those whole programs compile on (the topology's, or host devices for host-whole)."""
    from engine.xla.topology import physical_devices

    devices = physical_devices(topology)
    whole_devices = devices
    if analysis == "blocks" and unit_devices is None:
        unit_devices = _host_devices(topology.n_devices) or devices
    if analysis == "host-whole":
        host_devices = _host_devices(topology.n_devices)
        if host_devices is None:
            raise ValueError(f"host-whole needs {topology.n_devices} host devices; this process has fewer")
        whole_devices = unit_devices = host_devices
    return devices, unit_devices, whole_devices


def _one_device(network: Network, topology: Topology, stats, blocks, phases: _Phases) -> dict:
    """The step unsplit on one chip: from its blocks compiled on one host device when planning by blocks
    (cached like any plan's; a second or two for the bundle U-Net), else, or when the time limit or XLA
    stops that, from the estimate."""
    from engine.xla.block_analysis import analyse_plan

    chip = topology.chip
    single = Plan(1, 1, 1, tuple((False, False) for _ in range(network.levels)))
    est = estimate_plan(single, stats, network, topology)
    step_s, memory, source = est.compute_s, est.memory_bytes, "estimate"
    if blocks is not None:
        try:
            with phases("compiling"):
                composed = analyse_plan(
                    network,
                    single,
                    blocks.devices[:1],
                    units=blocks.units,
                    cache=blocks.cache,
                    memo=blocks.memo,
                    limit=blocks.limit,
                )
        except Exception:  # noqa: BLE001 - the limit (OutOfTime) or XLA refusing the step: the estimate stands
            pass
        else:
            step_s = chip.compute_s(composed.flops, composed.bytes_accessed)
            memory, source = composed.memory_bytes, "blocks"
    return {
        "step_ms": _ms(step_s),
        "memory_gb": round(memory / 1e9, 3),
        "fits": memory <= chip.hbm_bytes,
        "from": source,
    }


def _compile_survivors(survivors, measure, topology: Topology, orders, default: str, phases: _Phases):
    """Compile the survivors in order until the time limit; returns the measured ones and why it stopped
    early ("" when it did not). A plan not reached gets that reason in its row."""
    from engine.xla.block_analysis import OutOfTime

    compiled, cut_reason = [], ""
    for p, row, _est in survivors:
        if cut_reason:
            row.reason = f"not compiled: {cut_reason}"
            continue
        try:
            with phases("compiling"):
                measured = measure(p, row, topology, orders, default, phases)
        except OutOfTime as exc:
            cut_reason = str(exc)
            row.reason = f"not compiled: {cut_reason}"
            continue
        if measured is not None:
            compiled.append(measured)
    return compiled, cut_reason


def _compiles_elsewhere(unit_devices: Sequence, devices: Sequence) -> bool:
    """Whether the units compile on another platform than the topology's own devices (host devices for a
    TPU slice), whose partitioner makes other collectives."""
    from engine.xla.block_analysis import platform_of

    return platform_of(unit_devices) != platform_of(devices)


def _place_chosen_on_slice(blocks, compiled, survivors, topology: Topology, devices, orders, phases):
    """Price the plan ranked first on host units again with its communicating units compiled for the slice
    (``engine.xla.block_analysis``: the TPU's halos and reductions route differently, and so decide the
    placement). Only that plan: the slice's compiler takes 2-290 s a unit where the host takes 0.3 s, so
    all three survivors of the bundle U-Net would take about 30 minutes here, against 58 s for the first.
    Returns ({id(row): tuple}, why it was cut short or "")."""
    from engine.xla.block_analysis import OutOfTime

    entry = _fastest(compiled)
    row = entry[0]
    p = next(p for p, r, _est in survivors if r is row)
    blocks.say(f"placing {p.name}: compiling its communicating blocks for {topology.name} ...")
    try:
        with phases("compiling"):
            measured = blocks.place_on_slice(p, row, topology, devices, orders, "id-order", phases)
    except OutOfTime as exc:
        row.placed_on = "host-compiled units (the time limit came before the slice's compile finished)"
        return {}, f"{exc}: {p.name} is placed on host-compiled collectives, not the slice's"
    return ({id(row): measured} if measured is not None else {}), ""


class _WholeRun:
    """Each survivor compiled as one whole program (for the topology, or on host devices)."""

    def __init__(self, network: Network, devices, limit: _Limit, say):
        self.network, self.devices, self.limit, self.say = network, devices, limit, say

    def measure(self, p: Plan, row: Row, topology: Topology, orders, default: str, phases: _Phases):
        self.limit.check()
        self.say(f"compiling {p.name} for {topology.name} on {self.devices[0].platform} devices ...")
        return _compile_and_measure(p, row, self.network, topology, self.devices, orders, default, phases)


# Host compiles: only XLA's HLO passes matter (partitioning, fusion, the cost analysis); LLVM's optimisation
# of code that never runs leaves them unchanged and doubles the compile time.
_HOST_FAST = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def _host_devices(n: int) -> list | None:
    """``n`` host CPU devices for compiling units, or None when this process started JAX with fewer."""
    import jax

    cpus = jax.devices("cpu")
    return list(cpus[:n]) if len(cpus) >= n else None


class _BlockRun:
    """The units of one network, and their analyses, shared by the plans of one planning run."""

    def __init__(self, network: Network, devices, cache, limit: _Limit, say):
        self.network, self.devices, self.cache, self.limit, self.say = network, devices, cache, limit, say
        self.units: list[Unit] | None = None
        self.memo: dict = {}

    def measure(
        self,
        p: Plan,
        row: Row,
        topology: Topology,
        orders,
        default: str,
        phases: _Phases,
        collective_devices: Sequence | None = None,
        collectives_cached_only: bool = False,
    ):
        from engine.xla.block_analysis import OutOfTime, analyse_plan, unet_units

        t0 = time.perf_counter()
        if self.units is None:
            with phases("tracing"):
                self.units = unet_units(self.network)
        if collective_devices is None:
            self.say(f"compiling the units of {p.name} on {self.devices[0].platform} devices ...")
        try:
            composed = analyse_plan(
                self.network,
                p,
                self.devices,
                units=self.units,
                cache=self.cache,
                memo=self.memo,
                limit=self.limit,
                collective_devices=collective_devices,
                collectives_cached_only=collectives_cached_only,
            )
        except OutOfTime:
            raise
        except Exception as exc:  # noqa: BLE001 - one plan that XLA rejects must not stop the others
            row.status, row.reason = "failed", f"compile failed: {type(exc).__name__}: {str(exc)[:160]}"
            row.compile_s = round(time.perf_counter() - t0, 1)
            return None
        row.compile_s = round(time.perf_counter() - t0, 1)
        row.analysis = "blocks"
        if collective_devices is None:
            row.units = (
                f"{composed.distinct} distinct / {composed.units} units, {composed.compiled} compiled now"
            )
        elif composed.retargeted:  # the host units were counted when the row was measured first
            row.units += f"; {composed.retargeted_compiled} compiled now for the slice"
            n, chip = composed.retargeted, getattr(collective_devices[0], "device_kind", "") or "the slice"
            row.placed_on = f"{n} communicating block{'s' if n != 1 else ''} compiled for the {chip}"
        return _fill_row(
            row,
            composed.collectives,
            composed.flops,
            composed.bytes_accessed,
            composed.memory_bytes,
            topology,
            orders,
            default,
            phases,
        )

    def place_on_slice(
        self, p: Plan, row: Row, topology: Topology, slice_devices, orders, default, phases, cached_only=False
    ):
        """Price ``row`` (measured on host units) again with the collectives of its communicating units
        compiled for the slice's own devices; the host figures it was ranked on go to ``row.host``. Raises
        OutOfTime (the row unchanged) when the limit passes first; None when XLA refuses a unit there, or
        when ``cached_only`` and they are not all in the plan cache (the row stays host-priced)."""
        host = {"step_ms": row.step_ms, "comm_ms": row.comm_ms, "placement": row.placement}
        compile_s = row.compile_s or 0.0
        measured = self.measure(
            p, row, topology, orders, default, phases, slice_devices, collectives_cached_only=cached_only
        )
        row.compile_s = round(compile_s + (row.compile_s or 0.0), 1)
        if measured is None:  # XLA refused a unit for the slice: the host-priced row stands, saying so
            row.placed_on = f"host-compiled units (for the slice: {row.reason})"
            row.status, row.reason = "compiled", ""
            return None
        if not row.placed_on:  # cached_only, and not all in the cache: the same host-priced row again
            return None
        row.host = host
        return measured


def _estimate_plans(
    enumerated, stats, network: Network, topology: Topology, orders, phases: _Phases
) -> tuple[list[Row], list[tuple[Plan, Row, Estimate]]]:
    """A row per enumerated plan with its estimate; those that fit in HBM are the candidates."""
    chip = topology.chip
    rows: list[Row] = []
    candidates: list[tuple[Plan, Row, Estimate]] = []
    for p, mesh, reason in enumerated:
        if p is None:
            rows.append(
                Row(
                    Plan(mesh["data"], mesh["depth"], mesh["height"], ()).name,
                    "-",
                    mesh,
                    [],
                    "pruned",
                    reason or "",
                )
            )
            continue
        est = estimate_plan(p, stats, network, topology)
        with phases("placement"):
            _placement, comm = _best_placement(topology, est.collectives, orders)
        row = Row(
            p.name,
            p.kind,
            mesh,
            p.level_labels(),
            "pruned",
            est_step_ms=_ms(est.compute_s + comm),
            est_compute_ms=_ms(est.compute_s),
            est_comm_ms=_ms(comm),
            est_memory_gb=round(est.memory_bytes / 1e9, 3),
        )
        rows.append(row)
        if est.memory_bytes > chip.hbm_bytes:
            row.reason = (
                f"memory: estimated {est.memory_bytes / 1e9:.1f} GB > {chip.hbm_bytes / 1e9:.0f} GB HBM"
            )
            continue
        candidates.append((p, row, est))
    return rows, candidates


def _estimated_ms(row: Row) -> float:
    """A candidate's estimated step (every candidate has one: ``_estimate_plans`` sets it)."""
    if row.est_step_ms is None:
        raise ValueError(f"plan {row.plan} has no estimate")
    return row.est_step_ms


def _select_for_compile(
    candidates: list[tuple[Plan, Row, Estimate]],
    topology: Topology,
    default_order,
    compile_top: int,
    dominated_factor: float,
) -> list[tuple[Plan, Row, Estimate]]:
    """The candidates worth compiling: the top ``compile_top`` by estimate that are not dominated, plus the
    placement-unaware model's favourite; the others get their reason."""
    survivors: list[tuple[Plan, Row, Estimate]] = []
    if not candidates:
        return survivors
    best_est = min(_estimated_ms(r) for _p, r, _e in candidates)
    ranked = sorted(candidates, key=lambda c: _estimated_ms(c[1]))
    # The unaware model's favourite is compiled too (so up to compile_top + 1 compiles), so that the
    # comparison ranks the same plans.
    unaware_est = {
        id(c[1]): c[2].compute_s + program_comm_time(topology, c[2].collectives, default_order, aware=False)
        for c in candidates
    }
    unaware_first = min(candidates, key=lambda c: unaware_est[id(c[1])])
    for index, (p, row, est) in enumerate(ranked):
        if _estimated_ms(row) > dominated_factor * best_est and unaware_first[1] is not row:
            row.reason = (
                f"dominated: estimate {row.est_step_ms:.3g} ms > {dominated_factor:g}x best {best_est:.3g} ms"
            )
        elif index >= compile_top and unaware_first[1] is not row:
            row.reason = f"not in the top {compile_top} by estimate"
        else:
            survivors.append((p, row, est))
    return survivors


def _compile_and_measure(
    p: Plan, row: Row, network: Network, topology: Topology, devices, orders, default: str, phases: _Phases
) -> tuple[Row, list[Collective], float, float, float] | None:
    """Compile one plan's whole step and fill its row from XLA's cost and memory analyses; returns (row,
    collectives, compute s, best-placement step s, unaware step s), or None when it failed or does not fit in
    HBM."""
    t0 = time.perf_counter()
    try:
        ordered = [devices[i] for i in orders[default]]
        jitted, _ = build_program(network, p, ordered)
        lowered = jitted.lower(network.params, *network.abstract_inputs())
        executable = lowered.compile(_HOST_FAST if devices[0].platform == "cpu" else None)
        collectives = parse_hlo_collectives(executable.as_text(), topology.n_devices)
        cost = executable.cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        mem = executable.memory_analysis()
    except Exception as exc:  # noqa: BLE001 - one plan that XLA rejects must not stop the others
        row.status, row.reason = "failed", f"compile failed: {type(exc).__name__}: {str(exc)[:160]}"
        row.compile_s = round(time.perf_counter() - t0, 1)
        return None
    row.compile_s = round(time.perf_counter() - t0, 1)
    row.analysis = "whole" if devices[0].platform != "cpu" or not topology.is_tpu else "host-whole"
    memory = None
    if mem is not None:
        memory = mem.argument_size_in_bytes + mem.output_size_in_bytes + mem.temp_size_in_bytes
        memory -= mem.alias_size_in_bytes
    return _fill_row(
        row,
        collectives,
        float(cost.get("flops", 0.0)),
        float(cost.get("bytes accessed", 0.0)),
        memory,
        topology,
        orders,
        default,
        phases,
    )


def _fill_row(
    row: Row,
    collectives: list[Collective],
    flops: float,
    bytes_accessed: float,
    memory: float | None,
    topology: Topology,
    orders,
    default: str,
    phases: _Phases,
) -> tuple[Row, list[Collective], float, float, float] | None:
    """A compiled plan's row from its per-device FLOPs, bytes, memory and collectives; placements costed."""
    chip = topology.chip
    compute = chip.compute_s(flops, bytes_accessed)
    # Placements are applied to the logical ids of the one compiled module: the SPMD program is the
    # same for every order, only which physical chip plays which logical id changes.
    with phases("placement"):
        placement_name, comm = _best_placement(topology, collectives, orders)
        unaware = program_comm_time(topology, collectives, orders[default], aware=False)
    row.status, row.reason = "compiled", ""
    row.compute_ms, row.comm_ms, row.step_ms = _ms(compute), _ms(comm), _ms(compute + comm)
    row.unaware_step_ms = _ms(compute + unaware)
    row.placement = placement_name
    row.collectives = _collective_summary(collectives)
    if memory is not None:
        row.memory_gb = round(memory / 1e9, 3)
        if memory > chip.hbm_bytes:
            row.status, row.reason = "pruned", f"memory: compiled {memory / 1e9:.1f} GB > HBM"
            return None
    return row, collectives, compute, compute + comm, compute + unaware


def _choose_from_estimates(
    candidates: list[tuple[Plan, Row, Estimate]], topology: Topology, orders, default: str
) -> tuple[dict | None, dict | None, float | None]:
    """The best plan so far when the time limit stopped compiling before any plan: ranked on the estimates."""
    ranked = []
    for _p, row, est in candidates:
        placement_name, comm = _best_placement(topology, est.collectives, orders)
        unaware = program_comm_time(topology, est.collectives, orders[default], aware=False)
        shadow = dataclasses.replace(
            row,
            placement=placement_name,
            step_ms=_ms(est.compute_s + comm),
            unaware_step_ms=_ms(est.compute_s + unaware),
        )
        ranked.append((shadow, est.collectives, est.compute_s, est.compute_s + comm, est.compute_s + unaware))
    best, unaware_choice, gain = _choose(ranked, topology, orders, default)
    if best is not None:
        best["from"] = "estimate"
    return best, unaware_choice, gain


def _fastest(compiled):
    """The compiled plan ranked first on its host-priced step; within ``TIE_FRACTION`` of the fastest, the one
    the cost model estimated faster (then by name), so that noise in the compiled figures never decides."""
    fastest = min(c[3] for c in compiled)
    tied = [c for c in compiled if c[3] <= fastest * (1 + TIE_FRACTION)]
    return min(tied, key=lambda c: (c[0].est_step_ms or math.inf, c[0].plan))


def _choose(
    compiled, topology: Topology, orders, default: str, on_slice: dict[int, tuple] | None = None
) -> tuple[dict | None, dict | None, float | None]:
    """The best compiled plan, the placement-unaware model's choice (timed with placement), and the gain.

    Plans are ranked on ``compiled`` (one model for all of them); ``on_slice`` (id(row) -> the same tuple
    priced on the slice's own collectives) then gives the figures of those it holds."""
    if not compiled:
        return None, None, None
    on_slice = on_slice or {}
    # Ranked and compared in unrounded seconds: the rows' milliseconds are rounded for display.
    first = _fastest(compiled)
    row, best_s = first[0], on_slice.get(id(first[0]), first)[3]
    best = {"plan": row.plan, "placement": row.placement, "step_ms": row.step_ms}
    if row.placed_on:
        best["placed_on"] = row.placed_on
    unaware_first = min(compiled, key=lambda c: c[4])
    urow = unaware_first[0]
    _r, ucoll, ucompute, _a, _u = on_slice.get(id(urow), unaware_first)
    aware_of_unaware = ucompute + program_comm_time(topology, ucoll, orders[default], aware=True)
    unaware_choice = {
        "plan": urow.plan,
        "placement": default,
        "unaware_model_ms": urow.unaware_step_ms,
        "step_ms": _ms(aware_of_unaware),
    }
    gain = round(aware_of_unaware / best_s, 4) if best_s else None
    return best, unaware_choice, gain
