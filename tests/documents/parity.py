"""Packed documents against the same documents run one at a time, through a whole GPTModel
(shared by the CPU and GPU parity tests).

A packed micro-batch [b, s] of documents (each ended by the EOD token; a sample may end inside
one) goes through the model as a run with DOCUMENT_MASK=1 sends it (training/documents.py
pack_batch: one packed row and its PackedSeqParams); each document alone goes through the plain
causal path, its positions from 0. Their logits must agree token for token, and so must the
gradients of every parameter of the summed token loss (labels: the packed stream's next
tokens, the same for both). With MoE layers, over the tokens whose expert choices agree on
both sides (clean_tokens: bf16 may flip a near-tied top-k choice), most of them."""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from training.documents import pack_batch, packed_seq_params

EOD = 0
# two samples of 48: documents of 7, 12, 1, 20 and a cut 8 / 30 and a cut 18
LENGTHS = [[7, 12, 1, 20, 30], [30, 25]]


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


class Routing:
    """The experts each MoE router chose, per layer, for the tokens of one side (packed or
    alone), in the packed row's order: a forward hook on every TopKRouter (its output: probs,
    routing_map [tokens, experts]). `order` maps a router's rows to the packed row's
    (Megatron's [s, b] rows are position-major; a [1, t] packed row or a lone document is
    already in order)."""

    def __init__(self, gpt):
        self.routers = [m for m in gpt.modules() if type(m).__name__.endswith("TopKRouter")]
        self.maps: dict[int, list[torch.Tensor]] = {i: [] for i in range(len(self.routers))}
        self.order = None

    @contextlib.contextmanager
    def recording(self, order=None):
        self.order = order
        handles = [r.register_forward_hook(self._hook(i)) for i, r in enumerate(self.routers)]
        try:
            yield self
        finally:
            for h in handles:
                h.remove()

    def _hook(self, i):
        def hook(module, args, output):
            routing_map = output[1].detach()
            if self.order is not None:
                routing_map = self.order(routing_map)
            self.maps[i].append(routing_map)
        return hook

    def choices(self) -> torch.Tensor | None:
        """[layers, tokens, experts] bool (None: no MoE layer)."""
        if not self.routers:
            return None
        return torch.stack([torch.cat(self.maps[i]) for i in range(len(self.routers))])


def clean_tokens(packed: Routing, alone: Routing, tokens: torch.Tensor):
    """Which tokens of the packed row computed the same function on both sides: no router, in
    any layer, chose other experts for it or for any earlier token of its document (what a
    token sees; a routing flip at one token reaches the later tokens of its document through
    attention). bf16 rounds a packed row and a lone document differently (other GEMM
    batchings), which may flip a near-tied top-k choice: a discrete change, not noise. Returns
    (mask [b * s] bool, the fraction of (layer, token) routing decisions that agree)."""
    n = tokens.numel()
    a, b = packed.choices(), alone.choices()
    if a is None:
        return torch.ones(n, dtype=torch.bool, device=tokens.device), 1.0
    differs = (a != b).any(dim=-1)                 # [layers, tokens]
    agree = 1.0 - differs.float().mean().item()
    flipped = differs.any(dim=0).to(torch.int64)
    tainted = torch.zeros(n, dtype=torch.bool, device=tokens.device)
    for start, end in documents_of(tokens):
        tainted[start:end] = flipped[start:end].cumsum(0) > 0
    return ~tainted, agree


def loss_and_grads(gpt, logits: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor):
    """The summed token loss over the tokens of `mask`, and every parameter's gradient of it."""
    losses = F.cross_entropy(logits.float(), _labels(tokens).reshape(-1), reduction="none")
    loss = (losses * mask).sum()
    params = [p for p in gpt.parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return loss.detach(), {name: g for (name, _), g in
                           zip(((n, p) for n, p in gpt.named_parameters() if p.requires_grad),
                               grads) if g is not None}


def _position_major_to_packed(b: int, s: int):
    return lambda rows: rows.reshape(s, b, -1).transpose(0, 1).reshape(b * s, -1)


def parity(gpt, tokens: torch.Tensor, params="documents", context=contextlib.nullcontext):
    """Packed (with `params`) against alone, over the tokens whose expert choices agree (all
    tokens of a dense model; clean_tokens): the largest logit difference (and the logits'
    scale), the loss of each, the largest gradient difference relative to that gradient's own
    scale, the fraction of routing decisions that agree and of tokens compared."""
    b, s = tokens.shape
    packed_routing, alone_routing = Routing(gpt), Routing(gpt)
    order = _position_major_to_packed(b, s) if params is None else None
    with context():
        with packed_routing.recording(order):
            packed = packed_forward(gpt, tokens, params)
        with alone_routing.recording():
            alone = alone_forward(gpt, tokens)
        clean, agree = clean_tokens(packed_routing, alone_routing, tokens)
        loss_p, grads_p = loss_and_grads(gpt, packed, tokens, clean)
        loss_a, grads_a = loss_and_grads(gpt, alone, tokens, clean)
    assert grads_p.keys() == grads_a.keys() and grads_a
    grad_err = max(((grads_p[n].float() - grads_a[n].float()).abs().max()
                    / grads_a[n].float().abs().max().clamp_min(1e-12)).item() for n in grads_a)
    diff = (packed.float() - alone.float()).abs()[clean]
    return {"logit_err": diff.max().item() if diff.numel() else float("inf"),
            "logit_scale": alone.float().abs().max().item(),
            "loss_packed": loss_p.item(), "loss_alone": loss_a.item(),
            "loss_rel_err": abs(loss_p.item() - loss_a.item()) / max(abs(loss_a.item()), 1e-12),
            "grad_rel_err": grad_err, "routing_agree": agree,
            "tokens_compared": clean.float().mean().item()}


# at least this share of the (layer, token) expert choices must agree, and this share of the
# tokens be compared (a flip early in a long document takes the rest of it out)
ROUTING_AGREE = 0.98
TOKENS_COMPARED = 0.5


def close(result: dict, logit: float, loss: float, grad: float) -> bool:
    """Within the bounds: logits relative to their scale, loss and gradients relative, over
    the compared tokens; and enough routing agreement and tokens compared."""
    return (result["logit_err"] <= logit * max(result["logit_scale"], 1.0)
            and result["loss_rel_err"] <= loss and result["grad_rel_err"] <= grad
            and result["routing_agree"] >= ROUTING_AGREE
            and result["tokens_compared"] >= TOKENS_COMPARED)


def shifted_params(tokens: torch.Tensor):
    """The documents' PackedSeqParams with the first boundary one token later (the mutation a
    parity test must catch: a mask shifted by one token)."""
    params = packed_seq_params(tokens, EOD)
    cu = params.cu_seqlens_q.clone()
    cu[1] += 1
    params.cu_seqlens_q = params.cu_seqlens_kv = cu
    return params


# the load-balancing loss is a statistic of the whole micro-batch (its gradient differs when
# the documents are run apart): off, as in the MLPerf gpt_oss_20b recipe
NO_AUX = ("--moe-aux-loss-coeff", "0", "--moe-router-load-balancing-type", "none")


def dense_model(backend: str, device: str, dtype: torch.dtype):
    """The tiny Llama (2 layers), fused QKV RoPE off (Megatron: not with the packed layout)."""
    from training.launch.presets import PRESETS

    from tests.model.parity import gpt_model, init_single_rank

    init_single_rank(device)
    torch.manual_seed(0)
    gpt = gpt_model(PRESETS["tiny"], 2, backend, "torch", dtype, fused_qkv_rope=False)
    return gpt.to(device=device, dtype=dtype).train()


def moe_model(backend: str, device: str, dtype: torch.dtype):
    """The tiny Qwen3-MoE-like preset (q/k norms, 8 experts top-2), no load-balancing loss."""
    from training.moe.presets import MOE_PRESETS

    from tests.moe.model import build_moe_gpt

    gpt, _ = build_moe_gpt(MOE_PRESETS["tiny-moe"], 2, backend, "torch", device, dtype,
                           extra=NO_AUX)
    return gpt.train()


def gpt_oss_model(backend: str, device: str, dtype: torch.dtype):
    """The tiny gpt-oss (a 16-key window in layer 1, sinks drawn so that they matter)."""
    from training.moe.gpt_oss import TINY_GPT_OSS

    from tests.moe.gpt_oss_model import build_gpt_oss

    gpt, _ = build_gpt_oss(TINY_GPT_OSS, 2, device, dtype, backend=backend, extra=NO_AUX)
    with torch.no_grad():
        for name, p in gpt.named_parameters():
            if name.endswith("softmax_offset"):
                p.copy_(torch.linspace(-1.0, 1.5, p.numel()))
    return gpt.train()


MODELS = {"dense": dense_model, "moe": moe_model, "gpt_oss": gpt_oss_model}


def context_for(name: str, device: str):
    """The MoE dispatcher's side stream stands in on the CPU."""
    if name == "dense" or device != "cpu":
        return contextlib.nullcontext
    from tests.moe.model import cpu_dispatcher_streams

    return cpu_dispatcher_streams
