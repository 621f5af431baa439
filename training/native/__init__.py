"""The native backend: fast paths for nodes without Transformer Engine.

  attention.py      core attention through torch's scaled_dot_product_attention (cuDNN first)
  document_attention.py  block-causal attention over packed documents (DOCUMENT_MASK=1):
                    flex with a document block mask, torch's varlen flash, or a loop
  norm.py           RMSNorm: Liger-Kernel's Triton kernel, or torch's rms_norm
  rope.py           fused RoPE on the packed QKV projection (Triton), or torch
  cross_entropy.py  fused linear cross-entropy (Liger's, or a chunked torch version):
                    the logits are never materialised
  wgrad.py          gradient-accumulation fusion: the weight-gradient GEMM accumulates
                    straight into main_grad (cuBLAS GEMM with beta=1)
  optimizer.py      torch's fused AdamW where Megatron would fall back to the foreach one
  multi_tensor.py   gradient clipping's l2 norm and scale as torch foreach ops (no per-
                    parameter host sync, no temporary copy of each gradient)
  grouped_experts.py  MoE: the experts of a layer as grouped GEMMs (torch's grouped_mm) in
                    Megatron's TEGroupedMLP, no TE; a loop over the experts off the fast path
  moe_permute.py    MoE: the token dispatchers' permute/unpermute as gathers (no atomic
                    scatter-add; one Triton gather-sum pass, or torch ops)

Each module offers the Liger/Triton kernel and a plain torch implementation of the same
function; which one runs is decided once by the launcher (NATIVE_KERNELS) and shown in the
startup table. Tests compare the two. What goes into Megatron goes through the patch table
(training.megatron_patches); the manifest's "native" section names what is in place.

Two ops have a second Triton implementation with NATIVE_KERNELS=liger: Liger-Kernel's own
Megatron integration (liger_kernel.megatron: LigerMegatronRMSNorm, LigerMegatronSwiGLU over
its fused gate-up kernel). IMPLEMENTATION picks, per op, "ours" (norm.LigerRMSNorm,
swiglu.bias_swiglu) or "liger_megatron"; the RMSNorm also "torch_fused" (norm.FusedTorchRMSNorm:
torch's own fused rms_norm kernel). Switching is one line here, decided from the timing of
both (dev/gpu/liger_megatron.sh -> docs/benchmarks/kernels-liger-megatron_*.json). The H200
timing (kernels-liger-megatron_h200.json) has Liger's ahead by 13-19% per op but within the op
timer's noise, so SwiGLU stays ours. The RMSNorm is torch's fused kernel: at the MoE bench
shape (session 8, dev/gpu/norm_host_timing.py, dev/gpu_logs/2026-12-01_s8_*) its forward plus
backward costs the host 143-188 us against 500-621 us for the Liger Triton launch, on a
launch-bound MoE step (four norms per layer with the q/k norms), at about the same device time
(69 against 79 us at width 2048; 236 against 167 us over the 128-wide query heads).
"""

# document_attention (DOCUMENT_MASK=1): auto = flex on the GPU, the per-document loop on the
# CPU; flex | varlen | loop force one (training/native/document_attention.py; bench part
# `documents` measures flex against varlen)
IMPLEMENTATION = {"rmsnorm": "torch_fused", "swiglu": "ours", "document_attention": "auto"}
