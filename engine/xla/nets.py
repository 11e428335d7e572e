"""MONAI's ``DiffusionModelUNet`` (and MAISI v2's ``DiffusionModelUNetMaisi``, the same blocks with more
embeddings) and ``AutoencoderKL`` decoder as pure ``jax.lax`` functions.

Activations are channels-last (B, D, H, W, C), XLA's preferred 3-D layout on TPUs; weights are a flat dict
keyed by the MONAI ``state_dict`` names (see ``engine.xla.convert``). Each function mirrors the forward of
the MONAI block of the same name, in the same order of operations, so results match torch to float32
rounding (tests/engine/xla/test_parity.py).

``precision`` is XLA's matmul/convolution precision. A TPU's default multiplies float32 in one bf16 pass;
``"highest"`` (the backend's default) asks for full float32, which is what parity with torch needs and what
provenance records.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax

from engine.xla.convert import (
    AttentionHeads,
    Conv,
    DecoderArch,
    MaisiUNetArch,
    Norm,
    Resample,
    ResBlock,
    SpatialAttention,
    SpatialTransformer,
    UNetArch,
)

Params = dict[str, jax.Array]
Constrain = Callable[[int, jax.Array], jax.Array]

_DIMENSIONS = ("NDHWC", "DHWIO", "NDHWC")


def conv(p: Params, c: Conv, x: jax.Array, precision) -> jax.Array:
    y = lax.conv_general_dilated(
        x,
        p[f"{c.key}.weight"],
        window_strides=(c.stride,) * 3,
        padding=((c.padding, c.padding),) * 3,
        dimension_numbers=_DIMENSIONS,
        precision=precision,
    )
    bias = p.get(f"{c.key}.bias")
    return y if bias is None else y + bias


def group_norm(p: Params, n: Norm, x: jax.Array) -> jax.Array:
    b, d, h, w, c = x.shape
    grouped = x.reshape(b, d, h, w, n.groups, c // n.groups)
    mean = grouped.mean(axis=(1, 2, 3, 5), keepdims=True)
    var = jnp.square(grouped - mean).mean(axis=(1, 2, 3, 5), keepdims=True)  # biased, as torch
    normed = ((grouped - mean) * lax.rsqrt(var + n.eps)).reshape(x.shape)
    return normed * p[f"{n.key}.weight"] + p[f"{n.key}.bias"]


def layer_norm(p: Params, key: str, eps: float, x: jax.Array) -> jax.Array:
    mean = x.mean(axis=-1, keepdims=True)
    var = jnp.square(x - mean).mean(axis=-1, keepdims=True)
    return (x - mean) * lax.rsqrt(var + eps) * p[f"{key}.weight"] + p[f"{key}.bias"]


def linear(p: Params, key: str, x: jax.Array, precision) -> jax.Array:
    y = jnp.matmul(x, p[f"{key}.weight"].T, precision=precision)
    bias = p.get(f"{key}.bias")
    return y if bias is None else y + bias


def upsample_nearest(x: jax.Array) -> jax.Array:
    for axis in (1, 2, 3):
        x = jnp.repeat(x, 2, axis=axis)
    return x


def average_pool(x: jax.Array) -> jax.Array:
    """2x2x2 average pooling; an odd trailing voxel is dropped, as torch's AvgPool3d(2) does."""
    b, d, h, w, c = x.shape
    x = x[:, : d // 2 * 2, : h // 2 * 2, : w // 2 * 2]
    return x.reshape(b, d // 2, 2, h // 2, 2, w // 2, 2, c).mean(axis=(2, 4, 6))


def attention(p: Params, a: AttentionHeads, x: jax.Array, context: jax.Array | None, precision) -> jax.Array:
    """MONAI's SABlock / CrossAttentionBlock: heads split as 'b t (heads d) -> b heads t d'."""
    source = x if context is None else context
    q, k, v = (
        linear(p, f"{a.key}.to_{n}", s, precision) for n, s in (("q", x), ("k", source), ("v", source))
    )

    def split(t):
        return t.reshape(t.shape[0], t.shape[1], a.heads, -1).transpose(0, 2, 1, 3)

    q, k, v = split(q), split(k), split(v)
    weights = jax.nn.softmax(jnp.einsum("blxd,blyd->blxy", q, k, precision=precision) * a.scale, axis=-1)
    out = jnp.einsum("blxy,blyd->blxd", weights, v, precision=precision)
    out = out.transpose(0, 2, 1, 3).reshape(x.shape[0], x.shape[1], -1)
    return linear(p, f"{a.key}.out_proj", out, precision) if f"{a.key}.out_proj.weight" in p else out


def spatial_transformer(
    p: Params, s: SpatialTransformer, x: jax.Array, context: jax.Array | None, precision
) -> jax.Array:
    residual = x
    h = conv(p, s.proj_in, group_norm(p, s.norm, x), precision)
    b, d, hh, w, c = h.shape
    h = h.reshape(b, d * hh * w, c)
    for block in s.blocks:
        n1, n2, n3 = block.norm_keys
        h = attention(p, block.self_attention, layer_norm(p, n1, block.norm_eps, h), None, precision) + h
        h = attention(p, block.cross_attention, layer_norm(p, n2, block.norm_eps, h), context, precision) + h
        hidden = linear(p, f"{block.ff_key}.linear1", layer_norm(p, n3, block.norm_eps, h), precision)
        value, gate = jnp.split(hidden, 2, axis=-1)
        h = linear(p, f"{block.ff_key}.linear2", value * jax.nn.gelu(gate, approximate=False), precision) + h
    h = h.reshape(b, d, hh, w, c)
    return conv(p, s.proj_out, h, precision) + residual


def spatial_attention(p: Params, s: SpatialAttention, x: jax.Array, precision) -> jax.Array:
    h = group_norm(p, s.norm, x)
    b, d, hh, w, c = h.shape
    h = attention(p, s.attention, h.reshape(b, d * hh * w, c), None, precision)
    return h.reshape(x.shape) + x


def apply_attention(p, a, x, context, precision):
    if a is None:
        return x
    if isinstance(a, SpatialTransformer):
        return spatial_transformer(p, a, x, context, precision)
    return spatial_attention(p, a, x, precision)


def resblock(p: Params, r: ResBlock, x: jax.Array, emb: jax.Array | None, precision) -> jax.Array:
    h = jax.nn.silu(group_norm(p, r.norm1, x))
    if r.resample == "up":
        x, h = upsample_nearest(x), upsample_nearest(h)
    elif r.resample == "down":
        x, h = average_pool(x), average_pool(h)
    h = conv(p, r.conv1, h, precision)
    if r.temb_key is not None:
        h = h + linear(p, r.temb_key, jax.nn.silu(emb), precision)[:, None, None, None, :]
    h = conv(p, r.conv2, jax.nn.silu(group_norm(p, r.norm2, h)), precision)
    skip = x if r.skip is None else conv(p, r.skip, x, precision)
    return skip + h


def resample(p: Params, r: Resample | ResBlock, x: jax.Array, emb, precision) -> jax.Array:
    if isinstance(r, ResBlock):
        return resblock(p, r, x, emb, precision)
    if r.direction == "down":
        return average_pool(x) if r.conv is None else conv(p, r.conv, x, precision)
    if r.pre_conv is not None:
        x = conv(p, r.pre_conv, x, precision)
    x = upsample_nearest(x)
    return x if r.post_conv is None else conv(p, r.post_conv, x, precision)


def timestep_embedding(t: jax.Array, dim: int, max_period: int = 10000) -> jax.Array:
    """MONAI's ``get_timestep_embedding``: [cos, sin] of t times geometric frequencies."""
    half = dim // 2
    freqs = jnp.exp(-math.log(max_period) * jnp.arange(half, dtype=jnp.float32) / half)
    args = t.astype(jnp.float32)[:, None] * freqs[None, :]
    emb = jnp.concatenate([jnp.cos(args), jnp.sin(args)], axis=-1)
    return jnp.pad(emb, ((0, 0), (0, 1))) if dim % 2 else emb


def _same(level: int, h: jax.Array) -> jax.Array:
    return h


def unet_apply(
    arch: UNetArch,
    p: Params,
    x: jax.Array,
    t: jax.Array,
    context: jax.Array | None = None,
    constrain: Constrain | None = None,
    precision: str = "highest",
) -> jax.Array:
    """``DiffusionModelUNet.forward(x, t, context)`` on channels-last input (B, D, H, W, C).

    ``constrain(level, h)`` is applied to the activations entering each resolution level (0 = full
    resolution) on the way down, at the middle block and on the way up: the planner uses it to place a
    sharding per level.
    """
    return unet_body(arch, p, x, _time_embedding(arch, p, x, t, precision), context, constrain, precision)


def _embedding_mlp(p: Params, keys: tuple[str, str], v: jax.Array, precision) -> jax.Array:
    return linear(p, keys[1], jax.nn.silu(linear(p, keys[0], v, precision)), precision)


def _time_embedding(arch: UNetArch, p: Params, x: jax.Array, t: jax.Array, precision) -> jax.Array:
    emb = timestep_embedding(t, arch.time_dim).astype(x.dtype)
    return _embedding_mlp(p, arch.time_embed, emb, precision)


def maisi_unet_apply(
    arch: MaisiUNetArch,
    p: Params,
    x: jax.Array,
    t: jax.Array,
    class_labels: jax.Array | None = None,
    inputs: dict[str, jax.Array] | None = None,
    constrain: Constrain | None = None,
    precision: str = "highest",
) -> jax.Array:
    """``DiffusionModelUNetMaisi.forward(x, t, class_labels=..., spacing_tensor=..., ...)`` channels-last.

    ``inputs`` maps the names of ``arch.input_embeddings`` (``"spacing"``: spacing in mm x 100, (B, 3);
    ``"top_region_index"`` / ``"bottom_region_index"``: (B, 4)) to their tensors. MONAI's flash attention
    (``use_flash_attention``) is the same softmax attention computed in tiles, so the plain attention here
    is its port; it differs from it by float rounding only.
    """
    emb = _maisi_embedding(arch, p, x, t, class_labels, inputs, precision)
    return unet_body(arch, p, x, emb, None, constrain, precision)


def _maisi_embedding(arch: MaisiUNetArch, p: Params, x, t, class_labels, inputs, precision) -> jax.Array:
    emb = _time_embedding(arch, p, x, t, precision)
    if arch.class_embedding is not None:
        if class_labels is None:
            raise ValueError("this MAISI U-Net needs class_labels (the modality)")
        emb = emb + jnp.take(p[arch.class_embedding], class_labels.astype(jnp.int32), axis=0).astype(x.dtype)
    parts = [emb]
    for name, keys in arch.input_embeddings:
        if inputs is None or name not in inputs:
            raise ValueError(f"this MAISI U-Net needs its {name} input")
        parts.append(_embedding_mlp(p, keys, inputs[name].astype(x.dtype), precision))
    return jnp.concatenate(parts, axis=1) if len(parts) > 1 else emb


def step_embedding(
    arch: UNetArch, p: Params, x: jax.Array, t: jax.Array, context: jax.Array | None, precision
) -> tuple[jax.Array, jax.Array | None]:
    """What every residual block of a denoiser call ``(x, t, context)`` gets: the embedding, and the context
    its attention reads. A MAISI U-Net's context is its packed class label and spacing, which go into the
    embedding; its attention reads none."""
    if isinstance(arch, MaisiUNetArch):
        labels, inputs = _unpack_maisi_context(arch, context)
        return _maisi_embedding(arch, p, x, t, labels, inputs, precision), None
    return _time_embedding(arch, p, x, t, precision), context


def _unpack_maisi_context(arch: MaisiUNetArch, context: jax.Array | None):
    if context is None or context.shape[-1] != 4:
        raise ValueError("a MAISI U-Net needs its modality and spacing (context of shape (B, 1, 4))")
    unpacked = [name for name, _keys in arch.input_embeddings if name != "spacing"]
    if unpacked:
        raise ValueError(f"the packed MAISI context has no room for {', '.join(unpacked)}")
    return jnp.round(context[:, 0, 0]).astype(jnp.int32), {"spacing": context[:, 0, 1:4]}


def maisi_denoiser_apply(
    arch: MaisiUNetArch,
    p: Params,
    x: jax.Array,
    t: jax.Array,
    context: jax.Array | None = None,
    constrain: Constrain | None = None,
    precision: str = "highest",
) -> jax.Array:
    """``maisi_unet_apply`` called as every denoiser is, ``(x, t, context)``: ``context`` (B, 1, 4) packs the
    class label and the spacing (mm x 100) as ``engine.models.maisi.maisi_denoiser`` does. Region-index
    inputs do not fit that packing (the brain model has them off) and are refused."""
    labels, inputs = _unpack_maisi_context(arch, context)
    return maisi_unet_apply(arch, p, x, t, labels, inputs, constrain=constrain, precision=precision)


def unet_body(
    arch: UNetArch,
    p: Params,
    x: jax.Array,
    emb: jax.Array,
    context: jax.Array | None,
    constrain: Constrain | None,
    precision,
) -> jax.Array:
    """The U-Net after its embeddings: ``emb`` (B, E) feeds every residual block's timestep projection."""
    constrain = constrain or _same
    # A constrain that says ``every_block`` pins each block's output too: the level entries alone leave XLA
    # free to split a level the plan keeps whole ("cut") again from its split neighbours.
    pin = constrain if getattr(constrain, "every_block", False) else _same
    h = conv(p, arch.conv_in, constrain(0, x), precision)
    skips = [h]
    for level, block in enumerate(arch.down):
        h = constrain(level, h)
        for r, a in zip(block.resnets, block.attentions, strict=True):
            h = pin(level, apply_attention(p, a, resblock(p, r, h, emb, precision), context, precision))
            skips.append(h)
        if block.resample is not None:
            h = pin(level + 1, resample(p, block.resample, h, emb, precision))
            skips.append(h)

    deepest = arch.levels - 1
    h = constrain(deepest, h)
    first, mid_attention, second = arch.mid
    h = pin(deepest, resblock(p, first, h, emb, precision))
    h = pin(deepest, apply_attention(p, mid_attention, h, context, precision))
    h = pin(deepest, resblock(p, second, h, emb, precision))

    for index, block in enumerate(arch.up):
        level = deepest - index
        h = constrain(level, h)
        for r, a in zip(block.resnets, block.attentions, strict=True):
            h = jnp.concatenate([h, skips.pop()], axis=-1)
            h = pin(level, apply_attention(p, a, resblock(p, r, h, emb, precision), context, precision))
        if block.resample is not None:
            h = pin(level - 1, resample(p, block.resample, h, emb, precision))

    h = constrain(0, h)
    return conv(p, arch.out_conv, jax.nn.silu(group_norm(p, arch.out_norm, h)), precision)


def decoder_apply(
    arch: DecoderArch,
    p: Params,
    z: jax.Array,
    precision: str = "highest",
    constrain: Constrain | None = None,
) -> jax.Array:
    """``AutoencoderKL.decode(z)`` on a channels-last latent (B, D, H, W, C).

    ``constrain(index, h)`` is applied to the latent (index 0) and to the output of each op (index i + 1 for
    ``arch.ops[i]``): ``engine.xla.sharded_decode`` uses it to keep the activations split into slabs. The
    default leaves them as they are (one device).
    """
    constrain = constrain or _same
    h = constrain(0, z)
    for index, op in enumerate(arch.ops, start=1):
        if op == "silu":
            h = jax.nn.silu(h)
        elif isinstance(op, Conv):
            h = conv(p, op, h, precision)
        elif isinstance(op, ResBlock):
            h = resblock(p, op, h, None, precision)
        elif isinstance(op, Resample):
            h = resample(p, op, h, None, precision)
        elif isinstance(op, Norm):
            h = group_norm(p, op, h)
        elif isinstance(op, SpatialAttention):
            h = spatial_attention(p, op, h, precision)
        else:
            raise ValueError(f"unknown decoder op {op!r}")
        h = constrain(index, h)
    return h
