"""Post-training quantization of the U-Net and the decoder: int8 (x86 CPUs), fp8 (NVIDIA GPUs), mixed.

* **int8** — every ``nn.Conv3d`` becomes :class:`Int8Conv3d` (:mod:`engine.quantization.onednn_int8`): static
  per-tensor uint8 activations (ranges from a calibration run of the real sampling loop), per-channel
  symmetric int8 weights, oneDNN's int8 convolution called eagerly on plain tensors (no compiler, no
  deprecated quantized tensors; torchao 0.18 has no int8 Conv3d for x86 CPUs). Linear layers become
  :class:`DynamicInt8Linear`: oneDNN's int8 matmul, activation scale from each call's range (torchao's eager
  int8 Linear was measured slower than fp32 here, see that module). 7-bit activations where the CPU has no
  VNNI (int16 saturation otherwise). Everything else (GroupNorm, SiLU, attention softmax, the scheduler)
  stays in floating point. Each quantized layer takes
  float in and gives float out, so it drops into the MONAI network without touching its code.
* **fp8** — Linear layers become :class:`Fp8Linear` (``torch._scaled_mm``, e4m3 weights and activations,
  per-tensor scales) on NVIDIA GPUs of compute capability 8.9+; Conv3d layers can take torchao's float8 static
  config where :func:`engine.quantization.torchao_support.fp8_conv3d_support` allows (Hopper + mslk).
* **mixed** — :func:`mixed_precision_plan`: a calibration run measures each layer's sensitivity (the error
  in the final sample when that layer alone is quantized) and its share of the compute; the layers that add
  the most error per unit of compute are kept in floating point (the autocast dtype when autocast is on)
  until the final volume meets the user's PSNR budget against fp32.

torchao (:mod:`engine.quantization.torchao_support`, the one place it is imported) supplies float8 Conv3d on
Hopper-class GPUs and the comparison rows of ``benchmarks.int8_kernels``. The deprecated torch.ao
quantized-tensor path survives only in :mod:`engine.quantization.legacy`, as a benchmark row.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from engine.metrics.image import psnr
from engine.quantization.onednn_int8 import DynamicInt8Linear, Int8Conv3d, int8_dot_has_vnni

__all__ = [
    "MIN_INT8_LINEAR_MACS",
    "MIN_MIXED_SHARE",
    "MIN_QUANT_FEATURES",
    "Calibration",
    "DynamicInt8Linear",
    "Fp8Linear",
    "Int8Conv3d",
    "MixedPlan",
    "RangeObserver",
    "candidate_layers",
    "fp8_eligible",
    "fp8_support",
    "int8_dot_has_vnni",
    "int8_support",
    "mixed_precision_plan",
    "quantize_fp8",
    "quantize_int8",
]

# Layers thinner than this are not worth a quantize/dequantize round trip (e.g. the 2-4 wide cross-attention
# context projections).
MIN_QUANT_FEATURES = 16
# Linear layers doing fewer multiply-accumulates than this per call stay in float32: quantizing the activation
# on every call costs more than the int8 matmul saves. Measured on an AMD EPYC Zen 5 (1 thread, CPU time):
# 150x128->128 (2.5M MACs) 0.64x fp32, 1200x128->128 (20M) 1.4x alone but a net loss inside the shipped U-Net,
# 1200x128->1024 (157M) 2.5x, 9600x256->2048 2.7x (python -m benchmarks.int8_kernels; issue 23's note).
MIN_INT8_LINEAR_MACS = 50_000_000
FP8_MAX = 448.0  # largest finite float8_e4m3fn


def int8_support(device: torch.device) -> tuple[bool, str]:
    """Whether the int8 kernels exist for ``device`` here: (True, kernel name) or (False, why not)."""
    if device.type != "cpu":
        return False, (
            f"int8 Conv3d kernels (oneDNN) exist only for x86 CPUs in PyTorch; this run is on "
            f"{device.type}. Use bf16 autocast (or fp8 on Hopper) on GPUs"
        )
    if not torch.backends.mkldnn.is_available() or not all(
        hasattr(torch.ops.onednn, op) for op in ("qconv_pointwise", "qlinear_pointwise")
    ):
        return False, "this PyTorch build has no oneDNN int8 kernels (torch.ops.onednn.qconv_pointwise)"
    return True, "onednn"


def fp8_support(device: torch.device) -> tuple[bool, str]:
    """Whether fp8 matmuls (``torch._scaled_mm``) can run on ``device``."""
    if device.type != "cuda":
        return (
            False,
            f"fp8 needs an NVIDIA GPU of compute capability 8.9+ (Ada/Hopper); this run is on {device.type}",
        )
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < (8, 9):
        return False, f"fp8 needs compute capability 8.9+ (Ada/Hopper); this GPU is {major}.{minor}"
    if not hasattr(torch, "float8_e4m3fn") or not hasattr(torch, "_scaled_mm"):
        return False, "this PyTorch build has no float8 matmul (torch._scaled_mm)"
    return True, f"compute capability {major}.{minor}"


# -- candidate layers ----------------------------------------------------------------------------------


def candidate_layers(model: nn.Module, kinds: Iterable[type] = (nn.Conv3d, nn.Linear)) -> list[str]:
    """Names of the layers quantization would replace, in module order."""
    kinds = tuple(kinds)
    names = []
    for name, module in model.named_modules():
        if type(module) not in kinds:
            continue
        if isinstance(module, nn.Conv3d):
            if module.groups != 1 or module.padding_mode != "zeros" or isinstance(module.padding, str):
                continue
        elif (
            isinstance(module, nn.Linear)
            and min(module.in_features, module.out_features) < MIN_QUANT_FEATURES
        ):
            continue
        names.append(name)
    return names


def _set_module(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)


# -- calibration ---------------------------------------------------------------------------------------


@dataclass
class RangeObserver:
    """Running min/max of a layer's input and output over the calibration run."""

    in_min: float = math.inf
    in_max: float = -math.inf
    out_min: float = math.inf
    out_max: float = -math.inf
    calls: int = 0

    def update(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.in_min = min(self.in_min, float(x.min()))
        self.in_max = max(self.in_max, float(x.max()))
        self.out_min = min(self.out_min, float(y.min()))
        self.out_max = max(self.out_max, float(y.max()))
        self.calls += 1


@dataclass
class Calibration:
    """What one run of the sampling loop showed about each candidate layer.

    ``ranges``: activation ranges per Conv3d (Linear layers are quantized dynamically and need none).
    ``macs``: multiply-accumulates per layer summed over the run, i.e. the compute that quantizing it
    could speed up.
    """

    ranges: dict[str, RangeObserver] = field(default_factory=dict)
    macs: dict[str, int] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)

    def attach(self, model: nn.Module, names: Iterable[str]) -> list:
        """Add forward hooks that record ranges and compute; returns the handles (call ``.remove()`` on each)."""
        handles = []
        for name in names:
            module = model.get_submodule(name)
            if isinstance(module, nn.Conv3d):
                observer = self.ranges.setdefault(name, RangeObserver())
                per_output = (module.in_channels // module.groups) * math.prod(module.kernel_size)
            elif isinstance(module, nn.Linear):
                observer, per_output = None, module.in_features
            else:
                continue

            def hook(_module, inputs, output, name=name, observer=observer, per_output=per_output):
                if observer is not None:
                    observer.update(inputs[0].detach(), output.detach())
                self.macs[name] = self.macs.get(name, 0) + output.numel() * per_output
                self.calls[name] = self.calls.get(name, 0) + 1

            handles.append(module.register_forward_hook(hook))
        return handles

    def macs_per_call(self, name: str) -> float:
        """The layer's multiply-accumulates per call during the run (0 for a layer never called)."""
        calls = self.calls.get(name, 0)
        return self.macs.get(name, 0) / calls if calls else 0.0

    def too_small_for_int8(self, model: nn.Module, name: str) -> bool:
        """A Linear layer below :data:`MIN_INT8_LINEAR_MACS` per call: int8 would slow it down.

        A calibration without call counts (e.g. cached by an older version) decides nothing: False.
        """
        if not isinstance(model.get_submodule(name), nn.Linear) or name not in self.calls:
            return False
        return self.macs_per_call(name) < MIN_INT8_LINEAR_MACS

    def compute_share(self, name: str) -> float:
        """The layer's fraction of the MACs of all observed layers (0 for a layer never called)."""
        total = sum(self.macs.values())
        return self.macs.get(name, 0) / total if total else 0.0


# -- int8 modules ---------------------------------------------------------------------------------------


class Fp8Linear(nn.Module):
    """e4m3 weights (per-tensor scale) x e4m3 activations (per-call scale) via ``torch._scaled_mm``, bf16 out."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        weight = linear.weight.detach().float()
        w_scale = (weight.abs().amax() / FP8_MAX).clamp_min(1e-12)
        self.register_buffer("weight_fp8", (weight / w_scale).to(torch.float8_e4m3fn))
        self.register_buffer("weight_scale", w_scale.reshape(()).float())
        bias = None if linear.bias is None else linear.bias.detach().to(torch.bfloat16)
        self.register_buffer("bias", bias)
        self.out_features = linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).float()
        x_scale = (x2.abs().amax() / FP8_MAX).clamp_min(1e-12)
        xq = (x2 / x_scale).to(torch.float8_e4m3fn)
        # _scaled_mm wants the second operand column-major: the (out, in) weight transposed is exactly that.
        out = torch._scaled_mm(
            xq,
            self.weight_fp8.t(),
            scale_a=x_scale.float(),
            scale_b=self.weight_scale,
            bias=self.bias,
            out_dtype=torch.bfloat16,
        )
        return out.reshape(*shape[:-1], self.out_features)


def fp8_eligible(model: nn.Module) -> list[str]:
    """Linear layers whose shapes ``torch._scaled_mm`` accepts (both dimensions multiples of 16)."""
    return [
        name
        for name in candidate_layers(model, (nn.Linear,))
        if model.get_submodule(name).in_features % 16 == 0
        and model.get_submodule(name).out_features % 16 == 0
    ]


def quantize_fp8(
    model: nn.Module, calibration: Calibration | None = None, device: torch.device | None = None
) -> list[str]:
    """Replace eligible Linear layers with :class:`Fp8Linear` in place; returns the names replaced.

    With a ``calibration`` (activation ranges) and a ``device`` where torchao's float8 Conv3d runs
    (:func:`engine.quantization.torchao_support.fp8_conv3d_support`: Hopper + mslk), the calibrated Conv3d
    layers whose channel counts are multiples of 16 get torchao's float8 static config too; elsewhere they
    keep their precision (the caller reports the support function's reason).
    """
    names = fp8_eligible(model)
    for name in names:
        _set_module(model, name, Fp8Linear(model.get_submodule(name)))
    if calibration is None or device is None:
        return names
    from engine.quantization import torchao_support

    if not torchao_support.fp8_conv3d_support(device)[0]:
        return names
    for name in candidate_layers(model, (nn.Conv3d,)):
        conv, observer = model.get_submodule(name), calibration.ranges.get(name)
        if observer is None or observer.calls == 0 or conv.in_channels % 16 or conv.out_channels % 16:
            continue
        torchao_support.quantize_fp8_conv3d(conv, max(abs(observer.in_min), abs(observer.in_max)), device)
        names.append(name)
    return names


def quantize_int8(
    model: nn.Module,
    calibration: Calibration,
    names: Iterable[str],
    reduce_range: bool | None = None,
    legacy_kernels: bool = False,
) -> list[str]:
    """Replace the named layers with int8 modules in place; returns the names replaced.

    ``reduce_range``: 7-bit activations for the convolutions; default: where the CPU has no VNNI.
    ``legacy_kernels``: the deprecated torch.ao modules instead (``benchmarks.int8_kernels`` compares them;
    the engine never asks for them).
    """
    # (conv, observer, reduce_range) -> the int8 convolution; linear -> the int8 linear
    conv_int8: Callable[..., nn.Module]
    linear_int8: Callable[..., nn.Module]
    if legacy_kernels:
        from engine.quantization import legacy

        conv_int8 = lambda conv, observer, _: legacy.LegacyInt8Conv3d(conv, observer)  # noqa: E731
        linear_int8 = legacy.LegacyDynamicInt8Linear
    else:
        conv_int8 = Int8Conv3d
        linear_int8 = lambda linear: DynamicInt8Linear(linear, reduce_range)  # noqa: E731
    done = []
    for name in names:
        module = model.get_submodule(name)
        if isinstance(module, nn.Conv3d):
            observer = calibration.ranges.get(name)
            if observer is None or observer.calls == 0:
                continue  # a layer the calibration run never reached (e.g. an unused branch)
            _set_module(model, name, conv_int8(module, observer, reduce_range))
        elif isinstance(module, nn.Linear):
            if calibration.too_small_for_int8(model, name):
                continue  # int8 would slow this layer down (MIN_INT8_LINEAR_MACS)
            _set_module(model, name, linear_int8(module))
        else:
            continue
        done.append(name)
    return done


# -- mixed precision ------------------------------------------------------------------------------------


@dataclass
class MixedPlan:
    """Which layers run int8 and which stay in floating point, and what the search measured."""

    quantized: list[str]
    kept: list[str]
    sensitivity_db: dict[str, float]  # layer -> PSNR of the final sample with only that layer quantized
    achieved_psnr_db: float
    budget_db: float
    evaluations: int
    compute_share: dict[str, float] = field(default_factory=dict)  # layer -> fraction of the U-Net's MACs
    # below MIN_MIXED_SHARE, or Linear layers below MIN_INT8_LINEAR_MACS per call: not worth searching
    skipped_small: list[str] = field(default_factory=list)
    float_psnr_db: float = math.inf  # the final volume with no int8 layer (autocast alone) vs the reference

    @property
    def quantized_share(self) -> float:
        """Fraction of the candidate layers' compute (Conv3d + Linear MACs) that runs in int8."""
        return sum(self.compute_share.get(n, 0.0) for n in self.quantized)

    def record(self) -> dict[str, Any]:
        """What the search chose and measured, for a run's details (U-Net and decoder plans alike)."""
        return {
            "quantized": self.quantized,
            "kept_float": self.kept,
            "skipped_small": self.skipped_small,
            "sensitivity_psnr_db": self.sensitivity_db,
            "compute_share": self.compute_share,
            "int8_compute_share": self.quantized_share,
            "float_psnr_db": self.float_psnr_db,
            "achieved_psnr_db": self.achieved_psnr_db,
            "evaluations": self.evaluations,
        }


# Layers below this fraction of the U-Net's multiply-accumulates are not searched by the mixed plan: int8
# could save at most that much time on them, and each costs one sampling run to measure.
MIN_MIXED_SHARE = 0.005


def mixed_precision_plan(
    base: nn.Module,
    calibration: Calibration,
    candidates: list[str],
    budget_db: float,
    run_sample: Callable[[nn.Module], torch.Tensor],
    run_volume: Callable[[nn.Module], torch.Tensor],
    reference_volume: torch.Tensor | None = None,
    min_share: float = MIN_MIXED_SHARE,
) -> MixedPlan:
    """Find the largest set of int8 layers whose final volume stays within ``budget_db`` of the reference.

    Args:
        base: the float U-Net (not modified; copies are quantized).
        calibration: activation ranges and per-layer compute from a run of the sampling loop.
        candidates: layer names that may be quantized.
        budget_db: minimum PSNR of the final volume against ``reference_volume``.
        run_sample: runs the calibration sampling loop with a given U-Net, in the precision the prepared
            model will run in (e.g. under bf16 autocast), and returns the final sample (the latent for
            latent models: cheap, used for the per-layer sensitivities).
        run_volume: same, but returns the final decoded volume (used to check the budget).
        reference_volume: the volume the budget is measured against (the fp32 model's); default
            ``run_volume(base)``.
        min_share: layers below this fraction of the U-Net's compute stay in float without being searched.

    Sensitivity of a layer = PSNR of the final sample when that layer alone is int8, against the same run
    with no int8 layer. Layers are ranked by the error they add per unit of compute they would speed up
    (error power 10^(-PSNR/10) divided by their MACs): keeping a cheap layer that adds much error in float
    costs little time, keeping an expensive one costs much. Kept layers are taken from the top of that
    ranking; a binary search over how many to keep finds the fewest that meet the budget on the final
    volume (errors of independently quantized layers add up, which makes the search valid in practice;
    the achieved PSNR is measured, not predicted, and reported).
    """
    import copy

    float_volume = run_volume(base)
    if reference_volume is None:
        reference_volume = float_volume
    float_psnr = psnr(reference_volume, float_volume)
    share = {n: calibration.compute_share(n) for n in candidates}
    small = [n for n in candidates if share[n] < min_share or calibration.too_small_for_int8(base, n)]

    def result(quantized: list[str], kept: list[str], achieved_db: float, evaluations: int, sensitivity=None):
        return MixedPlan(
            quantized=quantized,
            kept=kept,
            sensitivity_db=sensitivity or {},
            achieved_psnr_db=achieved_db,
            budget_db=budget_db,
            evaluations=evaluations,
            compute_share=share,
            skipped_small=small,
            float_psnr_db=float_psnr,
        )

    def int8_volume_psnr(int8_layers: list[str]) -> float:
        model = copy.deepcopy(base)
        quantize_int8(model, calibration, int8_layers)
        return psnr(reference_volume, run_volume(model))

    if float_psnr < budget_db:
        # Even with every layer in float, the precision the model runs in (autocast) misses the budget:
        # int8 can only add error, so nothing is quantized or searched; the caller reports why.
        return result([], list(candidates), float_psnr, 1)
    searched = [n for n in candidates if n not in small]
    # The most aggressive plan first: when every searched layer in int8 already meets the budget (the
    # bundle-sized U-Net: all 27 of them, 46.1 dB against a 40 dB floor), the per-layer sensitivities cannot
    # change the answer, and one run replaces one per layer plus the binary search (33 runs there).
    quantizable = [n for n in searched if _int8_ready(base, n, calibration)]
    if quantizable:
        all_int8_psnr = int8_volume_psnr(quantizable)
        if all_int8_psnr >= budget_db:
            return result(quantizable, [n for n in candidates if n not in quantizable], all_int8_psnr, 2)
    reference_sample = run_sample(base)
    sensitivity: dict[str, float] = {}
    for name in searched:
        trial = _with_one_layer_swapped(base, name, calibration)  # shares all other weights with ``base``
        if trial is None:
            continue
        sensitivity[name] = psnr(reference_sample, run_sample(trial))

    def error_per_mac(name: str) -> float:
        return 10.0 ** (-sensitivity[name] / 10.0) / max(calibration.macs.get(name, 0), 1)

    ranked = sorted(sensitivity, key=error_per_mac, reverse=True)  # the first ones are kept in float first
    unsearched = [n for n in candidates if n not in sensitivity]

    evaluations = 3 if quantizable else 2  # sampling runs so far: float, every layer int8, the float sample
    # Invariant: keeping ``hi`` layers meets the budget (all kept = float_psnr). Keeping none (every ranked
    # layer int8, i.e. every quantizable one) was measured above and missed it.
    lo, hi = (1 if ranked else 0), len(ranked)
    results = {len(ranked): float_psnr}
    while lo < hi:
        mid = (lo + hi) // 2
        results[mid] = int8_volume_psnr(ranked[mid:])
        evaluations += 1
        if results[mid] >= budget_db:
            hi = mid
        else:
            lo = mid + 1
    return result(
        ranked[hi:], ranked[:hi] + unsearched, results[hi], evaluations + len(sensitivity), sensitivity
    )


def _int8_ready(base: nn.Module, name: str, calibration: Calibration) -> bool:
    """Whether layer ``name`` can run in int8: a Linear always, a Conv3d once calibration saw it run."""
    if not isinstance(base.get_submodule(name), nn.Conv3d):
        return True
    observer = calibration.ranges.get(name)
    return observer is not None and observer.calls > 0


def _with_one_layer_swapped(base: nn.Module, name: str, calibration: Calibration) -> nn.Module | None:
    """A copy of ``base`` sharing every parameter except the one layer replaced by its int8 version."""
    import copy

    module = base.get_submodule(name)
    if not _int8_ready(base, name, calibration):
        return None
    if isinstance(module, nn.Conv3d):
        replacement: nn.Module = Int8Conv3d(module, calibration.ranges[name])
    else:
        replacement = DynamicInt8Linear(module)
    # Copy only the module objects along the path (parameters stay shared), then swap the leaf.
    trial = copy.copy(base)
    trial._modules = dict(base._modules)
    parent_new, parent_old = trial, base
    parts = name.split(".")
    for part in parts[:-1]:
        child = copy.copy(parent_old._modules[part])
        child._modules = dict(parent_old._modules[part]._modules)
        parent_new._modules[part] = child
        parent_new, parent_old = child, parent_old._modules[part]
    parent_new._modules[parts[-1]] = replacement
    return trial
