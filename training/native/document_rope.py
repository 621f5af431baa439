"""RoPE over packed documents (the THD layout) as one gather, for the native backend.

With documents kept apart (DOCUMENT_MASK=1) Megatron's attention calls
`apply_rotary_pos_emb(t, freqs, config, cu_seqlens=...)` on the packed query and key
([t, heads, d]). Without Transformer Engine's fused kernel (apply_rope_fusion: the native
backend has none), megatron-core 0.19.2 runs `_apply_rotary_pos_emb_thd`: it reads the
documents' lengths on the host (`.tolist()` and `.item()`: the host waits for the GPU), splits
the tensor per document and rotates each in its own dozen kernels, forward and backward; for the
query and the key of every layer: at seq 8192 with ~2k-token documents, hundreds of small
kernels and two host synchronisations per layer.

Here the same function is one pass: each token's position in its own document,
`position = index - cu_seqlens[document of index]` (computed on the device, once per
micro-batch and shared by every layer), picks its row of the rotary table (an index_select),
and Megatron's own bshd rotation (`_apply_rotary_pos_emb_bshd`) runs once over the whole
packed tensor. Equal to Megatron's THD path (tests/documents/test_document_rope.py); the cases
this does not cover (context parallelism, whole-row frequency tables, TE's fused kernel) go to
Megatron's function unchanged.
"""
from __future__ import annotations

import torch

# the positions of the last packed row seen: (cu_seqlens, its version, tokens) -> positions;
# the query and key of every layer of a micro-batch take the same cu_seqlens object
_LAST: dict[str, object] = {}


def positions_in_documents(cu_seqlens: torch.Tensor, total: int) -> torch.Tensor:
    """[total] int64: each token's index within its own document (no host synchronisation)."""
    from training.documents import document_ids

    key = (cu_seqlens, cu_seqlens._version, total)
    cached = _LAST.get("key")
    if cached is not None and cached[0] is key[0] and cached[1:] == key[1:]:
        return _LAST["positions"]
    doc = document_ids(cu_seqlens, total).long()
    starts = cu_seqlens.long().index_select(0, doc)
    positions = torch.arange(total, device=cu_seqlens.device) - starts
    _LAST.update(key=key, positions=positions)
    return positions


def rope_thd(t: torch.Tensor, cu_seqlens: torch.Tensor, freqs: torch.Tensor, *,
             rotary_interleaved: bool = False, mla_rotary_interleaved: bool = False,
             mscale: float = 1.0) -> torch.Tensor:
    """t [t, heads, d] rotated with each document's positions from 0; freqs [max_s, 1, 1, d]
    (Megatron's rotary table of the longest document)."""
    from megatron.core.models.common.embeddings.rope_utils import _apply_rotary_pos_emb_bshd

    positions = positions_in_documents(cu_seqlens.to(t.device), t.shape[0])
    rows = freqs.index_select(0, positions)                     # [t, 1, 1, d]
    return _apply_rotary_pos_emb_bshd(t.unsqueeze(1), rows, rotary_interleaved=rotary_interleaved,
                                      mla_rotary_interleaved=mla_rotary_interleaved,
                                      mscale=mscale).squeeze(1)


def _cp_size(cp_group) -> int:
    if cp_group is None:
        from megatron.core import parallel_state

        cp_group = parallel_state.get_context_parallel_group()
    return cp_group.size()


def document_rope_replacement(original, run):
    """The patch table's factory (training.megatron_patches, native_document_rope): Megatron's
    apply_rotary_pos_emb, its packed (cu_seqlens) unfused path replaced by rope_thd."""

    def apply_rotary_pos_emb(t, freqs, config, cu_seqlens=None, mscale=1.0, cp_group=None,
                             mla_rotary_interleaved=False):
        ours = (cu_seqlens is not None and not config.apply_rope_fusion
                # Megatron reads a table as long as the whole row as per-token positions
                and not (freqs.size(0) == t.shape[0] and cu_seqlens.numel() > 2)
                and _cp_size(cp_group) == 1)
        if not ours:
            return original(t, freqs, config, cu_seqlens=cu_seqlens, mscale=mscale,
                            cp_group=cp_group, mla_rotary_interleaved=mla_rotary_interleaved)
        if mla_rotary_interleaved is None:
            mla_rotary_interleaved = config.multi_latent_attention
        return rope_thd(t, cu_seqlens, freqs, rotary_interleaved=config.rotary_interleaved,
                        mla_rotary_interleaved=mla_rotary_interleaved, mscale=mscale)

    return apply_rotary_pos_emb
