"""training/documents.py against Megatron's own definition of documents: the dense mask and
the reset positions its GPTDataset builds with --reset-attention-mask --reset-position-ids
(megatron.core.datasets.gpt_dataset._get_ltor_masks_and_position_ids, which the launcher never
asks for: --no-create-attention-mask-in-dataloader). Our cu_seqlens give exactly that mask as
block-causal documents, and start a document wherever Megatron's positions restart; the packed
batch is the THD layout Megatron's attention and Transformer Engine take (int32 cu_seqlens
from 0 to b * s, no padding, max_seqlen the longest document)."""
from __future__ import annotations

import pytest
import torch

from training.documents import document_ids, pack_batch, packed_seq_params, params_to

EOD = 0
ROWS = {
    "documents": [5, 3, 0, 7, 7, 0, 2, 9, 0, 4, 4, 4],
    "eod_first": [0, 3, 4, 0, 6, 6, 6, 6, 6, 6, 1, 2],
    "eod_last": [3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4, 0],
    "eods_together": [3, 0, 0, 0, 5, 6, 0, 1, 0, 0, 2, 0],
    "no_eod": [3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4, 5],
}


def megatrons(row: list[int]):
    from megatron.core.datasets.gpt_dataset import _get_ltor_masks_and_position_ids

    mask, _loss, positions = _get_ltor_masks_and_position_ids(
        torch.tensor(row), EOD, reset_position_ids=True, reset_attention_mask=True,
        eod_mask_loss=False, create_attention_mask=True)
    return ~mask[0], positions          # Megatron's mask is True where attention is cut


@pytest.mark.parametrize("name", list(ROWS))
def test_our_documents_are_megatrons_mask_and_positions(name):
    row = ROWS[name]
    allowed, positions = megatrons(row)
    params = packed_seq_params(torch.tensor([row]), EOD)
    doc = document_ids(params.cu_seqlens_q, len(row))
    i = torch.arange(len(row))
    ours = (doc[:, None] == doc[None, :]) & (i[None, :] <= i[:, None])
    assert torch.equal(ours, allowed)
    starts = params.cu_seqlens_q[:-1].tolist()
    assert starts == torch.nonzero(positions == 0).view(-1).tolist()


def test_a_micro_batch_packs_into_one_thd_row():
    rows = [ROWS["documents"], ROWS["eod_last"], ROWS["no_eod"]]
    tokens = torch.tensor(rows)
    batch = {"tokens": tokens, "labels": tokens + 1, "position_ids": torch.arange(12).expand(3, 12),
             "loss_mask": torch.ones(3, 12), "attention_mask": None}
    packed, params = pack_batch(batch, EOD)
    assert packed["tokens"].shape == (1, 36) and torch.equal(packed["tokens"][0, 12:24],
                                                             tokens[1])
    assert packed["labels"].shape == packed["loss_mask"].shape == (1, 36)
    assert params.qkv_format == "thd" and params.cu_seqlens_q.dtype == torch.int32
    assert params.cu_seqlens_q.tolist() == [0, 3, 6, 9, 12, 24, 36]
    assert params.cu_seqlens_kv is params.cu_seqlens_q
    assert params.max_seqlen_q == params.max_seqlen_kv == 12
    # no token is padded in: TE's padded offsets are the same as the plain ones (left unset)
    assert params.cu_seqlens_q_padded is None and params.cu_seqlens_kv_padded is None
    # a document never crosses a sample's end, even without an EOD there
    assert all(c % 12 == 0 or c < 12 for c in params.cu_seqlens_q.tolist()[3:])


def test_the_rotary_embedding_restarts_at_each_document():
    """Megatron's RoPE on the THD layout (rope_utils, the path both backends take with the
    cu_seqlens) rotates each document as if it began at position 0."""
    from megatron.core.models.common.embeddings.rope_utils import apply_rotary_pos_emb
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from megatron.core.transformer import TransformerConfig

    from tests.model.parity import init_single_rank

    init_single_rank("cpu")
    config = TransformerConfig(num_layers=1, hidden_size=16, num_attention_heads=2,
                               apply_rope_fusion=False, use_cpu_initialization=True)
    params = packed_seq_params(torch.tensor([ROWS["documents"]]), EOD)
    freqs = RotaryEmbedding(8, 1.0, rotary_base=10000, use_cpu_initialization=True)(
        params.max_seqlen_q, packed_seq=True)
    x = torch.randn(12, 2, 8)
    packed = apply_rotary_pos_emb(x, freqs, config, cu_seqlens=params.cu_seqlens_q)
    cu = params.cu_seqlens_q.tolist()
    for start, end in zip(cu[:-1], cu[1:]):
        alone = apply_rotary_pos_emb(x[start:end].unsqueeze(1), freqs[:end - start], config)
        torch.testing.assert_close(packed[start:end], alone.squeeze(1))


def test_the_documents_move_to_the_device_as_one_tensor_for_q_and_kv():
    """forward_step packs the loader's host tokens, then moves the cu_seqlens (the attention
    and the RoPE cache key on that one object)."""
    params = packed_seq_params(torch.tensor([ROWS["documents"]]), EOD)
    host = params.cu_seqlens_q
    assert params_to(params, "cpu").cu_seqlens_q is host
    moved = params_to(params, "meta")
    assert moved.cu_seqlens_q.device.type == "meta" and moved.cu_seqlens_kv is moved.cu_seqlens_q
