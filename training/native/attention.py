"""Core attention through torch's scaled_dot_product_attention.

Fills Megatron's `core_attention` slot (the part between the QKV projection and the output
projection). Inputs are Megatron's [s, b, heads, head_dim]; GQA runs natively (enable_gqa),
causal masking by the kernel (no mask tensor). With document masking (DOCUMENT_MASK=1) Megatron
hands it the packed (THD) layout and the documents' cu_seqlens (PackedSeqParams): then the
block-causal attention of training/native/document_attention.py runs (IMPLEMENTATION
["document_attention"]); any other mask or bias is refused, never ignored. Backend priority: cuDNN first (on an H200 at
seq 8192, GQA 32/8, it ran ~530 TFLOP/s fwd+bwd against ~280 for flash with repeated KV),
then flash, then memory-efficient; `describe_backend()` reports which one runs.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

PRIORITY = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION,
            SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


class SDPAttention(torch.nn.Module):
    """Megatron core-attention signature; causal self-attention only."""

    def __init__(self, config, layer_number: int, attn_mask_type, attention_type: str,
                 attention_dropout: float | None = None, softmax_scale: float | None = None,
                 cp_comm_type: str | None = None, pg_collection=None):
        super().__init__()
        from megatron.core.transformer.enums import AttnMaskType

        name = type(self).__name__    # and its subclass, the flex attention for gpt-oss
        if config.context_parallel_size != 1:
            raise ValueError(f"{name} does not implement context parallelism (use TE)")
        if attn_mask_type != AttnMaskType.causal or attention_type != "self":
            raise ValueError(f"{name} implements causal self-attention only, got "
                             f"{attn_mask_type} / {attention_type}")
        self.dropout = config.attention_dropout if attention_dropout is None else attention_dropout
        self.softmax_scale = softmax_scale

    def forward(self, query, key, value, attention_mask=None, attn_mask_type=None,
                attention_bias=None, packed_seq_params=None):
        check_inputs(type(self).__name__, attention_mask, attention_bias)
        if packed_seq_params is not None:
            return self.documents(query, key, value, packed_seq_params)
        # [s, b, h, d] -> [b, h, s, d] (views; the kernels take strided inputs)
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        with sdpa_kernel(PRIORITY, set_priority=True):
            out = F.scaled_dot_product_attention(
                q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0,
                scale=self.softmax_scale, enable_gqa=k.shape[1] != q.shape[1])
        s, b = query.shape[0], query.shape[1]
        return out.permute(2, 0, 1, 3).reshape(s, b, -1)

    def documents(self, query, key, value, packed_seq_params, window=None, sinks=None):
        """The packed (THD) layout [t, heads, d]: block-causal over the documents."""
        from training.native import IMPLEMENTATION
        from training.native.document_attention import document_attention

        if self.dropout and self.training:
            raise ValueError(f"{type(self).__name__}: attention dropout with document masking "
                             "is not implemented by the native backend (set the attention "
                             "dropout to 0)")
        out = document_attention(query, key, value, packed_seq_params, scale=self.softmax_scale,
                                 window=window, sinks=sinks,
                                 impl=IMPLEMENTATION["document_attention"])
        return out.reshape(out.shape[0], -1)


def check_inputs(name: str, attention_mask, attention_bias) -> None:
    """A dense mask or a bias would be computed as plain causal attention: refused. The
    launcher passes --no-create-attention-mask-in-dataloader (no mask is built); documents
    come as PackedSeqParams."""
    if attention_bias is not None:
        raise ValueError(f"{name}: attention bias is not supported")
    if attention_mask is not None:
        raise ValueError(f"{name}: a dense attention mask is not applied by the native backend: "
                         "keep documents apart with DOCUMENT_MASK=1 (the packed, THD, path) and "
                         "--no-create-attention-mask-in-dataloader")


def describe_backend(device: torch.device, heads: int, groups: int, head_dim: int,
                     seq: int = 256) -> str:
    """Which SDPA backend runs for this shape here (probed with a tiny causal call)."""
    if device.type != "cuda":
        return "math (CPU)"
    q = torch.randn(1, heads, seq, head_dim, device=device, dtype=torch.bfloat16)
    k = torch.randn(1, groups, seq, head_dim, device=device, dtype=torch.bfloat16)
    for backend in PRIORITY:
        try:
            with sdpa_kernel([backend]):
                F.scaled_dot_product_attention(q, k, k, is_causal=True,
                                               enable_gqa=groups != heads)
            return backend.name.lower()
        except RuntimeError:
            continue
    return "none"
