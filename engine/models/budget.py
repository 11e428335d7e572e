"""How much memory a model needs, estimated from its spec before anything real is allocated.

A model folder is untrusted input: a spec with enormous channel counts or shapes would otherwise allocate
gigabytes (and end in a traceback, or the OOM killer) before anything could say no. The estimate is
deliberately simple and on the high side for the working set; it exists to refuse the absurd, not to
predict the peak to the megabyte (``engine.machine.peak_memory`` measures that during a run):

* weights: parameters of every network x 4 bytes, plus the weights file read into memory before it is
  copied in. Parameters are counted from the definition's fields with MONAI's layer layout written out
  below, never by building the network: even on torch's ``meta`` device a hostile definition
  (``num_res_blocks: 100000``) constructs millions of modules for minutes. The count equals a built
  network's (MONAI 1.6; a test compares them over the allow-listed classes and their options);
* U-Net activations for one sample: the skip connections it keeps at every level plus a working set of
  a few feature maps at the largest level, and attention matrices (tokens^2 per head) where it attends;
* autoencoder decoding of one volume: a few feature maps at every resolution level of the output;
* the noise schedule: a handful of float64 arrays of ``num_train_timesteps``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.errors import ModelInvalid
from engine.models.spec import ModelSpec, one_line

_FLOAT = 4
_WORKING_MAPS = 4  # feature maps alive at once inside a residual block (input, norm, conv, residual)
#: The streamed decode's default ceiling on its working set (activations and slab temporaries). Here, not in
#: engine.optimization.streamed_decode, because the estimates of models that decode streamed count it and the
#: models sit below the optimizations.
STREAMED_DECODE_BUDGET_BYTES = 3 * 2**30


def parameter_count(definition: Mapping[str, Any], where: str) -> int:
    """Parameters of an allow-listed network, counted from its fields (nothing is built or allocated).

    The definition's size fields are bounded first (``engine.models.network_limits``), so the count is a
    few hundred additions whatever the file says.
    """
    from engine.models.network_limits import check_network_sizes
    from engine.models.networks import network_class_name

    name = network_class_name(definition)
    check_network_sizes(definition, where)
    try:
        if name in ("AutoencoderKL", "AutoencoderKlMaisi"):
            return _autoencoder_parameters(definition, maisi=name == "AutoencoderKlMaisi")
        if name == "ControlNet":
            return _controlnet_parameters(definition)
        return _unet_parameters(definition)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise ModelInvalid(
            f"the model's {where} definition is incomplete ({one_line(str(exc))[:120]}); it needs "
            "in_channels, out_channels and channels"
        ) from None


# -- MONAI's layer layout, as parameter counts (3D: a 3x3x3 kernel has 27 weights per channel pair) ------

_K3 = 27


def _conv(c_in: int, c_out: int, kernel: int = _K3) -> int:
    return c_in * c_out * kernel + c_out


def _linear(c_in: int, c_out: int, bias: bool = True) -> int:
    return c_in * c_out + (c_out if bias else 0)


def _norm(channels: int) -> int:
    return 2 * channels  # GroupNorm / LayerNorm: weight and bias


def _channels_of(definition: Mapping[str, Any]) -> list[int]:
    return [int(c) for c in definition.get("channels", definition.get("num_channels"))]


def _each_level(value: Any, count: int) -> list:
    return list(value) if isinstance(value, list | tuple) else [value] * count


def _self_attention(channels: int, include_fc: bool) -> int:
    """SABlock on ``channels`` (q, k, v without bias; the output projection where ``include_fc``)."""
    return 3 * channels * channels + (_linear(channels, channels) if include_fc else 0)


class _UNetLayout:
    """DiffusionModelUNet (and its MAISI and ControlNet relatives): the pieces the counts are made of."""

    def __init__(self, definition: Mapping[str, Any]) -> None:
        self.channels = _channels_of(definition)
        levels = len(self.channels)
        self.res_blocks = [int(n) for n in _each_level(definition.get("num_res_blocks", 2), levels)]
        self.attention = [bool(a) for a in _each_level(definition.get("attention_levels", False), levels)]
        self.conditioned = bool(definition.get("with_conditioning", False))
        self.context = int(definition.get("cross_attention_dim") or 0)
        self.layers = int(definition.get("transformer_num_layers", 1))
        self.updown = bool(definition.get("resblock_updown", False))
        self.include_fc = bool(definition.get("include_fc", True))
        self.time = 4 * self.channels[0]
        extra = sum(
            bool(definition.get(flag))
            for flag in (
                "include_top_region_index_input",
                "include_bottom_region_index_input",
                "include_spacing_input",
            )
        )
        self.block_time = self.time * (1 + extra)  # MAISI concatenates region and spacing embeddings
        self.embeddings = _linear(self.channels[0], self.time) + _linear(self.time, self.time)
        for flag, inputs in (
            ("include_top_region_index_input", 4),
            ("include_bottom_region_index_input", 4),
            ("include_spacing_input", 3),
        ):
            if definition.get(flag):
                self.embeddings += _linear(inputs, self.time) + _linear(self.time, self.time)
        if definition.get("num_class_embeds"):
            self.embeddings += int(definition["num_class_embeds"]) * self.time

    def res(self, c_in: int, c_out: int) -> int:
        shortcut = _conv(c_in, c_out, 1) if c_in != c_out else 0
        return (
            _norm(c_in)
            + _conv(c_in, c_out)
            + _linear(self.block_time, c_out)
            + _norm(c_out)
            + _conv(c_out, c_out)
            + shortcut
        )

    def attend(self, c: int) -> int:
        if not self.conditioned:  # SpatialAttentionBlock
            return _norm(c) + _self_attention(c, self.include_fc) + 3 * c  # q, k, v biases of this block
        layer = (
            _self_attention(c, self.include_fc)
            + (2 * c * c + c + 2 * self.context * c)  # cross attention: q, out (+bias), k, v from the context
            + (_linear(c, 8 * c) + _linear(4 * c, c))  # GEGLU feed-forward
            + 3 * _norm(c)
        )
        return _norm(c) + 2 * _conv(c, c, 1) + self.layers * layer

    def resample(self, c: int) -> int:
        return self.res(c, c) if self.updown else _conv(c, c)

    def down_and_middle(self) -> int:
        total = 0
        out = self.channels[0]
        for level, channels in enumerate(self.channels):
            c_in, out = out, channels
            for block in range(self.res_blocks[level]):
                total += self.res(c_in if block == 0 else out, out)
                total += self.attend(out) if self.attention[level] else 0
            if level < len(self.channels) - 1:
                total += self.resample(out)
        return total + 2 * self.res(out, out) + self.attend(out)

    def up(self) -> int:
        total = 0
        reverse = self.channels[::-1]
        res_blocks, attention = self.res_blocks[::-1], self.attention[::-1]
        out = reverse[0]
        for level, channels in enumerate(reverse):
            previous, out = out, channels
            skip_in = reverse[min(level + 1, len(reverse) - 1)]
            blocks = res_blocks[level] + 1
            for block in range(blocks):
                skip = skip_in if block == blocks - 1 else out
                total += self.res((previous if block == 0 else out) + skip, out)
                total += self.attend(out) if attention[level] else 0
            if level < len(reverse) - 1:
                total += self.resample(out)
        return total


def _unet_parameters(definition: Mapping[str, Any]) -> int:
    layout = _UNetLayout(definition)
    c0 = layout.channels[0]
    return (
        _conv(int(definition["in_channels"]), c0)
        + layout.embeddings
        + layout.down_and_middle()
        + layout.up()
        + _norm(c0)
        + _conv(c0, int(definition["out_channels"]))
    )


def _controlnet_parameters(definition: Mapping[str, Any]) -> int:
    layout = _UNetLayout(definition)
    c0 = layout.channels[0]
    embedding = [int(c) for c in definition.get("conditioning_embedding_num_channels", (16,))]
    cond = _conv(int(definition.get("conditioning_embedding_in_channels", 1)), embedding[0])
    for c_in, c_out in zip(embedding, embedding[1:], strict=False):
        cond += _conv(c_in, c_in) + _conv(c_in, c_out)
    cond += _conv(embedding[-1], c0)
    # 1x1 zero convolutions: one after conv_in, one per residual block and downsampler, one after the middle
    zero = _conv(c0, c0, 1)
    for level, channels in enumerate(layout.channels):
        copies = layout.res_blocks[level] + (1 if level < len(layout.channels) - 1 else 0)
        zero += copies * _conv(channels, channels, 1)
    zero += _conv(layout.channels[-1], layout.channels[-1], 1)
    return (
        _conv(int(definition["in_channels"]), c0) + layout.embeddings + cond + layout.down_and_middle() + zero
    )


def _autoencoder_parameters(definition: Mapping[str, Any], maisi: bool) -> int:
    channels = _channels_of(definition)
    levels = len(channels)
    res_blocks = [int(n) for n in _each_level(definition.get("num_res_blocks", 2), levels)]
    attention = [bool(a) for a in _each_level(definition.get("attention_levels", False), levels)]
    latent = int(definition.get("latent_channels", 3))
    # MONAI's defaults differ: AutoencoderKL has the non-local blocks and attention projections, MAISI not
    include_fc = bool(definition.get("include_fc", not maisi))
    nonlocal_default = not maisi

    def res(c_in: int, c_out: int) -> int:
        shortcut = _conv(c_in, c_out, 1) if c_in != c_out else 0
        return _norm(c_in) + _conv(c_in, c_out) + _norm(c_out) + _conv(c_out, c_out) + shortcut

    def attend(c: int) -> int:
        return _norm(c) + _self_attention(c, include_fc) + 3 * c

    upsample = (lambda c: c * c * 8 + c) if definition.get("use_convtranspose") else (lambda c: _conv(c, c))
    total = _conv(int(definition.get("in_channels", 1)), channels[0])
    out = channels[0]
    for level, c in enumerate(channels):
        c_in, out = out, c
        for block in range(res_blocks[level]):
            total += res(c_in if block == 0 else out, out) + (attend(out) if attention[level] else 0)
        if level < levels - 1:
            total += _conv(out, out)  # strided downsampling convolution
    if definition.get("with_encoder_nonlocal_attn", nonlocal_default):
        total += 2 * res(out, out) + attend(out)
    total += _norm(out) + _conv(out, latent) + 3 * _conv(latent, latent, 1)  # conv_out, mu, sigma, post
    reverse = channels[::-1]
    total += _conv(latent, reverse[0])
    if definition.get("with_decoder_nonlocal_attn", nonlocal_default):
        total += 2 * res(reverse[0], reverse[0]) + attend(reverse[0])
    c_in = reverse[0]
    for level, c in enumerate(reverse):
        for _ in range(res_blocks[::-1][level]):
            total += res(c_in, c) + (attend(c) if attention[::-1][level] else 0)
            c_in = c
        if level < levels - 1:
            total += upsample(c)
    return total + _norm(channels[0]) + _conv(channels[0], int(definition.get("out_channels", 1)))


def _levels(definition: Mapping[str, Any]) -> list[int]:
    channels = definition.get("channels", definition.get("num_channels", (32, 64, 64)))
    try:
        return [max(1, int(c)) for c in channels]
    except (TypeError, ValueError):
        raise ModelInvalid("a network's channels must be a list of whole numbers") from None


def _per_level(flag, count: int) -> list:
    if isinstance(flag, list | tuple):
        return list(flag) + [flag[-1] if flag else False] * max(0, count - len(flag))
    return [flag] * count


def unet_activation_bytes(definition: Mapping[str, Any], shape: tuple[int, ...]) -> int:
    """Feature maps and attention matrices of one U-Net forward pass on a (channels, x, y, z) input."""
    levels = _levels(definition)
    res_blocks = _per_level(definition.get("num_res_blocks", 2), len(levels))
    attention = _per_level(definition.get("attention_levels", False), len(levels))
    head_channels = _per_level(definition.get("num_head_channels", 8), len(levels))
    spatial = 1
    for n in shape[1:]:
        spatial *= int(n)
    total = 0
    largest = 0
    for level, channels in enumerate(levels):
        voxels = max(1, spatial // 8**level)
        maps = channels * voxels * _FLOAT
        total += (int(res_blocks[level]) + 1) * maps  # skip connections kept for the up path
        largest = max(largest, maps)
        if attention[level]:
            heads = max(1, channels // max(1, int(head_channels[level] or channels)))
            total += heads * voxels * voxels * _FLOAT  # attention matrix (math kernel materialises it)
    return total + _WORKING_MAPS * 2 * largest  # up path concatenates skips: twice the channels


def decoder_activation_bytes(definition: Mapping[str, Any], shape: tuple[int, ...]) -> int:
    """Feature maps of decoding one volume of ``shape`` (channels, x, y, z) with an AutoencoderKL."""
    levels = _levels(definition)
    spatial = 1
    for n in shape[1:]:
        spatial *= int(n)
    return sum(_WORKING_MAPS * c * max(1, spatial // 8**level) * _FLOAT for level, c in enumerate(levels))


def estimate_model_memory(spec: ModelSpec, weights_file_bytes: int = 0) -> dict[str, int]:
    """Bytes needed to load ``spec``'s model and sample one volume, by part, with ``total``."""
    params = sum(
        parameter_count(definition, f"networks.{role}") for role, definition in spec.networks.items()
    )
    try:
        estimate = {
            "weights": params * _FLOAT + int(weights_file_bytes),
            "denoising": unet_activation_bytes(spec.networks["unet"], spec.diffusion_shape),
            "decoding": decoder_activation_bytes(spec.networks["autoencoder"], spec.output_shape)
            if "autoencoder" in spec.networks
            else 0,
            "schedule": 8 * 8 * int(spec.schedule.get("num_train_timesteps", 1000)),
        }
    except (TypeError, ValueError, OverflowError) as exc:
        raise ModelInvalid(
            f"the model's network definitions are malformed: {one_line(str(exc))[:200]}"
        ) from None
    estimate["total"] = sum(estimate.values())
    return estimate
