"""Packed documents against the same documents run one at a time, through a whole GPTModel
(shared by the CPU and GPU parity tests).

A packed micro-batch [b, s] of documents (each ended by the EOD token; a sample may end inside
one) goes through the model as a run with DOCUMENT_MASK=1 sends it (training/documents.py
pack_batch: one packed row and its PackedSeqParams); each document alone goes through the plain
causal path, its positions from 0. Their logits must agree token for token, and so must the
gradients of every parameter of the summed token loss (labels: the packed stream's next
tokens, the same for both)."""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from training.documents import pack_batch, packed_seq_params

EOD = 0


def packed_tokens(lengths_per_sample: list[list[int]], vocab: int, device: str,
                  seed: int = 5) -> torch.Tensor:
    """[b, s] tokens: sample i holds documents of lengths_per_sample[i], each ending with EOD
    except a sample's last one when `s` cuts it (all samples the same length)."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for lengths in lengths_per_sample:
        parts = []
        for n in lengths:
            doc = torch.randint(1, vocab, (n,), generator=gen)
            doc[-1] = EOD
            parts.append(doc)
        rows.append(torch.cat(parts))
    s = min(len(r) for r in rows)
    return torch.stack([r[:s] for r in rows]).to(device)


def documents_of(tokens: torch.Tensor) -> list[tuple[int, int]]:
    """(start, end) in the packed row of each document: after an EOD, and at sample ends."""
    params = packed_seq_params(tokens, EOD)
    cu = params.cu_seqlens_q.tolist()
    return list(zip(cu[:-1], cu[1:]))


def _labels(tokens: torch.Tensor) -> torch.Tensor:
    """Next-token labels per sample (the last label of a sample: its first token, unused
    weight-wise identical on both sides)."""
    return torch.roll(tokens, -1, dims=1)


def packed_forward(gpt, tokens: torch.Tensor, params="documents"):
    """Logits [b * s, V] of the packed batch. params: "documents" (pack_batch's own), None (no
    documents: plain causal over each sample), or a PackedSeqParams given (a mutated one)."""
    b, s = tokens.shape
    positions = torch.arange(s, device=tokens.device).expand(b, s)
    if params is None:
        return gpt(tokens, positions, None).reshape(b * s, -1)
    batch = {"tokens": tokens, "position_ids": positions, "labels": _labels(tokens),
             "loss_mask": torch.ones_like(tokens, dtype=torch.float)}
    packed, own = pack_batch(batch, EOD)
    params = own if isinstance(params, str) else params
    logits = gpt(packed["tokens"], packed["position_ids"], None, packed_seq_params=params)
    return logits.reshape(b * s, -1)


def alone_forward(gpt, tokens: torch.Tensor) -> torch.Tensor:
    """Logits [b * s, V]: each document through the model on its own, positions from 0."""
    flat = tokens.reshape(-1)
    outs = []
    for start, end in documents_of(tokens):
        doc = flat[start:end].unsqueeze(0)
        positions = torch.arange(end - start, device=doc.device).unsqueeze(0)
        outs.append(gpt(doc, positions, None).reshape(end - start, -1))
    return torch.cat(outs)


def loss_and_grads(gpt, logits: torch.Tensor, tokens: torch.Tensor):
    loss = F.cross_entropy(logits.float(), _labels(tokens).reshape(-1), reduction="sum")
    params = [p for p in gpt.parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return loss.detach(), {name: g for (name, _), g in
                           zip(((n, p) for n, p in gpt.named_parameters() if p.requires_grad),
                               grads) if g is not None}


def parity(gpt, tokens: torch.Tensor, params="documents", context=contextlib.nullcontext):
    """Packed (with `params`) against alone: the largest logit difference (and the logits'
    scale), the loss of each, and the largest gradient difference relative to that
    gradient's own scale."""
    with context():
        packed = packed_forward(gpt, tokens, params)
        loss_p, grads_p = loss_and_grads(gpt, packed, tokens)
        alone = alone_forward(gpt, tokens)
        loss_a, grads_a = loss_and_grads(gpt, alone, tokens)
    assert grads_p.keys() == grads_a.keys() and grads_a
    grad_err = max(((grads_p[n].float() - grads_a[n].float()).abs().max()
                    / grads_a[n].float().abs().max().clamp_min(1e-12)).item() for n in grads_a)
    return {"logit_err": (packed.float() - alone.float()).abs().max().item(),
            "logit_scale": alone.float().abs().max().item(),
            "loss_packed": loss_p.item(), "loss_alone": loss_a.item(),
            "loss_rel_err": abs(loss_p.item() - loss_a.item()) / abs(loss_a.item()),
            "grad_rel_err": grad_err}


def shifted_params(tokens: torch.Tensor):
    """The documents' PackedSeqParams with the first boundary one token later (the mutation a
    parity test must catch: a mask shifted by one token)."""
    params = packed_seq_params(tokens, EOD)
    cu = params.cu_seqlens_q.clone()
    cu[1] += 1
    params.cu_seqlens_q = params.cu_seqlens_kv = cu
    return params
