"""Documents kept apart on the GPU (bf16): the packed batch against its documents run one at a
time through the tiny models (dense, MoE, gpt-oss with sinks and a window), on the native
backend with each document-attention implementation (flex compiled, varlen) and on Transformer
Engine's THD path where TE imports; dropping the documents or moving one boundary by a token
breaks the parity. The module itself: flex (compiled, forward and backward) and varlen against
the per-document loop at an 8192-token row of short documents. The CPU's fp32 versions:
tests/documents/."""
from __future__ import annotations

import importlib.util

import pytest
import torch

from training.documents import packed_seq_params
from training.native import IMPLEMENTATION
from training.native import document_attention as da

from tests.documents.parity import (LENGTHS, MODELS, close, context_for, packed_tokens, parity,
                                    shifted_params)

pytestmark = pytest.mark.gpu

HAVE_TE = importlib.util.find_spec("transformer_engine") is not None
# bf16: a packed row and a document alone run different kernels (block-sparse against a
# whole short sequence), so they round differently
BF16 = dict(logit=3e-2, loss=2e-3, grad=6e-2)


@pytest.fixture
def impl(request):
    saved = IMPLEMENTATION["document_attention"]
    IMPLEMENTATION["document_attention"] = request.param
    yield request.param
    IMPLEMENTATION["document_attention"] = saved


CASES = [("native", name, impl) for name in MODELS for impl in ("flex", "loop")] + \
    [("native", "dense", "varlen")] + \
    ([("transformer_engine", name, "auto") for name in ("dense", "moe")] if HAVE_TE else [])


@pytest.mark.parametrize("backend,name,impl", CASES, indirect=["impl"],
                         ids=[f"{b}-{n}-{i}" for b, n, i in CASES])
def test_packed_documents_are_the_documents_alone_bf16(backend, name, impl):
    gpt = MODELS[name](backend, "cuda", torch.bfloat16)
    tokens = packed_tokens([[n * 8 for n in lengths] for lengths in LENGTHS], 8192, "cuda")
    result = parity(gpt, tokens, context=context_for(name, "cuda"))
    dropped = parity(gpt, tokens, None, context=context_for(name, "cuda"))
    shifted = parity(gpt, tokens, shifted_params(tokens), context=context_for(name, "cuda"))
    print(f"\n{backend}/{name}/{impl}: {result}\n  dropped {dropped}\n  shifted {shifted}")
    assert close(result, **BF16), result
    assert not close(dropped, **BF16) and not close(shifted, **BF16)


def _short_documents(total: int, mean: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.ones(total, dtype=torch.long)
    at = 0
    while at < total:
        at += int(torch.randint(1, 2 * mean, (1,), generator=gen))
        if at <= total:
            tokens[at - 1] = 0
    return tokens.unsqueeze(0).cuda()


@pytest.mark.parametrize("impl_name", ["flex", "varlen"])
@pytest.mark.parametrize("window", [None, 128])
def test_document_attention_forward_and_backward_against_the_loop(impl_name, window):
    """Llama 3 8B's heads (32 / 8 groups of 128) over an 8192-token row of ~1.5k-token
    documents, bf16: outputs and the gradients of q, k, v within bf16 noise of the loop."""
    tokens = _short_documents(8192, 1536)
    params = packed_seq_params(tokens, 0)
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(8192, heads, 128, device="cuda", generator=gen, dtype=torch.bfloat16)
               for heads in (32, 8, 8))
    grad = torch.randn_like(q)
    results = []
    for impl in (impl_name, "loop"):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        out = da.document_attention(*leaves, params, window=window, impl=impl)
        out.backward(grad)
        results.append([out.float(), *(t.grad.float() for t in leaves)])
    for name, ours, ref in zip(("out", "dq", "dk", "dv"), *results):
        err = (ours - ref).abs().max().item()
        scale = ref.abs().max().item()
        print(f"\n{impl_name} window {window} {name}: max abs err {err:.3e} (max |ref| "
              f"{scale:.3e})")
        assert err <= 2e-2 * max(scale, 1.0), name


@pytest.mark.parametrize("backend", ["native"] + (["transformer_engine"] if HAVE_TE else []))
def test_a_run_with_documents_kept_apart_trains_differently(tmp_path, backend):
    """Issue 51's reproduction, inverted: the tiny Llama through examples/llama/train_llama3.sh
    on Megatron's mock documents (1-4095 tokens, EOD-ended) at seq 1024, same seed, with and
    without DOCUMENT_MASK: before, the losses were the same bit for bit; now they differ, and
    both runs train (finite losses)."""
    from tests.gpu.test_train_gpu import _losses, _train

    runs = {mask: _losses(_train(tmp_path / f"m{mask}", f"docs{mask}", DATA_PATH="",
                                 SEQ_LENGTH=1024, TOTAL_ITERS=6, TRANSFORMER_IMPL=backend,
                                 DOCUMENT_MASK=mask))
            for mask in (0, 1)}
    print(f"\n{backend}: losses without documents {runs[0]}\n  kept apart {runs[1]}")
    assert runs[0].keys() == runs[1].keys() and len(runs[0]) == 6
    assert all(v == v and abs(v) < 100 for r in runs.values() for v in r.values())
    assert any(runs[0][i] != runs[1][i] for i in runs[0])
