"""Layer specs for the three backends, and the native kernels' installation.

  transformer_engine  Megatron's TE spec (fused LayerNorm-linear, TE attention, fp8/fp4)
  local               Megatron's local spec, unchanged (torch norms, unfused attention)
  native              the local spec's linears and MLP, with SDPA core attention and the
                      native RMSNorm; plus, put into Megatron by install_native() through
                      the patch table (training.megatron_patches, which states what the
                      native backend uses where TE or apex is importable): fused QKV RoPE,
                      a one-pass SwiGLU, gradient-accumulation fusion, a fused AdamW and
                      foreach clipping ops, the MoE dispatchers' atomic-free permute; and
                      the fused linear cross-entropy as the model's output processor
                      (pretrain_gpt); in MoE layers, the experts as grouped GEMMs on torch's
                      grouped_mm (native/grouped_experts.py)
Nothing here re-decides a setting: the launcher resolved backend, kernels and toggles, and
this module builds exactly that, or fails loudly. NativeSetup names what is in place (the
objects in Megatron's modules and the spec's classes), not the flags that asked for them.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
from dataclasses import dataclass, field


@dataclass
class NativeSetup:
    """What install_native() put in place (printed at startup, stored in the manifest)."""

    kernels: str
    parts: dict[str, str] = field(default_factory=dict)


NORM_KERNEL = {"liger": "Triton, Liger-Kernel's kernel",
               "torch_fused": "torch's fused rms_norm kernel, fp32 statistics",
               "torch": "torch ops, fp32 statistics"}


def norm_class(kernels: str):
    """The native backend's RMSNorm class for NATIVE_KERNELS (torch or liger; for liger, ours
    on Liger's Triton kernel, Liger-Kernel's Megatron module or torch's fused kernel, as
    training.native.IMPLEMENTATION says)."""
    from training.native import IMPLEMENTATION
    from training.native import norm

    if kernels == "torch":
        return norm.NativeRMSNorm
    if kernels != "liger":
        raise ValueError(f"unknown kernels {kernels!r}")
    if IMPLEMENTATION["rmsnorm"] == "torch_fused":
        return norm.FusedTorchRMSNorm
    from liger_kernel.transformers.functional import liger_rms_norm  # noqa: F401 - installed?

    if IMPLEMENTATION["rmsnorm"] == "liger_megatron":
        return norm.liger_megatron_rms_norm()
    return norm.LigerRMSNorm


def _with_native_experts(spec, config):
    """The spec with its MoE layer's experts on the native grouped experts (TEGroupedMLP on
    torch's grouped GEMM, native/grouped_experts.py; with biases where the config's linears
    have them: gpt-oss)."""
    from training.native.grouped_experts import grouped_experts_builder

    spec = copy.deepcopy(spec)
    sub = spec.submodules
    moe_layer = sub.mlp  # partial(MoELayer, submodules=MoESubmodules(...))
    sub.mlp = functools.partial(moe_layer.func, *moe_layer.args, **{
        **moe_layer.keywords, "submodules": dataclasses.replace(
            moe_layer.keywords["submodules"],
            experts=grouped_experts_builder(bias=config.add_bias_linear))})
    return spec


def layer_spec(backend: str, config, kernels: str = "torch", experts: str = "native"):
    """`experts` (MOE_EXPERT_IMPL, resolved): on the TE backend, native puts the native grouped
    experts beside TE's attention and dense linears; te keeps Megatron's TEGroupedMLP."""
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_layer_local_spec, get_gpt_layer_with_transformer_engine_spec)

    # MoE (config.num_moe_experts set): Megatron's MoE layer in the MLP slot; its experts are
    # TEGroupedMLP (TE) or SequentialMLP (local) as Megatron builds them, and with grouped GEMM
    # on the native backend (or TE's with experts=native) TEGroupedMLP on torch's grouped GEMM.
    moe = {"num_experts": config.num_moe_experts,
           "moe_grouped_gemm": bool(config.num_moe_experts and config.moe_grouped_gemm)}
    if backend == "transformer_engine":
        spec = get_gpt_layer_with_transformer_engine_spec(
            qk_layernorm=config.qk_layernorm, fp8=None, **moe)
        return _with_native_experts(spec, config) if moe["moe_grouped_gemm"] and \
            experts == "native" \
            else spec
    spec = get_gpt_layer_local_spec(normalization=config.normalization,
                                    qk_layernorm=config.qk_layernorm, **moe)
    if backend == "local":
        return spec
    if backend != "native":
        raise ValueError(f"unknown backend {backend!r}")
    from training.native.flex_attention import core_attention_for

    spec = copy.deepcopy(spec)
    sub = spec.submodules
    sub.input_layernorm = norm_class(kernels)
    sub.pre_mlp_layernorm = norm_class(kernels)
    # SDPA; flex attention where the config has sinks or a sliding window (gpt-oss)
    sub.self_attention.submodules.core_attention = core_attention_for(config)
    if config.qk_layernorm:  # Qwen3: RMSNorm over each head's query and key
        sub.self_attention.submodules.q_layernorm = norm_class(kernels)
        sub.self_attention.submodules.k_layernorm = norm_class(kernels)
    return _with_native_experts(spec, config) if moe["moe_grouped_gemm"] else spec


def install_native(run) -> NativeSetup:
    """Put the native backend's kernels into Megatron (before the model and optimizer are
    built) through the patch table, and name what is in place. `run`: training.run.Run (its
    args: native_kernels, gradient_accumulation_fusion, fused_single_qkv_rope)."""
    from training import megatron_patches
    from training.megatron_patches import describe, in_place
    from training.native.attention import SDPAttention

    args = run.args
    megatron_patches.apply(run, groups=("native",))
    setup = NativeSetup(kernels=args.native_kernels)
    norm = norm_class(args.native_kernels)
    kernel = NORM_KERNEL[getattr(norm, "kernels", "liger")]   # Liger's Megatron module: liger
    setup.parts["rmsnorm"] = f"{describe(norm)} ({kernel})"
    setup.parts["attention"] = f"{describe(SDPAttention)} (torch SDPA, cuDNN > flash > " \
                               "memory-efficient)"
    if getattr(args, "softmax_type", "vanilla") != "vanilla" or getattr(args, "window_size",
                                                                       None):
        from training.native.flex_attention import FlexSinkAttention

        setup.parts["attention"] = f"{describe(FlexSinkAttention)} (torch flex attention: " \
                                   "sinks and the sliding window; gpt-oss)"
    if getattr(args, "reset_attention_mask", False):
        from training.native import IMPLEMENTATION

        setup.parts["attention"] += (
            "; documents kept apart (DOCUMENT_MASK=1): block-causal over the packed (THD) "
            f"documents, training.native.document_attention "
            f"({IMPLEMENTATION['document_attention']}: flex on the GPU, the loop on the CPU); "
            f"RoPE from each document's start: {in_place('native_document_rope')}")
    setup.parts["qkv_rope"] = (in_place("native_qkv_rope") if args.fused_single_qkv_rope
                               else "Megatron's unfused RoPE (--no-fused-single-qkv-rope)")
    setup.parts["swiglu"] = in_place("native_swiglu")
    setup.parts["optimizer"] = in_place("native_adam")
    setup.parts["multi_tensor"] = (f"l2 norm: {in_place('native_l2_norm')}; scale: "
                                   f"{in_place('native_clip_scale')}")
    setup.parts["wgrad"] = (in_place("native_wgrad") if args.gradient_accumulation_fusion
                            else "autograd weight gradient, added to main_grad by DDP hooks")
    setup.parts.update(moe_parts(args))
    return setup


def moe_parts(args) -> dict[str, str]:
    """What runs in the MoE layers (none for a dense model): experts, permute, token counts."""
    from training.megatron_patches import in_place

    if not getattr(args, "num_experts", None):
        return {}
    if not args.moe_grouped_gemm:
        return {"experts": "Megatron's SequentialMLP: one GEMM pair per expert, in turn"}
    if getattr(args, "moe_expert_impl", "native") != "native":
        return {"experts": "Megatron's TEGroupedMLP on Transformer Engine's grouped linear",
                "moe_permute": ("Transformer Engine's fused permute"
                                if getattr(args, "moe_permute_fusion", False)
                                else "Megatron's torch permute")}
    from training.native.grouped_experts import WGRAD_FUSION, describe as describe_experts

    bf16 = (" (bf16: the precision recipe covers TE's layers)"
            if getattr(args, "fp8", None) or getattr(args, "fp4", None) else "")
    # the run's choice, read by GroupedLinear in the backward (set before the model is built)
    WGRAD_FUSION["on"] = bool(getattr(args, "moe_wgrad_fusion", False)
                              and getattr(args, "gradient_accumulation_fusion", False))
    wgrad = ("; weight gradients added into main_grad by a Triton kernel "
             "(training.native.grouped_wgrad)" if WGRAD_FUSION["on"] else "")
    return {"experts": describe_experts() + bf16 + wgrad,
            "moe_permute": (f"permute: {in_place('native_moe_permute')}; unpermute: "
                            f"{in_place('native_moe_unpermute')}"),
            "moe_token_counts": (
                in_place("native_moe_device_counts") if getattr(args, "moe_device_counts", False)
                else "copied to the host, synchronised once per MoE layer (Megatron's "
                     "dispatcher)")}


def install_transformer_engine(run) -> NativeSetup:
    """What the TE spec takes from us before the model is built, and what is in place. Its
    linears accumulate their weight gradients with TE's own kernel; the output layer is
    Megatron's own ColumnParallelLinear, which with gradient-accumulation fusion calls apex's
    fused_weight_gradient_mlp_cuda even under the TE spec (and fails where apex is absent):
    there the patch table gives it the native cuBLAS accumulate (native_wgrad; the guard
    grad_accum_fusion_kernel chose the same). The optimizer is what Megatron built (TE's
    FusedAdam)."""
    from training import megatron_patches
    from training.megatron_patches import in_place

    args = run.args
    megatron_patches.apply(run, groups=("native",))   # under TE only the wgrad entries hold
    setup = NativeSetup(kernels="transformer_engine")
    if args.gradient_accumulation_fusion:
        setup.parts["wgrad_te_linears"] = "Transformer Engine (fuse_wgrad_accumulation)"
        setup.parts["wgrad_megatron_linears"] = in_place("native_wgrad")
    else:
        setup.parts["wgrad"] = "autograd weight gradient, added to main_grad by DDP hooks"
    setup.parts["optimizer"] = in_place("native_adam")
    setup.parts.update(moe_parts(args))
    return setup


def decoder_spec(backend: str, config, vp_stage=None, kernels: str = "torch",
                 experts: str = "native"):
    """What GPTModel takes as transformer_layer_spec: a layer spec, or for the native backend
    the block's submodules, so the final norm is the native RMSNorm too (Megatron's default
    torch-norm wrapper refuses sequence parallel)."""
    layer = layer_spec(backend, config, kernels, experts)
    if backend != "native":
        return layer
    from megatron.core.transformer.transformer_block import (TransformerBlockSubmodules,
                                                             get_num_layers_to_build)

    return TransformerBlockSubmodules(
        layer_specs=[layer] * get_num_layers_to_build(config, vp_stage=vp_stage),
        layer_norm=norm_class(kernels))
