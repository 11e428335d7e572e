"""How much memory a model needs, estimated from its spec before anything real is allocated.

A model folder is untrusted input: a spec with enormous channel counts or shapes would otherwise allocate
gigabytes (and end in a traceback, or the OOM killer) before anything could say no. The estimate is
deliberately simple and on the high side for the working set; it exists to refuse the absurd, not to
predict the peak to the megabyte (``engine.machine.peak_memory`` measures that during a run):

* weights: parameters of every network (counted by building it on torch's ``meta`` device, which
  allocates nothing) x 4 bytes, plus the weights file read into memory before it is copied in;
* U-Net activations for one sample: the skip connections it keeps at every level plus a working set of
  a few feature maps at the largest level, and attention matrices (tokens^2 per head) where it attends;
* autoencoder decoding of one volume: a few feature maps at every resolution level of the output;
* the noise schedule: a handful of float64 arrays of ``num_train_timesteps``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.errors import EngineError, ModelInvalid
from engine.models.spec import ModelSpec, one_line

_FLOAT = 4
_WORKING_MAPS = 4  # feature maps alive at once inside a residual block (input, norm, conv, residual)


def parameter_count(definition: Mapping[str, Any], where: str) -> int:
    """Parameters of an allow-listed network, counted without allocating them (meta device)."""
    import torch

    from engine.models.networks import build_network

    try:
        with torch.device("meta"):
            net = build_network(definition, where=where)
        return int(sum(p.numel() for p in net.parameters()))
    except EngineError:
        raise
    except Exception as exc:  # noqa: BLE001 - torch/MONAI raise many types on absurd arguments
        raise ModelInvalid(
            f"cannot build the model's {where} definition: {one_line(str(exc))[:200]}"
        ) from None


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
