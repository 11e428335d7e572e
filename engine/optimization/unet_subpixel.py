"""The U-Net's upsampling convolutions as sub-pixel convolutions: the same function in 8/27 of the work.

MONAI's ``DiffusionModelUNet`` upsamples by nearest x2 followed by a 3x3x3 convolution, in one of two forms:

* ``WrappedUpsample`` with a ``postconv`` (``resblock_updown=False``, the shipped model): upsample, convolve;
* ``DiffusionUNetResnetBlock(up=True)`` (``resblock_updown=True``, the MONAI brain bundle): GroupNorm and
  SiLU at low resolution, then nearest x2 of both branches and ``conv1`` on the upsampled branch.

Nearest x2 then a 3x3x3 convolution equals eight 2x2x2 convolutions at the low resolution, one per output
parity (:class:`engine.optimization.streamed_decode.SubpixelUpsample`, which the decoder already uses): exact up to
float rounding, 8 x 8 = 64 multiply-adds per output group of eight voxels instead of 8 x 27 = 216.

The rewrite keeps every layer's name (``...upsampler.postconv.conv`` and ``...upsampler.conv1.conv`` are the
sub-pixel ``Conv3d`` afterwards), so int8 calibration ranges and a mixed plan measured on the plain U-Net
apply to the rewritten one: a sub-pixel convolution sees the same input values (the low-resolution tensor
has the values of its nearest upsampling) and gives the same outputs.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from engine.optimization.streamed_decode import SubpixelUpsample, _is_nearest_upsample, _is_nearest_x2

__all__ = [
    "SubpixelResnetUp",
    "SubpixelWrappedUpsample",
    "call_macs",
    "subpixel_rewrite_unet",
    "upsampling_conv_names",
]


class SubpixelWrappedUpsample(nn.Module):
    """A ``WrappedUpsample`` (nearest x2 + 3x3x3 ``postconv``) as one sub-pixel convolution."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.postconv = SubpixelUpsample(block.postconv.conv)

    def forward(self, x: torch.Tensor, emb: torch.Tensor | None = None) -> torch.Tensor:
        del emb  # the signature of MONAI's WrappedUpsample
        return self.postconv(x)


class SubpixelResnetUp(nn.Module):
    """``DiffusionUNetResnetBlock(up=True)`` with its ``conv1`` on the upsampled branch as a sub-pixel
    convolution; everything else is the block's own modules and arithmetic (MONAI's forward, step by step)."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.spatial_dims = block.spatial_dims
        self.norm1, self.nonlinearity = block.norm1, block.nonlinearity
        self.upsample = block.upsample  # nearest x2 of the skip branch (no weights)
        self.conv1 = SubpixelUpsample(block.conv1.conv)
        self.time_emb_proj, self.norm2, self.conv2 = block.time_emb_proj, block.norm2, block.conv2
        self.skip_connection = block.skip_connection

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        h = self.nonlinearity(self.norm1(x))
        x = self.upsample(x)
        h = self.conv1(h)  # == conv1(nearest_x2(h))
        temb = self.time_emb_proj(self.nonlinearity(emb))
        h = h + temb.reshape(*temb.shape, *([1] * self.spatial_dims))
        h = self.conv2(self.nonlinearity(self.norm2(h)))
        return self.skip_connection(x) + h


def _is_resnet_up(block: nn.Module) -> bool:
    from monai.networks.nets.diffusion_model_unet import DiffusionUNetResnetBlock

    if not isinstance(block, DiffusionUNetResnetBlock) or not block.up or block.upsample is None:
        return False
    up, conv = block.upsample, getattr(block.conv1, "conv", None)
    return (
        len(up) == 1
        and _is_nearest_x2(getattr(up, "upsample_non_trainable", None))
        and isinstance(conv, nn.Conv3d)
        and conv.kernel_size == (3, 3, 3)
        and conv.padding == (1, 1, 1)
        and conv.stride == (1, 1, 1)
        and conv.padding_mode == "zeros"
        and conv.groups == 1
    )


def subpixel_rewrite_unet(unet: nn.Module) -> list[str]:
    """Replace ``unet``'s nearest-x2 + 3x3x3 upsampling blocks (both forms) in place; returns their names."""
    found = []
    for name, module in unet.named_modules():
        if _is_nearest_upsample(module):
            found.append((name, SubpixelWrappedUpsample))
        elif _is_resnet_up(module):
            found.append((name, SubpixelResnetUp))
    for name, kind in found:
        parent_name, _, child = name.rpartition(".")
        parent = unet.get_submodule(parent_name) if parent_name else unet
        setattr(parent, child, kind(getattr(parent, child)))
    return [name for name, _ in found]


def upsampling_conv_names(unet: nn.Module) -> list[str]:
    """Names of the 3x3x3 convolutions that follow a nearest x2 upsampling (what the rewrite replaces)."""
    names = []
    for name, module in unet.named_modules():
        if _is_nearest_upsample(module):
            names.append(f"{name}.postconv.conv")
        elif _is_resnet_up(module):
            names.append(f"{name}.conv1.conv")
    return names


def call_macs(unet: nn.Module, x: torch.Tensor, timesteps: torch.Tensor, context=None) -> dict[str, int]:
    """Multiply-adds of one ``unet`` call per ``Conv3d`` / ``Linear`` (forward hooks; for benchmarks)."""
    macs: dict[str, int] = {}
    handles = []
    for name, module in unet.named_modules():
        if isinstance(module, nn.Conv3d):
            per = (module.in_channels // module.groups) * math.prod(module.kernel_size)
        elif isinstance(module, nn.Linear):
            per = module.in_features
        else:
            continue

        def hook(_m, _i, out, name=name, per=per):
            macs[name] = macs.get(name, 0) + out.numel() * per

        handles.append(module.register_forward_hook(hook))
    try:
        with torch.inference_mode():
            unet(x, timesteps=timesteps, context=context)
    finally:
        for handle in handles:
            handle.remove()
    return macs
