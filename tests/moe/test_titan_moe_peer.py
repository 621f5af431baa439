"""The torchtitan peer's Qwen3-MoE spec against torchtitan 0.2.2 itself, on the CPU (meta
device): our preset's shape in its Qwen3 model with MoE. Skipped when torchtitan 0.2.x is not
installed (as tests/bench/test_titan_peer.py)."""
from __future__ import annotations

import dataclasses
import importlib.metadata
import sys

import pytest

from training.bench import titan_peer
from training.moe.presets import MIXTRAL_8X7B, QWEN3_30B_A3B, TINY_MOE


def _version():
    try:
        return importlib.metadata.version("torchtitan")
    except importlib.metadata.PackageNotFoundError:
        return None


pytestmark = pytest.mark.skipif(not (_version() or "").startswith("0.2."),
                                reason="torchtitan 0.2.x is not installed (make setup)")


@pytest.fixture
def registry():
    import importlib.util

    stubbed = importlib.util.find_spec("datasets") is None
    titan_peer._stub_datasets()
    import torchtitan.protocols.train_spec as train_spec

    train_spec._extra_train_specs.pop(titan_peer.SPEC_NAME, None)
    yield train_spec
    train_spec._extra_train_specs.pop(titan_peer.SPEC_NAME, None)
    if stubbed:
        sys.modules.pop("datasets.distributed", None)
        sys.modules.pop("datasets", None)


@pytest.mark.parametrize("preset", [TINY_MOE, QWEN3_30B_A3B])
def test_qwen3_moe_spec_has_our_shape(registry, preset):
    import torch

    titan_peer.register_qwen3_moe_spec(preset, 2, 4096)
    spec = registry.get_train_spec(titan_peer.SPEC_NAME)
    args = spec.model_args["bench"]
    assert spec.build_tokenizer_fn is None and args.attn_type == "sdpa"
    with torch.device("meta"):
        model = spec.model_cls(args)
    h, d, n, g = preset.hidden_size, preset.head_dim, preset.num_attention_heads, \
        preset.num_query_groups
    e, f, v = preset.num_experts, preset.moe_ffn_hidden_size, preset.vocab_size
    block = model.layers["0"]
    assert block.moe_enabled and block.moe.experts.num_experts == e
    assert tuple(block.moe.experts.w1.shape) == (e, f, h)
    assert block.moe.router.top_k == preset.router_topk
    attention = 2 * h * n * d + 2 * h * g * d + 2 * d       # q, o, k, v, q/k norms
    per_layer = attention + 3 * e * h * f + e * h + 2 * h   # experts, router, two norms
    expected = 2 * per_layer + 2 * v * h + h
    counted = sum(p.numel() for p in model.parameters())
    assert counted == expected


def test_a_mixtral_shape_is_not_runnable(registry):
    with pytest.raises(RuntimeError, match="no Mixtral model"):
        titan_peer.register_qwen3_moe_spec(MIXTRAL_8X7B, 2, 4096)
    with pytest.raises(RuntimeError, match="no Mixtral model"):
        titan_peer.register_qwen3_moe_spec(
            dataclasses.replace(TINY_MOE, shared_expert_ffn_hidden_size=64), 2, 256)
