"""Documents kept apart through a whole model on the CPU (fp32): a packed batch gives the
logits, loss and gradients of its documents run one at a time; the native backend, dense
(Llama), MoE (Qwen3-MoE-like) and gpt-oss (sinks, a window in one layer). Dropping the
documents or moving one boundary by a token breaks the parity. GPU (bf16, native and TE):
tests/gpu/test_documents_gpu.py."""
from __future__ import annotations

import pytest
import torch

from tests.documents.parity import (LENGTHS, MODELS, close, context_for, packed_tokens, parity,
                                    shifted_params)
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
    assert not close(dropped, **TIGHT), dropped
    assert not close(shifted, **TIGHT), shifted
