"""The run description: derived once by the launcher, written to manifest.json as itself,
read back as itself (also from manifests written before it existed)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from training.launch.manifest import write_launch_manifest
from training.launch.presets import PRESETS
from training.run_description import Layout, Model, RunDescription

from .helpers import launch

RUNS = Path(__file__).resolve().parents[1] / "data" / "runs"


@pytest.mark.parametrize("toggles", [
    {},
    {"PLATFORM": "h200", "GPUS_PER_NODE": 8, "TP": 2, "PP": 2, "BS": 64, "MBS": 2,
     "PRECISION": "fp8", "NUM_LAYERS": 8, "RECOMPUTE": "selective"},
    {"MODEL_SIZE": "tiny", "TRANSFORMER_IMPL": "local", "FSDP": 1, "GPUS_PER_NODE": 2},
], ids=["default", "h200x8_tp2_pp2_fp8", "tiny_local_fsdp"])
def test_the_description_round_trips_through_the_manifest(base_env, toggles):
    result = launch(base_env, **toggles)
    write_launch_manifest(result)
    manifest = json.loads((result.log_dir / "manifest.json").read_text())
    assert RunDescription.from_dict(manifest) == result.run
    assert RunDescription.from_dict(json.loads(json.dumps(result.run.to_dict()))) == result.run
    # the manifest's sections are the description's, derived values included for readers
    for key, value in result.run.to_dict().items():
        assert manifest[key] == value, key


def test_the_description_is_what_the_launcher_resolved(base_env):
    result = launch(base_env, PLATFORM="h200", GPUS_PER_NODE=8, TP=2, PP=2, BS=64, MBS=2,
                    NUM_LAYERS=8, SEQ_LENGTH=4096)
    run = result.run
    assert (run.layout.world_size, run.layout.dp, run.layout.microbatches) == (8, 2, 16)
    assert run.tokens_per_step == 64 * 4096
    assert (run.model.num_layers, run.model.preset_layers, run.model.seq_length) == (8, 32, 4096)
    assert run.backend == "transformer_engine" and run.precision == "bf16"
    assert run.platform == "h200" and run.capabilities["transformer_engine"] is True
    assert run["SEQUENCE_PARALLEL"] is True   # derived from TP by the launcher
    words = result.buckets["GPT_ARGS"]
    assert words[words.index("--num-layers") + 1] == str(run.model.num_layers)


def test_a_manifest_from_before_the_description_reads_the_same_way():
    """Recorded runs (manifest schema 1) carry the same sections: no second reader."""
    manifest = json.loads((RUNS / "h200x2_l32_native" / "manifest.json").read_text())
    assert manifest["schema"] == 1
    run = RunDescription.from_dict(manifest)
    old = manifest["layout"]
    assert (run.layout.world_size, run.layout.dp) == (old["world_size"], old["dp"])
    assert (run.layout.mbs, run.layout.global_batch) == (old["mbs"], old["global_batch"])
    assert run.model.num_layers == manifest["model"]["num_layers"] == 32
    assert run.precision == manifest["precision"] and run.backend == manifest["backend"]
    assert run.platform == manifest["capabilities"]["platform"] == "h200"
    assert run.model.preset_layers is None   # not recorded then (the advisor looks it up)


def test_with_values_derives_the_layout_again(base_env):
    run = launch(base_env, PLATFORM="h200", GPUS_PER_NODE=8).run
    assert run.layout.dp == 8
    tp4 = run.with_values(TP=4)
    assert (tp4.layout.dp, tp4.layout.microbatches) == (2, 64)
    assert tp4["SEQUENCE_PARALLEL"] is True and run["SEQUENCE_PARALLEL"] is False
    assert tp4.with_values(TP=1)["SEQUENCE_PARALLEL"] is False
    assert run.with_values(SEQ_LENGTH=2048).model.seq_length == 2048
    assert run.with_values(NUM_LAYERS=4).model.num_layers == 4
    assert run.with_values(TP=4) == tp4 and run != tp4


@pytest.mark.parametrize("layout,world,dp,micro", [
    (Layout(1, 8, 2, 2, 1, 1, 64), 8, 2, 32),
    (Layout(2, 8, 1, 1, 2, 2, 64), 16, 8, 4),
    (Layout(1, 1, 1, 1, 1, 1, 8), 1, 1, 8),
])
def test_layout_arithmetic(layout, world, dp, micro):
    assert (layout.world_size, layout.dp, layout.microbatches) == (world, dp, micro)
    assert layout.to_dict()["dp"] == dp


def test_a_preset_cut_to_a_run_keeps_its_own_layer_count():
    model = Model.of(PRESETS["llama3-8B"], num_layers=8)
    assert (model.num_layers, model.preset_layers, model.seq_length) == (8, 32, 8192)
    assert model.kv_width == 8 * 128 and model.padded_vocab(2) % 256 == 0
    assert Model.from_dict(model.to_dict()) == model
