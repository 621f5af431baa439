"""Megatron flags after the script name that the launcher builds itself are mapped onto their
toggle (the guards see them, the run folder is named by them, Megatron gets the flag once)
or refused with the knob to set instead (issue 20)."""
from __future__ import annotations

import pytest

from training.launch.guards import Refusals
from training.launch.settings import BadInput
from training.launch.toggles import BY_NAME, DISTRIBUTED_ARGS, MEGATRON_BUCKETS, REGISTRY
from training.launch.userflags import LAUNCHER_WORDS, flag_owners, map_flags

from .helpers import launch

OWNERS = flag_owners(REGISTRY)

# Launches that between them emit every kind of flag the launcher builds.
SHAPES = [
    {},
    {"PLATFORM": "h200", "PRECISION": "fp8", "RECOMPUTE": "selective"},
    {"PLATFORM": "b300", "PRECISION": "mxfp8"},
    {"PLATFORM": "b300", "PRECISION": "nvfp4", "FP4_SELECTIVE_BF16": "1"},
    {"TRANSFORMER_IMPL": "local", "RECOMPUTE": "full", "MODEL_SIZE": "tiny"},
    {"PROFILE": "torch", "NAN_CHECK": "bucket", "MANUAL_GC_INTERVAL": "10",
     "MODEL_SIZE": "3.1-8B", "GRADIENT_ACCUMULATION_FUSION": "0"},
    {"PLATFORM": "h200", "GPUS_PER_NODE": "8", "FSDP": "1", "TP": "1", "SAVE": "/tmp/ckpt",
     "SAVE_INTERVAL": "5", "DETERMINISTIC": "1", "SEQUENCE_PARALLEL": "0"},
    {"PLATFORM": "h200", "GPUS_PER_NODE": "2", "TP": "2", "LR_DECAY_ITERS": "10"},
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: ",".join(s) or "default")
def test_every_flag_a_launch_emits_has_an_owner(base_env, shape):
    family = "llama2" if shape.get("MODEL_SIZE") == "13B" else "llama3"
    result = launch(base_env, family=family, **shape)
    for bucket in (*MEGATRON_BUCKETS, DISTRIBUTED_ARGS):
        for word in result.buckets[bucket]:
            if word.startswith("--"):
                assert word in OWNERS, f"{word} ({bucket}) has no owner in the registry"


# The MoE family (its presets and recipe layer, training/moe): each published preset's words
# and the layer's flags, on the native and TE backends.
MOE_SHAPES = [("qwen3_moe", {"MODEL_SIZE": "30B-A3B", "GPUS_PER_NODE": "8", "EP": "8"}),
              ("mixtral", {"MODEL_SIZE": "8x7B", "PLATFORM": "h200", "GPUS_PER_NODE": "8",
                           "EP": "8", "MOE_CAPACITY_FACTOR": "1.25"}),
              ("qwen3_moe", {"MODEL_SIZE": "tiny", "MOE_TOKEN_DISPATCHER": "allgather"})]


@pytest.mark.parametrize("family,shape", MOE_SHAPES, ids=lambda s: s if isinstance(s, str) else "")
def test_every_flag_an_moe_launch_emits_has_an_owner(base_env, family, shape):
    """A word of an MoE preset (--num-experts, --qk-layernorm, ...) or of the MoE layer given
    after the script name is mapped or refused like the dense ones, never passed twice."""
    from training.launch.resolve import resolve
    from training.moe import presets  # noqa: F401 - registers the MoE families
    from training.moe.layer import MOE

    result = resolve(family, dict(base_env, DRY_RUN="1", **shape), layers=[MOE])
    owners = flag_owners(result.ctx.toggles)
    for bucket in (*MEGATRON_BUCKETS, DISTRIBUTED_ARGS):
        for word in result.buckets[bucket]:
            if word.startswith("--"):
                assert word in owners, f"{word} ({bucket}) has no owner"


@pytest.mark.parametrize("flag", sorted(OWNERS))
def test_each_owned_flag_is_mapped_or_refused(flag):
    owner = OWNERS[flag]
    mapping = map_flags([flag, "7", "--log-params-norm"], OWNERS, BY_NAME)
    assert "--log-params-norm" in mapping.kept
    assert (flag in mapping.kept) == (owner.how == "given")
    if owner.how == "given":
        assert mapping.kept == [flag, "7", "--log-params-norm"] and not mapping.problems
    elif owner.how == "value":
        assert mapping.values == [(owner.toggle, "7", f"{flag} 7")] and not mapping.problems
    elif owner.how in ("on", "off"):
        assert mapping.values == [(owner.toggle, "1" if owner.how == "on" else "0", flag)]
        assert mapping.kept == ["7", "--log-params-norm"]   # a stray word stays Megatron's
    else:
        assert not mapping.values and len(mapping.problems) == 1
        name = owner.toggle or ""
        assert (f"set {name}=" in mapping.problems[0] if owner.toggle
                else LAUNCHER_WORDS[flag] in mapping.problems[0])


@pytest.mark.parametrize("words,env,toggle,value", [
    (["--tensor-model-parallel-size", "4"], {"GPUS_PER_NODE": "4"}, "TP", 4),
    (["--micro-batch-size=2"], {}, "MBS", 2),
    (["--lr", "1e-4"], {}, "LR", 1e-4),
    (["--seq-length", "4096"], {}, "SEQ_LENGTH", 4096),
    (["--num-layers", "8"], {}, "NUM_LAYERS", 8),
    (["--no-gradient-accumulation-fusion"], {}, "GRADIENT_ACCUMULATION_FUSION", False),
    (["--transformer-backend", "local"], {}, "TRANSFORMER_IMPL", "local"),
    (["--global-batch-size", "64"], {}, "BS", 64),
    (["--master-port", "31000"], {}, "MASTER_PORT", 31000),
])
def test_a_mapped_flag_is_the_toggle(base_env, words, env, toggle, value):
    result = launch(base_env, words=["--log-params-norm", *words], **env)
    setting = result.settings.setting(toggle)
    assert setting.value == value and setting.source == "cli"
    assert words[0].split("=")[0] in setting.reason
    assert "--log-params-norm" in result.user_args
    flag = words[0].split("=")[0]
    command = result.command
    assert command.count(flag) <= 1 and flag not in result.user_args


def test_a_preset_default_flag_replaces_the_presets_word(base_env):
    result = launch(base_env, words=["--hidden-dropout", "0.1"])
    command = result.command
    assert command.count("--hidden-dropout") == 1
    assert command[command.index("--hidden-dropout") + 1] == "0.1"
    assert result.buckets["GPT_ARGS"].count("--attention-dropout") == 1


def test_the_run_folder_is_named_by_the_flag(base_env):
    result = launch(base_env, GPUS_PER_NODE=4, words=["--tensor-model-parallel-size", "4"])
    assert "_tp4pp1" in str(result.log_dir)
    words = result.command
    assert words[words.index("--tensor-model-parallel-size") + 1] == "4"


def test_the_guards_see_a_mapped_flag(base_env):
    with pytest.raises(Refusals, match=r"\[parallel_sizes\] BS=128 is not a multiple of MBS"):
        launch(base_env, GPUS_PER_NODE=4, words=["--micro-batch-size", "7"])


def test_flags_inside_extra_megatron_args_are_mapped_too(base_env):
    result = launch(base_env, EXTRA_MEGATRON_ARGS="--micro-batch-size 2 --exit-duration-in-mins 3")
    assert result.settings["MBS"] == 2 and result.ctx.extra_args == ["--exit-duration-in-mins", "3"]


def test_a_flag_that_contradicts_the_toggle_is_refused(base_env):
    with pytest.raises(Refusals, match=r"--tensor-model-parallel-size 4 contradicts TP=2"):
        launch(base_env, TP=2, GPUS_PER_NODE=4, words=["--tensor-model-parallel-size", "4"])
    with pytest.raises(Refusals, match=r"contradicts --micro-batch-size 2"):
        launch(base_env, words=["--micro-batch-size", "2", "--micro-batch-size", "4"])
    assert launch(base_env, TP=2, GPUS_PER_NODE=2,
                  words=["--tensor-model-parallel-size", "2"]).settings["TP"] == 2


@pytest.mark.parametrize("words,needle", [
    (["--hidden-size", "5120"], "set MODEL_SIZE="),
    (["--recompute-granularity", "full"], "set RECOMPUTE="),
    (["--manual-gc"], "set MANUAL_GC_INTERVAL="),
    (["--data-path", "a", "b"], "set DATA_PATH="),
    (["--run-dir", "/tmp/x"], "the run folder"),
    (["--distributed-backend", "gloo"], "the launcher"),
    (["--sequence-parallel=1"], "takes no value"),
    (["--tensor-model-parallel-size"], "takes one value"),
])
def test_built_flags_are_refused_with_what_to_set(base_env, words, needle):
    with pytest.raises(Refusals) as err:
        launch(base_env, words=words)
    assert "[flags_against_settings]" in str(err.value) and needle in str(err.value)
    assert str(err.value).count("\n") == 0


def test_a_bad_value_names_the_flag(base_env):
    with pytest.raises(BadInput, match=r"^--tensor-model-parallel-size four after the script"):
        launch(base_env, words=["--tensor-model-parallel-size", "four"])
    with pytest.raises(BadInput, match="out of range"):
        launch(base_env, words=["--lr", "-1"])
