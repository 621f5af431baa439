"""A random HF LlamaForCausalLM and our GPTModel with the same weights, and their comparison
(shared by the CPU and GPU parity tests). The weight mapping is training.hf_import's."""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F


def init_single_rank(device: str) -> None:
    """One-rank process group and Megatron model-parallel state (gloo, also on GPU)."""
    if not torch.distributed.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29600 + os.getpid() % 1000))
        torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel()
    if device == "cpu":
        # Megatron's RotaryEmbedding moves its buffer to torch.cuda.current_device().
        torch.cuda.current_device = lambda: "cpu"
    else:
        # Megatron's attention dropout forks the model-parallel CUDA RNG, even at p=0.
        from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

        model_parallel_cuda_manual_seed(1234)


def hf_config(preset, num_layers: int):
    from transformers import LlamaConfig

    config = LlamaConfig(
        vocab_size=preset.vocab_size, hidden_size=preset.hidden_size,
        intermediate_size=preset.ffn_hidden_size, num_hidden_layers=num_layers,
        num_attention_heads=preset.num_attention_heads,
        num_key_value_heads=preset.num_query_groups,
        max_position_embeddings=preset.max_position_embeddings,
        rope_theta=float(preset.rotary_base), rms_norm_eps=preset.norm_epsilon,
        tie_word_embeddings=False, attention_bias=False, mlp_bias=False)
    config._attn_implementation = "sdpa"
    return config


def native_run(kernels: str, fused_qkv_rope: bool = True, gradient_accumulation_fusion=False):
    """A training.run.Run carrying the native backend's arguments (no torchrun, no parser)."""
    from argparse import Namespace

    from training.run import Run

    return Run(args=Namespace(transformer_backend="native", native_kernels=kernels,
                              fused_single_qkv_rope=fused_qkv_rope,
                              gradient_accumulation_fusion=gradient_accumulation_fusion))


def build_pair(preset, num_layers: int, backend: str, kernels: str, device: str,
               dtype: torch.dtype, fused_qkv_rope: bool = True):
    """A random HF Llama and our GPTModel holding the same weights."""
    from megatron.core.transformer import TransformerConfig
    from transformers import LlamaForCausalLM

    from training import specs
    from training.hf_import import copy_hf_llama_weights

    init_single_rank(device)
    torch.manual_seed(0)
    hf_model = LlamaForCausalLM(hf_config(preset, num_layers)).to(device=device)
    # Cast the weights, not the RoPE frequencies: `.to(bfloat16)` would also round HF's
    # inv_freq buffer to bf16, and at theta 500000 that moves the reference, not us.
    inv_freq = {name: buf.clone() for name, buf in hf_model.named_buffers() if "inv_freq" in name}
    hf_model = hf_model.to(dtype=dtype)
    for name, buf in inv_freq.items():
        module = hf_model.get_submodule(name.rsplit(".", 1)[0])
        setattr(module, name.rsplit(".", 1)[1], buf)
    hf_model.eval()
    config = TransformerConfig(
        num_layers=num_layers, hidden_size=preset.hidden_size,
        ffn_hidden_size=preset.ffn_hidden_size, num_attention_heads=preset.num_attention_heads,
        num_query_groups=preset.num_query_groups, normalization="RMSNorm",
        layernorm_epsilon=preset.norm_epsilon, gated_linear_unit=True, activation_func=F.silu,
        add_bias_linear=False, hidden_dropout=0.0, attention_dropout=0.0,
        bias_activation_fusion=False, apply_rope_fusion=False, persist_layer_norm=False,
        fused_single_qkv_rope=fused_qkv_rope and backend == "native",
        use_cpu_initialization=True, params_dtype=dtype, bf16=dtype == torch.bfloat16,
        gradient_accumulation_fusion=False)
    if backend == "native":
        specs.install_native(native_run(kernels, fused_qkv_rope))
    from megatron.core.models.gpt import GPTModel

    gpt = GPTModel(config=config,
                   transformer_layer_spec=specs.decoder_spec(backend, config, kernels=kernels),
                   vocab_size=preset.vocab_size, max_sequence_length=preset.max_position_embeddings,
                   position_embedding_type="rope", rotary_base=preset.rotary_base,
                   share_embeddings_and_output_weights=False).to(device=device, dtype=dtype)
    gpt.eval()
    copy_hf_llama_weights(hf_model, gpt, preset.num_attention_heads, preset.num_query_groups)
    return hf_model, gpt


@torch.no_grad()
def compare(hf_model, gpt, vocab: int, batch: int, seq: int, device: str) -> dict:
    tokens = torch.randint(0, vocab, (batch, seq), device=device)
    positions = torch.arange(seq, device=device).unsqueeze(0).expand(batch, seq)
    theirs = hf_model(input_ids=tokens).logits.float()
    ours = gpt(tokens, positions, None).float()
    labels = tokens[:, 1:].reshape(-1)
    loss_theirs = F.cross_entropy(theirs[:, :-1].reshape(-1, vocab), labels).item()
    loss_ours = F.cross_entropy(ours[:, :-1].reshape(-1, vocab), labels).item()
    diff = (ours - theirs).abs()
    return {"max_abs_err": diff.max().item(), "mean_abs_err": diff.mean().item(),
            "logit_scale": theirs.abs().mean().item(), "loss_hf": loss_theirs,
            "loss_ours": loss_ours, "loss_rel_err": abs(loss_ours - loss_theirs) / loss_theirs}
