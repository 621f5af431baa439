"""Which document-attention implementation the native backend should run (issue 51): forward +
backward time of each on one GPU, beside plain causal SDPA (what runs without DOCUMENT_MASK), at
Llama 3 8B's heads (32 / 8 groups of 128), bf16, one packed row of 8192 tokens whose documents
are drawn as Megatron's MockGPTDataset draws them (1 to 4095 tokens, uniform) and, for the
other extreme, one document filling the row. Timed with CUDA events after warm-up (the compiled
flex kernel's compilation is left out); a dev measurement that informs
training.native.IMPLEMENTATION["document_attention"], not a benchmark of record (those are the
harness's parts levers-documents / te-documents). Writes JSON to argv[1]."""
from __future__ import annotations

import json
import sys

import numpy
import torch
import torch.nn.functional as F

from training.documents import packed_seq_params
from training.native.document_attention import document_attention

T, HEADS, GROUPS, DIM = 8192, 32, 8, 128


def rows() -> dict[str, torch.Tensor]:
    rng = numpy.random.default_rng(0)
    tokens = torch.ones(T, dtype=torch.long)
    at = 0
    while True:
        at += int(rng.integers(1, 4096))
        if at > T:
            break
        tokens[at - 1] = 0
    return {"mock_documents": tokens[None].cuda(), "one_document": torch.ones(1, T).long().cuda()}


def timed(fn, q, k, v, grad, reps=20) -> float:
    for _ in range(3):
        fn(q, k, v).backward(grad)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn(q, k, v).backward(grad)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def main(out: str) -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(T, h, DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
               .requires_grad_() for h in (HEADS, GROUPS, GROUPS))
    grad = torch.randn_like(q)

    def causal(q, k, v):
        return F.scaled_dot_product_attention(
            *(t.transpose(0, 1)[None] for t in (q, k, v)), is_causal=True,
            enable_gqa=True)[0].transpose(0, 1)

    result = {"shape": {"tokens": T, "heads": HEADS, "groups": GROUPS, "head_dim": DIM},
              "device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": {}}
    for name, tokens in rows().items():
        params = packed_seq_params(tokens, 0)
        lengths = (params.cu_seqlens_q[1:] - params.cu_seqlens_q[:-1]).tolist()
        times = {"sdpa_causal": timed(causal, q, k, v, grad)}
        for impl in ("flex", "varlen", "loop"):
            try:
                times[impl] = timed(lambda a, b, c, i=impl: document_attention(
                    a, b, c, params, impl=i), q, k, v, grad)
            except Exception as err:  # noqa: BLE001 - an implementation that cannot run here
                times[impl] = f"failed: {type(err).__name__}: {err}"[:300]
        result["rows"][name] = {"documents": len(lengths), "mean_length": sum(lengths) / len(lengths),
                                "fwd_bwd_ms": times}
        print(name, len(lengths), "documents:",
              {k: (round(t, 3) if isinstance(t, float) else t) for k, t in times.items()},
              flush=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
