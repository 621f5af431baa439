"""The memory estimator on MoE runs: parameters against the Hugging Face model's own count,
the experts' states sharded over expert parallelism, the routed copies' activations."""
from __future__ import annotations

import dataclasses
import json

import pytest

import training.moe.presets  # noqa: F401 - registers the MoE families
from training.launch.manifest import write_launch_manifest
from training.moe.presets import QWEN3_30B_A3B, TINY_MOE
from training.optimize.config import from_manifest
from training.optimize.memory import estimate, expert_data_parallel, stage_expert_params

from tests.moe.test_moe_launch import moe


def _config(env, **toggles):
    result = moe(env, PLATFORM="h200", TRANSFORMER_IMPL="native",
                 **{"GPUS_PER_NODE": 1, "BS": 8, **toggles})
    write_launch_manifest(result)
    return from_manifest(json.loads((result.log_dir / "manifest.json").read_text()))


@pytest.mark.parametrize("preset,size", [(QWEN3_30B_A3B, "30B-A3B"), (TINY_MOE, "tiny")])
def test_parameters_are_the_hf_models(base_env, preset, size):
    import torch

    from training.bench.hf_peer import hf_model_config

    model_class, config = hf_model_config(preset, 2, preset.seq_length)
    with torch.device("meta"):
        hf_count = sum(p.numel() for p in model_class(config).parameters())
    c = _config(base_env, MODEL_SIZE=size, NUM_LAYERS=2)
    assert estimate(c).params_on_rank == hf_count


def test_qwen3_30b_a3b_is_30b_parameters_of_which_the_experts_hold_most(base_env):
    c = _config(base_env)
    total = estimate(c).params_on_rank
    assert total == pytest.approx(30.5e9, rel=0.01)       # the model card's 30.5B
    assert stage_expert_params(c) / total > 0.9


def test_expert_parallelism_shards_the_experts_and_their_states(base_env):
    one = _config(base_env, NUM_LAYERS=8)
    ep8 = _config(base_env, NUM_LAYERS=8, GPUS_PER_NODE=8, EP=8)
    experts = stage_expert_params(one)
    assert stage_expert_params(ep8) == pytest.approx(experts / 8)
    dense = estimate(one).params_on_rank - experts
    assert estimate(ep8).params_on_rank == pytest.approx(dense + experts / 8)
    # expert data parallel = 8 GPUs / EP 8 = 1: the experts' Adam states are whole on each
    # rank; the dense ones shard over DP = 8
    assert expert_data_parallel(ep8) == 1 and ep8.layout.dp == 8
    adam = estimate(ep8).term("adam").gib * 2**30
    assert adam == pytest.approx(8 * (dense / 8 + experts / 8))
    assert "expert DP = 1" in estimate(ep8).term("adam").formula


def test_expert_data_parallel_leaves_out_the_pipeline_stages(base_env):
    """At PP = 2 (the test above is at PP = 1): 8 GPUs, EP 2, PP 2 shard the experts' states
    over 8 / (EP 2 x ETP 1 x PP 2) = 2 ranks, the dense ones over DP = 4."""
    c = _config(base_env, NUM_LAYERS=8, GPUS_PER_NODE=8, EP=2, PP=2)
    assert (c.layout.dp, expert_data_parallel(c)) == (4, 2)
    experts = stage_expert_params(c)
    dense = estimate(c).params_on_rank - experts
    assert estimate(c).term("adam").gib * 2**30 == pytest.approx(8 * (dense / 4 + experts / 2))


def test_routed_copies_dominate_the_activations_and_grow_with_top_k(base_env):
    c = _config(base_env, NUM_LAYERS=8)
    m = c.model
    top16 = dataclasses.replace(c, model=dataclasses.replace(m, router_topk=16))
    per_copy = 2 * m.hidden_size + 6 * m.moe_ffn_hidden_size  # fc1 in, fc1 out, SwiGLU out
    extra = estimate(top16).term("activations").gib - estimate(c).term("activations").gib
    assert extra * 2**30 == pytest.approx(8 * 8 * m.seq_length * per_copy)
    assert "k(2h + 6f_e) + 8E" in estimate(c).term("activations").formula


def test_the_bench_depth_fits_one_h200_and_two_more_layers_would_not(base_env):
    """The MoE bench part's shape (training/bench/catalog.py MOE_SHAPE: Qwen3-30B-A3B cut to 8
    layers, seq 4096) fits an H200 by this estimate with the core's fp32 optimizer state, as
    chosen; 10 layers do not. The lean step's 16-bit state (the MoE default since session 11)
    leaves room for more."""
    from training.bench.catalog import MOE_SHAPE

    layers = MOE_SHAPE.num_layers
    assert estimate(_config(base_env, NUM_LAYERS=layers, MOE_LEAN_STEP=0)).fits
    assert not estimate(_config(base_env, NUM_LAYERS=layers + 2, MOE_LEAN_STEP=0)).fits
    assert estimate(_config(base_env, NUM_LAYERS=layers + 2)).fits


def _dry_run(env, **toggles):
    result = moe(env, PLATFORM="h200", TRANSFORMER_IMPL="native", **{"BS": 8, **toggles})
    write_launch_manifest(result)
    return result.log_dir


def test_the_advisor_recommends_the_moe_toggles_back_on(base_env):
    from tests.optimize.helpers import FIXTURE, advise

    report = advise(_dry_run(base_env, GPUS_PER_NODE=1, NUM_LAYERS=8, MOE_GROUPED_GEMM=0),
                    levers=FIXTURE)
    ids = [r["id"] for r in report["recommendations"]]
    assert "on:MOE_GROUPED_GEMM" in ids and "on:MOE_PERMUTE_FUSION" not in ids


def test_a_memory_bound_moe_run_is_told_to_split_its_experts(base_env):
    from tests.optimize.helpers import FIXTURE, advise

    report = advise(_dry_run(base_env, GPUS_PER_NODE=8), levers=FIXTURE)
    assert report["bottleneck"]["kind"] == "memory-bound"
    (ep,) = [r for r in report["recommendations"] if r["id"] == "ep_up"]
    assert ep["sets"] == {"EP": "2"} and ep["estimate"]["delta_gib"] < 0
