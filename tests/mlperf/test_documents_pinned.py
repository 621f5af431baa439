"""The MLPerf recipes keep their references' attention whatever the launcher's default: both
pin DOCUMENT_MASK=0 (the references set no reset_attention_mask; Megatron's and NeMo's default
is off), shown with source recipe; the closed division refuses documents kept apart."""
from __future__ import annotations

import pytest

from training.launch.guards import Refusals
from training.mlperf import rules as rules_mod
from training.mlperf.launch import resolve_mlperf


@pytest.mark.parametrize("benchmark", ["llama31_8b", "gpt_oss_20b"])
def test_the_recipes_pin_the_references_document_mask(mlperf_env, benchmark):
    rules = rules_mod.load_benchmark(benchmark)
    assert rules.closed["DOCUMENT_MASK"] == 0
    env = dict(mlperf_env, GPUS_PER_NODE="8", EP="8") if benchmark == "gpt_oss_20b" \
        else dict(mlperf_env)
    launch, _, _ = resolve_mlperf(env, [], rules)
    setting = launch.settings.setting("DOCUMENT_MASK")
    assert setting.value is False or setting.value == 0
    assert setting.source == "recipe"
    words = [w for bucket in launch.buckets.values() for w in bucket]
    assert "--reset-attention-mask" not in words
    with pytest.raises(Refusals, match="DOCUMENT_MASK"):
        resolve_mlperf(dict(env, DOCUMENT_MASK="1"), [], rules)
