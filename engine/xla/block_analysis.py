"""A plan's compiled costs from its U-Net's blocks, each distinct block compiled once (``volsynth plan``).

Compiling the whole sharded U-Net for a TPU slice takes 10-17 minutes on a 2-core machine, and most of it is
the same work again and again: a U-Net level repeats resblocks and attention blocks of identical shapes, and
plans that share a mesh and a level's sharding share that level's blocks. So the step is cut into *units*
at the points where ``engine.xla.nets.unet_apply`` places its per-level sharding (the stem, each
resblock + attention pair, each resample, the output head), every unit is traced on its own, units whose
jaxpr and shardings are identical are compiled once and counted as many times as they occur, and the
plan's FLOPs, bytes accessed and collectives are the sums (cf. nnScaler / Galvatron / CFP: profile the
repeated segments). Each unit's input and output carry the sharding of the level they belong to, exactly
the constraints the whole program has there, so XLA's SPMD partitioner inserts the same halo exchanges,
statistics all-reduces and gathers inside each unit as it does in the whole program.

Where the units are compiled: by default on fake host CPU devices with the plan's logical mesh (collectives
are read in logical ids, which the placement costing maps onto the slice), because host compiles take
0.1-0.3 s a unit where a TPU compile-only compile takes 2-290 s (bundle U-Net). The host's collectives are not the TPU's,
though: XLA's TPU passes exchange bf16 halos at precision "default" (the host float32 ones), reduce the
GroupNorm statistics over both spatial axes in one all-reduce (the host: one per axis), and gather
differently at a level change. The totals move little, but the routes do, and so does the best placement
(bundle U-Net, v5e:4x4, dp2xd2xh4/cut@1: host collectives put JAX's id order first, 0.84 against 0.89 ms;
the TPU's put snake-xy first, 1.02 against 1.20 ms, as the whole TPU compile does). So
``collective_devices`` (the slice's compile-only devices) compiles again, for the slice, the units that
communicate on the host, and their collectives replace the host's; FLOPs, bytes and memory stay the host's,
one model for every plan. A unit without collectives on the host (in these U-Nets: those of levels kept
whole over the spatial axes, split only over the batch) is not compiled again. Composed this way, the bundle
U-Net's three survivors on v5e:4x4 send exactly what their whole TPU programs send, to the byte
(resources/measurements/2026-12-01-amd-epyc-zen5/slice-units-vs-whole-bundle-v5e-4x4.json).
Unit analyses go to an optional :class:`engine.xla.plan_cache.PlanCache` under a key of everything that
decides them, the platform included.

The memory of a plan is composed, not measured: parameters (replicated) + the skip activations the
U-Net holds + the largest unit's temporaries and live activations.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from engine.xla.bounded_compile import OutOfTime, compile_within
from engine.xla.topology import Collective

# "data" marks an input sharded over the data axis only (timestep embedding, context); an int is a level.
Role = int | str
# Checked to leave the HLO, and so the cost analysis and collectives, unchanged (bundle resblock on 16 devices).
_HOST_FAST = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
FORMAT = 1  # bump when what a unit analysis holds changes (part of every cache key)


@dataclass(frozen=True)
class Unit:
    """One piece of the U-Net step, compiled on its own: ``fn(params, *inputs) -> outputs``."""

    label: str
    fn: Callable
    params: tuple[str, ...]  # the parameter names it reads
    inputs: tuple[Any, ...]  # jax.ShapeDtypeStruct per positional input
    in_roles: tuple[Role, ...]
    out_roles: tuple[Role, ...]
    out_shapes: tuple[Any, ...]
    signature: str  # sha256 of its jaxpr: equal for blocks that compute the same thing on the same shapes
    skip: bool = False  # its (first) output is kept for the way up


class _Recorder(dict):
    """A parameter dict that notes which names a block reads (``p[k]``, ``p.get(k)``, ``k in p``)."""

    def __init__(self, data, used: set):
        super().__init__(data)
        self._used = used

    def __getitem__(self, key):
        self._used.add(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        if dict.__contains__(self, key):
            self._used.add(key)
        return super().get(key, default)


def _unit(label, fn, network, inputs, in_roles, out_roles, skip=False) -> Unit:
    import jax

    used: set[str] = set()

    def probe(params, *args):
        return fn(_Recorder(params, used), *args)

    out = jax.eval_shape(probe, network.params, *inputs)
    outs = out if isinstance(out, tuple) else (out,)
    names = tuple(sorted(used))
    jaxpr = str(jax.make_jaxpr(fn)({k: network.params[k] for k in names}, *inputs))
    signature = hashlib.sha256(jaxpr.encode()).hexdigest()
    return Unit(label, fn, names, tuple(inputs), in_roles, out_roles, tuple(outs), signature, skip)


def unet_units(network) -> list[Unit]:
    """The units of one ``unet_apply`` step, in program order (mirrors ``engine.xla.nets.unet_apply``)."""
    import jax
    import jax.numpy as jnp

    from engine.xla import nets

    arch, precision = network.arch, network.precision
    x, t, ctx = network.abstract_inputs()
    stem_in, stem_role = ((x, t), (0, "data")) if ctx is None else ((x, t, ctx), (0, "data", "data"))

    def stem(p, x, t, ctx=None):
        emb, _attention_context = nets.step_embedding(arch, p, x, t, ctx, precision)
        return nets.conv(p, arch.conv_in, x, precision), emb

    units = [_unit("stem", stem, network, stem_in, stem_role, (0, "data"), skip=True)]
    h, emb = units[0].out_shapes
    # The blocks' attention reads the context unless the embedding took it (MAISI's class label and spacing).
    attention_context = jax.eval_shape(
        lambda p, x, t, c: nets.step_embedding(arch, p, x, t, c, precision)[1], network.params, x, t, ctx
    )
    ctx_in, ctx_role = ((ctx,), ("data",)) if attention_context is not None else ((), ())

    def res_attention(r, a, concat: bool):
        def block(p, h, *inputs):
            rest = list(inputs)
            if concat:
                h = jnp.concatenate([h, rest.pop(0)], axis=-1)  # the skip connection comes first
            e, *c = rest
            return nets.apply_attention(
                p, a, nets.resblock(p, r, h, e, precision), c[0] if c else None, precision
            )

        return block

    def resample(r):
        return lambda p, h, e, *_c: nets.resample(p, r, h, e, precision)

    skips: list[tuple[Any, int]] = [(h, 0)]
    for level, block in enumerate(arch.down):
        for i, (r, a) in enumerate(zip(block.resnets, block.attentions, strict=True)):
            u = _unit(
                f"down{level}.res{i}", res_attention(r, a, False), network, (h, emb, *ctx_in),
                (level, "data", *ctx_role), (level,), skip=True,
            )  # fmt: skip
            units.append(u)
            h = u.out_shapes[0]
            skips.append((h, level))
        if block.resample is not None:
            u = _unit(
                f"down{level}.resample", resample(block.resample), network, (h, emb, *ctx_in),
                (level, "data", *ctx_role), (level + 1,), skip=True,
            )  # fmt: skip
            units.append(u)
            h = u.out_shapes[0]
            skips.append((h, level + 1))

    deepest = arch.levels - 1
    first, mid_attention, second = arch.mid
    for label, r, a in (("mid.res0", first, mid_attention), ("mid.res1", second, None)):
        u = _unit(
            label, res_attention(r, a, False), network, (h, emb, *ctx_in),
            (deepest, "data", *ctx_role), (deepest,),
        )  # fmt: skip
        units.append(u)
        h = u.out_shapes[0]

    for index, block in enumerate(arch.up):
        level = deepest - index
        for i, (r, a) in enumerate(zip(block.resnets, block.attentions, strict=True)):
            skip, skip_level = skips.pop()
            u = _unit(
                f"up{level}.res{i}", res_attention(r, a, True), network, (h, skip, emb, *ctx_in),
                (level, skip_level, "data", *ctx_role), (level,),
            )  # fmt: skip
            units.append(u)
            h = u.out_shapes[0]
        if block.resample is not None:
            u = _unit(
                f"up{level}.resample", resample(block.resample), network, (h, emb, *ctx_in),
                (level, "data", *ctx_role), (max(level - 1, 0),),
            )  # fmt: skip
            units.append(u)
            h = u.out_shapes[0]

    def head(p, h):
        return nets.conv(p, arch.out_conv, jax.nn.silu(nets.group_norm(p, arch.out_norm, h)), precision)

    units.append(_unit("head", head, network, (h,), (0,), (0,)))
    return units


# ------------------------------------------------------------------------------------------ analysis


@dataclass
class UnitCost:
    """What one compiled unit contributes, per device."""

    flops: float
    bytes_accessed: float
    temp_bytes: float
    collectives: list[Collective]

    def to_dict(self) -> dict:
        return {
            "flops": self.flops,
            "bytes_accessed": self.bytes_accessed,
            "temp_bytes": self.temp_bytes,
            "collectives": [
                [c.kind, c.nbytes, [list(g) for g in c.groups], [list(p) for p in c.pairs], c.count]
                for c in self.collectives
            ],
        }

    @classmethod
    def from_dict(cls, data: dict) -> UnitCost:
        return cls(
            float(data["flops"]),
            float(data["bytes_accessed"]),
            float(data["temp_bytes"]),
            [
                Collective(k, int(b), tuple(tuple(g) for g in gs), tuple(tuple(p) for p in ps), int(n))
                for k, b, gs, ps, n in data["collectives"]
            ],
        )


class PlanningLimit(Protocol):
    """What :func:`analyse_plan` needs of the planner's time limit."""

    message: str  # "planning-time limit of 120 s reached"

    def check(self) -> None: ...  # raises OutOfTime once the limit has passed

    def remaining(self) -> float | None: ...  # seconds left; None: no limit


@dataclass
class BlockAnalysis:
    """A plan's compiled costs composed from its units."""

    flops: float
    bytes_accessed: float
    memory_bytes: float
    collectives: list[Collective]
    units: int  # units in the step
    distinct: int  # distinct (unit, sharding) programs
    compiled: int  # of which compiled now on ``devices`` (the rest came from the cache or an earlier plan)
    per_unit: list[dict] = field(default_factory=list)
    # With ``collective_devices``: their platform, the distinct units whose collectives came from there, and
    # how many of those were compiled now.
    collectives_platform: str = ""
    retargeted: int = 0
    retargeted_compiled: int = 0


def _role_spec(plan, role: Role):
    from jax.sharding import PartitionSpec

    if role == "data":
        return PartitionSpec("data" if plan.data > 1 else None)
    return plan.spec(int(role))


def _role_shards(plan, role: Role) -> int:
    return plan.data if role == "data" else plan.shards(int(role))


def unit_key(unit: Unit, plan, platform: str) -> str:
    """The cache key of the unit's compiled analysis under ``plan`` on ``platform``."""
    import jax

    facts = {
        "format": FORMAT,
        "unit": unit.signature,
        "mesh": list(plan.mesh_shape),
        "in": [str(_role_spec(plan, r)) for r in unit.in_roles],
        "out": [str(_role_spec(plan, r)) for r in unit.out_roles],
        "platform": platform,
        "jax": jax.__version__,
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:32]


def lower_unit(unit: Unit, network, plan, devices: Sequence, n_devices: int) -> Callable[[], UnitCost]:
    """Trace and lower one unit for ``plan`` on ``devices`` (logical mesh order) here, in the caller's thread
    (JAX's configuration is per thread); returns its compile and the reading of XLA's analyses, which may
    run on another."""
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from engine.xla.hlo import parse_hlo_collectives
    from engine.xla.topology import AXES

    mesh = Mesh(np.array(list(devices), dtype=object).reshape(plan.mesh_shape), AXES)
    sub = {k: network.params[k] for k in unit.params}
    replicated = NamedSharding(mesh, PartitionSpec())
    in_shardings = (
        {k: replicated for k in sub},
        *(NamedSharding(mesh, _role_spec(plan, r)) for r in unit.in_roles),
    )
    outs = tuple(NamedSharding(mesh, _role_spec(plan, r)) for r in unit.out_roles)
    jitted = jax.jit(unit.fn, in_shardings=in_shardings, out_shardings=outs if len(outs) > 1 else outs[0])
    lowered = jitted.lower(sub, *unit.inputs)
    # On host devices only XLA's HLO passes matter (partitioning, fusion, the cost analysis); LLVM's
    # optimisation of code that never runs would double the compile time.
    options = _HOST_FAST if devices[0].platform == "cpu" else None

    def compile_and_read() -> UnitCost:
        executable = lowered.compile(options)
        cost = executable.cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        mem = executable.memory_analysis()
        return UnitCost(
            float(cost.get("flops", 0.0)),
            float(cost.get("bytes accessed", 0.0)),
            float(mem.temp_size_in_bytes) if mem is not None else 0.0,
            parse_hlo_collectives(executable.as_text(), n_devices),
        )

    return compile_and_read


def platform_of(devices: Sequence) -> str:
    return f"{devices[0].platform}:{getattr(devices[0], 'device_kind', '')}"


def analyse_plan(
    network,
    plan,
    devices: Sequence,
    *,
    units: Sequence[Unit] | None = None,
    cache=None,
    memo: dict | None = None,
    limit: PlanningLimit | None = None,
    on_compile: Callable[[str], None] | None = None,
    collective_devices: Sequence | None = None,
    collectives_cached_only: bool = False,
) -> BlockAnalysis:
    """Compose ``plan``'s costs from its units, compiling each distinct (unit, sharding) once.

    ``memo`` (key -> UnitCost) is shared between the plans of one planning run; ``cache`` is the disk
    cache. ``limit`` is the planning-time limit: ``limit.check()`` before each compile raises
    :class:`OutOfTime` once it has passed (a limit of 0 compiles nothing), and a compile still under way when
    it passes is waited for no longer (``engine.xla.bounded_compile``: it finishes in the background, into
    ``cache``). ``collective_devices``: the slice's own devices, on which the units that communicate on
    ``devices`` are compiled again for their collectives (see the module docstring); with
    ``collectives_cached_only`` only if every one of them is in ``memo`` or ``cache`` already (else the
    host's collectives stay, and ``retargeted`` is 0).
    """
    units = list(units) if units is not None else unet_units(network)
    memo = {} if memo is None else memo
    n = len(devices)
    counts: Counter = Counter()
    first_unit: dict[str, Unit] = {}
    labels: dict[str, list[str]] = {}
    platform = platform_of(devices)
    for u in units:
        key = unit_key(u, plan, platform)
        counts[key] += 1
        first_unit.setdefault(key, u)
        labels.setdefault(key, []).append(u.label)

    compiled_now = 0

    def cost_on(u: Unit, key: str, on: Sequence) -> UnitCost:
        nonlocal compiled_now
        cost = memo.get(key)
        if cost is None and cache is not None:
            cached = cache.load_unit(key)
            cost = None if cached is None else UnitCost.from_dict(cached)
        if cost is None:
            what = u.label if on is devices else f"{u.label} for {on[0].platform}"
            if limit is not None:
                limit.check()
            if on_compile is not None:
                on_compile(what)
            work = lower_unit(u, network, plan, on, n)
            keep = None if cache is None else (lambda done: cache.save_unit(key, done.to_dict()))
            try:
                cost = compile_within(key, work, None if limit is None else limit.remaining(), keep)
            except OutOfTime:
                if limit is None:
                    raise
                where = ", into the plan cache" if cache is not None else ""
                raise OutOfTime(
                    f"{limit.message} while {what} compiled (it finishes in the background{where})"
                ) from None
            compiled_now += 1
        memo[key] = cost
        return cost

    costs = {key: cost_on(u, key, devices) for key, u in first_unit.items()}
    communicating = {key: cost.collectives for key, cost in costs.items()}
    target = "" if collective_devices is None else platform_of(collective_devices)
    on_target = {}  # host key -> its key on the target, for the units that communicate
    if target and target != platform:
        on_target = {k: unit_key(first_unit[k], plan, target) for k, c in costs.items() if c.collectives}
    if collectives_cached_only and not all(
        k in memo or (cache is not None and cache.load_unit(k) is not None) for k in on_target.values()
    ):
        on_target = {}
    before = compiled_now
    for key, target_key in on_target.items():
        assert collective_devices is not None  # on_target is empty without them
        communicating[key] = cost_on(first_unit[key], target_key, collective_devices).collectives
    retargeted_compiled = compiled_now - before

    found: Counter = Counter()
    for key, collectives in communicating.items():
        for c in collectives:
            found[(c.kind, c.nbytes, c.groups, c.pairs)] += c.count * counts[key]
    skips = sum(_nbytes(u.out_shapes[0]) / _role_shards(plan, u.out_roles[0]) for u in units if u.skip)
    largest = max(
        cost.temp_bytes
        + sum(_nbytes(a) / _role_shards(plan, r) for a, r in zip(u.inputs, u.in_roles, strict=True))
        + sum(_nbytes(a) / _role_shards(plan, r) for a, r in zip(u.out_shapes, u.out_roles, strict=True))
        for key, cost in costs.items()
        for u in [first_unit[key]]
    )
    return BlockAnalysis(
        flops=sum(c.flops * counts[k] for k, c in costs.items()),
        bytes_accessed=sum(c.bytes_accessed * counts[k] for k, c in costs.items()),
        memory_bytes=network.params_bytes + skips + largest,
        collectives=[Collective(k, int(b), g, p, int(c)) for (k, b, g, p), c in found.items()],
        units=len(units),
        distinct=len(costs),
        compiled=compiled_now - retargeted_compiled,
        per_unit=[
            {"units": labels[k], "count": counts[k], "flops": c.flops, "bytes": c.bytes_accessed}
            for k, c in costs.items()
        ],
        collectives_platform=target if on_target else platform,
        retargeted=len(on_target),
        retargeted_compiled=retargeted_compiled,
    )


def _nbytes(aval) -> int:
    return int(np.prod(aval.shape)) * np.dtype(aval.dtype).itemsize
