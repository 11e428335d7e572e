"""Read a MONAI network's structure and weights into the plain description ``engine.xla.nets`` runs.

Why a native port and not torchax: torchax 0.0.13 (the newest) fails to import beside torch 2.13 (22
named-tensor overloads torch removed), and any shim would chase torch's internals on every upgrade. The
two MONAI networks VolSynth runs (``DiffusionModelUNet`` and ``AutoencoderKL``'s decoder) are built from a
dozen block kinds (MAISI v2's ``DiffusionModelUNetMaisi`` reuses the U-Net's blocks and adds class-label,
spacing and region-index embeddings), so they are ported here once, as ``jax.lax`` functions, and the
weights are used under their MONAI ``state_dict`` names unchanged. The structure (which blocks, heads, norms, strides) is read off
the built torch module rather than re-derived from constructor arguments, so MONAI's defaults and version
differences cannot drift from the port: a module kind the port does not know is refused by name.

Nothing here imports jax at module level except through the functions that return jax arrays; torch is
only needed to build the module (on the ``meta`` device for structure-only uses such as planning).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.errors import ModelInvalid


@dataclass(frozen=True)
class Conv:
    key: str  # state_dict prefix of the torch Conv3d ("conv_in.conv")
    stride: int
    padding: int


@dataclass(frozen=True)
class Norm:
    key: str
    groups: int
    eps: float


@dataclass(frozen=True)
class ResBlock:
    """MONAI's ``DiffusionUNetResnetBlock`` (with a timestep projection) or ``AEKLResBlock`` (without)."""

    norm1: Norm
    conv1: Conv
    norm2: Norm
    conv2: Conv
    skip: Conv | None
    temb_key: str | None  # time_emb_proj linear; None for the autoencoder's blocks
    resample: str | None  # "up" / "down" for resblock_updown U-Nets (nearest x2 / 2x2x2 average pool)


@dataclass(frozen=True)
class AttentionHeads:
    key: str  # SABlock / CrossAttentionBlock prefix: to_q, to_k, to_v, out_proj
    heads: int
    scale: float


@dataclass(frozen=True)
class TransformerBlock:
    self_attention: AttentionHeads
    cross_attention: AttentionHeads
    norm_keys: tuple[str, str, str]  # LayerNorm before self-attention, cross-attention, feed-forward
    norm_eps: float
    ff_key: str  # MLPBlock with GEGLU: linear1 -> (x, gate) -> x * gelu(gate) -> linear2


@dataclass(frozen=True)
class SpatialTransformer:
    norm: Norm
    proj_in: Conv
    blocks: tuple[TransformerBlock, ...]
    proj_out: Conv


@dataclass(frozen=True)
class SpatialAttention:
    """MONAI's ``SpatialAttentionBlock``: self-attention over voxels, no context."""

    norm: Norm
    attention: AttentionHeads


@dataclass(frozen=True)
class Resample:
    """Nearest x2 upsampling with optional convolutions, or a strided-convolution / pooled downsampling."""

    direction: str  # "up" or "down"
    pre_conv: Conv | None = None
    post_conv: Conv | None = None
    conv: Conv | None = None  # strided convolution (down); None means 2x2x2 average pooling


Attention = SpatialTransformer | SpatialAttention


@dataclass(frozen=True)
class Level:
    resnets: tuple[ResBlock, ...]
    attentions: tuple[Attention | None, ...]
    resample: Resample | ResBlock | None


@dataclass(frozen=True)
class UNetArch:
    time_dim: int
    time_embed: tuple[str, str]  # the two linears of time_embed
    conv_in: Conv
    down: tuple[Level, ...]
    mid: tuple[ResBlock, Attention | None, ResBlock]
    up: tuple[Level, ...]
    out_norm: Norm
    out_conv: Conv
    in_channels: int
    out_channels: int
    context_dim: int | None

    @property
    def levels(self) -> int:
        return len(self.down)


@dataclass(frozen=True)
class MaisiUNetArch(UNetArch):
    """MAISI v2's ``DiffusionModelUNetMaisi``: a ``DiffusionModelUNet`` whose timestep embedding is summed
    with a class-label embedding (the modality) and then concatenated with embeddings of the top / bottom
    body-region indices and the voxel spacing (each a Linear-SiLU-Linear on a 4- or 3-vector), in that
    order; the residual blocks' timestep projections take the concatenation."""

    class_embedding: str | None = None  # nn.Embedding weight key; None without num_class_embeds
    # (input name, (first linear, second linear)) in MONAI's concatenation order; the names are those of
    # ``MAISI_INPUTS``.
    input_embeddings: tuple[tuple[str, tuple[str, str]], ...] = ()


# DiffusionModelUNetMaisi's optional inputs: (forward argument stem, module attribute, include flag, width).
MAISI_INPUTS = (
    ("top_region_index", "top_region_index_layer", "include_top_region_index_input", 4),
    ("bottom_region_index", "bottom_region_index_layer", "include_bottom_region_index_input", 4),
    ("spacing", "spacing_layer", "include_spacing_input", 3),
)


@dataclass(frozen=True)
class DecoderArch:
    """``AutoencoderKL.decode``: post-quantisation 1x1 convolution, then the decoder's blocks in order."""

    ops: tuple[Conv | ResBlock | Resample | Norm | SpatialAttention | str, ...]  # "silu" is the one str
    latent_channels: int
    out_channels: int


class UnsupportedNetwork(ModelInvalid):
    """The network uses a MONAI feature the XLA port does not have; the message names it."""


def meta_network(definition: dict[str, Any]):
    """Build an allow-listed MONAI network on torch's meta device: its structure and shapes, no memory."""
    import torch

    from engine.models.networks import build_network

    with torch.device("meta"):
        return build_network(definition)


def _conv(module, key: str) -> Conv:
    conv = getattr(module, "conv", module)
    if type(conv).__name__ != "Conv3d":
        raise UnsupportedNetwork(f"{key}: {type(conv).__name__} layers are not ported to XLA (only Conv3d)")
    stride, padding = set(conv.stride), set(conv.padding) if not isinstance(conv.padding, str) else {-1}
    if (
        len(stride) != 1
        or len(padding) != 1
        or -1 in padding
        or conv.dilation != (1, 1, 1)
        or conv.groups != 1
    ):
        raise UnsupportedNetwork(f"{key}: anisotropic, dilated or grouped convolutions are not ported to XLA")
    return Conv(f"{key}.conv" if hasattr(module, "conv") else key, stride.pop(), padding.pop())


def _norm(module, key: str) -> Norm:
    if type(module).__name__ != "GroupNorm" or not module.affine:
        raise UnsupportedNetwork(f"{key}: expected an affine GroupNorm, found {type(module).__name__}")
    return Norm(key, module.num_groups, float(module.eps))


def _heads(module, key: str) -> AttentionHeads:
    if getattr(module, "use_combined_linear", False) or getattr(module, "rel_positional_embedding", None):
        raise UnsupportedNetwork(f"{key}: combined qkv or relative positions are not ported to XLA")
    if getattr(module, "causal", False):
        raise UnsupportedNetwork(f"{key}: causal attention is not ported to XLA")
    return AttentionHeads(key, int(module.num_heads), float(module.scale))


def _attention(module, key: str) -> Attention | None:
    kind = type(module).__name__
    if kind == "SpatialTransformer":
        blocks = []
        for i, block in enumerate(module.transformer_blocks):
            prefix = f"{key}.transformer_blocks.{i}"
            if type(block.ff.fn).__name__ != "GEGLU":
                raise UnsupportedNetwork(
                    f"{prefix}.ff: {type(block.ff.fn).__name__} is not ported (GEGLU is)"
                )
            blocks.append(
                TransformerBlock(
                    self_attention=_heads(block.attn1, f"{prefix}.attn1"),
                    cross_attention=_heads(block.attn2, f"{prefix}.attn2"),
                    norm_keys=(f"{prefix}.norm1", f"{prefix}.norm2", f"{prefix}.norm3"),
                    norm_eps=float(block.norm1.eps),
                    ff_key=f"{prefix}.ff",
                )
            )
        return SpatialTransformer(
            _norm(module.norm, f"{key}.norm"),
            _conv(module.proj_in, f"{key}.proj_in"),
            tuple(blocks),
            _conv(module.proj_out, f"{key}.proj_out"),
        )
    if kind == "SpatialAttentionBlock":
        return SpatialAttention(_norm(module.norm, f"{key}.norm"), _heads(module.attn, f"{key}.attn"))
    raise UnsupportedNetwork(f"{key}: attention block {kind} is not ported to XLA")


def _resblock(module, key: str) -> ResBlock:
    kind = type(module).__name__
    if kind == "DiffusionUNetResnetBlock":
        resample = "up" if module.upsample is not None else "down" if module.downsample is not None else None
        skip = module.skip_connection
        temb_key: str | None = f"{key}.time_emb_proj"
    elif kind == "AEKLResBlock":
        resample, skip, temb_key = None, module.nin_shortcut, None
    else:
        raise UnsupportedNetwork(f"{key}: residual block {kind} is not ported to XLA")
    skip_name = "skip_connection" if kind == "DiffusionUNetResnetBlock" else "nin_shortcut"
    return ResBlock(
        norm1=_norm(module.norm1, f"{key}.norm1"),
        conv1=_conv(module.conv1, f"{key}.conv1"),
        norm2=_norm(module.norm2, f"{key}.norm2"),
        conv2=_conv(module.conv2, f"{key}.conv2"),
        skip=None if type(skip).__name__ == "Identity" else _conv(skip, f"{key}.{skip_name}"),
        temb_key=temb_key,
        resample=resample,
    )


def _resample(module, key: str) -> Resample | ResBlock | None:
    if module is None:
        return None
    kind = type(module).__name__
    if kind == "DiffusionUNetResnetBlock":
        return _resblock(module, key)
    if kind == "DiffusionUnetDownsample":
        if module.use_conv:
            return Resample("down", conv=_conv(module.op, f"{key}.op"))
        return Resample("down")
    if kind in ("WrappedUpsample", "UpSample", "Upsample"):
        children = dict(module.named_children())
        if "upsample_non_trainable" not in children:
            raise UnsupportedNetwork(
                f"{key}: only nearest-neighbour upsampling is ported (no transposed conv)"
            )
        inner = children["upsample_non_trainable"]
        if getattr(inner, "mode", "nearest") != "nearest" or set(_scale(inner)) != {2.0}:
            raise UnsupportedNetwork(f"{key}: only nearest x2 upsampling is ported to XLA")
        return Resample(
            "up",
            pre_conv=_conv(children["preconv"], f"{key}.preconv") if "preconv" in children else None,
            post_conv=_conv(children["postconv"], f"{key}.postconv") if "postconv" in children else None,
        )
    raise UnsupportedNetwork(f"{key}: resampling block {kind} is not ported to XLA")


def _scale(upsample) -> tuple[float, ...]:
    factor = upsample.scale_factor
    return tuple(float(f) for f in factor) if isinstance(factor, tuple | list) else (float(factor),)


def _level(block, key: str, up: bool) -> Level:
    attentions = getattr(block, "attentions", None)
    resnets = tuple(_resblock(r, f"{key}.resnets.{i}") for i, r in enumerate(block.resnets))
    attn = (
        tuple(_attention(a, f"{key}.attentions.{i}") for i, a in enumerate(attentions))
        if attentions is not None
        else (None,) * len(resnets)
    )
    name = "upsampler" if up else "downsampler"
    return Level(resnets, attn, _resample(getattr(block, name), f"{key}.{name}"))


def unet_arch(unet) -> UNetArch:
    """The structure of a MONAI ``DiffusionModelUNet`` (built on any device, ``meta`` included)."""
    if type(unet).__name__ != "DiffusionModelUNet":
        raise UnsupportedNetwork(
            f"the XLA backend runs DiffusionModelUNet denoisers, not {type(unet).__name__}"
        )
    if unet.num_class_embeds is not None:
        raise UnsupportedNetwork("class-embedding U-Nets are not ported to XLA")
    return UNetArch(**_unet_fields(unet))


def maisi_unet_arch(unet) -> MaisiUNetArch:
    """The structure of MAISI v2's ``DiffusionModelUNetMaisi`` (built on any device, ``meta`` included)."""
    if type(unet).__name__ != "DiffusionModelUNetMaisi":
        raise UnsupportedNetwork(f"expected a DiffusionModelUNetMaisi, not {type(unet).__name__}")
    inputs = []
    for name, attribute, flag, width in MAISI_INPUTS:
        if not getattr(unet, flag, False):
            continue
        layer = getattr(unet, attribute)
        if int(layer[0].in_features) != width:
            raise UnsupportedNetwork(f"{attribute}: expected {width} inputs, found {layer[0].in_features}")
        inputs.append((name, (f"{attribute}.0", f"{attribute}.2")))
    return MaisiUNetArch(
        **_unet_fields(unet),
        class_embedding=None if unet.num_class_embeds is None else "class_embedding.weight",
        input_embeddings=tuple(inputs),
    )


def _unet_fields(unet) -> dict[str, Any]:
    """``UNetArch``'s fields, read off a DiffusionModelUNet or a DiffusionModelUNetMaisi (same blocks)."""
    mid = unet.middle_block
    mid_attention = getattr(mid, "attention", None)
    first = unet.time_embed[0]
    context_dim = None
    if unet.with_conditioning:
        for name, param in unet.named_parameters():
            if ".attn2.to_k." in name:
                context_dim = int(param.shape[1])
                break
    return dict(
        time_dim=int(first.in_features),
        time_embed=("time_embed.0", "time_embed.2"),
        conv_in=_conv(unet.conv_in, "conv_in"),
        down=tuple(_level(b, f"down_blocks.{i}", up=False) for i, b in enumerate(unet.down_blocks)),
        mid=(
            _resblock(mid.resnet_1, "middle_block.resnet_1"),
            None if mid_attention is None else _attention(mid_attention, "middle_block.attention"),
            _resblock(mid.resnet_2, "middle_block.resnet_2"),
        ),
        up=tuple(_level(b, f"up_blocks.{i}", up=True) for i, b in enumerate(unet.up_blocks)),
        out_norm=_norm(unet.out[0], "out.0"),
        out_conv=_conv(unet.out[2], "out.2"),
        in_channels=int(unet.in_channels),
        out_channels=int(unet.out_channels),
        context_dim=context_dim,
    )


def decoder_arch(autoencoder) -> DecoderArch:
    """The structure of ``AutoencoderKL.decode``: ``post_quant_conv`` then ``decoder.blocks``."""
    if type(autoencoder).__name__ != "AutoencoderKL":
        raise UnsupportedNetwork(
            f"the XLA backend decodes with AutoencoderKL, not {type(autoencoder).__name__}"
        )
    ops: list[Any] = [_conv(autoencoder.post_quant_conv, "post_quant_conv")]
    for i, block in enumerate(autoencoder.decoder.blocks):
        key = f"decoder.blocks.{i}"
        kind = type(block).__name__
        if kind == "Convolution":
            ops.append(_conv(block, key))
        elif kind == "AEKLResBlock":
            ops.append(_resblock(block, key))
        elif kind in ("UpSample", "Upsample"):
            ops.append(_resample(block, key))
        elif kind == "GroupNorm":
            ops.append(_norm(block, key))
        elif kind == "SiLU":
            ops.append("silu")
        elif kind == "SpatialAttentionBlock":
            ops.append(_attention(block, key))
        else:
            raise UnsupportedNetwork(f"{key}: decoder block {kind} is not ported to XLA")
    return DecoderArch(
        tuple(ops),
        latent_channels=int(autoencoder.post_quant_conv.conv.in_channels),
        out_channels=int(autoencoder.decoder.blocks[-1].conv.out_channels),
    )


def _to_jax_layout(name: str, array):
    """Conv3d weights (O, I, D, H, W) become XLA's DHWIO; every other tensor keeps its shape."""
    if name.endswith(".weight") and array.ndim == 5:
        return array.transpose(2, 3, 4, 1, 0)
    return array


def numpy_params(module, prefix: str = "") -> dict[str, Any]:
    """The module's weights as float32 numpy arrays under their state_dict names (conv weights DHWIO)."""
    import numpy as np

    out = {}
    for name, tensor in module.state_dict().items():
        array = tensor.detach().float().cpu().numpy()
        out[prefix + name] = np.ascontiguousarray(_to_jax_layout(name, array))
    return out


def abstract_params(module, prefix: str = "") -> dict[str, Any]:
    """``jax.ShapeDtypeStruct`` per weight (float32, conv weights DHWIO), for planning without memory."""
    import jax
    import numpy as np

    out = {}
    for name, tensor in module.state_dict().items():
        shape = tuple(tensor.shape)
        if name.endswith(".weight") and len(shape) == 5:
            shape = (shape[2], shape[3], shape[4], shape[1], shape[0])
        out[prefix + name] = jax.ShapeDtypeStruct(shape, np.float32)
    return out
