"""RoPE over packed documents (training/native/document_rope.py): the same numbers as
megatron-core's THD path (each document rotated from position 0), forward and backward in
fp32, with no per-document loop and no host synchronisation; Megatron's function keeps the
cases it does not cover; the native backend puts it in place."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from megatron.core.models.common.embeddings import rope_utils

from training.native import document_rope

CU = [0, 7, 19, 20, 40, 48, 78, 96]       # documents of 7, 12, 1, 20, 8 | 30, 18 (two rows)
ONE_RANK = SimpleNamespace(size=lambda: 1, rank=lambda: 0)


def _freqs(max_s: int, dim: int) -> torch.Tensor:
    inv = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    angles = torch.outer(torch.arange(max_s, dtype=torch.float64), inv)
    return torch.cat([angles, angles], dim=-1).float().view(max_s, 1, 1, dim)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("mscale", [1.0, 1.3])
def test_the_gather_is_megatrons_thd_rope_forward_and_backward(interleaved, mscale):
    cu = torch.tensor(CU, dtype=torch.int32)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(CU[-1], 4, 16, generator=gen)
    grad = torch.randn_like(x)
    freqs = _freqs(30, 16)
    outs = []
    for fn in (lambda t: document_rope.rope_thd(t, cu, freqs, rotary_interleaved=interleaved,
                                                mscale=mscale),
               lambda t: rope_utils._apply_rotary_pos_emb_thd(
                   t, cu, freqs, rotary_interleaved=interleaved, mscale=mscale,
                   cp_group=ONE_RANK)):
        leaf = x.clone().requires_grad_()
        out = fn(leaf)
        out.backward(grad)
        outs.append((out, leaf.grad))
    torch.testing.assert_close(outs[0][0], outs[1][0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(outs[0][1], outs[1][1], rtol=1e-6, atol=1e-6)
    # and it is not the unpacked rotation (positions continuing across documents)
    assert not torch.allclose(outs[0][0], rope_utils._apply_rotary_pos_emb_bshd(
        x.unsqueeze(1), _freqs(CU[-1], 16), rotary_interleaved=interleaved,
        mscale=mscale).squeeze(1), atol=1e-3)


def test_positions_restart_at_each_document():
    positions = document_rope.positions_in_documents(torch.tensor(CU, dtype=torch.int32), 96)
    expected = [p for a, b in zip(CU[:-1], CU[1:]) for p in range(b - a)]
    assert positions.tolist() == expected


def test_no_per_document_loop_and_no_host_synchronisation(monkeypatch):
    """Megatron's THD path splits per document after .tolist()/.item(); ours calls neither."""
    cu = torch.tensor(CU, dtype=torch.int32)
    x, freqs = torch.randn(96, 2, 8), _freqs(30, 8)

    def refuse(*args, **kwargs):
        raise AssertionError("a per-document split or a host read")

    for name in ("tolist", "item", "__int__", "__bool__"):
        monkeypatch.setattr(torch.Tensor, name, refuse)
    monkeypatch.setattr(torch, "split", refuse)
    document_rope._LAST.clear()
    document_rope.rope_thd(x, cu, freqs)
    with pytest.raises(AssertionError, match="per-document"):
        rope_utils._apply_rotary_pos_emb_thd(x, cu, freqs, cp_group=ONE_RANK)


def test_positions_are_computed_once_per_micro_batch():
    cu = torch.tensor(CU, dtype=torch.int32)
    first = document_rope.positions_in_documents(cu, 96)
    assert document_rope.positions_in_documents(cu, 96) is first
    other = cu.clone()
    assert document_rope.positions_in_documents(other, 96) is not first
    other[1] += 1                                   # changed in place: computed again
    assert document_rope.positions_in_documents(other, 96)[7].item() == 7


def test_megatrons_function_keeps_what_the_gather_does_not_cover():
    calls = []

    def original(*args, **kwargs):
        calls.append(kwargs)
        return "megatron's"

    apply = document_rope.document_rope_replacement(original, None)
    cu = torch.tensor(CU, dtype=torch.int32)
    x = torch.randn(96, 2, 8)
    plain = SimpleNamespace(apply_rope_fusion=False, rotary_interleaved=False,
                            multi_latent_attention=False)
    fused = SimpleNamespace(**{**vars(plain), "apply_rope_fusion": True})
    two_ranks = SimpleNamespace(size=lambda: 2, rank=lambda: 0)
    assert apply(x, _freqs(30, 8), plain, cu_seqlens=None, cp_group=ONE_RANK) == "megatron's"
    assert apply(x, _freqs(30, 8), fused, cu_seqlens=cu, cp_group=ONE_RANK) == "megatron's"
    assert apply(x, _freqs(30, 8), plain, cu_seqlens=cu, cp_group=two_ranks) == "megatron's"
    assert apply(x, _freqs(96, 8), plain, cu_seqlens=cu, cp_group=ONE_RANK) == "megatron's"
    assert len(calls) == 4
    ours = apply(x, _freqs(30, 8), plain, cu_seqlens=cu, cp_group=ONE_RANK)
    assert isinstance(ours, torch.Tensor) and len(calls) == 4


def test_the_native_backend_puts_it_in_place():
    from megatron.core.transformer import attention

    from training import megatron_patches, specs

    from tests.model.parity import native_run

    setup = specs.install_native(native_run("torch", fused_qkv_rope=False))
    assert attention.apply_rotary_pos_emb.__module__ == document_rope.__name__
    assert "one gather" in megatron_patches.in_place("native_document_rope")
    assert "native_document_rope" in megatron_patches.restore(names=["native_document_rope"])
    assert attention.apply_rotary_pos_emb is rope_utils.apply_rotary_pos_emb
    assert setup.kernels == "torch"
