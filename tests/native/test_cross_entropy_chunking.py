"""The native backend's fused linear cross-entropy on Liger's kernel (training/native/
cross_entropy.py, SyncFreeLigerLinearCrossEntropy): our chunk loop around Liger's Triton
kernel. Triton's interpreter cannot run that kernel on the CPU, so here a torch stand-in with
the kernel's contract (each row's loss written, the row's logits replaced by d loss/d logits,
ignored rows zero) checks the loop: chunking at Liger's sizes, the bf16 accumulation of the
weight gradient, the ignored tokens, the backward's scaling. tests/gpu runs the real kernel
against torch and with CUDA's sync debug mode set to error (no host read)."""
from __future__ import annotations

import pytest
import torch

from training.native import cross_entropy as ce


class _KernelStandIn:
    """liger_cross_entropy_kernel[grid](**kwargs) for reduction="sum", in torch."""

    def __init__(self):
        self.launches = []

    def __getitem__(self, grid):
        def launch(**kw):
            assert kw["reduction"] == "sum" and kw["HAS_GRADIENTS"]
            x, y = kw["X_ptr"], kw["Y_ptr"]
            assert grid == (x.shape[0],) and kw["n_cols"] == x.shape[1]
            self.launches.append(x.shape[0])
            logits = x.float()
            valid = y != kw["ignore_index"]
            safe = torch.where(valid, y, torch.zeros_like(y))
            loss = torch.logsumexp(logits, -1) - logits.gather(1, safe[:, None])[:, 0]
            grad = torch.softmax(logits, -1)
            grad[torch.arange(len(y)), safe] -= 1
            # as the kernel: an ignored token's row is zeroed, its loss left unwritten
            kw["loss_ptr"][valid] = loss[valid]
            x.copy_((grad * valid[:, None]).to(x.dtype))
        return launch


@pytest.fixture(autouse=True)
def _dirty_allocations(monkeypatch):
    """torch.empty returns whatever memory held before (the GPU's caching allocator reuses
    blocks): here it returns NaNs, so an output the loop forgets to initialise shows."""
    empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **kw: empty(*a, **kw).fill_(float("nan")))


@pytest.fixture
def kernel(monkeypatch):
    import liger_kernel.ops.cross_entropy as liger_ce

    stand_in = _KernelStandIn()
    monkeypatch.setattr(liger_ce, "liger_cross_entropy_kernel", stand_in)
    return stand_in


@pytest.mark.parametrize("tokens,vocab,width,chunk_mem,dtype", [
    (37, 300, 16, 1, torch.float32), (64, 1000, 32, 8, torch.float32),
    (50, 257, 8, 2, torch.bfloat16)])
def test_loss_and_gradients_match_torch(kernel, tokens, vocab, width, chunk_mem, dtype):
    gen = torch.Generator().manual_seed(tokens)
    hidden = torch.randn(tokens, width, generator=gen).to(dtype).requires_grad_()
    weight = (torch.randn(vocab, width, generator=gen) * 0.3).to(dtype).requires_grad_()
    target = torch.randint(0, vocab, (tokens,), generator=gen)
    target[::5] = ce.IGNORE_INDEX
    loss = ce.liger_linear_cross_entropy_sum(hidden, weight, target, chunk_mem)
    (loss * 0.37).backward()
    h64, w64 = (t.detach().double().requires_grad_() for t in (hidden, weight))
    ref = torch.nn.functional.cross_entropy(h64 @ w64.t(), target, reduction="sum",
                                            ignore_index=ce.IGNORE_INDEX)
    (ref * 0.37).backward()
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(loss.double(), ref.detach(), **tol)
    torch.testing.assert_close(hidden.grad.double(), h64.grad, **tol)
    torch.testing.assert_close(weight.grad.double(), w64.grad, **tol)
    rows = ce.liger_chunk_rows(tokens, vocab, width, chunk_mem)
    assert kernel.launches == [min(rows, tokens - s) for s in range(0, tokens, rows)]


@pytest.mark.parametrize("tokens,vocab,width,chunk_mem,rows", [
    (8192, 128256, 4096, 1, 256),     # Liger's default at Llama3-8B: 32 chunks
    (8192, 128256, 4096, 8, 2048),    # CE_CHUNK_MEM=8
    (4096, 151936, 2048, 8, 512),     # Qwen3-30B-A3B at seq 4096
    (100, 1000, 4096, 1, 100)])       # one chunk holds every token
def test_chunks_are_sized_as_liger_sizes_them(tokens, vocab, width, chunk_mem, rows):
    assert ce.liger_chunk_rows(tokens, vocab, width, chunk_mem) == rows


def test_the_loop_calls_the_kernel_with_the_pinned_liger_signature():
    """A Liger release that renames the kernel's arguments fails here, not at the first step."""
    import inspect

    from liger_kernel.ops.cross_entropy import liger_cross_entropy_kernel

    names = set(inspect.signature(liger_cross_entropy_kernel.fn).parameters)
    source = inspect.getsource(ce.SyncFreeLigerLinearCrossEntropy.forward)
    passed = {word.split("=")[0].strip() for word in source.split("liger_cross_entropy_kernel[")[1]
              .split("num_warps")[0].replace("\n", " ").split(",") if "=" in word}
    passed = {p.split("(")[-1].strip() for p in passed}
    assert passed <= names and names - passed == set(), (passed ^ names)
