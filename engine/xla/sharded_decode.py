"""The autoencoder's decoder split spatially over several devices: slabs along depth (or depth x height).

SPMD: one program over a ``Mesh``; the activations entering and leaving every decoder op are constrained
(``jax.lax.with_sharding_constraint``) to be split along the chosen spatial axes, and XLA's partitioner
inserts what a hand-written slab decode would: halo exchanges (collective-permutes of one voxel plane per
neighbour) for the 3x3x3 convolutions, all-reduces of the per-group sums for GroupNorm (so the statistics
are global and the output equals the one-device decode), nothing for nearest x2 upsampling (each slab
upsamples its own voxels). A ``SpatialAttentionBlock`` attends over the whole volume: XLA keeps the queries
split and all-gathers the keys and values (2 x voxels x channels per device, 11.5 MB for the bundle-sized
decoder with mid-block attention), so each device holds its 1/N rows of the score matrix and the whole K
and V. Measured (``python -m benchmarks.xla_decode``): temp bytes per device 0.65 / 0.33 / 0.16 of one
device on 2 / 4 / 8 devices; the 1 -> 2 step is above 1/2 because the partitioned convolutions take a
halo-padded copy of their input (a ``concatenate`` of D/N + 2 planes) where the one-device convolution pads
inside the op. On the CPU backend the one-device attention's score matrix sits inside one fusion that
the memory analysis does not count, so attention alone looks cheaper on one device there than it is on a
TPU or GPU.

Divisibility: every decoder op keeps or doubles the spatial extents, so if the latent's sharded extents
divide over their mesh axes, every activation's do. A latent that does not divide is refused before
anything is compiled, with the device counts that would work.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.errors import InvalidRequest
from engine.xla.convert import DecoderArch

# Channels-last activation axes (B, D, H, W, C) that may be split.
SPATIAL_AXES = {"depth": 1, "height": 2, "width": 3}


def mesh_shape_for(n_devices: int, axes: Sequence[str]) -> tuple[int, ...]:
    """How ``n_devices`` split over ``axes``: all on one axis, or as square as possible (first axis larger)."""
    if len(axes) == 1:
        return (n_devices,)
    if len(axes) != 2:
        raise InvalidRequest(f"the decoder splits over one or two spatial axes, not {len(axes)}: {axes}")
    second = max(d for d in range(1, math.isqrt(n_devices) + 1) if n_devices % d == 0)
    return (n_devices // second, second)


def _check_axes(axes: Sequence[str]) -> tuple[str, ...]:
    axes = tuple(axes)
    unknown = [a for a in axes if a not in SPATIAL_AXES]
    if unknown or not axes or len(set(axes)) != len(axes):
        raise InvalidRequest(
            f"decoder split axes {axes} are not valid: name one or two distinct axes of {tuple(SPATIAL_AXES)}"
        )
    return axes


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def check_divisible(latent_shape: Sequence[int], axes: Sequence[str], mesh_shape: Sequence[int]) -> None:
    """Refuse (InvalidRequest) a channels-last latent whose split extents do not divide over the mesh."""
    if len(latent_shape) != 5:
        raise InvalidRequest(
            f"the decoder takes a channels-last latent (B, D, H, W, C), got shape {tuple(latent_shape)}"
        )
    for axis, parts in zip(axes, mesh_shape, strict=True):
        extent = int(latent_shape[SPATIAL_AXES[axis]])
        if extent % parts:
            raise InvalidRequest(
                f"the latent's {axis} ({extent}) does not divide over {parts} devices; "
                f"split it over {', '.join(map(str, _divisors(extent)))} devices"
                f"{'' if len(axes) > 1 else ' or along another axis'}"
            )


def _split(depth: int, height: int, n_devices: int):
    if depth % n_devices == 0:
        return ("depth",), (n_devices,)
    pairs = [
        (a, n_devices // a)
        for a in _divisors(n_devices)
        if 1 < a < n_devices and depth % a == 0 and height % (n_devices // a) == 0
    ]
    if pairs:
        return ("depth", "height"), min(pairs, key=lambda ab: (abs(ab[0] - ab[1]), -ab[0]))
    if height % n_devices == 0:
        return ("height",), (n_devices,)
    return None


def split_for(latent_shape: Sequence[int], n_devices: int) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """A split of a channels-last latent (B, D, H, W, C) over ``n_devices``: ``(axes, mesh_shape)``.

    Depth alone if it divides (slabs: the fewest halo planes per device), else depth x height with the
    most balanced sizes that divide (the shipped model's 20x24x20 latent over 8 devices: 4 x 2), else
    height alone; refused (InvalidRequest, with the device counts that would work) when nothing divides.
    """
    check_divisible(latent_shape, (), ())  # the rank check
    depth, height = int(latent_shape[1]), int(latent_shape[2])
    found = _split(depth, height, int(n_devices))
    if found is None:
        workable = [n for n in range(1, 65) if _split(depth, height, n)]
        raise InvalidRequest(
            f"a latent of depth {depth} and height {height} does not split over {n_devices} devices along "
            f"depth, height or both; use one of {', '.join(map(str, workable))} devices"
        )
    return found


@dataclass
class ShardedDecoder:
    """The jitted, sharded decoder: ``decoder(params, z)`` on a channels-last latent; checks divisibility.

    ``jitted`` is the ``jax.jit`` object itself (for ``lower`` / ``compile``); calling this wrapper checks
    the latent's shape first, so a bad extent is refused with one line instead of a partitioner error.
    """

    jitted: Any
    mesh: Any
    axes: tuple[str, ...]
    mesh_shape: tuple[int, ...]
    latent_sharding: Any
    params_sharding: Any

    def check(self, latent_shape: Sequence[int]) -> None:
        check_divisible(latent_shape, self.axes, self.mesh_shape)

    def __call__(self, params, z):
        self.check(z.shape)
        return self.jitted(params, z)

    def lower(self, params, z):
        self.check(z.shape)
        return self.jitted.lower(params, z)


def sharded_decoder_program(
    arch: DecoderArch,
    devices: Sequence,
    precision: str = "highest",
    axes: Sequence[str] = ("depth",),
    mesh_shape: Sequence[int] | None = None,
) -> tuple[ShardedDecoder, tuple]:
    """The decoder split over ``devices`` along ``axes``, and its input shardings ``(params, latent)``.

    ``mesh_shape`` (one entry per axis, product = device count) defaults to :func:`mesh_shape_for`. Weights
    are replicated; the latent and the image are split along the same axes, so the output stays on the
    devices in slabs (``np.asarray`` gathers it).
    """
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from engine.xla.nets import decoder_apply

    axes = _check_axes(axes)
    devices = list(devices)
    if not devices:
        raise InvalidRequest("the sharded decoder needs at least one device")
    shape = tuple(int(s) for s in (mesh_shape or mesh_shape_for(len(devices), axes)))
    if len(shape) != len(axes) or math.prod(shape) != len(devices):
        raise InvalidRequest(
            f"mesh shape {shape} does not fit {len(devices)} devices over axes {axes}; "
            f"give one size per axis whose product is {len(devices)}"
        )
    mesh = Mesh(np.array(devices, dtype=object).reshape(shape), axes)
    spec: list[str | None] = [None] * 5
    for axis in axes:
        spec[SPATIAL_AXES[axis]] = axis
    slabs = NamedSharding(mesh, PartitionSpec(*spec))
    replicated = NamedSharding(mesh, PartitionSpec())

    def constrain(_index: int, h):
        return jax.lax.with_sharding_constraint(h, slabs)

    def program(params, z):
        return decoder_apply(arch, params, z, precision=precision, constrain=constrain)

    # One sharding for the whole params dict: a pytree prefix, whatever the weights' names.
    in_shardings = (replicated, slabs)
    jitted = jax.jit(program, in_shardings=in_shardings, out_shardings=slabs)
    return ShardedDecoder(jitted, mesh, axes, shape, slabs, replicated), in_shardings


def memory_record(compiled) -> dict[str, int]:
    """Per-device bytes of a compiled program from XLA's memory analysis (total as the planner counts)."""
    mem = compiled.memory_analysis()
    argument = int(mem.argument_size_in_bytes)
    output = int(mem.output_size_in_bytes)
    temp = int(mem.temp_size_in_bytes)
    alias = int(mem.alias_size_in_bytes)
    return {
        "argument_bytes": argument,
        "output_bytes": output,
        "temp_bytes": temp,
        "alias_bytes": alias,
        "total_bytes": argument + output + temp - alias,
    }


def collective_summary(compiled, n_devices: int) -> dict[str, dict[str, int]]:
    """``{kind: {"count", "bytes"}}`` of the collectives in a compiled SPMD program's HLO (per device)."""
    from engine.xla.hlo import parse_hlo_collectives

    summary: dict[str, dict[str, int]] = {}
    for c in parse_hlo_collectives(compiled.as_text(), n_devices):
        entry = summary.setdefault(c.kind, {"count": 0, "bytes": 0})
        entry["count"] += c.count
        entry["bytes"] += c.count * c.nbytes
    return summary


def compile_decoder(
    arch, params_abstract, latent_shape, devices, precision="highest", axes=("depth",), mesh_shape=None
):
    """Compile (without running) the decoder on ``devices`` for a channels-last latent shape."""
    import jax

    program, _ = sharded_decoder_program(arch, devices, precision, axes, mesh_shape)
    latent = jax.ShapeDtypeStruct(tuple(int(s) for s in latent_shape), np.float32)
    return program.lower(params_abstract, latent).compile()


def compile_one_device(arch, params_abstract, latent_shape, device, precision="highest"):
    """Compile the plain, unsharded decoder (as the xla backend runs it) on one device."""
    import jax
    from jax.sharding import SingleDeviceSharding

    from engine.xla.nets import decoder_apply

    here = SingleDeviceSharding(device)
    jitted = jax.jit(
        lambda p, z: decoder_apply(arch, p, z, precision=precision),
        in_shardings=(here, here),
        out_shardings=here,
    )
    latent = jax.ShapeDtypeStruct(tuple(int(s) for s in latent_shape), np.float32)
    return jitted.lower(params_abstract, latent).compile()


def decoder_memory_per_device(
    arch: DecoderArch,
    params_abstract: dict,
    latent_shape: Sequence[int],
    devices: Sequence,
    precision: str = "highest",
    axes: Sequence[str] = ("depth",),
    mesh_shape: Sequence[int] | None = None,
) -> dict[str, Any]:
    """Per-device bytes (XLA's memory analysis) of the decode on one device and split over ``devices``.

    ``latent_shape`` is channels-last (B, D, H, W, C). Returns ``{"one_device": {...}, "sharded": {...},
    "devices": N, "axes": [...], "mesh_shape": [...], "temp_ratio": sharded / one-device temp bytes,
    "total_ratio": ..., "collectives": {kind: {"count", "bytes"}}}``; each memory record has argument,
    output, temp, alias and total bytes (total = argument + output + temp - alias, as the planner counts).
    """
    devices = list(devices)
    axes = _check_axes(axes)
    shape = tuple(int(s) for s in (mesh_shape or mesh_shape_for(len(devices), axes)))
    check_divisible(latent_shape, axes, shape)
    single = memory_record(compile_one_device(arch, params_abstract, latent_shape, devices[0], precision))
    compiled = compile_decoder(arch, params_abstract, latent_shape, devices, precision, axes, shape)
    sharded = memory_record(compiled)
    return {
        "devices": len(devices),
        "axes": list(axes),
        "mesh_shape": list(shape),
        "latent_shape": [int(s) for s in latent_shape],
        "one_device": single,
        "sharded": sharded,
        "temp_ratio": sharded["temp_bytes"] / max(single["temp_bytes"], 1),
        "total_ratio": sharded["total_bytes"] / max(single["total_bytes"], 1),
        "collectives": collective_summary(compiled, len(devices)),
    }
