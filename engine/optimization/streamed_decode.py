"""Memory-bounded decoding for MONAI's AutoencoderKL: layer by layer, in slabs along one axis.

A plain 3D decode keeps several full-resolution activations alive at once: the brain bundle's 160x224x160
decode peaks at about 13 GB of RSS on the CPU. Tiling the latent bounds memory but changes the result,
because every GroupNorm then normalises each tile with its own statistics (31.7 dB against the full
decode, measured on the bundle-sized autoencoder).

This decoder computes the same function as ``AutoencoderKL.decode`` (with whatever the decoder's layers
are: fp32, under autocast, int8) within a memory budget:

* convolutions run slab by slab along the first spatial axis, each slab read with a halo of ``padding``
  rows, zero-padded only at the volume's edges, exactly as the full convolution pads; the GroupNorm + SiLU
  in front of a convolution is applied to the slab on its way in, never to a whole activation;
* GroupNorm statistics are accumulated per slab (mean and variance per channel, combined in float64);
* a residual block with an identity shortcut adds its result into its input in place (its second
  convolution reads only the block's intermediate, so the input rows are free to overwrite); otherwise
  the result overwrites the intermediate itself, keeping aside the few rows a later slab still reads;
* a nearest-x2 upsampling followed by a 3x3x3 convolution is computed as a *sub-pixel convolution*: each
  of the 8 output parities is a 2x2x2 convolution of the low-resolution input (the 3x3x3 taps that land on
  the same source voxel summed), all 8 as one convolution with 8x the output channels, then interleaved.
  The same function in 8/27 of the multiply-adds (:class:`SubpixelUpsample`);
* an upsampled activation is stored when the budget allows; otherwise it is recomputed from the
  half-resolution input whenever a later layer reads it (statistics, first convolution, shortcut), with
  the rows of the previous slab's halo kept so neighbouring slabs do not recompute them. Where the budget
  allows, a 1x1 shortcut is computed during the first convolution's pass instead of a third recomputation;
* activations are stored in the autocast dtype (bf16 under bf16 autocast, as the full decode's are) and,
  with ``channels_last=True``, in NDHWC, where oneDNN's convolutions are faster on these CPUs;
* slab sizes are chosen from the memory budget (default: from the memory available now).

MONAI's ``AutoencoderKlMaisi`` (MAISI v2, NVIDIA's NV-Generate models) decodes the same way: its
``MaisiConvolution`` splits (``num_splits`` along ``dim_split``, with overlaps) are an exact memory device of
the full convolution, so each is streamed as the convolution it wraps; its upsampling (trilinear x2, then a
3x3x3 convolution) is evaluated lazily like the sub-pixel one (:class:`_TrilinearUpsampled`); its GroupNorm
is the plain GroupNorm when ``norm_float16`` is off, as VolSynth builds it (``norm_float16`` rounds the
normalised activations to fp16, a GPU memory saver that needs CUDA autocast).

Differences from the full decode come only from summation order: max abs error ~1e-6 on unit-range output
in fp32.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.models.budget import STREAMED_DECODE_BUDGET_BYTES

MIN_BUDGET_BYTES = 256 * 2**20
MAX_SLAB = 64  # rows per slab: beyond this a larger slab only costs memory
MIN_SLAB = 2


def default_budget_bytes() -> int:
    """Half the memory available now, at most :data:`STREAMED_DECODE_BUDGET_BYTES` (at least 256 MiB)."""
    available = None
    try:
        import psutil

        available = psutil.virtual_memory().available
    except Exception:  # noqa: BLE001 - psutil missing or no /proc: use the default ceiling
        available = None
    if available is None:
        return STREAMED_DECODE_BUDGET_BYTES
    return int(max(MIN_BUDGET_BYTES, min(STREAMED_DECODE_BUDGET_BYTES, available // 2)))


# -- sub-pixel upsampling ---------------------------------------------------------------------------------

# For output parity p along one axis, the 3 taps of the original kernel land on 2 source voxels:
# p = 0 reads source rows (i-1, i) with taps (k0, k1 + k2); p = 1 reads (i, i+1) with (k0 + k1, k2).
_PARITY_TAPS = (
    torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 1.0]]),
    torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 1.0]]),
)
PARITIES = tuple((px, py, pz) for px in (0, 1) for py in (0, 1) for pz in (0, 1))


class SubpixelUpsample(nn.Module):
    """Nearest x2 upsampling followed by a 3x3x3 convolution (padding 1), as one 2x2x2 convolution.

    ``conv`` has ``8 * out_channels`` outputs (one group of ``out_channels`` per output parity, in
    :data:`PARITIES` order), kernel 2, padding (0, 1, 1): the first axis is padded by the caller (the full
    forward pads it by one row each side; the streamed decoder reads a halo instead). ``conv`` may be
    replaced by an int8 module; it is the only layer here.
    """

    def __init__(self, conv3: nn.Conv3d):
        super().__init__()
        if conv3.kernel_size != (3, 3, 3) or conv3.padding != (1, 1, 1) or conv3.stride != (1, 1, 1):
            raise ValueError("SubpixelUpsample needs a 3x3x3 convolution with padding 1 and stride 1")
        weight = conv3.weight.detach().double()
        out_ch = conv3.out_channels
        kernels = []
        for px, py, pz in PARITIES:
            ax, ay, az = (_PARITY_TAPS[p].double() for p in (px, py, pz))
            kernels.append(torch.einsum("au,bv,cw,oiuvw->oiabc", ax, ay, az, weight))
        self.out_channels = out_ch
        self.conv = torch.nn.utils.skip_init(
            nn.Conv3d,
            conv3.in_channels,
            8 * out_ch,
            2,
            padding=(0, 1, 1),
            bias=conv3.bias is not None,
            device=conv3.weight.device,
        )
        with torch.no_grad():
            self.conv.weight.copy_(torch.cat(kernels).to(conv3.weight.dtype))
            if conv3.bias is not None:
                self.conv.bias.copy_(conv3.bias.detach().repeat(8))
        self.conv.requires_grad_(False)

    def shuffle(self, y: torch.Tensor, rows: int, out: torch.Tensor | None = None) -> torch.Tensor:
        """Interleave the 8 parity groups of ``y`` (B, 8C, rows+1, Y+1, Z+1) into (B, C, 2 rows, 2Y, 2Z)."""
        b, _, _, y1, z1 = y.shape
        c = self.out_channels
        if out is None:
            out = torch.empty((b, c, 2 * rows, 2 * (y1 - 1), 2 * (z1 - 1)), dtype=y.dtype, device=y.device)
        for k, (px, py, pz) in enumerate(PARITIES):
            out[:, :, px::2, py::2, pz::2] = y[
                :, k * c : (k + 1) * c, px : px + rows, py : py + y1 - 1, pz : pz + z1 - 1
            ]
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(F.pad(x, (0, 0, 0, 0, 1, 1)))
        return self.shuffle(y, x.shape[2])


_SUBPIXEL_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _subpixel_of(block: nn.Module) -> SubpixelUpsample:
    """The sub-pixel form of a MONAI upsampling block, built once per block (and per weight version)."""
    conv = block.postconv.conv
    key = (conv.weight._version, conv.weight.data_ptr())
    hit = _SUBPIXEL_CACHE.get(block)
    if hit is None or hit[0] != key:
        hit = (key, SubpixelUpsample(conv))
        _SUBPIXEL_CACHE[block] = hit
    return hit[1]


def subpixel_rewrite(autoencoder: nn.Module) -> int:
    """Replace the decoder's nearest-x2 + conv upsampling blocks by :class:`SubpixelUpsample`, in place."""
    blocks = autoencoder.decoder.blocks
    count = 0
    for i, block in enumerate(blocks):
        if _is_nearest_upsample(block):
            blocks[i] = SubpixelUpsample(block.postconv.conv)
            count += 1
    return count


def _is_nearest_upsample(block: nn.Module) -> bool:
    from monai.networks.blocks import UpSample

    return (
        isinstance(block, UpSample)
        and hasattr(block, "upsample_non_trainable")
        and hasattr(block, "postconv")
        and _is_nearest_x2(block.upsample_non_trainable)
        and isinstance(getattr(block.postconv, "conv", None), nn.Conv3d)
        and block.postconv.conv.kernel_size == (3, 3, 3)
        and block.postconv.conv.padding == (1, 1, 1)
        and block.postconv.conv.stride == (1, 1, 1)
        and block.postconv.conv.padding_mode == "zeros"
        and block.postconv.conv.groups == 1
        and len(block) == 2
    )


def _is_nearest_x2(up: nn.Module) -> bool:
    return (
        isinstance(up, nn.Upsample) and up.mode == "nearest" and up.scale_factor in (2, 2.0, (2.0, 2.0, 2.0))
    )


# -- row convolutions ---------------------------------------------------------------------------------


class _RowConv:
    """A convolution evaluated on rows of its input: the first axis unpadded (the caller adds the halo)."""

    def __init__(self, module: nn.Module):
        from engine.quantization import Int8Conv3d

        self.module = module
        if isinstance(module, Int8Conv3d):
            self.kernel_x, self.pad_x = module.kernel_size[0], module.padding[0]
            self.out_channels = module.out_channels
            self.call: Callable[[torch.Tensor], torch.Tensor] = (
                module.with_padding((0, *module.padding[1:])) if self.pad_x else module
            )
            return
        if not isinstance(module, nn.Conv3d):
            raise TypeError(f"not a convolution: {type(module).__name__}")
        self.kernel_x, self.pad_x = module.kernel_size[0], module.padding[0]
        self.out_channels = module.out_channels
        padding = (0, *module.padding[1:])

        def call(x: torch.Tensor) -> torch.Tensor:
            return F.conv3d(
                x,
                module.weight,
                module.bias,
                stride=1,
                padding=padding,
                dilation=module.dilation,
                groups=module.groups,
            )

        self.call = call

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.call(x)


def _row_convolvable(module: nn.Module) -> bool:
    from engine.quantization import Int8Conv3d

    if isinstance(module, Int8Conv3d):
        return module.stride == (1, 1, 1) and module.kernel_size[0] in (2 * module.padding[0] + 1,)
    return (
        isinstance(module, nn.Conv3d)
        and module.stride == (1, 1, 1)
        and module.padding_mode == "zeros"
        and isinstance(module.padding, tuple)
        and module.dilation == (1, 1, 1)
        and module.kernel_size[0] == 2 * module.padding[0] + 1
    )


# -- activations that hand out rows -------------------------------------------------------------------


class _Ctx:
    """What the whole decode shares: storage dtype and layout, the budget, what it did (``stats``)."""

    def __init__(self, dtype, channels_last: bool, budget: int, slab: int | None, stats: dict):
        self.dtype, self.channels_last, self.budget, self.slab, self.stats = (
            dtype,
            channels_last,
            budget,
            slab,
            stats,
        )
        self.alive: list[_Stored] = []

    def empty(self, shape, device, dtype=None) -> torch.Tensor:
        fmt = torch.channels_last_3d if self.channels_last else torch.contiguous_format
        return torch.empty(shape, dtype=dtype or self.dtype, device=device, memory_format=fmt)

    def layout(self, x: torch.Tensor) -> torch.Tensor:
        if self.channels_last and not x.is_contiguous(memory_format=torch.channels_last_3d):
            return x.contiguous(memory_format=torch.channels_last_3d)
        return x

    def rows_for(self, size: int, per_row: int, held: int) -> int:
        """Rows per slab: what the budget left after ``held`` bytes allows at ``per_row`` bytes a row."""
        if self.slab is not None:
            return max(1, min(self.slab, size))
        slack = self.budget - held
        rows = slack // max(per_row, 1) if slack > 0 else MIN_SLAB
        return int(max(MIN_SLAB, min(MAX_SLAB, size, rows)))


def _nbytes(shape, dtype) -> int:
    return math.prod(shape) * torch.empty((), dtype=dtype).element_size()


class _Rows:
    """An activation (B, C, X, Y, Z) that can hand out rows [a, b) along X."""

    shape: tuple[int, ...]
    dtype: torch.dtype

    def rows(self, a: int, b: int) -> torch.Tensor:
        raise NotImplementedError

    def store(self) -> _Stored:
        """The activation computed in full."""
        raise NotImplementedError

    @property
    def nbytes(self) -> int:
        return _nbytes(self.shape, self.dtype)


class _Stored(_Rows):
    def __init__(self, tensor: torch.Tensor):
        self.value = tensor
        self.shape = tuple(tensor.shape)
        self.dtype = tensor.dtype

    def rows(self, a: int, b: int) -> torch.Tensor:
        return self.value[:, :, a:b]


class _Upsampled(_Rows):
    """A :class:`SubpixelUpsample` of a stored input, evaluated lazily; the last rows computed are kept."""

    def __init__(self, source: _Stored, up: SubpixelUpsample, ctx: _Ctx):
        self.source, self.up, self.ctx = source, up, ctx
        self.conv = _RowConv(up.conv)
        b, _, x, y, z = source.shape
        self.shape = (b, up.out_channels, 2 * x, 2 * y, 2 * z)
        self.dtype = ctx.dtype
        self.cached: tuple[int, int, torch.Tensor] | None = None

    def compute(self, a: int, b: int, out: torch.Tensor | None = None) -> torch.Tensor:
        """Rows [a, b) of the upsampled activation (computes whole pairs of rows, then slices).

        ``out``: where to write them when [a, b) are whole pairs (a and b even), e.g. the stored activation.
        """
        lo, hi = a // 2, (b + 1) // 2
        size = self.source.shape[2]
        x = _halo_rows(self.source.rows, size, lo - 1, hi + 1, None, self.ctx)
        y = self.conv(x)
        self.ctx.stats["upsampled_rows_computed"] = self.ctx.stats.get("upsampled_rows_computed", 0) + 2 * (
            hi - lo
        )
        if out is not None and a == 2 * lo and b == 2 * hi:
            return self.up.shuffle(y, hi - lo, out=out)
        rows = self.ctx.empty((self.shape[0], self.shape[1], 2 * (hi - lo), *self.shape[3:]), x.device)
        self.up.shuffle(y, hi - lo, out=rows)
        rows = rows[:, :, a - 2 * lo : b - 2 * lo]
        if out is not None:
            out.copy_(rows)
        return rows

    def rows(self, a: int, b: int) -> torch.Tensor:
        if self.cached is not None:
            ca, cb, value = self.cached
            if ca <= a and b <= cb:
                return value[:, :, a - ca : b - ca]
            if ca <= a < cb < b:  # the previous slab's halo: compute only the new rows
                new = self.compute(cb, b)
                value = torch.cat([value[:, :, a - ca :], new], dim=2)
                value = self.ctx.layout(value)
                self.cached = (a, b, value)
                return value
        value = self.compute(a, b)
        self.cached = (a, b, value)
        return value

    def forget(self) -> None:
        self.cached = None

    def store(self) -> _Stored:
        size = self.shape[2]
        out = self.ctx.empty(self.shape, self.source.value.device)
        per_row = 3 * _nbytes((self.shape[0], self.shape[1], 1, *self.shape[3:]), torch.float32)
        slab = self.ctx.rows_for(size, per_row, self.nbytes + self.source.nbytes)
        slab += slab % 2  # whole pairs of rows: shuffled straight into ``out``
        for a in range(0, size, slab):
            b = min(a + slab, size)
            self.compute(a, b, out=out[:, :, a:b])
        return _Stored(out)


class _TrilinearUpsampled(_Upsampled):
    """MAISI's upsampling (trilinear x2, align_corners False, then a 3x3x3 convolution) of a stored input,
    evaluated lazily. Output rows [a, b) need upsampled rows [a - 1, b + 1), which need source rows around
    them: a slab of the source interpolated on its own gives exactly the full interpolation's rows except
    at the slab's own edges (where it clamps), so one extra source row is read on each side."""

    def __init__(self, source: _Stored, conv: nn.Conv3d, ctx: _Ctx):
        self.source, self.ctx = source, ctx
        self.conv = _RowConv(conv)
        b, _, x, y, z = source.shape
        self.shape = (b, conv.out_channels, 2 * x, 2 * y, 2 * z)
        self.dtype = ctx.dtype
        self.cached = None

    def compute(self, a: int, b: int, out: torch.Tensor | None = None) -> torch.Tensor:
        size = self.source.shape[2]
        pad = self.conv.pad_x
        lo, hi = a - pad, b + pad  # upsampled rows the convolution reads
        up_a, up_b = max(lo, 0), min(hi, 2 * size)
        src_a, src_b = max(0, (up_a - 1) // 2), min(size, (up_b + 2) // 2)
        part = self.source.rows(src_a, src_b)
        with torch.autocast(part.device.type, enabled=False):
            up = F.interpolate(part, scale_factor=2.0, mode="trilinear")
        up = up[:, :, up_a - 2 * src_a : up_b - 2 * src_a]
        if up_a > lo or up_b < hi:  # the convolution's zero padding at the volume's edges
            up = F.pad(up, (0, 0, 0, 0, up_a - lo, hi - up_b))
        rows = self.conv(self.ctx.layout(up.to(self.ctx.dtype)))
        self.ctx.stats["upsampled_rows_computed"] = self.ctx.stats.get("upsampled_rows_computed", 0) + b - a
        if out is not None:
            out.copy_(rows)
            return out
        return rows


def _maisi_conv(block: nn.Module) -> nn.Conv3d | None:
    """The Conv3d inside a MaisiConvolution (MaisiConvolution -> monai Convolution -> Conv3d), if any."""
    inner = getattr(getattr(block, "conv", None), "conv", None)
    return inner if isinstance(inner, nn.Conv3d) and _row_convolvable(inner) else None


class _MaisiResView:
    """A MaisiResBlock seen as the AEKLResBlock ``_res_block`` streams (the same computation)."""

    def __init__(self, block: nn.Module, conv1: nn.Conv3d, conv2: nn.Conv3d):
        from types import SimpleNamespace

        self.norm1, self.norm2 = block.norm1, block.norm2
        self.conv1, self.conv2 = SimpleNamespace(conv=conv1), SimpleNamespace(conv=conv2)
        shortcut = block.nin_shortcut
        self.nin_shortcut = (
            shortcut if isinstance(shortcut, nn.Identity) else SimpleNamespace(conv=_maisi_conv(shortcut))
        )


def _maisi_block(blocks: list[nn.Module], i: int, src: _Rows, ctx: _Ctx) -> tuple[_Rows, int] | None:
    """``blocks[i]`` of a MAISI decoder, streamed; None when it is not one streamed here."""
    try:
        from monai.apps.generation.maisi.networks.autoencoderkl_maisi import (
            MaisiConvolution,
            MaisiGroupNorm3D,
            MaisiResBlock,
            MaisiUpsample,
        )
    except ImportError:  # pragma: no cover - MONAI without the MAISI networks
        return None
    block = blocks[i]
    if isinstance(block, MaisiGroupNorm3D | MaisiResBlock) and (
        getattr(block, "norm_float16", False) or getattr(getattr(block, "norm1", None), "norm_float16", False)
    ):
        # fp16-rounded normalisation (needs CUDA autocast): run as MONAI does.
        return _Stored(ctx.layout(block(_stored(src, ctx).value).to(ctx.dtype))), i + 1
    if isinstance(block, MaisiResBlock):
        conv1, conv2 = _maisi_conv(block.conv1), _maisi_conv(block.conv2)
        shortcut_ok = (
            isinstance(block.nin_shortcut, nn.Identity) or _maisi_conv(block.nin_shortcut) is not None
        )
        if conv1 is not None and conv2 is not None and shortcut_ok:
            return _res_block(_MaisiResView(block, conv1, conv2), src, ctx), i + 1
        return None
    if isinstance(block, MaisiConvolution) and _maisi_conv(block) is not None:
        return _conv_all(src, _RowConv(_maisi_conv(block)), ctx), i + 1
    if (
        isinstance(block, MaisiUpsample)
        and not block.use_convtranspose
        and _maisi_conv(block.conv) is not None
    ):
        return _TrilinearUpsampled(_stored(src, ctx), _maisi_conv(block.conv), ctx), i + 1
    return None


def _halo_rows(read, size: int, lo: int, hi: int, pre, ctx: _Ctx, dtype=None) -> torch.Tensor:
    """Rows [lo, hi) of ``pre(input)``, zero where they fall outside [0, size) (the convolution's padding)."""
    a, b = max(lo, 0), min(hi, size)
    x = read(a, b)
    if a == lo and b == hi:
        return x if pre is None else pre(x, None)
    shape = (x.shape[0], x.shape[1], hi - lo, *x.shape[3:])
    buf = ctx.empty(shape, x.device, dtype=dtype or (ctx.dtype if pre is not None else x.dtype))
    if a > lo:
        buf[:, :, : a - lo].zero_()
    if b < hi:
        buf[:, :, b - lo :].zero_()
    body = buf[:, :, a - lo : b - lo]
    if pre is not None:
        pre(x, body)
    else:
        body.copy_(x)
    return buf


def _conv_rows(read, size: int, conv: _RowConv, a: int, b: int, ctx: _Ctx, pre=None) -> torch.Tensor:
    """Rows [a, b) of ``conv(pre(input))`` where ``read(a, b)`` gives input rows and the conv keeps the size."""
    pad = conv.pad_x
    return conv(_halo_rows(read, size, a - pad, b + pad, pre, ctx))


# -- GroupNorm ------------------------------------------------------------------------------------------


def _group_stats(src: _Rows, norm: nn.GroupNorm, ctx: _Ctx, slab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per (batch, group) mean and 1/std over the whole activation.

    Each slab gives per-channel means and variances (one pass, in fp32 over at most a slab); slabs and
    then the channels of a group are combined in float64 with the parallel-variance formula, which does
    not cancel the way ``E[x^2] - E[x]^2`` does.
    """
    b, c = src.shape[:2]
    g = norm.num_groups
    device = norm.weight.device
    count = 0
    mean = torch.zeros(b, c, dtype=torch.float64, device=device)
    m2 = torch.zeros_like(mean)
    for a in range(0, src.shape[2], slab):
        part = src.rows(a, min(a + slab, src.shape[2]))
        mean_p, var_p = _channel_moments(part)
        n = part[0, 0].numel()
        delta = mean_p - mean
        total = count + n
        mean += delta * (n / total)
        m2 += var_p.double() * n + delta * delta * (count * n / total)
        count = total
    var_c = (m2 / count).view(b, g, c // g)
    mean_c = mean.view(b, g, c // g)
    mean_g = mean_c.mean(dim=2)
    var_g = (var_c + (mean_c - mean_g[:, :, None]) ** 2).mean(dim=2)  # biased, as GroupNorm uses
    return mean_g, torch.rsqrt(var_g + norm.eps)


def _channel_moments(part: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per (batch, channel) mean and biased variance of a slab, as float64.

    Measured here: ``var_mean`` over three dimensions is ~8x slower than a sum and a norm over one
    contiguous dimension (fp32 NCDHW), and for bf16 or NDHWC slabs batch norm's own statistics kernel
    (fp32 accumulation, no fp32 copy of the slab) is the fastest way.
    """
    b, c = part.shape[:2]
    if part.dtype == torch.float32:
        if _is_channels_last(part):
            flat, dim = part.permute(0, 2, 3, 4, 1).reshape(b, -1, c), 1
            squares = torch.square(flat).sum(dim).double()  # a norm over the strided axis is ~5x slower
        else:
            flat, dim = part.reshape(b, c, -1), 2
            squares = torch.linalg.vector_norm(flat, dim=dim).double().square()
        n = flat.shape[dim]
        mean = flat.sum(dim).double() / n
        return mean, (squares / n - mean * mean).clamp_min(0)
    n = part[0, 0].numel()
    means, variances = [], []
    with torch.autocast(part.device.type, enabled=False):
        for i in range(b):
            mean = torch.zeros(c, dtype=torch.float32, device=part.device)
            var = torch.ones_like(mean)
            F.batch_norm(part[i : i + 1], mean, var, None, None, True, 1.0, 1e-5)  # eps: unused here
            means.append(mean.double())
            variances.append(
                var.double() * ((n - 1) / n) if n > 1 else torch.zeros_like(mean, dtype=torch.float64)
            )
    return torch.stack(means), torch.stack(variances)


def _is_channels_last(x: torch.Tensor) -> bool:
    return x.is_contiguous(memory_format=torch.channels_last_3d) and not x.is_contiguous()


def _normaliser(norm: nn.GroupNorm, stats, activate: bool):
    """``pre(x, out)``: GroupNorm(x) (then SiLU if ``activate``), written into ``out`` or returned.

    fp32 slabs: one ``addcmul`` with per-channel scale and shift. Other dtypes (bf16): batch norm's
    inference kernel with the group statistics as per-channel running statistics (fp32 parameters, bf16
    in and out), ~10x faster here than a mixed-dtype ``addcmul``.
    """
    mean_g, rstd_g = stats
    b = mean_g.shape[0]
    c = norm.num_channels
    per = c // norm.num_groups
    weight = norm.weight.detach().double().view(1, c)
    bias = norm.bias.detach().double().view(1, c)
    rstd_c = rstd_g.repeat_interleave(per, dim=1)
    mean_c = mean_g.repeat_interleave(per, dim=1)
    scale = (rstd_c * weight).float().view(b, c, 1, 1, 1)
    shift = (bias - mean_c * rstd_c * weight).float().view(b, c, 1, 1, 1)
    # Batch norm computes (x - mean) / sqrt(var + eps) * w + b: the group's variance with its eps folded in.
    bn_var = (1.0 / (rstd_c * rstd_c)).float()
    bn_mean = mean_c.float()
    bn_weight, bn_bias = norm.weight.detach().float(), norm.bias.detach().float()

    def apply(x: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
        if x.dtype == torch.float32 and (out is None or out.dtype == torch.float32):
            if out is None:
                out = torch.empty_like(x)
            torch.addcmul(shift, x, scale, out=out)
            y = out
        else:
            with torch.autocast(x.device.type, enabled=False):
                parts = [
                    F.batch_norm(x[i : i + 1], bn_mean[i], bn_var[i], bn_weight, bn_bias, False, 0.0, 0.0)
                    for i in range(x.shape[0])
                ]
            y = parts[0] if len(parts) == 1 else torch.cat(parts)
        if activate:
            F.silu(y, inplace=True)
        if out is not None and y is not out:
            out.copy_(y)
            return out
        return y

    return apply


# -- blocks ---------------------------------------------------------------------------------------------


def _row_bytes(shape, dtype) -> int:
    return _nbytes((shape[0], shape[1], 1, *shape[3:]), dtype)


def _conv_all(src: _Rows, conv: _RowConv, ctx: _Ctx, pre=None, held: int = 0) -> _Stored:
    size = src.shape[2]
    out_shape = (src.shape[0], conv.out_channels, *src.shape[2:])
    out = ctx.empty(out_shape, _device(src))
    per_row = 2 * _row_bytes(src.shape, torch.float32) + 2 * _row_bytes(out_shape, torch.float32)
    slab = ctx.rows_for(size, per_row, held + src.nbytes + _nbytes(out_shape, ctx.dtype))
    for a in range(0, size, slab):
        b = min(a + slab, size)
        out[:, :, a:b] = _conv_rows(src.rows, size, conv, a, b, ctx, pre)
    return _Stored(out)


def _device(src: _Rows) -> torch.device:
    if isinstance(src, _Upsampled):
        return src.source.value.device
    if isinstance(src, _Stored):
        return src.value.device
    raise TypeError(f"rows of an unknown kind: {type(src).__name__}")


def _res_block(block, src: _Rows, ctx: _Ctx) -> _Stored:
    size = src.shape[2]
    out_shape = (src.shape[0], block.conv1.conv.out_channels, *src.shape[2:])
    h_bytes = _nbytes(out_shape, ctx.dtype)
    per_row = 2 * _row_bytes(src.shape, torch.float32) + 2 * _row_bytes(out_shape, torch.float32)
    identity = isinstance(block.nin_shortcut, nn.Identity)
    shortcut = None if identity else _RowConv(block.nin_shortcut.conv)
    if isinstance(src, _Upsampled):
        held = src.source.nbytes + h_bytes + 4 * per_row
        if held + src.nbytes <= ctx.budget:
            ctx.stats.setdefault("upsampled_stored", []).append(list(src.shape))
            src = src.store()
        else:
            ctx.stats.setdefault("upsampled_recomputed", []).append(list(src.shape))
    lazy = isinstance(src, _Upsampled)
    held = src.source.nbytes if isinstance(src, _Upsampled) else src.nbytes
    if lazy:
        # Rows of a lazy input cost more than their size: the 8-parity convolution output, the shuffled
        # rows, the kept halo and their concatenation (measured: ~5x the rows' fp32 bytes, not 2x).
        per_row += 3 * _row_bytes(src.shape, torch.float32)

    slab = ctx.rows_for(size, per_row, held + h_bytes)
    stats1 = _group_stats(src, block.norm1, ctx, slab)
    if isinstance(src, _Upsampled):
        src.forget()
    first = _normaliser(block.norm1, stats1, activate=True)
    conv1 = _RowConv(block.conv1.conv)
    # A lazy input with a 1x1 shortcut: compute the shortcut while the rows are at hand (one recomputation
    # fewer), if a second output-sized buffer fits the budget.
    early = lazy and held + 2 * h_bytes + 4 * per_row <= ctx.budget
    h = ctx.empty(out_shape, _device(src))
    side = ctx.empty(out_shape, _device(src)) if early else None
    slab = ctx.rows_for(size, per_row, held + h_bytes * (2 if early else 1))
    for a in range(0, size, slab):
        b = min(a + slab, size)
        h[:, :, a:b] = _conv_rows(src.rows, size, conv1, a, b, ctx, first)
        if side is not None:
            rows = src.rows(a, b)
            side[:, :, a:b] = rows if shortcut is None else shortcut(rows)
    if isinstance(src, _Upsampled):
        src.forget()
    h = _Stored(h)
    stats2 = _group_stats(h, block.norm2, ctx, slab)
    second = _normaliser(block.norm2, stats2, activate=True)
    conv2 = _RowConv(block.conv2.conv)

    # conv2 reads only h, so these rows can take the result in place
    in_place = side if side is not None else src.value if identity and isinstance(src, _Stored) else None
    if in_place is not None:
        for a in range(0, size, slab):
            b = min(a + slab, size)
            in_place[:, :, a:b] += _conv_rows(h.rows, size, conv2, a, b, ctx, second)
        return _Stored(in_place)
    if lazy:
        ctx.stats["shortcut_recomputed"] = ctx.stats.get("shortcut_recomputed", 0) + 1
    # Otherwise the result overwrites h slab by slab: conv2 of a later slab still needs the last `pad`
    # original rows of h before it, so those are kept aside before they are overwritten.
    out, pad = h.value, conv2.pad_x
    slab = max(slab, pad)
    kept, kept_from = out[:, :, :0].clone(), 0
    for a in range(0, size, slab):
        b = min(a + slab, size)

        def original_rows(lo: int, hi: int, a=a, kept=kept, kept_from=kept_from) -> torch.Tensor:
            if lo >= a:
                return out[:, :, lo:hi]
            return torch.cat([kept[:, :, lo - kept_from :], out[:, :, a:hi]], dim=2)

        new = _conv_rows(original_rows, size, conv2, a, b, ctx, second)
        kept_from = max(b - pad, a)
        kept = out[:, :, kept_from:b].clone()
        rows = src.rows(a, b)
        if shortcut is not None:
            rows = shortcut(rows)
        out[:, :, a:b] = rows + new
    if isinstance(src, _Upsampled):
        src.forget()
    return _Stored(out)


def _stored(src: _Rows, ctx: _Ctx) -> _Stored:
    return src if isinstance(src, _Stored) else src.store()


def _apply(blocks: list[nn.Module], i: int, src: _Rows, ctx: _Ctx) -> tuple[_Rows, int]:
    """Apply ``blocks[i]`` (and the convolution after a GroupNorm, fused); returns the result and next index."""
    from monai.networks.blocks import Convolution
    from monai.networks.nets.autoencoderkl import AEKLResBlock

    block = blocks[i]
    maisi = _maisi_block(blocks, i, src, ctx)
    if maisi is not None:
        return maisi
    if (
        isinstance(block, AEKLResBlock)
        and _row_convolvable(block.conv1.conv)
        and _row_convolvable(block.conv2.conv)
    ):
        return _res_block(block, src, ctx), i + 1
    if isinstance(block, nn.GroupNorm):
        stored = _stored(src, ctx)
        slab = ctx.rows_for(stored.shape[2], 2 * _row_bytes(stored.shape, torch.float32), stored.nbytes)
        stats = _group_stats(stored, block, ctx, slab)
        apply = _normaliser(block, stats, activate=False)
        nxt = blocks[i + 1] if i + 1 < len(blocks) else None
        if isinstance(nxt, Convolution) and len(nxt) == 1 and _row_convolvable(nxt.conv):
            return _conv_all(stored, _RowConv(nxt.conv), ctx, pre=apply), i + 2
        if nxt is not None and type(nxt).__name__ == "MaisiConvolution" and _maisi_conv(nxt) is not None:
            return _conv_all(stored, _RowConv(_maisi_conv(nxt)), ctx, pre=apply), i + 2
        for a in range(0, stored.shape[2], slab):
            rows = stored.value[:, :, a : a + slab]
            rows.copy_(apply(rows, None))
        return stored, i + 1
    if isinstance(block, Convolution) and len(block) == 1 and _row_convolvable(block.conv):
        return _conv_all(src, _RowConv(block.conv), ctx), i + 1
    if isinstance(block, SubpixelUpsample):
        return _Upsampled(_stored(src, ctx), block, ctx), i + 1
    if _is_nearest_upsample(block):
        return _Upsampled(_stored(src, ctx), _subpixel_of(block), ctx), i + 1
    # Anything else (attention at a low resolution, transposed convolutions): run it as MONAI does.
    return _Stored(ctx.layout(block(_stored(src, ctx).value).to(ctx.dtype))), i + 1


@torch.inference_mode()
def streamed_decode(
    autoencoder,
    z: torch.Tensor,
    slab: int | None = None,
    budget_bytes: int | None = None,
    channels_last: bool | None = None,
    stats: dict[str, Any] | None = None,
) -> torch.Tensor:
    """``autoencoder.decode(z)`` for a MONAI ``AutoencoderKL``, within a memory budget.

    Args:
        autoencoder: the autoencoder (its decoder may hold :class:`SubpixelUpsample` and int8 layers).
        z: latent (B, C, X, Y, Z).
        slab: rows per slab; default: as many as the budget allows (at most :data:`MAX_SLAB`).
        budget_bytes: working set for activations and slab temporaries; default :func:`default_budget_bytes`.
            Activations that cannot be avoided are kept even when they exceed it.
        channels_last: keep activations NDHWC; default: whether ``z`` is channels-last.
        stats: a dict that receives what the decode did (slab budget, what was stored or recomputed).

    Under autocast the activations are stored in the autocast dtype (as the full decode's are), unless the
    decoder has int8 layers.
    Returns float32 (or the autocast dtype's values converted to float32).
    """
    if z.dim() != 5:
        raise ValueError(f"streamed_decode expects a 5D latent (B, C, X, Y, Z), got shape {tuple(z.shape)}")
    from engine.quantization import Int8Conv3d

    device_type = z.device.type
    dtype = torch.float32
    # Under autocast the full decode's activations are in the autocast dtype, except where int8 layers
    # (which return float32) feed the residual sums: then they stay float32, here too.
    if torch.is_autocast_enabled(device_type) and not any(
        isinstance(m, Int8Conv3d) for m in autoencoder.decoder.modules()
    ):
        dtype = torch.get_autocast_dtype(device_type)
    if channels_last is None:
        channels_last = z.is_contiguous(memory_format=torch.channels_last_3d) and not z.is_contiguous()
    budget = default_budget_bytes() if budget_bytes is None else int(budget_bytes)
    record = {} if stats is None else stats
    record.update(budget_bytes=budget, dtype=str(dtype).replace("torch.", ""), channels_last=channels_last)
    ctx = _Ctx(dtype, bool(channels_last), budget, slab, record)
    first = autoencoder.post_quant_conv(z.float())
    src: _Rows = _Stored(ctx.layout(first.to(dtype)))
    blocks = list(autoencoder.decoder.blocks)
    i = 0
    while i < len(blocks):
        src, i = _apply(blocks, i, src, ctx)
    return _stored(src, ctx).value.float().contiguous()
