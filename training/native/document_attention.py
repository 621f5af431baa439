"""Block-causal attention over packed documents, for the native backend (no dense [s, s] mask).

With document masking (DOCUMENT_MASK=1) Megatron's attention hands its core attention the
packed (THD) layout: q [t, heads, d], k and v [t, groups, d] for the t = b * s tokens of the
micro-batch laid end to end, and PackedSeqParams whose cu_seqlens say where each document
starts (training/documents.py). A query sees the keys of its own document at or before it
(and, in a windowed gpt-oss layer, only the last W of them; with sinks, the sink column joins
each query's softmax). Three implementations of that one function (IMPLS):

  flex    torch's flex attention with a block mask whose mask_mod is causal AND same document
          (AND within the window): blocks wholly across documents are skipped, so short
          documents cost less than one causal sequence; the sinks are flex's output corrected
          by its log-sum-exp (training/native/flex_attention.apply_sinks). Compiled on the GPU;
          the block mask is built once per micro-batch and window and shared by the layers.
  varlen  torch's variable-length flash attention (torch.nn.attention.varlen.varlen_attn) on
          the cu_seqlens, causal or windowed (the GPU; no sinks).
  loop    one attention per document (SDPA causal, or the fp32 sink reference with sinks or a
          window): exact, the CPU's path (torch 2.11's flex has no CPU backward) and the
          tests' reference.

`auto` (training.native.IMPLEMENTATION["document_attention"]): flex on the GPU, loop on the
CPU; the GPU benchmark part `documents` measures flex against varlen, so the choice is one
line there.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

IMPLS = ("auto", "flex", "varlen", "loop")


def resolve_impl(impl: str, device: torch.device, sinks: bool) -> str:
    if impl not in IMPLS:
        raise ValueError(f"unknown document-attention implementation {impl!r}: use {IMPLS}")
    if impl == "auto":
        return "flex" if device.type == "cuda" else "loop"
    if impl == "varlen" and sinks:
        raise ValueError("document attention 'varlen' has no sinks: use flex or loop")
    return impl


def document_attention(q, k, v, packed_seq_params, *, scale: float | None = None,
                       window: int | None = None, sinks: torch.Tensor | None = None,
                       impl: str = "auto") -> torch.Tensor:
    """q [t, heads, d], k and v [t, groups, d] -> [t, heads, d], each query attending to the
    keys of its own document at or before it (the last `window` of them where given)."""
    if packed_seq_params.qkv_format != "thd":
        raise ValueError(f"document attention takes the packed (thd) layout, got "
                         f"qkv_format={packed_seq_params.qkv_format!r}")
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    cu = packed_seq_params.cu_seqlens_q
    if packed_seq_params.cu_seqlens_kv is not None and packed_seq_params.cu_seqlens_kv is not cu \
            and not torch.equal(packed_seq_params.cu_seqlens_kv, cu):
        raise ValueError("document attention is self-attention: cu_seqlens_q != cu_seqlens_kv")
    impl = resolve_impl(impl, q.device, sinks is not None)
    if impl == "loop":
        return _loop(q, k, v, cu, scale, window, sinks)
    if impl == "varlen":
        return _varlen(q, k, v, cu, packed_seq_params.max_seqlen_q, scale, window)
    return _flex(q, k, v, packed_seq_params, scale, window, sinks)


def _loop(q, k, v, cu, scale, window, sinks):
    from training.documents import lengths_of
    from training.native.flex_attention import sink_attention_reference

    outs = []
    gqa = k.shape[1] != q.shape[1]
    for qd, kd, vd in zip(*(torch.split(t, lengths_of(cu)) for t in (q, k, v))):
        qd, kd, vd = (t.transpose(0, 1).unsqueeze(0) for t in (qd, kd, vd))   # [1, h, n, d]
        if sinks is None and window is None:
            out = F.scaled_dot_product_attention(qd, kd, vd, is_causal=True, scale=scale,
                                                 enable_gqa=gqa)
        else:
            out = sink_attention_reference(qd, kd, vd, sinks, window, scale)
        outs.append(out.squeeze(0).transpose(0, 1))
    return torch.cat(outs)


def _varlen(q, k, v, cu, max_seqlen, scale, window):
    from torch.nn.attention.varlen import varlen_attn

    if k.shape[1] != q.shape[1]:
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    left = -1 if window is None else window - 1
    return varlen_attn(q, k, v, cu, cu, max_seqlen, max_seqlen, scale=scale,
                       window_size=(left, 0))


# One document-id buffer per packed length and device, refilled for each micro-batch, and one
# mask_mod per window reading it: the compiled flex kernel and create_block_mask see the same
# function and tensor objects every micro-batch (BlockMask compares mask_mods by code and closure
# contents), so they compile once instead of once per batch. The buffer holds the micro-batch
# whose attention ran last (refilled when another micro-batch's runs, e.g. a recomputed
# forward): right while each backward follows its own forward (no pipeline parallelism: the
# guard document_mask refuses PP > 1 on the native backend).
_DOC_BUFFERS: dict[tuple[int, str], torch.Tensor] = {}
_MASK_MODS: dict[tuple[int, str, int | None], object] = {}
_DOC_OWNERS: dict[tuple[int, str], object] = {}   # whose documents each buffer holds


def _mask_mod(doc: torch.Tensor, total: int, window: int | None):
    key = (total, str(doc.device), window)
    if key not in _MASK_MODS:
        if window is None:
            def mask(b, h, q_idx, kv_idx):
                return (q_idx >= kv_idx) & (doc[q_idx] == doc[kv_idx])
        else:
            def mask(b, h, q_idx, kv_idx):
                return (q_idx >= kv_idx) & (doc[q_idx] == doc[kv_idx]) & \
                    (q_idx - kv_idx < window)
        _MASK_MODS[key] = mask
    return _MASK_MODS[key]


def block_mask_for(packed_seq_params, total: int, window: int | None, device):
    """Flex's block mask of causal-within-document (and the window), built once per micro-batch
    and window: kept on the PackedSeqParams object every layer of the step receives."""
    from torch.nn.attention.flex_attention import create_block_mask

    from training.documents import document_ids

    cache = packed_seq_params.__dict__.setdefault("_block_masks", {})
    key = (total, str(device))
    if _DOC_OWNERS.get(key) is not packed_seq_params:   # this micro-batch's documents
        if key not in _DOC_BUFFERS:
            _DOC_BUFFERS[key] = torch.empty(total, dtype=torch.int32, device=device)
        _DOC_BUFFERS[key].copy_(document_ids(packed_seq_params.cu_seqlens_q.to(device), total))
        _DOC_OWNERS[key] = packed_seq_params
    if window not in cache:
        mask = _mask_mod(_DOC_BUFFERS[(total, str(device))], total, window)
        cache[window] = create_block_mask(mask, None, None, total, total, device=str(device),
                                          _compile=device.type == "cuda")
    return cache[window]


def _flex(q, k, v, packed_seq_params, scale, window, sinks):
    from training.native.flex_attention import flex_with_sinks

    mask = block_mask_for(packed_seq_params, q.shape[0], window, q.device)
    qb, kb, vb = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))   # [1, h, t, d]
    return flex_with_sinks(qb, kb, vb, mask, sinks, scale).squeeze(0).transpose(0, 1)
