"""The deprecated torch.ao quantized-tensor int8 path, kept only as a measured comparison row.

torch 2.13 marks ``torch.quantize_per_tensor`` and quantized tensors deprecated (pytorch/pytorch#184982).
The engine no longer runs on them: :class:`engine.quantization.Int8Conv3d` calls oneDNN's int8
convolution on plain tensors and Linear layers use torchao. ``benchmarks.int8_kernels`` still times this
path beside the new one, so the day it is faster somewhere it shows; ``tests/engine/optimization/
test_quantization_stack.py`` fails loudly (it does not skip) the day torch removes these APIs, so this
module and the bench row are then removed on purpose rather than found broken.

The deprecation warnings are silenced here only, and only around these calls (one per layer otherwise).
"""

from __future__ import annotations

import contextlib
import warnings

import torch
from torch import nn

# What this module needs from torch; the loud-failure test checks each of them.
REQUIRED_APIS = (
    "torch.ao.nn.quantized.Conv3d",
    "torch.quantize_per_tensor",
    "torch.quantize_per_channel",
    "quantized engine 'x86'",
)


@contextlib.contextmanager
def quiet():
    """Silence PyTorch's deprecation warnings for the quantized-tensor API (one per layer otherwise)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*deprecated.*", category=UserWarning)
        warnings.filterwarnings("ignore", message=".*deprecated.*", category=DeprecationWarning)
        warnings.filterwarnings("ignore", message=".*deprecated.*", category=FutureWarning)
        yield


def missing_apis() -> list[str]:
    """The entries of :data:`REQUIRED_APIS` this torch lacks (empty: the legacy path can run)."""
    missing = []
    with quiet():
        try:
            import torch.ao.nn.quantized as nnq

            if not hasattr(nnq, "Conv3d"):
                missing.append("torch.ao.nn.quantized.Conv3d")
        except ImportError:
            missing.append("torch.ao.nn.quantized.Conv3d")
        for name in ("quantize_per_tensor", "quantize_per_channel"):
            if not hasattr(torch, name):
                missing.append(f"torch.{name}")
        if "x86" not in torch.backends.quantized.supported_engines:
            missing.append("quantized engine 'x86'")
    return missing


def available() -> bool:
    return not missing_apis()


class LegacyInt8Conv3d(nn.Module):
    """Float in, float out; inside: quint8 activation x qint8 per-channel weight ``torch.ao.nn.quantized.Conv3d``."""

    def __init__(self, conv: nn.Conv3d, observer):
        super().__init__()
        import torch.ao.nn.quantized as nnq

        from engine.quantization.onednn_int8 import activation_qparams

        if observer.calls == 0:
            raise ValueError("layer was never called during calibration")
        self.in_scale, self.in_zero_point = activation_qparams(observer.in_min, observer.in_max, False)
        out_scale, out_zero_point = activation_qparams(observer.out_min, observer.out_max, False)
        weight = conv.weight.detach().float().contiguous()
        scales = (weight.abs().amax(dim=(1, 2, 3, 4)) / 127.0).clamp_min(1e-12).double()
        with quiet():
            torch.backends.quantized.engine = "x86"
            qweight = torch.quantize_per_channel(
                weight, scales, torch.zeros_like(scales, dtype=torch.long), 0, torch.qint8
            )
            self.qconv = nnq.Conv3d(
                conv.in_channels,
                conv.out_channels,
                conv.kernel_size,
                stride=conv.stride,
                padding=conv.padding,
                dilation=conv.dilation,
                groups=conv.groups,
                bias=conv.bias is not None,
            )
            self.qconv.set_weight_bias(qweight, None if conv.bias is None else conv.bias.detach().float())
        self.qconv.scale = out_scale
        self.qconv.zero_point = out_zero_point

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with quiet():
            q = torch.quantize_per_tensor(x.float(), self.in_scale, self.in_zero_point, torch.quint8)
            return self.qconv(q).dequantize()


class LegacyDynamicInt8Linear(nn.Module):
    """Float in, float out; ``torch.ao.nn.quantized.dynamic.Linear`` (per-channel qint8 weights)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        import torch.ao.nn.quantized.dynamic as nnqd

        weight = linear.weight.detach().float().contiguous()
        scales = (weight.abs().amax(dim=1) / 127.0).clamp_min(1e-12).double()
        with quiet():
            torch.backends.quantized.engine = "x86"
            qweight = torch.quantize_per_channel(
                weight, scales, torch.zeros_like(scales, dtype=torch.long), 0, torch.qint8
            )
            self.qlinear = nnqd.Linear(
                linear.in_features, linear.out_features, bias_=linear.bias is not None, dtype=torch.qint8
            )
            self.qlinear.set_weight_bias(
                qweight, None if linear.bias is None else linear.bias.detach().float()
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with quiet():
            return self.qlinear(x.float().contiguous())
