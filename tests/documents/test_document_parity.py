"""Documents kept apart through a whole model on the CPU (fp32): a packed batch gives the
logits, loss and gradients of its documents run one at a time; the native backend, dense
(Llama), MoE (Qwen3-MoE-like) and gpt-oss (sinks, a window in one layer). Dropping the
documents or moving one boundary by a token breaks the parity. GPU (bf16, native and TE):
tests/gpu/test_documents_gpu.py."""
from __future__ import annotations

import pytest
import torch

from tests.documents.parity import packed_tokens, parity, shifted_params
from tests.moe.conftest import _eager_megatron_helpers  # noqa: F401 - autouse fixture

# two samples of 48: documents of 7, 12, 1, 20 and a cut 8 / 30 and a cut 18
LENGTHS = [[7, 12, 1, 20, 30], [30, 25]]
# the load-balancing loss is a statistic of the whole micro-batch (its gradient differs when
# the documents are run apart): off, as in the MLPerf gpt_oss_20b recipe
NO_AUX = ("--moe-aux-loss-coeff", "0", "--moe-router-load-balancing-type", "none")
TIGHT = dict(logit=1e-4, loss=1e-5, grad=1e-4)


def _close(r, tol=TIGHT):
    return (r["logit_err"] <= tol["logit"] * max(r["logit_scale"], 1.0)
            and r["loss_rel_err"] <= tol["loss"] and r["grad_rel_err"] <= tol["grad"])


def dense_model():
    from training.launch.presets import PRESETS

    from tests.model.parity import gpt_model, init_single_rank

    init_single_rank("cpu")
    torch.manual_seed(0)
    return gpt_model(PRESETS["tiny"], 2, "native", "torch", torch.float32,
                     fused_qkv_rope=False).train()   # Megatron: not with the packed layout


def moe_model():
    from training.moe.presets import MOE_PRESETS

    from tests.moe.model import build_moe_gpt

    gpt, _ = build_moe_gpt(MOE_PRESETS["tiny-moe"], 2, "native", "torch", "cpu", extra=NO_AUX)
    return gpt.train()


def gpt_oss_model():
    from training.moe.gpt_oss import TINY_GPT_OSS

    from tests.moe.gpt_oss_model import build_gpt_oss

    gpt, _ = build_gpt_oss(TINY_GPT_OSS, 2, extra=NO_AUX)
    with torch.no_grad():          # sinks that matter (the initialisation leaves them near 0)
        for name, p in gpt.named_parameters():
            if name.endswith("softmax_offset"):
                p.copy_(torch.linspace(-1.0, 1.5, p.numel()))
    return gpt.train()


MODELS = {"dense": dense_model, "moe": moe_model, "gpt_oss": gpt_oss_model}


def _context(name):
    if name == "dense":
        import contextlib

        return contextlib.nullcontext
    from tests.moe.model import cpu_dispatcher_streams

    return cpu_dispatcher_streams


@pytest.mark.parametrize("name", list(MODELS))
def test_packed_documents_are_the_documents_alone(name):
    gpt = MODELS[name]()
    tokens = packed_tokens(LENGTHS, 8192, "cpu")
    result = parity(gpt, tokens, context=_context(name))
    assert _close(result), result


@pytest.mark.parametrize("name", list(MODELS))
def test_dropped_or_shifted_documents_break_the_parity(name):
    gpt = MODELS[name]()
    tokens = packed_tokens(LENGTHS, 8192, "cpu")
    dropped = parity(gpt, tokens, None, context=_context(name))
    shifted = parity(gpt, tokens, shifted_params(tokens), context=_context(name))
    assert not _close(dropped), dropped
    assert not _close(shifted), shifted
