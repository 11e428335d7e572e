"""Kernel-time shares by category, read from the names of the kernels (or CPU operators) a profile recorded.

The project's GPU-optimization source paper (arXiv 2606.19365) counts SM cycles and Tensor-Core pipe use
with hardware counters. Those need Nsight Compute, which this check does not assume. What any
``torch.profiler`` run has is each GPU kernel's name and time, and library kernel names say a lot:

* cuDNN convolutions are implicit GEMMs named ``sm80_xmma_fprop_implicit_gemm_<types>_<layouts>_...`` (or
  older ``implicit_convolveNd_sgemm``, ``..._winograd_...``); the types part says what the operands are:
  ``tf32f32_tf32f32_f32`` or ``bf16bf16_bf16f32_f32`` run on Tensor Cores, ``f32f32_f32f32_f32`` does not.
* cuBLAS and CUTLASS GEMMs carry the MMA shape: ``s1688gemm`` / ``s16816gemm`` (Ampere tf32/bf16/fp16
  MMA), ``h884gemm`` / ``h1688gemm`` (Volta/Turing fp16 MMA), ``i8816gemm``; ``tensorop``, ``wmma``,
  ``hmma``, ``imma``, ``gmma`` / ``wgmma`` and ``warpgroup`` (Hopper); Hopper cuBLAS's ``nvjet_*`` kernels
  (``nvjet_tst_...``: bf16 in, fp32 accumulate), except the plain-fp32 ``nvjet_sss_*``. A plain
  ``ampere_sgemm_128x64_nn`` or any name with ``ffma`` / ``simt`` is an FMA-pipe kernel.
* Layout conversions are explicit kernels: cuDNN's ``nchwToNhwcKernel`` / ``nhwcToNchwKernel`` around a
  convolution whose input is NCHW/NCDHW, transposes and permutations.

So the *Tensor-Core share* below is the share of GPU kernel time spent in kernels whose names mark
Tensor-Core instructions. It is a stand-in for the paper's hardware counters, not the same measurement: a
Tensor-Core kernel also spends cycles outside the tensor pipe, and a name can only say what the kernel was
built to use. Names seen in public profiles that shaped the rules (tests/benchmarks/test_kernel_categories.py
lists them with their sources): pytorch/pytorch#34977 and #59168, NVIDIA/cutlass#231, karpathy/nanochat#105,
sgl-project/sglang#22353, huggingface/blog#3408, tile-ai/TileOPs#1998.

On a CPU (the ``--cpu-smoke`` run) there are no kernels: the same rules read ATen operator names
(``aten::mkldnn_convolution``, ``aten::native_group_norm``, ``aten::copy_``...), and no name marks Tensor
Cores.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

# Categories, each kernel in exactly one; their shares add up to 1.
CATEGORIES = (
    "convolution",  # convolution kernels, implicit GEMM included
    "gemm",  # matrix products (linear layers, attention projections)
    "attention",  # fused attention and softmax kernels
    "normalisation",  # group/layer/batch norm statistics and their application
    "layout",  # explicit layout conversions: NCHW<->NHWC, transposes, permutations
    "copy",  # plain copies and dtype casts (autocast weight casts, .contiguous(), memcpy)
    "elementwise",  # pointwise maths, upsampling, concatenation, fills
    "other",
)

_I = re.IGNORECASE


def _any(*patterns: str) -> re.Pattern[str]:
    return re.compile("|".join(f"(?:{p})" for p in patterns), _I)


_LAYOUT = _any(
    r"nchwToNhwc",
    r"nhwcToNchw",
    r"nchw2nhwc",
    r"nhwc2nchw",
    r"transpose",
    r"permut",
    r"\breorder",
    r"aten::(?:permute|contiguous)\b",
)
_NORMALISATION = _any(
    r"group_?norm",
    r"layer_?norm",
    r"batch_?norm",
    r"instance_?norm",
    r"RowwiseMoments",
    r"ComputeFusedParams",
    r"\bbn_fw",
    r"welford",
    r"var_mean",
)
_ATTENTION = _any(
    r"flash",
    r"fmha",
    r"\bsdpa",
    r"_sdpa_",
    r"scaled_dot_product",
    r"softmax",
    r"attention",
)
_CONVOLUTION = _any(
    r"conv(?!ert)",
    r"fprop",
    r"dgrad",
    r"wgrad",
    r"implicit_gemm",
    r"winograd",
)
_GEMM = _any(
    r"gemm",
    r"nvjet",
    r"gemv",
    r"cublas",
    r"cutlass",
    r"aten::(?:mm|bmm|addmm|baddbmm|matmul|linear)\b",
    r"splitKreduce",
)
_COPY = _any(
    r"direct_copy",
    r"copy_kernel",
    r"\bmemcpy",
    r"\bmemset",
    r"aten::(?:copy_|_to_copy|to|clone)\b",
)
_ELEMENTWISE = _any(
    r"elementwise",
    r"pointwise",
    r"\bupsample",
    r"CatArrayBatched",
    r"\bcat\b",
    r"aten::(?:add|mul|sub|div|silu|sigmoid|gelu|cat|fill_|zero_|upsample_\w+|pad|constant_pad_nd)\b",
    r"fill",
)

# Tensor-Core markers (see the module docstring), and markers of FMA-pipe kernels that override them.
_TENSOR_CORE = _any(
    r"\b[shi]\d{3,6}(?:gemm|fprop|dgrad|wgrad)",  # s1688gemm, h884gemm, i8816gemm, s16816dgrad...
    r"[_\d][shi]\d{3,6}(?:gemm|fprop|dgrad|wgrad)",
    r"tensorop",
    r"wmma",
    r"hmma",
    r"imma",
    r"w?gmma",
    r"warpgroup",
    r"tensor\d+x\d+x\d+",  # cuDNN xmma kernels' MMA shape: _tensor16x8x8_, _tensor16x8x16_
    r"tf32",
    r"bf16bf16",
    r"f16f16",
    r"i8i8",
    r"e4m3",
    r"e5m2",
    r"nvjet_(?!sss)",
    r"flash_fwd",
    r"flash_fprop",
    r"fmha_cutlassF_(?:bf16|f16)",
)
_FMA_PIPE = _any(r"ffma", r"simt", r"nvjet_sss", r"\b\w*_sgemm_(?!\w*tensor)")
_TRITON = re.compile(r"^triton_(poi|red|per|tem)_", _I)


def categorise(name: str) -> str:
    """The category (one of ``CATEGORIES``) of a kernel or operator name."""
    triton = _TRITON.match(name)
    if triton:  # Inductor's generated kernels say what they are in their prefix and fused-op list
        kind = triton.group(1).lower()
        if kind == "tem":
            return "convolution" if "conv" in name.lower() else "gemm"
        if _NORMALISATION.search(name):
            return "normalisation"
        if _ATTENTION.search(name):
            return "attention"
        if kind == "poi" and re.search(r"permute|transpose|clone", name, _I):
            return "layout"  # Inductor's layout changes are pointwise kernels named after the ops they fuse
        if kind == "poi" and "_to_copy" in name:
            return "copy"
        return "elementwise" if kind == "poi" else "other"
    for category, pattern in (
        ("layout", _LAYOUT),
        ("normalisation", _NORMALISATION),  # before elementwise: GroupNorm's apply is a TensorIterator kernel
        (
            "attention",
            _ATTENTION,
        ),  # before convolution and gemm: cudnn_..._sdpa_..._flash_fprop, fmha_cutlass
        ("convolution", _CONVOLUTION),  # before gemm: implicit_gemm is a convolution
        ("gemm", _GEMM),
        ("copy", _COPY),
        ("elementwise", _ELEMENTWISE),
    ):
        if pattern.search(name):
            return category
    return "other"


def uses_tensor_cores(name: str) -> bool:
    """Whether a kernel's name marks Tensor-Core instructions (a name-based stand-in, see the module doc)."""
    if name.startswith("aten::"):
        return False  # a CPU operator, not a kernel
    return bool(_TENSOR_CORE.search(name)) and not _FMA_PIPE.search(name)


def summarise(kernels: Iterable[tuple[str, float, int]], top: int = 12) -> dict[str, Any]:
    """Shares of time by category, the Tensor-Core share and the top kernels.

    Args:
        kernels: ``(name, microseconds, calls)`` per kernel (or operator), any number of rows per name.
        top: How many of the longest kernels to list with their category.

    Returns:
        ``{"total_us", "kernels", "shares": {category: share}, "tensor_core_share", "top": [...]}``; shares
        are fractions of ``total_us`` (all zero when nothing was timed).
    """
    merged: dict[str, list[float]] = {}
    for name, us, calls in kernels:
        row = merged.setdefault(name, [0.0, 0])
        row[0] += float(us)
        row[1] += int(calls)
    total = sum(us for us, _ in merged.values())
    by_category = dict.fromkeys(CATEGORIES, 0.0)
    tensor_core_us = 0.0
    rows = []
    for name, (us, calls) in merged.items():
        category = categorise(name)
        tensor_core = uses_tensor_cores(name)
        by_category[category] += us
        if tensor_core:
            tensor_core_us += us
        rows.append(
            {"name": name, "us": us, "calls": calls, "category": category, "tensor_core": tensor_core}
        )
    rows.sort(key=lambda r: -r["us"])
    for row in rows:
        row["share"] = row["us"] / total if total else 0.0
    return {
        "total_us": total,
        "kernels": len(merged),
        "shares": {c: (us / total if total else 0.0) for c, us in by_category.items()},
        "tensor_core_share": tensor_core_us / total if total else 0.0,
        "top": rows[:top],
    }


def profile_kernels(prof, on_cuda: bool) -> list[tuple[str, float, int]]:
    """``(name, microseconds, calls)`` of a finished ``torch.profiler.profile``.

    On CUDA: the GPU kernels (and memcpy/memset), by device time; CPU-side operators are left out, since
    their device time is their kernels' time counted again. On a CPU: every operator by *self* CPU time, so
    nested operators are not counted twice.
    """
    from torch.autograd import DeviceType

    rows = []
    for event in prof.key_averages():
        if getattr(event, "is_user_annotation", False):
            continue  # record_function ranges on the GPU timeline span other kernels: counted twice
        if on_cuda:
            if event.device_type != DeviceType.CUDA:
                continue
            us = float(event.self_device_time_total)
        else:
            us = float(event.self_cpu_time_total)
        if us > 0:
            rows.append((event.key, us, int(event.count)))
    return rows
