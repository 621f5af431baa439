from __future__ import annotations

import re

import pytest

from training.profiling import kernel_groups as kg

# Names as they appear in H100/H200 torch profiler traces (and the CPU timeline's ops).
CASES = [
    ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTT", kg.GEMM),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas", kg.GEMM),
    ("void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cutlass::gemm::GemmShape<128, 256, 64>>>(Params)", kg.GEMM),
    ("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn", kg.GEMM),
    ("Cijk_Alik_Bljk_BBS_BH_MT256x256x64_MI32x32x8x1_SN_1LDSB1", kg.GEMM),
    ("aten::addmm", kg.GEMM),
    ("aten::mm", kg.GEMM),
    ("cudnn_generated_fortran_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128_4x1x1_kernel0_0", kg.ATTENTION),
    ("cudnn_generated_fortran_fprop_wgmma_f16_knob_7_128x128x64", kg.ATTENTION),
    ("flash_fwd_kernel", kg.ATTENTION),
    # seen in an H200 trace (torch 2.11 SDPA, cuDNN backend), see tests/data/profiling/
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64_4x1x1_cga1x1x1_kernel0_0", kg.ATTENTION),
    ("void cudnn::fusion::compute_dot_do_o_specialized<true, 64>(void const*, void const*, void*, void*)", kg.ATTENTION),
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_bias_TNT", kg.GEMM),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", kg.COMMUNICATION),
    ("void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernelTemplate<float, float, 32u, 32u, 256u, false, true, false>(long)", kg.NORM_ELEMENTWISE),
    ("void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<float, float, long>(float*)", kg.NORM_ELEMENTWISE),
    ("void at_cuda_detail::cub::detail::radix_sort::DeviceRadixSortOnesweepKernel<long>", kg.OTHER),
    ("void flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<128, 64, 128>>(Flash_bwd_params)", kg.ATTENTION),
    ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::bfloat16_t>::Params)", kg.ATTENTION),
    ("pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4>>", kg.ATTENTION),
    ("aten::_scaled_dot_product_flash_attention_for_cpu", kg.ATTENTION),
    ("scaled_upper_triang_masked_softmax_warp_forward", kg.ATTENTION),
    ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", kg.COMMUNICATION),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", kg.COMMUNICATION),
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", kg.COMMUNICATION),
    ("gloo:all_reduce", kg.COMMUNICATION),
    ("c10d::allreduce_", kg.COMMUNICATION),
    ("Memcpy DtoD (Device -> Device)", kg.MEMCPY),
    ("Memcpy HtoD (Pinned -> Device)", kg.MEMCPY),
    ("Memset (Device)", kg.MEMCPY),
    ("_rms_norm_forward_kernel", kg.NORM_ELEMENTWISE),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>", kg.NORM_ELEMENTWISE),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul>>", kg.NORM_ELEMENTWISE),
    ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda>", kg.NORM_ELEMENTWISE),
    ("triton_poi_fused_add_mul_0", kg.NORM_ELEMENTWISE),
    ("void multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float>>", kg.NORM_ELEMENTWISE),
    ("void transformer_engine::cast_transpose_kernel<8, true, float, __nv_bfloat16>", kg.NORM_ELEMENTWISE),
    ("aten::add_", kg.NORM_ELEMENTWISE),
    ("aten::native_layer_norm", kg.NORM_ELEMENTWISE),
    ("aten::gelu_backward", kg.NORM_ELEMENTWISE),
    ("aten::empty", kg.OTHER),
    ("some_custom_kernel", kg.OTHER),
]


@pytest.mark.parametrize("name,group", CASES)
def test_classify(name, group):
    assert kg.classify(name) == group


def test_every_group_is_exercised():
    assert {g for _, g in CASES} == set(kg.GROUPS)


def test_table_is_well_formed():
    for group, pattern, what in kg.GROUP_PATTERNS:
        assert group in kg.GROUPS and group != kg.OTHER
        re.compile(pattern)
        assert what


def test_order_matters_attention_before_gemm():
    # "fmha_cutlassF" carries the GEMM word "cutlass": the more specific attention group must win.
    assert re.search(r"cutlass", "fmha_cutlassF_bf16", re.I)
    assert kg.classify("fmha_cutlassF_bf16") == kg.ATTENTION
