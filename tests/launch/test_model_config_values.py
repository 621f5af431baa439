"""Every value a config.json gives a shape is held to JSON's own type and a finite range, over
the class: each field the schema (training.records.HFConfig) names, fed every wrong type and
every non-finite number, is refused in one line naming the field, by MODEL_CONFIG, the import
and gpt-oss's reader alike; nothing reaches a shape as it came."""
from __future__ import annotations

import json
import math
import typing

import pytest

from training.checkpoint.gpt_oss_files import GptOssFolderError, check_config
from training.launch.model_config import ConfigError, load_model_config, shape_from_hf_config
from training.records import HFConfig, RopeScaling

LLAMA = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
         "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
         "vocab_size": 256, "max_position_embeddings": 512, "rope_theta": 500000.0,
         "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "attention_bias": False,
         "mlp_bias": False, "head_dim": 16, "hidden_act": "silu",
         "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}
MOE = {"model_type": "qwen3_moe", "num_hidden_layers": 2, "hidden_size": 64,
       "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
       "vocab_size": 256, "max_position_embeddings": 512, "num_experts": 4,
       "num_experts_per_tok": 2, "moe_intermediate_size": 32, "norm_topk_prob": True,
       "router_aux_loss_coef": 0.001, "use_sliding_window": False, "sliding_window": 64}
NON_FINITE = (math.nan, math.inf, -math.inf)
# where 0 is a value, not an error: an expert count of a dense model, a loss coefficient off
ZERO_IS_VALID = {"num_experts", "num_local_experts", "router_aux_loss_coef"}


def _kind(annotation) -> type:
    """int, float, bool or str: the JSON type a field's annotation asks for."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
    base = args[0]
    while typing.get_origin(base) is typing.Annotated:
        base = typing.get_args(base)[0]
    return base


def _wrong(kind: type) -> list:
    """Every wrong type for a field of this kind, and every non-finite number."""
    if kind is bool:
        return ["false", "true", 0, 1, [], *NON_FINITE]
    if kind is int:
        return ["4", 4.0, 2.5, True, [], {}, 0, -1, *NON_FINITE]
    if kind is float:
        return ["1e-5", True, [], {}, 0, -1.0, *NON_FINITE]
    return [4, True, [], {}]


def _cases():
    """(field path, wrong value) for every typed field of the schema (a field added later is
    covered by being added)."""
    for name, field in HFConfig.model_fields.items():
        kind = _kind(field.annotation)
        if kind in (int, float, bool):
            for bad in _wrong(kind):
                if not (bad == 0 and not isinstance(bad, bool) and name in ZERO_IS_VALID):
                    yield (name,), bad
    for name, field in RopeScaling.model_fields.items():
        kind = _kind(field.annotation)
        if kind in (int, float):
            for bad in _wrong(kind):
                yield ("rope_scaling", name), bad


CASES = list(_cases())


def _with(config: dict, path: tuple, value) -> dict:
    out = json.loads(json.dumps(config))
    target = out
    for key in path[:-1]:
        target = target.setdefault(key, {})
    target[path[-1]] = value
    return out


def test_the_class_is_every_field_of_the_schema():
    fields = {p[-1] for p, _ in CASES}
    assert {"tie_word_embeddings", "router_aux_loss_coef", "num_experts_per_tok", "rope_theta",
            "factor", "hidden_size", "rms_norm_eps", "head_dim"} <= fields
    assert len(CASES) > 150


@pytest.mark.parametrize("path,bad", CASES, ids=[f"{'.'.join(p)}={b!r}" for p, b in CASES])
def test_a_wrong_type_or_non_finite_value_is_refused_naming_the_field(path, bad):
    base = MOE if path[-1] in MOE or path[0] in ("num_local_experts",) else LLAMA
    with pytest.raises(ConfigError) as err:
        shape_from_hf_config(_with(base, path, bad), "x")
    assert ".".join(path) in str(err.value) and "\n" not in str(err.value)


def test_the_four_reported_values(tmp_path):
    """tie_word_embeddings "false" was read as true, NaN reached the aux-loss coefficient,
    top-k above the expert count and rope_theta Infinity were used as they came."""
    for config, field in ((_with(LLAMA, ("tie_word_embeddings",), "false"), "tie_word_embeddings"),
                          (_with(MOE, ("router_aux_loss_coef",), math.nan), "router_aux_loss_coef"),
                          (_with(MOE, ("num_experts_per_tok",), 8), "num_experts_per_tok"),
                          (_with(LLAMA, ("rope_theta",), math.inf), "rope_theta")):
        path = tmp_path / "config.json"
        path.write_text(json.dumps(config))     # NaN and Infinity as Python's json writes them
        with pytest.raises(ConfigError, match=field):
            load_model_config(str(path))


def test_valid_configs_pass_and_gpt_oss_reads_through_the_same_schema():
    assert shape_from_hf_config(LLAMA, "x").tied_embeddings is False
    assert shape_from_hf_config(_with(MOE, ("num_experts_per_tok",), 4), "x").router_topk == 4
    gpt_oss = {"model_type": "gpt_oss", "num_hidden_layers": 2, "hidden_size": 64,
               "num_attention_heads": 4, "num_key_value_heads": 2, "num_local_experts": 4,
               "intermediate_size": 64, "vocab_size": 256, "num_experts_per_tok": 2,
               "sliding_window": 8, "head_dim": 16,
               "rope_scaling": {"rope_type": "yarn", "factor": 32.0}, "rope_theta": 150000}
    check_config(gpt_oss)
    for field, bad in (("num_experts_per_tok", 5), ("num_hidden_layers", True),
                       ("rope_theta", math.inf), ("tie_word_embeddings", "false")):
        with pytest.raises(GptOssFolderError, match=field):
            check_config(_with(gpt_oss, (field,), bad))
