"""Documents kept apart through a whole model on the CPU (fp32): a packed batch gives the
logits, loss and gradients of its documents run one at a time; the native backend, dense
(Llama), MoE (Qwen3-MoE-like) and gpt-oss (sinks, a window in one layer). Dropping the
documents or moving one boundary by a token breaks the parity. GPU (bf16, native and TE):
tests/gpu/test_documents_gpu.py."""
from __future__ import annotations

import pytest
import torch

from tests.documents.parity import (LENGTHS, MODELS, Routing, clean_tokens, close, context_for,
                                    packed_tokens, parity, shifted_params)
from tests.moe.conftest import _eager_megatron_helpers  # noqa: F401 - autouse fixture

TIGHT = dict(logit=1e-4, loss=1e-5, grad=1e-4)   # fp32


@pytest.mark.parametrize("name", list(MODELS))
def test_packed_documents_are_the_documents_alone(name):
    gpt = MODELS[name]("native", "cpu", torch.float32)
    tokens = packed_tokens(LENGTHS, 8192, "cpu")
    result = parity(gpt, tokens, context=context_for(name, "cpu"))
    assert close(result, **TIGHT), result


@pytest.mark.parametrize("name", list(MODELS))
def test_dropped_or_shifted_documents_break_the_parity(name):
    gpt = MODELS[name]("native", "cpu", torch.float32)
    tokens = packed_tokens(LENGTHS, 8192, "cpu")
    dropped = parity(gpt, tokens, None, context=context_for(name, "cpu"))
    shifted = parity(gpt, tokens, shifted_params(tokens), context=context_for(name, "cpu"))
    print(f"\n{name}: dropped {dropped}\n  shifted {shifted}")
    assert not close(dropped, **TIGHT), dropped
    assert not close(shifted, **TIGHT), shifted


def test_a_routing_flip_takes_its_token_and_the_rest_of_its_document_out():
    """clean_tokens: a token whose experts differ in any layer, and every later token of its
    document, leave the comparison; the other documents stay; the agreement counts decisions."""
    tokens = packed_tokens([[4, 3, 5]], 8192, "cpu")        # documents [0, 4) [4, 7) [7, 12)
    packed, alone = Routing(torch.nn.Module()), Routing(torch.nn.Module())
    packed.routers = alone.routers = [None, None]            # two MoE layers
    choice = torch.zeros(12, 4, dtype=torch.bool)
    choice[:, 0] = True
    packed.maps = {0: [choice], 1: [choice]}
    flipped = choice.clone()
    flipped[5] = torch.tensor([False, True, False, False])   # layer 1, token 5 (document 2)
    alone.maps = {0: [choice[:7], choice[7:]], 1: [flipped]}
    clean, agree = clean_tokens(packed, alone, tokens)
    assert clean.tolist() == [True] * 4 + [True, False, False] + [True] * 5
    assert agree == pytest.approx(1 - 1 / 24)
    same, agree = clean_tokens(packed, packed, tokens)
    assert same.all() and agree == 1.0
