"""The toggle registry against megatron-core's own parser and torchrun's."""
from __future__ import annotations

import json

import pytest

from training.launch.toggles import (BY_NAME, DISTRIBUTED_ARGS, GROUP_TO_BUCKET,
                                     MEGATRON_BUCKETS, PERF_TOGGLES, REGISTRY)

from .helpers import flag_groups, launch

PERF_FLAGS = {
    # toggle: (bucket, words when on, words when off)
    "GRADIENT_ACCUMULATION_FUSION": ("TRAIN_ARGS", [], ["--no-gradient-accumulation-fusion"]),
    "GRAD_REDUCE_IN_BF16": ("GPT_ARGS", ["--grad-reduce-in-bf16"], []),
    "DDP_AVERAGE_IN_COLLECTIVE": ("EXTRA_ARGS", ["--ddp-average-in-collective"], []),
    "CROSS_ENTROPY_LOSS_FUSION": ("GPT_ARGS", ["--cross-entropy-loss-fusion"], []),
    "FUSED_SINGLE_QKV_ROPE": ("GPT_ARGS", ["--fused-single-qkv-rope"],
                              ["--no-fused-single-qkv-rope"]),
}


def test_the_five_default_on_toggles_are_registered_on():
    assert {t.name for t in PERF_TOGGLES} == set(PERF_FLAGS)
    assert all(t.default is True and t.kind == "bool" for t in PERF_TOGGLES)


@pytest.mark.parametrize("toggle", [t for t in REGISTRY if t.megatron_flags
                                    and t.bucket in MEGATRON_BUCKETS], ids=lambda t: t.name)
def test_each_flag_lives_in_the_megatron_group_of_its_bucket(toggle):
    groups = flag_groups()
    for flag in toggle.megatron_flags:
        assert flag in groups, f"{toggle.name}: {flag} is not a megatron-core 0.19.2 flag"
        assert GROUP_TO_BUCKET.get(groups[flag]) == toggle.bucket, (
            f"{toggle.name}: {flag} is defined in Megatron group {groups[flag]!r}, "
            f"which routes to {GROUP_TO_BUCKET.get(groups[flag])}, not {toggle.bucket}")


def test_every_word_the_launcher_emits_is_routed_by_its_megatron_group(base_env):
    """Not just registry flags: every --flag in every bucket of a full launch."""
    groups = flag_groups()
    result = launch(base_env, PRECISION="bf16", RECOMPUTE="full", PROFILE="torch",
                    TOTAL_ITERS=20, DATA_PATH="", SAVE="/tmp/ckpt")
    for bucket in MEGATRON_BUCKETS:
        for word in result.buckets[bucket]:
            if word.startswith("--"):
                assert word in groups, f"{word} is not a Megatron flag"
                assert GROUP_TO_BUCKET[groups[word]] == bucket, (word, groups[word], bucket)


def test_torchrun_flags_exist():
    from torch.distributed.run import get_args_parser

    options = {o for a in get_args_parser()._actions for o in a.option_strings}
    for toggle in REGISTRY:
        if toggle.bucket == DISTRIBUTED_ARGS:
            assert toggle.flag in options, toggle.name


@pytest.mark.parametrize("name", sorted(PERF_FLAGS))
@pytest.mark.parametrize("value", [0, 1])
def test_perf_toggle_on_and_off_lands_in_its_bucket(base_env, name, value):
    bucket, on_words, off_words = PERF_FLAGS[name]
    result = launch(base_env, PLATFORM="h200", TRANSFORMER_IMPL="transformer_engine",
                    **{name: value})
    words = on_words if value else off_words
    assert result.emitted[name] == words
    for word in on_words + off_words:
        present = word in result.buckets[bucket]
        assert present == (word in words), (name, value, word)
        for other in MEGATRON_BUCKETS:
            if other != bucket:
                assert word not in result.buckets[other]
    setting = result.settings.setting(name)
    assert setting.value is bool(value) and setting.source == "env"


def test_cross_entropy_impl_only_emitted_with_the_fusion(base_env):
    on = launch(base_env)
    off = launch(base_env, CROSS_ENTROPY_LOSS_FUSION=0)
    assert "--cross-entropy-fusion-impl" in on.buckets["GPT_ARGS"]
    assert "--cross-entropy-fusion-impl" not in off.buckets["GPT_ARGS"]


def test_registry_names_are_unique_and_typed():
    assert len(BY_NAME) == len(REGISTRY)
    for toggle in REGISTRY:
        assert toggle.kind in ("bool", "int", "float", "str", "choice", "path")
        if toggle.kind == "choice":
            assert toggle.choices and (toggle.default is None or toggle.default in toggle.choices)


def test_megatron_alone_has_no_fused_single_qkv_rope_flag_and_ours_adds_it():
    """megatron-core 0.19.2 has the TransformerConfig field but its parser exits 2 on the flag;
    training/arguments.py adds it, and core_transformer_config_from_args copies it over."""
    import argparse
    import contextlib
    import io

    from megatron.core.transformer import TransformerConfig
    from megatron.training.arguments import add_megatron_arguments

    stock = argparse.ArgumentParser(allow_abbrev=False)
    add_megatron_arguments(stock)
    with pytest.raises(SystemExit) as exit_info, contextlib.redirect_stderr(io.StringIO()):
        stock.parse_args(["--fused-single-qkv-rope"])
    assert exit_info.value.code == 2
    assert "fused_single_qkv_rope" in TransformerConfig.__dataclass_fields__
    from .helpers import megatron_parser

    assert megatron_parser().parse_args(["--fused-single-qkv-rope"]).fused_single_qkv_rope


def test_extra_megatron_args_from_the_environment(base_env):
    result = launch(base_env, EXTRA_MEGATRON_ARGS="--exit-duration-in-mins 25 --log-num-zeros-in-grad",
                    words=["--log-params-norm"])
    words = ["--exit-duration-in-mins", "25", "--log-num-zeros-in-grad", "--log-params-norm"]
    assert result.user_args == words and result.command[-4:] == words


def test_each_toggle_says_how_its_flags_are_built():
    """A value flag, an emit of its own, or the entry whose emit builds it."""
    for toggle in REGISTRY:
        if toggle.emitted_by and toggle.emitted_by != "passthrough":
            owner = BY_NAME[toggle.emitted_by]
            assert owner.emit is not None, (toggle.name, owner.name)
        if toggle.emit is not None:
            assert toggle.emit.__doc__, f"{toggle.name}: its emit needs a one-line docstring"


def test_the_bucket_builder_has_no_toggle_specific_case():
    import inspect

    from training.launch import resolve

    source = inspect.getsource(resolve.build_buckets)
    assert [name for name in BY_NAME if f'"{name}"' in source] == []



def test_the_recorded_megatron_flags_are_the_installed_parsers():
    """training/launch/megatron_flags.json (what a user's --flags are checked against before
    torchrun) is what megatron-core's parser with ours accepts: rerun
    `python -m training.launch.megatron_flags` after a Megatron or training/arguments.py change."""
    from training.launch.megatron_flags import RECORD, from_parser

    assert json.loads(RECORD.read_text())["flags"] == from_parser()["flags"]
