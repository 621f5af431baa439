"""DOCUMENT_MASK and RESET_POSITION_IDS in the launcher: one setting, two spellings (the toggle
and Megatron's own --reset-attention-mask / --reset-position-ids passed through), what they
emit, what they refuse before torchrun, what the DRY_RUN says; a plain torchrun derives the
same (training.arguments.as_the_launcher)."""
from __future__ import annotations

import pytest

from training.arguments import ArgumentConflict, as_the_launcher
from training.launch.guards import Refusals

from tests.launch.helpers import launch, megatron_args


def _words(result):
    return [w for bucket in result.buckets.values() for w in bucket]


def _refusal(env, words=None, **toggles) -> str:
    with pytest.raises(Refusals) as err:
        launch(env, words=words, MODEL_SIZE="tiny", **toggles)
    mine = [str(r) for r in err.value.refusals if r.guard == "document_mask"]
    assert mine, [str(r) for r in err.value.refusals]
    return mine[0]


def _notice(result) -> str:
    (text,) = [n.message for n in result.settings.notices
               if n.guard == "document_mask" and n.level == "info"]
    return text


def test_off_by_default_and_the_dry_run_says_documents_are_not_kept_apart(base_env):
    result = launch(base_env, MODEL_SIZE="tiny")
    assert result.settings["DOCUMENT_MASK"] is False
    words = _words(result)
    assert "--reset-attention-mask" not in words and "--reset-position-ids" not in words
    assert "not kept apart" in _notice(result)


@pytest.mark.parametrize("spelling", ["toggle", "flag"])
def test_the_toggle_and_megatrons_flag_are_one_setting(base_env, spelling):
    if spelling == "toggle":
        result = launch(base_env, MODEL_SIZE="tiny", DOCUMENT_MASK="1")
    else:
        result = launch(base_env, words=["--reset-attention-mask"], MODEL_SIZE="tiny")
    s = result.settings
    assert s["DOCUMENT_MASK"] is True
    assert s.setting("DOCUMENT_MASK").source == ("env" if spelling == "toggle" else "cli")
    words = _words(result)
    assert words.count("--reset-attention-mask") == 1 and words.count("--reset-position-ids") == 1
    assert "--no-fused-single-qkv-rope" in words and "--fused-single-qkv-rope" not in words
    assert s.setting("RESET_POSITION_IDS").source == "guard"
    assert s.setting("FUSED_SINGLE_QKV_ROPE").source == "guard"
    assert "kept apart" in _notice(result) and "not kept" not in _notice(result)
    args = megatron_args(result)            # megatron-core's parser and validate_args
    assert args.reset_attention_mask and args.reset_position_ids
    assert not args.create_attention_mask_in_dataloader and not args.fused_single_qkv_rope


@pytest.mark.parametrize("toggles,words,expect", [
    ({"TRANSFORMER_IMPL": "local"}, None, "local backend"),
    ({"CUDA_GRAPH": "full_iteration"}, None, "CUDA_GRAPH=none"),
    ({"PP": "2", "MBS": "2", "GPUS_PER_NODE": "2", "BS": "8"}, None, "MBS=1"),
    ({"PP": "2", "GPUS_PER_NODE": "2", "BS": "8"}, None, "use PP=1"),
    ({}, ["--attention-dropout", "0.1"], "attention dropout"),
    ({"FUSED_SINGLE_QKV_ROPE": "1"}, None, "FUSED_SINGLE_QKV_ROPE=0"),
    ({"RESET_POSITION_IDS": "0"}, None, "Unset RESET_POSITION_IDS"),
])
def test_what_the_packed_layout_cannot_run_is_refused_before_torchrun(base_env, toggles, words,
                                                                      expect):
    assert expect in _refusal(base_env, words, DOCUMENT_MASK="1", **toggles)


def test_context_parallel_with_documents_is_refused(base_env):
    message = _refusal(base_env, DOCUMENT_MASK="1", CP="2", PLATFORM="h200",
                       GPUS_PER_NODE="2", BS="8")
    assert "CP=1" in message


@pytest.mark.parametrize("words,toggles", [(["--reset-position-ids"], {}),
                                           (None, {"RESET_POSITION_IDS": "1"})])
def test_positions_reset_alone_would_change_nothing_under_rope_and_is_refused(base_env, words,
                                                                              toggles):
    assert "DOCUMENT_MASK=1" in _refusal(base_env, words, **toggles)


def test_transformer_engine_takes_documents(base_env):
    result = launch(base_env, MODEL_SIZE="tiny", DOCUMENT_MASK="1", PLATFORM="h200")
    assert result.settings["TRANSFORMER_IMPL"] == "transformer_engine"
    assert "--reset-attention-mask" in _words(result)


BASE = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
        "--seq-length", "64", "--max-position-embeddings", "64", "--micro-batch-size", "1",
        "--transformer-backend", "native", "--native-kernels", "torch", "--train-iters", "2",
        "--position-embedding-type", "rope", "--attention-dropout", "0.0"]


def test_a_plain_torchrun_derives_what_the_launcher_does():
    argv, notes = as_the_launcher(BASE + ["--reset-attention-mask"])
    assert "--no-fused-single-qkv-rope" in argv and "--reset-position-ids" in argv
    assert any("packed" in n for n in notes)
    with pytest.raises(ArgumentConflict, match="Drop --fused-single-qkv-rope"):
        as_the_launcher(BASE + ["--reset-attention-mask", "--fused-single-qkv-rope"])
    with pytest.raises(ArgumentConflict, match="local backend"):
        as_the_launcher([w if w != "native" else "local" for w in BASE]
                        + ["--reset-attention-mask"])
    with pytest.raises(ArgumentConflict, match="attention dropout 0.1"):   # Megatron's default
        as_the_launcher(BASE[:-2] + ["--reset-attention-mask"])
    with pytest.raises(ArgumentConflict, match="rotary embedding takes no position ids"):
        as_the_launcher(BASE + ["--reset-position-ids"])
    plain, _ = as_the_launcher(BASE)
    assert "--reset-position-ids" not in plain
