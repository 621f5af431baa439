"""Documents kept apart in a packed batch: where each document starts, as cu_seqlens.

Megatron's GPTDataset packs documents end to end into each sample; a document ends at its
end-of-document token (the EOD belongs to the document it ends, as Megatron's own
`_get_ltor_masks_and_position_ids` counts it: the next document starts right after it). With
document masking (DOCUMENT_MASK=1, Megatron's --reset-attention-mask) every backend runs
attention block-causal over these documents, never over a dense [s, s] mask:

  pack_batch(batch, eod)   the micro-batch [b, s] laid out as one packed row [1, b * s]
                           (Megatron's THD layout) and its PackedSeqParams: cu_seqlens
                           [0, end_1, ..., b * s] (int32) where every sample's end is also a
                           document's end, and max_seqlen the longest document

Megatron's attention then runs the packed (THD) path on every backend: Transformer Engine's
fused attention takes the cu_seqlens (padding_causal), the native backend's core attention
(training.native.document_attention) a block-causal mask built from them, and Megatron's RoPE
restarts its positions at each document (rope_utils' THD path: each document's rows rotated
from position 0). Under RoPE the attention of a document to itself depends on positions only
through their differences, so the restart computes exactly what a document alone computes.
"""
from __future__ import annotations

import torch

BATCH_KEYS = ("tokens", "labels", "loss_mask", "position_ids")


def document_ends(tokens: torch.Tensor, eod: int) -> torch.Tensor:
    """[b, s] tokens -> the flat end offsets (exclusive) of every document of the packed row
    [1, b * s], in order, ending with b * s: after each EOD token, and at each sample's end."""
    b, s = tokens.shape
    flat = tokens.reshape(-1)
    after_eod = torch.nonzero(flat == eod, as_tuple=False).view(-1) + 1
    sample_ends = torch.arange(1, b + 1, device=tokens.device) * s
    ends = torch.cat([after_eod, sample_ends])
    return torch.unique(ends)          # sorted; an EOD at a sample's end counted once


def cu_seqlens_of(tokens: torch.Tensor, eod: int) -> tuple[torch.Tensor, int]:
    """(cu_seqlens int32 [0, ...ends], the longest document's length)."""
    ends = document_ends(tokens, eod)
    cu = torch.cat([ends.new_zeros(1), ends]).to(torch.int32)
    longest = int((cu[1:] - cu[:-1]).max().item())
    return cu, longest


def packed_seq_params(tokens: torch.Tensor, eod: int):
    """Megatron's PackedSeqParams (THD) for the packed row of `tokens`."""
    from megatron.core.packed_seq_params import PackedSeqParams

    cu, longest = cu_seqlens_of(tokens, eod)
    return PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu,
                           max_seqlen_q=longest, max_seqlen_kv=longest)


def pack_batch(batch: dict, eod: int) -> tuple[dict, object]:
    """The batch as one packed row (tokens, labels, loss mask, positions: [1, b * s]; the
    attention mask dropped: the cu_seqlens say it) and its PackedSeqParams."""
    params = packed_seq_params(batch["tokens"], eod)
    packed = dict(batch)
    for key in BATCH_KEYS:
        if packed.get(key) is not None:
            packed[key] = packed[key].reshape(1, -1)
    packed["attention_mask"] = None
    return packed, params


def params_to(params, device):
    """The PackedSeqParams with its cu_seqlens (one tensor for q and kv) on `device`. Built on
    the host from the loader's tokens, copied from pinned memory without waiting: the step
    never reads the GPU for the documents (building them from the tokens on the GPU would:
    nonzero, unique and the longest length each wait for the queued work)."""
    device = torch.device(device)
    cu = params.cu_seqlens_q
    if cu.device != device:
        if device.type == "cuda":
            cu = cu.pin_memory()
        cu = cu.to(device, non_blocking=True)
    params.cu_seqlens_q = params.cu_seqlens_kv = cu
    return params


def document_ids(cu_seqlens: torch.Tensor, total: int) -> torch.Tensor:
    """[total] the document index of each token of the packed row (int32)."""
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    return torch.repeat_interleave(torch.arange(lengths.numel(), device=cu_seqlens.device,
                                                dtype=torch.int32), lengths, output_size=total)


def lengths_of(cu_seqlens: torch.Tensor) -> list[int]:
    """The documents' lengths on the host (one synchronisation)."""
    return (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
