"""Exact, memory-bounded decoding for MONAI's AutoencoderKL: layer by layer, in slabs along one axis.

A plain 3D decode keeps several full-resolution activations alive at once: the brain bundle's 160x224x160
decode peaks at about 13 GB of RSS on the CPU. Tiling the latent bounds memory but changes the result,
because every GroupNorm then normalises each tile with its own statistics (31.7 dB against the full
decode, measured on the bundle-sized autoencoder).

This decoder computes the same function as ``AutoencoderKL.decode`` while holding at most two
full-resolution activations of a residual block's width (one, plus the half-resolution input, where a
block follows an upsampling):

* convolutions run slab by slab along the first spatial axis, each slab read with a halo of ``padding``
  rows, zero-padded only at the volume's edges, exactly as the full convolution pads;
* GroupNorm statistics are accumulated over the whole activation in float64 first, then applied per slab;
* a residual block with an identity shortcut adds its result into its input in place (its second
  convolution reads only the block's intermediate, so the input rows are free to overwrite); otherwise
  the result overwrites the intermediate itself, keeping aside the few rows a later slab still reads;
* a large upsampled activation (nearest-neighbour x2, then a convolution) is never stored: its rows are
  recomputed from the half-resolution input whenever a later layer reads them (three times for the next
  residual block: statistics, first convolution, shortcut). Compute for memory.

Differences from the full decode come only from summation order: max abs error ~1e-6 on unit-range output.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

DEFAULT_SLAB = 8  # output rows per slab; a slab's temporaries are ~slab/size of one activation
MATERIALISE_LIMIT_BYTES = 256 * 2**20  # upsampled activations larger than this are recomputed, not stored


class _Rows:
    """An activation (B, C, X, Y, Z) that can hand out rows [a, b) along X."""

    shape: tuple[int, ...]

    def rows(self, a: int, b: int) -> torch.Tensor:
        raise NotImplementedError

    def tensor(self) -> torch.Tensor:
        return self.rows(0, self.shape[2])


class _Stored(_Rows):
    def __init__(self, tensor: torch.Tensor):
        self.value = tensor
        self.shape = tuple(tensor.shape)

    def rows(self, a: int, b: int) -> torch.Tensor:
        return self.value[:, :, a:b]

    def tensor(self) -> torch.Tensor:
        return self.value


class _Upsampled(_Rows):
    """Nearest x2 upsampling followed by a convolution, evaluated lazily from a stored input."""

    def __init__(self, source: _Stored, conv: nn.Conv3d, slab: int):
        self.source, self.conv, self.slab = source, conv, slab
        b, _, x, y, z = source.shape
        self.shape = (b, conv.out_channels, 2 * x, 2 * y, 2 * z)

    def _upsampled_rows(self, a: int, b: int) -> torch.Tensor:
        # Row r of the upsampled tensor is row r // 2 of the source (nearest neighbour, factor 2).
        lo, hi = a // 2, (b + 1) // 2
        up = F.interpolate(self.source.rows(lo, hi), scale_factor=2.0, mode="nearest")
        return up[:, :, a - 2 * lo : b - 2 * lo]

    def rows(self, a: int, b: int) -> torch.Tensor:
        return _conv_rows(self._upsampled_rows, self.shape[2], self.conv, a, b)


def _conv_rows(read, size: int, conv: nn.Conv3d, a: int, b: int, pre=None) -> torch.Tensor:
    """Rows [a, b) of ``conv(pre(input))`` where ``read(a, b)`` gives input rows and the conv keeps the size."""
    pad = conv.padding[0]
    lo, hi = max(a - pad, 0), min(b + pad, size)
    x = read(lo, hi)
    if pre is not None:
        x = pre(x)
    if lo > a - pad or hi < b + pad:  # at the volume's edge: the zero padding the full conv would add
        x = F.pad(x, (0, 0, 0, 0, lo - (a - pad), (b + pad) - hi))
    return F.conv3d(
        x,
        conv.weight,
        conv.bias,
        stride=1,
        padding=(0, conv.padding[1], conv.padding[2]),
        dilation=conv.dilation,
        groups=conv.groups,
    )


def _group_stats(src: _Rows, norm: nn.GroupNorm, slab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per (batch, group) mean and 1/std over the whole activation, accumulated in float64."""
    b, c = src.shape[:2]
    g = norm.num_groups
    total = torch.zeros(b, g, dtype=torch.float64, device=norm.weight.device)
    squares = torch.zeros_like(total)
    count = 0
    for a in range(0, src.shape[2], slab):
        part = src.rows(a, min(a + slab, src.shape[2])).reshape(b, g, -1).double()
        total += part.sum(dim=2)
        squares += (part * part).sum(dim=2)
        count += part.shape[2]
    mean = total / count
    var = (squares / count - mean * mean).clamp_min(0)  # biased variance, as GroupNorm uses
    return mean.float(), torch.rsqrt(var + norm.eps).float()


def _normaliser(norm: nn.GroupNorm, stats, activate: bool):
    mean, rstd = stats
    g = norm.num_groups

    def apply(x: torch.Tensor) -> torch.Tensor:
        b, c = x.shape[:2]
        y = (x.reshape(b, g, -1) - mean[:, :, None]) * rstd[:, :, None]
        y = y.reshape(x.shape) * norm.weight.view(1, c, 1, 1, 1) + norm.bias.view(1, c, 1, 1, 1)
        return F.silu(y) if activate else y

    return apply


def _conv_all(src: _Rows, conv: nn.Conv3d, slab: int, pre=None) -> torch.Tensor:
    size = src.shape[2]
    out = torch.empty(
        (src.shape[0], conv.out_channels, *src.shape[2:]), dtype=torch.float32, device=conv.weight.device
    )
    for a in range(0, size, slab):
        b = min(a + slab, size)
        out[:, :, a:b] = _conv_rows(src.rows, size, conv, a, b, pre)
    return out


def _res_block(block, src: _Rows, slab: int) -> _Stored:
    h = _Stored(
        _conv_all(
            src,
            block.conv1.conv,
            slab,
            _normaliser(block.norm1, _group_stats(src, block.norm1, slab), activate=True),
        )
    )
    second = _normaliser(block.norm2, _group_stats(h, block.norm2, slab), activate=True)
    size = src.shape[2]
    identity = isinstance(block.nin_shortcut, nn.Identity)
    if identity and isinstance(src, _Stored):
        out = src.value  # conv2 reads only h, so the input's rows can take the result in place
        for a in range(0, size, slab):
            b = min(a + slab, size)
            out[:, :, a:b] += _conv_rows(h.rows, size, block.conv2.conv, a, b, second)
        return _Stored(out)
    # Otherwise the result overwrites h slab by slab: conv2 of a later slab still needs the last `pad`
    # original rows of h before it, so those are kept aside before they are overwritten.
    out, pad = h.value, block.conv2.conv.padding[0]
    if slab < pad:
        raise ValueError(f"slab ({slab}) must be at least the convolution's padding ({pad})")
    shortcut = (lambda x: x) if identity else block.nin_shortcut
    kept, kept_from = out[:, :, :0].clone(), 0
    for a in range(0, size, slab):
        b = min(a + slab, size)

        def original_rows(lo: int, hi: int, a=a, kept=kept, kept_from=kept_from) -> torch.Tensor:
            if lo >= a:
                return out[:, :, lo:hi]
            return torch.cat([kept[:, :, lo - kept_from :], out[:, :, a:hi]], dim=2)

        new = _conv_rows(original_rows, size, block.conv2.conv, a, b, second)
        kept_from = max(b - pad, a)
        kept = out[:, :, kept_from:b].clone()
        out[:, :, a:b] = shortcut(src.rows(a, b)) + new
    return _Stored(out)


def _stored(src: _Rows) -> _Stored:
    return src if isinstance(src, _Stored) else _Stored(src.tensor())


def _apply(block: nn.Module, src: _Rows, slab: int, limit: int) -> _Rows:
    from monai.networks.blocks import Convolution, UpSample
    from monai.networks.nets.autoencoderkl import AEKLResBlock

    if isinstance(block, AEKLResBlock):
        return _res_block(block, src, slab)
    if isinstance(block, nn.GroupNorm):
        stored = _stored(src)
        apply = _normaliser(block, _group_stats(stored, block, slab), activate=False)
        for a in range(0, stored.shape[2], slab):
            rows = stored.value[:, :, a : a + slab]
            rows.copy_(apply(rows))
        return stored
    if isinstance(block, Convolution) and len(block) == 1 and _plain_conv(block.conv):
        return _Stored(_conv_all(src, block.conv, slab))
    if (
        isinstance(block, UpSample)
        and hasattr(block, "upsample_non_trainable")
        and hasattr(block, "postconv")
        and _is_nearest_x2(block.upsample_non_trainable)
        and _plain_conv(block.postconv.conv)
    ):
        lazy = _Upsampled(_stored(src), block.postconv.conv, slab)
        size = 4 * torch.Size(lazy.shape).numel()
        return lazy if size > limit else _Stored(lazy.tensor())
    # Anything else (attention at a low resolution, transposed convolutions): run it as MONAI does.
    return _Stored(block(_stored(src).value))


def _plain_conv(conv: nn.Module) -> bool:
    return (
        isinstance(conv, nn.Conv3d)
        and conv.stride == (1, 1, 1)
        and conv.padding_mode == "zeros"
        and isinstance(conv.padding, tuple)
        and conv.kernel_size[0] == 2 * conv.padding[0] + 1
    )


def _is_nearest_x2(up: nn.Module) -> bool:
    return (
        isinstance(up, nn.Upsample) and up.mode == "nearest" and up.scale_factor in (2, 2.0, (2.0, 2.0, 2.0))
    )


@torch.inference_mode()
def streamed_decode(
    autoencoder,
    z: torch.Tensor,
    slab: int = DEFAULT_SLAB,
    materialise_limit_bytes: int = MATERIALISE_LIMIT_BYTES,
) -> torch.Tensor:
    """``autoencoder.decode(z)`` for a MONAI ``AutoencoderKL``, with bounded memory. float32 in and out."""
    if z.dim() != 5:
        raise ValueError(f"streamed_decode expects a 5D latent (B, C, X, Y, Z), got shape {tuple(z.shape)}")
    src: _Rows = _Stored(autoencoder.post_quant_conv(z.float()))
    for block in autoencoder.decoder.blocks:
        src = _apply(block, src, slab, materialise_limit_bytes)
    return _stored(src).value
