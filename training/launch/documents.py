"""Documents kept apart (DOCUMENT_MASK, RESET_POSITION_IDS): what can honour them, one rule for
the guard `document_mask` and a plain torchrun (training.arguments).

DOCUMENT_MASK=1 is Megatron's --reset-attention-mask: attention stops at each end-of-document
token. It runs as the packed (THD) layout with the documents' cu_seqlens (training/documents.py)
on the native backend (training/native/document_attention.py) and Transformer Engine's (its
fused attention's padding_causal THD path), never as a dense [s, s] mask. Megatron's RoPE then
rotates every document from position 0, so --reset-position-ids comes with it. Without the
mask, --reset-position-ids would change nothing under RoPE (Megatron's rotary embedding takes
no position ids; only learned absolute position embeddings read them): refused, not ignored.
"""
from __future__ import annotations

# Settings the packed layout cannot run with, and why (the fix is in the message).
LOCAL = ("the local backend's attention (Megatron's DotProductAttention) takes no packed "
         "documents and the launcher builds no dense mask: use TRANSFORMER_IMPL=native or "
         "transformer_engine")
CONTEXT_PARALLEL = ("context parallelism over packed documents needs each document padded to "
                    "a multiple of 2 x CP and Megatron's THD split per rank, which this "
                    "launcher does not build: use CP=1")
CUDA_GRAPH = ("the packed layout reads the documents' lengths on the host every micro-batch "
              "(RoPE per document, the block mask), which a CUDA graph of the step cannot "
              "capture: use CUDA_GRAPH=none")
PIPELINE = ("pipeline stages exchange [seq, micro-batch, hidden] activations, and the packed "
            "layout is [micro-batch x seq, 1, hidden]: use MBS=1 with PP > 1")
NATIVE_PIPELINE = ("the native backend's flex attention keeps one micro-batch's documents for "
                   "its backward, and a pipeline schedule runs later forwards first: use PP=1, "
                   "or TRANSFORMER_IMPL=transformer_engine")
FUSED_QKV_ROPE = ("Megatron's fused QKV RoPE does not take the packed (THD) layout (megatron-"
                  "core asserts 'fused_single_qkv_rope requested but not available/supported'); "
                  "RoPE runs on the split query and key, each document from position 0 (the "
                  "native backend: one gather of the rotary table, training/native/"
                  "document_rope.py)")
POSITIONS_ALONE = ("Megatron's rotary embedding takes no position ids (only learned absolute "
                   "position embeddings read them), so restarting them without the mask would "
                   "change nothing: set DOCUMENT_MASK=1 (--reset-attention-mask), which keeps "
                   "documents apart and rotates each from position 0, or unset it")
POSITIONS_WITH_MASK = ("with DOCUMENT_MASK=1 the packed layout rotates each document from "
                       "position 0 (under RoPE the same attention as continued positions, "
                       "since each document attends only to itself)")


def conflicts(backend: str, cp: int, cuda_graph: str, pp: int, mbs: int,
              attention_dropout: float = 0.0) -> list[str]:
    """Why DOCUMENT_MASK=1 cannot run in this launch (none: it can)."""
    found = [(backend == "local", LOCAL), (cp > 1, CONTEXT_PARALLEL),
             (cuda_graph != "none", CUDA_GRAPH), (pp > 1 and mbs > 1, PIPELINE),
             (pp > 1 and backend == "native", NATIVE_PIPELINE),
             (backend == "native" and attention_dropout > 0,
              f"attention dropout {attention_dropout:g}: the native backend's block-causal "
              "attention has none: use an attention dropout of 0, or TRANSFORMER_IMPL="
              "transformer_engine")]
    return [why for applies, why in found if applies]


def kept_apart(mask: bool, data: bool) -> str:
    """The DRY_RUN's line on documents: whether attention stops at each document's end."""
    if mask:
        return ("documents kept apart: attention stops at each end-of-document token "
                "(DOCUMENT_MASK=1; packed THD layout, positions restart per document)")
    source = "the dataset's documents" if data else "mock data's documents"
    return (f"documents not kept apart: attention runs across {source} packed in each sequence "
            "(DOCUMENT_MASK=1 keeps them apart)")
