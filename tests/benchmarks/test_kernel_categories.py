"""The kernel-name categoriser on kernel names from public profiles, cuDNN/CUTLASS/cuBLAS naming, PyTorch."""

from __future__ import annotations

import pytest

from benchmarks.kernel_categories import (
    CATEGORIES,
    categorise,
    profile_kernels,
    summarise,
    uses_tensor_cores,
)

# (kernel name as a profiler printed it, category, marks Tensor-Core use, where the name was seen)
SEEN = [
    (
        "void wgrad2d_grouped_direct_kernel<__half, float, float, cudnnTensorFormat_t=1>(cudnnTensorStruct, "
        "__half const *, cudnnTensorStruct, __half const *, cudnnConvolutionStruct, cudnnFilterStruct, __half*, "
        "float, float, cudnn::reduced_divisor, int)",
        "convolution",
        False,
        "nvprof, pytorch/pytorch#34977",
    ),
    (
        "void conv2d_grouped_direct_kernel<__half, __half, __half, float, float, bool=1, bool=0, int=1, int=0, "
        "int=0>(cudnnTensorStruct, __half const *, cudnnFilterStruct, __half const *, cudnnConvolutionStruct)",
        "convolution",
        False,
        "nvprof, pytorch/pytorch#34977",
    ),
    ("[CUDA memcpy DtoD]", "copy", False, "nvprof, pytorch/pytorch#34977"),
    (
        "sm75_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_nhwc...",
        "convolution",
        True,
        "torch.profiler, pytorch/pytorch#90204",
    ),
    ("void cudnn::ops::nhwcToNchwKernel<__half, __half, fl...", "layout", False, "pytorch/pytorch#90204"),
    ("void at::native::reduce_kernel<512, 1, at::native::R...", "other", False, "pytorch/pytorch#90204"),
    ("conv2d_c1_k1_nhwc_kernel", "convolution", False, "ncu, pytorch/pytorch#111024"),
    ("implicit_convolveNd_hhgemm", "convolution", False, "NVIDIA/cudnn-frontend#22"),
    ("winograd_nonfused", "convolution", False, "nvprof, NVIDIA/cutlass#231"),
    ("ampere_bf16_s1688gemm_bf16_128x128_ldg8_f2f_stages_32x1_nn", "gemm", True, "karpathy/nanochat#105"),
    ("ampere_bf16_s16816gemm_bf16_256x128_ldg8_f2f_stages_32x3_nn", "gemm", True, "karpathy/nanochat#105"),
    ("nvjet_tst_128x24_64x11_2x1_v_bz_TNT", "gemm", True, "H100 cuBLAS, sgl-project/sglang#22353"),
    ("nvjet_tst_64x24_64x16_4x1_v_bz_splitK_TNT", "gemm", True, "sgl-project/sglang#22353"),
    (
        "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::"
        "direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#12}::"
        "operator()() const::{lambda(c10::BFloat16)#1}>(at::TensorIteratorBase&, at::native::"
        "direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const)",
        "copy",
        False,
        "sgl-project/sglang#22353",
    ),
    # Public profiler dumps found by code search (their repositories not named by the search).
    (
        "cudnn_generated_fort_native_sdpa_sm120_flash_fprop_f16_knob_3_64x64x128_4x1x1",
        "attention",
        True,
        "nsys",
    ),
    ("cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_256x128_32x3_tn_align8", "gemm", True, "nsys"),
    ("fmha_cutlassF_bf16_aligned_64x128_rf_sm80", "attention", True, "nsys"),
    ("sm80_xmma_fprop_implicit_gemm_tf32f32_..._nhwckrsc_nchw", "convolution", True, "nsys"),
    ("triton_poi_fused_cat_3", "elementwise", False, "nsys"),
    ("triton_poi_fused_add_mul_native_layer_norm_unsqueeze_3", "normalisation", False, "nsys"),
    (
        "sm80_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize128x32x32_stage4_warpsize4x1x1_"
        "g1_tensor16x8x16_execute_kernel__5x_cudnn",
        "convolution",
        True,
        "nsys",
    ),
    (
        "void cutlass_cudnn::Kernel<cutlass_tensorop_f16_s16816dgrad_optimized_f16_128x256_32x3_unity_stride>"
        "(cutlass_tensorop_f16_s16816dgrad_optimized_f16_128x256_32x3_unity_stride::Params)",
        "convolution",
        True,
        "TensorFlow profile",
    ),
    (
        "void cudnn::engines_precompiled::nchwToNhwcKernel<float, __half, float, (bool)0, (bool)1, (cudnnKer…",
        "layout",
        False,
        "nsys",
    ),
    (
        "void implicit_convolve_sgemm<__half, __half, (int)1024, (int)5, (int)5, (int)3, (int)3, (int)3, (in…",
        "convolution",
        False,
        "nsys",
    ),
    ("ampere_sgemm_128x128_nt", "gemm", False, "a profiler test fixture"),
    # PyTorch's own CUDA kernels (aten/src/ATen/native/cuda/group_norm_kernel.cu, UpSampleNearest3d.cu).
    (
        "void at::native::(anonymous namespace)::RowwiseMomentsCUDAKernel<float>(long, float, float const*, "
        "float*, float*)",
        "normalisation",
        False,
        "PyTorch source",
    ),
    (
        "void at::native::(anonymous namespace)::ComputeFusedParamsCUDAKernel<float>(long, long, long, "
        "float const*, float const*, float const*, float const*, float*, float*)",
        "normalisation",
        False,
        "PyTorch source",
    ),
    (
        "void at::native::(anonymous namespace)::upsample_nearest3d_out_frame<float, &at::native::"
        "nearest_neighbor_compute_source_index>(float const*, unsigned long, unsigned long, float*)",
        "elementwise",
        False,
        "PyTorch source",
    ),
]

# Names made by the libraries' naming rules, for the cases the seen names above do not cover.
BY_RULE = [
    # cuDNN's fp32 implicit GEMM on the FMA pipe names its instruction: not Tensor Cores, though it is xmma.
    (
        "sm80_xmma_fprop_implicit_gemm_indexed_f32f32_f32f32_f32_nchwkcrs_nchw_tilesize32x32x8_stage3_"
        "warpsize1x2x1_g1_ffma_aligna4_alignc4_execute_kernel",
        "convolution",
        False,
    ),
    (
        "cutlass3x_sm90_tensorop_s64x128x16gemm_bf16_bf16_f32_bf16_bf16_128x128x64_1x1x1_0_tnn_align8",
        "gemm",
        True,
    ),
    ("volta_h884gemm_128x128_ldg8_nn", "gemm", True),
    ("nvjet_sss_128x64_64x4_1x2_v_bz_NNT", "gemm", False),
    ("triton_poi_fused_clone_permute_0", "layout", False),
    ("triton_red_fused_native_group_norm_0", "normalisation", False),
    ("triton_tem_fused_convolution_1", "convolution", False),
    (
        "void at::native::unrolled_elementwise_kernel<at::native::CUDAFunctor_add<float>>",
        "elementwise",
        False,
    ),
    (
        "void (anonymous namespace)::softmax_warp_forward<float, float, float, 9, false, false>",
        "attention",
        False,
    ),
    # CPU operators (the --cpu-smoke profile): categories, never Tensor Cores.
    ("aten::mkldnn_convolution", "convolution", False),
    ("aten::native_group_norm", "normalisation", False),
    ("aten::copy_", "copy", False),
    ("aten::add", "elementwise", False),
    ("aten::bmm", "gemm", False),
    ("aten::_softmax", "attention", False),
    ("aten::upsample_nearest3d", "elementwise", False),
    ("aten::conv_tbc", "convolution", False),
    ("void convertTensor_kernel<float>", "other", False),  # "convert" is not a convolution
]


@pytest.mark.parametrize(("name", "category", "tensor_core", "source"), SEEN, ids=[s[3] for s in SEEN])
def test_kernel_names_seen_in_public_profiles(name, category, tensor_core, source):
    assert categorise(name) == category
    assert uses_tensor_cores(name) is tensor_core


@pytest.mark.parametrize(("name", "category", "tensor_core"), BY_RULE, ids=[n[:40] for n, *_ in BY_RULE])
def test_kernel_names_by_the_libraries_naming_rules(name, category, tensor_core):
    assert categorise(name) == category
    assert uses_tensor_cores(name) is tensor_core


def test_summary_shares_add_up_and_tensor_core_share_counts_only_marked_kernels():
    kernels = [
        ("sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nhwc_tensor16x8x8", 600.0, 6),
        ("void cudnn::ops::nchwToNhwcKernel<float, float, float, false, true>", 100.0, 2),
        ("void at::native::(anonymous namespace)::RowwiseMomentsCUDAKernel<float>", 200.0, 4),
        (
            "void cudnn::ops::nchwToNhwcKernel<float, float, float, false, true>",
            100.0,
            2,
        ),  # merged with above
    ]
    summary = summarise(kernels, top=2)
    assert summary["total_us"] == 1000.0 and summary["kernels"] == 3
    assert set(summary["shares"]) == set(CATEGORIES)
    assert summary["shares"]["convolution"] == pytest.approx(0.6)
    assert summary["shares"]["layout"] == pytest.approx(0.2)
    assert summary["shares"]["normalisation"] == pytest.approx(0.2)
    assert sum(summary["shares"].values()) == pytest.approx(1.0)
    assert summary["tensor_core_share"] == pytest.approx(0.6)
    assert [r["category"] for r in summary["top"]] == ["convolution", "layout"]
    assert summary["top"][1]["calls"] == 4


def test_empty_profile_gives_zero_shares_not_a_division_error():
    summary = summarise([])
    assert summary["total_us"] == 0 and summary["tensor_core_share"] == 0.0
    assert all(share == 0.0 for share in summary["shares"].values())


@pytest.mark.slow
def test_a_real_cpu_profile_is_read_by_self_time_into_categories():
    import torch
    from torch.profiler import ProfilerActivity, profile

    conv = torch.nn.Conv3d(4, 8, 3, padding=1)
    norm = torch.nn.GroupNorm(2, 8)
    x = torch.randn(1, 4, 8, 8, 8)
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU]) as prof:
        norm(conv(x)).add_(1.0)
    rows = profile_kernels(prof, on_cuda=False)
    summary = summarise(rows)
    assert summary["shares"]["convolution"] > 0
    assert summary["shares"]["normalisation"] > 0
    assert summary["tensor_core_share"] == 0.0  # operators of a CPU: no name marks Tensor Cores
    # Self time: the nested aten::conv3d -> aten::convolution -> ... chain is counted once, so the total is
    # below the sum of the operators' inclusive times, which counts every nesting level again.
    inclusive = sum(e.cpu_time_total for e in prof.key_averages())
    assert 0 < summary["total_us"] < inclusive
