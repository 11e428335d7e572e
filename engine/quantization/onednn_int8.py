"""Int8 ``Conv3d`` and ``Linear`` on oneDNN's quantized kernels, called eagerly on plain uint8/int8 tensors.

``torch.ops.onednn.qconv_prepack`` / ``qconv_pointwise`` and ``qlinear_prepack`` / ``qlinear_pointwise``
are the kernels torchao's PT2E x86 flow lowers quantized convolutions and linears to under Inductor. torchao 0.18 itself offers no int8 Conv3d on x86 CPUs: its eager
``quantize_`` configs implement only linear ops for int8 (``aten.convolution`` raises NotImplementedError),
its ``X86InductorQuantizer`` annotates conv1d/conv2d/linear but not conv3d, and a Conv3d annotated by hand
stays dequantize + float convolution even after its x86 lowering passes. Calling the oneDNN kernels directly
needs no compiler (the PyInstaller build has none), takes and gives plain tensors (no deprecated quantized
tensor), and dequantizes inside the kernel (float32 out, no extra pass). For Linear layers torchao's eager
``Int8DynamicActivationInt8WeightConfig`` exists but was measured slower than fp32 at every U-Net shape
(0.3-0.9x: its per-token quantization runs as separate Python-level ops meant for torch.compile), while
``qlinear_pointwise`` with one per-tensor scale per call was 0.9-4.5x faster. Measured against the
deprecated ``torch.ao.nn.quantized`` modules by ``python -m benchmarks.int8_kernels``.

Activations are static per-tensor uint8 (ranges from a calibration run); weights per-output-channel
symmetric int8. On CPUs without VNNI (AVX2, AVX-512 without VNNI, or ``ONEDNN_MAX_CPU_ISA`` capped below
it) oneDNN multiplies u8 x s8 pairs with ``vpmaddubsw``, whose int16 pair sums saturate for large
activations: there the activations use 7 bits (0..127), as torch.ao's x86 qconfig does with
``reduce_range``.
"""

from __future__ import annotations

import torch
from torch import nn


def int8_dot_has_vnni() -> bool:
    """Whether oneDNN's int8 convolutions get a VNNI (or AMX) dot product here (no int16 saturation): the
    hardware probe's answer, which honours ONEDNN_MAX_CPU_ISA (the AVX2 stand-in has none)."""
    from engine.machine.probe import probe_machine

    return probe_machine().cpu.int8_dot is not None


def _quantize_uint8(x: torch.Tensor, inverse_scale: float, zero_point: int, top: int) -> torch.Tensor:
    return x.float().mul(inverse_scale).add_(zero_point + 0.5).clamp_(0, top).to(torch.uint8)


def activation_qparams(lo: float, hi: float, reduce_range: bool) -> tuple[float, int]:
    """uint8 scale and zero point covering [lo, hi] (always including 0, so zero padding is exact)."""
    levels = 127.0 if reduce_range else 255.0
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = max((hi - lo) / levels, 1e-8)
    zero_point = int(min(levels, max(0, round(-lo / scale))))
    return scale, zero_point


class Int8Conv3d(nn.Module):
    """Float in, float out; inside: uint8 activation x int8 per-channel weight oneDNN 3D convolution.

    Args:
        conv: the float convolution (groups 1, zero padding).
        observer: its input range from the calibration run (an object with ``in_min``, ``in_max``, ``calls``).
        reduce_range: 7-bit activations; default: when this CPU has no VNNI (:func:`int8_dot_has_vnni`).
    """

    def __init__(self, conv: nn.Conv3d, observer, reduce_range: bool | None = None):
        super().__init__()
        if observer.calls == 0:
            raise ValueError("layer was never called during calibration")
        if conv.groups != 1 or conv.padding_mode != "zeros" or isinstance(conv.padding, str):
            raise ValueError("Int8Conv3d needs groups=1 and explicit zero padding")
        self.reduce_range = (not int8_dot_has_vnni()) if reduce_range is None else bool(reduce_range)
        self.in_scale, self.in_zero_point = activation_qparams(
            observer.in_min, observer.in_max, self.reduce_range
        )
        weight = conv.weight.detach().float().contiguous()
        scales = (weight.abs().amax(dim=(1, 2, 3, 4)) / 127.0).clamp_min(1e-12)
        qweight = torch.round(weight / scales.view(-1, 1, 1, 1, 1)).clamp_(-127, 127).to(torch.int8)
        self.register_buffer("weight_int8", qweight)
        self.register_buffer("weight_scale", scales)
        self.register_buffer("weight_zero_point", torch.zeros(len(scales), dtype=torch.long))
        self.register_buffer("bias", None if conv.bias is None else conv.bias.detach().float().clone())
        self.in_channels, self.out_channels = conv.in_channels, conv.out_channels
        self.kernel_size, self.stride = tuple(conv.kernel_size), tuple(conv.stride)
        self.padding, self.dilation = tuple(conv.padding), tuple(conv.dilation)
        self._packed: torch.Tensor | None = None

    # The packed weight is an opaque oneDNN tensor (no storage: it cannot be deep-copied or pickled); it is
    # rebuilt from ``weight_int8`` on first use after a copy.
    def __getstate__(self):
        state = dict(super().__getstate__())
        state["_packed"] = None
        state.pop("_padded", None)
        return state

    def _packed_weight(self) -> torch.Tensor:
        if self._packed is None or self._packed.device != self.weight_int8.device:
            self._packed = torch.ops.onednn.qconv_prepack(
                self.weight_int8,
                self.weight_scale,
                self.in_scale,
                self.in_zero_point,
                list(self.stride),
                list(self.padding),
                list(self.dilation),
                1,
                None,
            )
        return self._packed

    def with_padding(self, padding: tuple[int, int, int]) -> Int8Conv3d:
        """The same quantized layer with other zero padding (shares the int8 weights).

        The streamed decoder pads the first axis itself (a halo of real rows, zeros only at the volume's
        edges); zero in float is exactly the zero point in uint8, so the result is the same function.
        """
        import copy

        cache = self.__dict__.setdefault("_padded", {})
        key = tuple(padding)
        if key not in cache:
            other = copy.copy(self)
            other.__dict__ = dict(self.__dict__)
            other.padding, other._packed = key, None
            other.__dict__["_padded"] = {}
            cache[key] = other
        return cache[key]

    def quantize_input(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` as uint8 with this layer's static scale and zero point (round half up, saturating).

        Multiply, add, clamp in place, then the cast (which truncates, hence the +0.5), with Python scalars:
        1.7x faster than ``torch.addcmul`` with 0-dim tensors and 3.3x faster than round/add/clamp/cast on a
        64 x 20x24x20 activation here. The layout of ``x`` is kept (oneDNN takes channels-last as it is).
        """
        top = 127 if self.reduce_range else 255
        return _quantize_uint8(x, 1.0 / self.in_scale, self.in_zero_point, top)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.onednn.qconv_pointwise(
            self.quantize_input(x),
            self.in_scale,
            self.in_zero_point,
            self._packed_weight(),
            self.weight_scale,
            self.weight_zero_point,
            self.bias,
            list(self.stride),
            list(self.padding),
            list(self.dilation),
            1,
            1.0,
            0,
            torch.float32,  # dequantized inside the kernel
            "none",
            [],
            "",
        )
        # oneDNN answers channels-last and it is returned as is: the float ops around it accept any layout,
        # and converting back costs a full pass (the shipped U-Net's int8 step: 39 -> 33 ms CPU time here).
        return y

    def extra_repr(self) -> str:
        bits = 7 if self.reduce_range else 8
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
            f"padding={self.padding}, activations={bits}-bit uint8, onednn"
        )


class DynamicInt8Linear(nn.Module):
    """Float in, float out; uint8 activations (one scale per call, from the input's range) x int8
    per-output-channel weights, oneDNN's int8 matmul with float32 out."""

    def __init__(self, linear: nn.Linear, reduce_range: bool | None = None):
        super().__init__()
        self.reduce_range = (not int8_dot_has_vnni()) if reduce_range is None else bool(reduce_range)
        weight = linear.weight.detach().float().contiguous()
        scales = (weight.abs().amax(dim=1) / 127.0).clamp_min(1e-12)
        self.register_buffer(
            "weight_int8", torch.round(weight / scales[:, None]).clamp_(-127, 127).to(torch.int8)
        )
        self.register_buffer("weight_scale", scales)
        self.register_buffer("weight_zero_point", torch.zeros(len(scales), dtype=torch.long))
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float().clone())
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self._packed: torch.Tensor | None = None

    def __getstate__(self):
        state = dict(super().__getstate__())
        state["_packed"] = None  # opaque oneDNN tensor: rebuilt after a copy
        return state

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._packed is None:
            self._packed = torch.ops.onednn.qlinear_prepack(self.weight_int8, None)
        rows = x.reshape(-1, self.in_features).float()
        lo, hi = torch.aminmax(rows)  # one pass; one sync for the two scalars
        scale, zero_point = activation_qparams(float(lo), float(hi), self.reduce_range)
        quantized = _quantize_uint8(rows, 1.0 / scale, zero_point, 127 if self.reduce_range else 255)
        y = torch.ops.onednn.qlinear_pointwise(
            quantized,
            scale,
            zero_point,
            self._packed,
            self.weight_scale,
            self.weight_zero_point,
            self.bias,
            1.0,
            0,
            torch.float32,
            "none",
            [],
            "",
        )
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        bits = 7 if self.reduce_range else 8
        return f"{self.in_features}, {self.out_features}, activations={bits}-bit uint8 per call, onednn"
