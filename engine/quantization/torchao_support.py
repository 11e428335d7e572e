"""The one place the engine imports torchao (pinned in pyproject.toml): float8 Conv3d, and the bench's rows.

What torchao 0.18 covers, looked up in its source and measured (``benchmarks.int8_kernels``):

* int8 ``Linear``: ``quantize_`` with ``Int8DynamicActivationInt8WeightConfig`` (per-token activations,
  per-channel weights) runs a real int8 matmul eagerly (``torch._int_mm``), but its quantization runs as
  separate Python-level ops meant for torch.compile: 0.3-0.9x fp32 at the U-Net's shapes here, so the engine
  uses oneDNN's int8 matmul (:mod:`engine.quantization.onednn_int8`); :func:`int8_linear` is a bench row.
* int8 ``Conv3d``: nothing. The eager int8 configs implement linear ops only (``aten.convolution`` raises
  NotImplementedError); ``X86InductorQuantizer`` annotates conv1d/conv2d/linear, not conv3d; a Conv3d
  annotated by hand runs reference quantize/dequantize ops + float conv, and its x86 lowering does not fuse
  it. :mod:`engine.quantization.onednn_int8` calls oneDNN's int8 convolution instead.
* float8 ``Conv3d``: ``Float8StaticActivationFloat8WeightConfig`` (per-tensor, calibrated activation scale)
  runs ``torch.ops.mslk.f8f8bf16_conv``: CUDA only, the ``mslk`` kernel package, compute capability 9.0+
  (torchao's automatic kernel choice wants 10.0; the explicit MSLK preference is used). Everywhere else
  :func:`fp8_conv3d_support` says why not.

torchao prints at import what a user must never see: ``Failed to load .../_C_mxfp8...so`` and
``_C_cutlass_90a.abi3.so`` (its ``torchao`` logger at WARNING: CUDA extensions built for another Python
ABI; harmless on a CPU build, nothing here uses them) and a pytree deprecation (torch's
``torch.utils._pytree`` logger, about torchao registering ``KernelPreference``). :func:`torchao` imports
it once with those two loggers raised to ERROR and puts their levels back.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import warnings
from typing import Any

import torch
from torch import nn

TORCHAO_VERSION = "0.18.0"  # pinned in pyproject.toml; the notes above were checked against it
_NOISY_LOGGERS = ("torchao", "torch.utils._pytree")


@contextlib.contextmanager
def _quiet_import():
    loggers = [logging.getLogger(name) for name in _NOISY_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


@functools.cache
def torchao():
    """The torchao module, imported without its load-time noise; ImportError if it is not installed."""
    with _quiet_import():
        import torchao as module
        import torchao.quantization  # noqa: F401
    return module


# -- float8 Conv3d on CUDA ------------------------------------------------------------------------------


def fp8_conv3d_support(device: torch.device) -> tuple[bool, str]:
    """Whether torchao's float8 static config can run a Conv3d on ``device``, and why not."""
    if device.type != "cuda":
        return False, (
            "float8 Conv3d (torchao Float8StaticActivationFloat8WeightConfig) runs only on NVIDIA GPUs of "
            f"compute capability 9.0+ (Hopper) with the mslk kernel package; this run is on {device.type}"
        )
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < (9, 0):
        return False, f"float8 Conv3d needs compute capability 9.0+ (Hopper); this GPU is {major}.{minor}"
    import importlib.util

    if importlib.util.find_spec("mslk") is None:
        return False, "float8 Conv3d needs the mslk kernel package (torchao's fp8 convolution), not installed"
    try:
        torchao()
    except ImportError:
        return False, f"torchao=={TORCHAO_VERSION} is not installed"
    return True, f"compute capability {major}.{minor}, torchao float8 static Conv3d (mslk)"


def quantize_fp8_conv3d(conv: nn.Conv3d, input_absmax: float, device: torch.device) -> nn.Conv3d:
    """``conv`` (in place) with float8 e4m3 weight and static e4m3 activation scale, via torchao.

    Raises ValueError with the reason where :func:`fp8_conv3d_support` refuses.
    """
    ok, why = fp8_conv3d_support(device)
    if not ok:
        raise ValueError(why)
    ao = torchao()
    from torchao.prototype.quantization.quant_api import Float8StaticActivationFloat8WeightConfig
    from torchao.quantization.granularity import PerTensor
    from torchao.quantization.quantize_.common import KernelPreference

    scale = torch.tensor([max(input_absmax, 1e-12) / torch.finfo(torch.float8_e4m3fn).max], device=device)
    config = Float8StaticActivationFloat8WeightConfig(
        act_quant_scale=scale, granularity=PerTensor(), kernel_preference=KernelPreference.MSLK
    )
    ao.quantize_(conv, config, filter_fn=lambda m, _: isinstance(m, nn.Conv3d))
    return conv


# -- rows of benchmarks.int8_kernels: what torchao does with a Conv3d or a Linear on this CPU ------------


def int8_linear(linear: nn.Linear) -> nn.Linear:
    """A copy of ``linear`` whose weight is torchao's Int8Tensor (dynamic per-token int8 activations)."""
    import copy

    ao = torchao()
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig

    quantized = copy.deepcopy(linear).float()
    # set_inductor_config=False: run eagerly; torchao would otherwise change global Inductor flags.
    ao.quantize_(
        quantized,
        Int8DynamicActivationInt8WeightConfig(set_inductor_config=False),
        filter_fn=lambda m, _: True,
    )
    return quantized


def eager_int8_conv3d(conv: nn.Conv3d, example: torch.Tensor) -> nn.Module:
    """``conv`` after ``quantize_(Int8DynamicActivationInt8WeightConfig)``, run once (raises where unsupported)."""
    ao = torchao()
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig

    ao.quantize_(
        conv,
        Int8DynamicActivationInt8WeightConfig(set_inductor_config=False),
        filter_fn=lambda m, _: isinstance(m, nn.Conv3d),
    )
    with torch.inference_mode():
        conv(example)
    return conv


def pt2e_int8_conv3d(model: nn.Module, example: torch.Tensor) -> Any:
    """torchao's PT2E flow with the x86 quantizer's int8 specs, Conv3d annotated by hand, converted.

    The stock ``X86InductorQuantizer`` leaves ``aten.conv3d`` unannotated (nothing would be quantized); the
    converted graph runs reference quantize/dequantize ops around a float convolution.
    """
    torchao()
    import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer as xiq
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer import QuantizationAnnotation

    class Conv3dX86Quantizer(xiq.X86InductorQuantizer):
        def annotate(self, graph_module):
            config = xiq.get_default_x86_inductor_quantization_config()
            for node in graph_module.graph.nodes:
                if node.target == torch.ops.aten.conv3d.default:
                    node.meta["quantization_annotation"] = QuantizationAnnotation(
                        input_qspec_map={node.args[0]: config.input_activation, node.args[1]: config.weight},
                        _annotated=True,
                    )
            return graph_module

    with _quiet_import():
        exported = torch.export.export(model.eval(), (example,)).module()
        prepared = prepare_pt2e(exported, Conv3dX86Quantizer())
        with torch.inference_mode():
            prepared(example)
        return convert_pt2e(prepared)


def compile_frozen(graph_module):
    """``torch.compile`` with Inductor freezing (where torchao's x86 lowering runs); needs a C++ compiler."""
    from torch._inductor import config as inductor_config

    inductor_config.freezing = True
    return torch.compile(graph_module)
