"""CE_CHUNK_MEM reaches Liger's fused linear cross-entropy (the Triton kernel runs on GPUs only:
here a stand-in records the call; tests/gpu checks the kernel against torch)."""
from __future__ import annotations

import torch

from training.native import cross_entropy


def test_chunk_mem_and_sum_reduction_are_passed_to_liger(monkeypatch):
    import liger_kernel.transformers.functional as functional

    calls = []

    def fake(hidden, weight, target, **kw):
        calls.append(kw)
        return torch.zeros(())

    monkeypatch.setattr(functional, "liger_fused_linear_cross_entropy", fake)
    hidden, weight = torch.randn(8, 4), torch.randn(16, 4)
    target = torch.randint(0, 16, (8,))
    cross_entropy.liger_linear_cross_entropy_sum(hidden, weight, target, chunk_mem=8)
    assert calls == [{"ignore_index": cross_entropy.IGNORE_INDEX, "reduction": "sum",
                      "chunk_mem_const": 8}]


def test_liger_accepts_chunk_mem_const():
    # the pinned Liger-Kernel has the keyword (0.8.5); an older one would fail at the first step
    import inspect

    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    assert "chunk_mem_const" in inspect.signature(liger_fused_linear_cross_entropy).parameters
