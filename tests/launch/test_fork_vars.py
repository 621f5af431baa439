"""Every variable of ROCm Megatron-LM's train_llama3.sh / train_llama2.sh (and those its README
and AMD's docs give them) is honoured with its meaning or refused with what to use instead:
generated from training/launch/fork_vars.py (issue 20)."""
from __future__ import annotations

import importlib.util
import io

import pytest

from training.launch import fork_docs, fork_vars
from training.launch.__main__ import shell_assignments
from training.launch.environment import MASK
from training.launch.guards import Refusals
from training.launch.manifest import fork_rows
from training.launch.report import print_report
from training.launch.settings import BadInput, LaunchError
from training.launch.toggles import BY_ALIAS, BY_NAME, parse_value

from .helpers import launch

# What the fork's scripts read, transcribed from them (SOURCES' commits): `${NAME:-default}`
# and the variables they test ($DATA_PATH, $SAVE_CKPT_PATH, $LOAD_CKPT_PATH, $WANDB_API_KEY);
# GPUS_PER_NODE and EXPERIMENT_DIR are assigned by the scripts, never read.
READ_BY_TRAIN_LLAMA3 = {
    "GPU_MAX_HW_QUEUES", "TORCH_NCCL_HIGH_PRIORITY", "NCCL_CHECKS_DISABLE", "NCCL_IB_HCA",
    "NCCL_IB_GID_INDEX", "NCCL_CROSS_NIC", "CUDA_DEVICE_MAX_CONNECTIONS", "NCCL_PROTO",
    "RCCL_MSCCL_ENABLE", "TOKENIZERS_PARALLELISM", "HSA_NO_SCRATCH_RECLAIM", "EXP_NAME",
    "TEE_OUTPUT", "USE_FLASH_ATTN", "NO_TRAINING", "ENABLE_PROFILING", "MASTER_ADDR",
    "MASTER_PORT", "NNODES", "NODE_RANK", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME",
    "MODEL_SIZE", "TP", "PP", "CP", "MBS", "BS", "SEQ_LENGTH", "TOTAL_ITERS", "SEQ_PARALLEL",
    "CONTI_PARAMS", "TE_FP8", "TE_FP8_RECIPE", "TE_FP4", "TE_FP4_RECIPE", "FP4_PARAM_GATHER",
    "FP4_SELECTIVE_BF16", "FP4_BF16_START", "FP4_BF16_END", "GRADIENT_ACCUMULATION_FUSION",
    "DDP_AVERAGE_IN_COLLECTIVE", "CROSS_ENTROPY_LOSS_FUSION", "CROSS_ENTROPY_FUSION_IMPL",
    "FUSED_SINGLE_QKV_ROPE", "GRAD_REDUCE_IN_BF16", "GEMM_TUNING", "MCORE", "OPTIMIZER", "FSDP",
    "RECOMPUTE", "TOKENIZER_TYPE", "TOKENIZER_MODEL", "ROPE_FUSION", "LOG_INTERVAL",
    "EVAL_INTERVAL", "SAVE_INTERVAL", "EVAL_ITERS", "CKPT_FORMAT", "DATA_CACHE_PATH",
    "MEGATRON_FSDP", "FP8_PARAM_GATHER", "FP8_TRANSPOSE_CACHE", "ENABLE_HSDP",
    "HSDP_NUM_REPLICAS", "LOG_DIR", "DATA_PATH", "SAVE_CKPT_PATH", "LOAD_CKPT_PATH",
    "WANDB_API_KEY"}
READ_BY_TRAIN_LLAMA2 = READ_BY_TRAIN_LLAMA3 - {
    "TE_FP4", "TE_FP4_RECIPE", "FP4_PARAM_GATHER", "FP4_SELECTIVE_BF16", "FP4_BF16_START",
    "FP4_BF16_END", "GRADIENT_ACCUMULATION_FUSION", "DDP_AVERAGE_IN_COLLECTIVE",
    "CROSS_ENTROPY_LOSS_FUSION", "CROSS_ENTROPY_FUSION_IMPL", "FUSED_SINGLE_QKV_ROPE",
    "GRAD_REDUCE_IN_BF16", "ENABLE_HSDP", "HSDP_NUM_REPLICAS"}
NAMED_BY_THE_DOCS = {"MOCK_DATA", "NO_TORCH_COMPILE", "HF_TOKEN"}

# A value each variable is honoured with, and the companions it needs on an 8-GPU MI355X.
SAMPLES: dict[str, tuple[str, dict]] = {
    "MODEL_SIZE": ("70", {}), "TP": ("8", {}), "PP": ("2", {}), "CP": ("1", {}),
    "MBS": ("1", {}), "BS": ("8", {}), "SEQ_LENGTH": ("2048", {}), "TOTAL_ITERS": ("12", {}),
    "SEQ_PARALLEL": ("1", {"TP": "2"}), "FSDP": ("1", {}), "RECOMPUTE": ("1", {}),
    "TE_FP8": ("1", {}), "TE_FP8_RECIPE": ("delayed", {"TE_FP8": "1"}),
    "TE_FP4": ("0", {}), "TE_FP4_RECIPE": ("nvfp4", {"TE_FP4": "1", "PLATFORM": "b300"}),
    "FP4_SELECTIVE_BF16": ("1", {"TE_FP4": "1", "TE_FP4_RECIPE": "nvfp4", "PLATFORM": "b300"}),
    "FP4_BF16_START": ("2", {"TE_FP4": "1", "TE_FP4_RECIPE": "nvfp4", "PLATFORM": "b300"}),
    "FP4_BF16_END": ("8", {"TE_FP4": "1", "TE_FP4_RECIPE": "nvfp4", "PLATFORM": "b300"}),
    "FP4_PARAM_GATHER": ("1", {"TE_FP4": "1", "TE_FP4_RECIPE": "nvfp4", "PLATFORM": "b300"}),
    "FP8_PARAM_GATHER": ("1", {"TE_FP8": "1"}),
    "CROSS_ENTROPY_FUSION_IMPL": ("native", {}), "ROPE_FUSION": ("0", {}),
    "USE_FLASH_ATTN": ("1", {}), "GEMM_TUNING": ("1", {}), "ENABLE_PROFILING": ("1", {}),
    "EVAL_ITERS": ("10", {}), "CKPT_FORMAT": ("torch", {}),
    "DATA_CACHE_PATH": ("/tmp/data-cache", {}), "SAVE_CKPT_PATH": ("{tmp}/ckpt", {}),
    "LOG_DIR": ("{tmp}/logdir", {}), "EXP_NAME": ("perf", {}), "TEE_OUTPUT": ("0", {}),
    "MASTER_PORT": ("6000", {}), "NNODES": ("1", {}), "NODE_RANK": ("0", {}),
    "DATA_PATH": ("{tmp}/no-such-dataset", {}),
    "TOKENIZER_MODEL": ("NousResearch/Meta-Llama-3-8B", {}),
}
# Honoured by being read, and refused for what they name (no data here, no hub here).
REFUSED_SAMPLES = {"DATA_PATH": "data_path", "TOKENIZER_MODEL": "tokenizer_model"}
PLATFORM = {"PLATFORM": "mi355x", "GPUS_PER_NODE": "8"}


def _env(base_env, tmp_path, extra: dict) -> dict:
    env = dict(base_env, **PLATFORM)
    env.update({k: v.replace("{tmp}", str(tmp_path)) for k, v in extra.items()})
    return env


def _sample(var) -> tuple[str, dict]:
    if var.name in SAMPLES:
        return SAMPLES[var.name]
    return var.defaults.get("llama3") or var.defaults.get("llama2") or "1", {}


def test_the_list_holds_every_variable_the_scripts_read_and_the_docs_name():
    names = set(fork_vars.BY_NAME)
    assert READ_BY_TRAIN_LLAMA3 <= names, READ_BY_TRAIN_LLAMA3 - names
    assert READ_BY_TRAIN_LLAMA2 <= names and NAMED_BY_THE_DOCS <= names
    assert names <= READ_BY_TRAIN_LLAMA3 | NAMED_BY_THE_DOCS, names - READ_BY_TRAIN_LLAMA3
    assert len(fork_vars.FORK_VARS) == len(names)
    for var in fork_vars.FORK_VARS:
        assert var.kind in fork_vars.KINDS and var.meaning
        assert set(var.sources) <= set(fork_vars.SOURCES), var.name
        assert set(var.defaults) <= set(fork_vars.SCRIPTS), var.name
        if var.kind in ("accept", "refuse", "derive"):
            assert var.here, f"{var.name}: what to use instead"


def test_the_list_and_the_registry_agree():
    for var in fork_vars.FORK_VARS:
        if var.kind == "toggle":
            assert var.target == var.name and var.name in BY_NAME, var.name
        elif var.kind == "alias":
            toggle, _alias = BY_ALIAS[var.name]
            assert toggle.name == var.target
        elif var.kind == "derive":
            assert var.target in BY_NAME
        else:
            assert var.name not in BY_NAME and var.name not in BY_ALIAS, var.name
    listed = {v.name for v in fork_vars.FORK_VARS if v.kind == "alias"}
    assert set(BY_ALIAS) == listed        # every alias the registry knows is a fork variable


HONOURED = [v for v in fork_vars.FORK_VARS if v.kind in ("toggle", "alias")]


@pytest.mark.parametrize("source", ["env", "cli"])
@pytest.mark.parametrize("var", HONOURED, ids=lambda v: v.name)
def test_a_toggle_or_alias_is_shown_with_its_source(base_env, tmp_path, monkeypatch, var, source):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    raw, companions = _sample(var)
    raw = raw.replace("{tmp}", str(tmp_path))
    env = _env(base_env, tmp_path, companions)
    if source == "env":
        env[var.name] = raw
        words = []
    else:
        words = [f"{var.name}={raw}"]
    if var.name in REFUSED_SAMPLES:
        with pytest.raises(Refusals, match=rf"\[{REFUSED_SAMPLES[var.name]}\].*{var.name}"):
            launch(env, words=words)
        return
    result = launch(env, words=words)
    toggle = BY_NAME[var.target]
    if var.kind == "alias":
        alias = next(a for a in toggle.aliases if a.name == var.name)
        expect = parse_value(toggle, alias.translate(toggle, raw))
    else:
        expect = parse_value(toggle, raw)
    setting = result.settings.setting(var.target)
    assert (setting.value, setting.source) == (expect, source), setting
    if var.kind == "alias":
        assert var.name in setting.reason
    out = io.StringIO()
    print_report(result, out)
    assert f"│ {var.target} " in out.getvalue()


@pytest.mark.parametrize("var", [v for v in HONOURED if v.defaults.get("llama3")],
                         ids=lambda v: v.name)
def test_the_forks_own_default_is_honoured_or_refused_by_name(base_env, tmp_path, var):
    """Typed as the fork defaults it: honoured, or refused with a message naming it."""
    raw = var.defaults["llama3"]
    env = _env(base_env, tmp_path, {var.name: raw})
    try:
        result = launch(env)
    except LaunchError as err:
        assert var.name in str(err) or var.target in str(err), str(err)
        return
    setting = result.settings.setting(var.target)
    # honoured, or overridden loudly by a guard (SEQ_PARALLEL=1 at TP=1), never silently
    assert setting.source == "env" or (setting.source == "guard" and setting.requested is not None)


ACCEPTED = [v for v in fork_vars.FORK_VARS if v.kind == "accept"]


@pytest.mark.parametrize("var", ACCEPTED, ids=lambda v: v.name)
def test_an_accepted_value_is_shown_and_any_other_refused(base_env, tmp_path, var):
    for raw in var.accept:
        extra = {"DATA_PATH": ""} if var.name != "MOCK_DATA" or raw == "1" else None
        if extra is None:
            continue              # MOCK_DATA=0 needs a dataset: see the next test
        env = _env(base_env, tmp_path, {var.name: raw})
        result = launch(env)
        row = fork_rows(result)[var.name]
        assert (row["value"], row["source"]) == (raw, "env")
        out = io.StringIO()
        print_report(result, out)
        assert f"│ {var.name} " in out.getvalue() and "FORK" in out.getvalue()
    with pytest.raises(Refusals) as err:
        launch(_env(base_env, tmp_path, {}), words=[f"{var.name}=not-{var.accept[0]}"])
    assert f"[fork_variables] {var.name}=not-" in str(err.value)
    assert var.here[:40] in str(err.value)


def test_mock_data_agrees_with_data_path(base_env, tmp_path):
    with pytest.raises(Refusals, match="MOCK_DATA=0 needs DATA_PATH"):
        launch(_env(base_env, tmp_path, {"MOCK_DATA": "0"}))
    with pytest.raises(Refusals, match="MOCK_DATA=1 with DATA_PATH set"):
        launch(_env(base_env, tmp_path, {"MOCK_DATA": "1", "DATA_PATH": str(tmp_path / "d")}))


@pytest.mark.parametrize("var", [v for v in fork_vars.FORK_VARS if v.kind == "refuse"],
                         ids=lambda v: v.name)
def test_a_refused_variable_says_what_to_use(base_env, tmp_path, var):
    for source in ("env", "cli"):
        env = _env(base_env, tmp_path, {var.name: "x"} if source == "env" else {})
        with pytest.raises(Refusals) as err:
            launch(env, words=[] if source == "env" else [f"{var.name}=x"])
        assert str(err.value) == f"[fork_variables] {var.name}=x: {var.here}."


ENVIRONMENT = [v for v in fork_vars.FORK_VARS if v.kind == "env"]


@pytest.mark.parametrize("var", ENVIRONMENT, ids=lambda v: v.name)
def test_an_environment_variable_reaches_the_run_and_is_shown(base_env, tmp_path, var):
    result = launch(_env(base_env, tmp_path, {var.name: "v1"}))
    value, source, _why = result.env[var.name]
    assert (value, source) == ("v1", "env")
    out = io.StringIO()
    print_report(result, out)
    assert f"│ {var.name} " in out.getvalue()
    if var.name == "HF_TOKEN":
        assert "v1" not in out.getvalue() and MASK in out.getvalue()
    # as a word after the script: exported to the run
    result = launch(_env(base_env, tmp_path, {}), words=[f"{var.name}=w2"])
    assert f"export {var.name}=w2" in shell_assignments(result)


def test_wandb_api_key_turns_wandb_logging_on_or_says_why_not(base_env, tmp_path):
    env = _env(base_env, tmp_path, {"WANDB_API_KEY": "k3y"})
    if importlib.util.find_spec("wandb") is None:
        result = launch(env)
        assert result.settings.get("WANDB_PROJECT") is None
        assert any(n.guard == "wandb_logging" for n in result.settings.notices)
        with pytest.raises(Refusals, match=r"\[wandb_logging\] STRICT=1"):
            launch(dict(env, STRICT="1"))
        with pytest.raises(Refusals, match=r"\[wandb_logging\] WANDB_PROJECT=p"):
            launch(dict(env, WANDB_PROJECT="p"))
    else:
        result = launch(env)
        assert result.settings["WANDB_PROJECT"] == "LLama"
        assert "--wandb-project" in result.buckets["OUTPUT_ARGS"]
    assert fork_rows(result)["WANDB_API_KEY"]["value"] == MASK


def test_strict_knows_every_variable_of_the_fork(base_env, tmp_path):
    """STRICT=1 covers them: none is an unknown lookalike; each is honoured or refused."""
    env = _env(base_env, tmp_path, {"STRICT": "1"})
    for var in fork_vars.FORK_VARS:
        if var.kind == "accept":
            env[var.name] = var.accept[-1] if var.name != "MOCK_DATA" else "1"
    result = launch(env)
    assert not result.ctx.lookalikes


@pytest.mark.parametrize("family,size,preset", [("llama3", "8", "llama3-8B"),
                                                ("llama3", "70", "llama3-70B"),
                                                ("llama2", "7", "llama2-7B"),
                                                ("llama2", "13", "llama2-13B"),
                                                ("llama2", "70", "llama2-70B")])
def test_numeric_model_size_is_the_forks_spelling(base_env, family, size, preset):
    result = launch(dict(base_env, GPUS_PER_NODE="8"), family=family, MODEL_SIZE=size)
    assert result.ctx.preset.name == preset
    assert "the ROCm fork's spelling" in result.settings.setting("MODEL_SIZE").reason
    with pytest.raises(BadInput):
        launch(base_env, family="llama3", MODEL_SIZE="7")


@pytest.mark.parametrize("raw,value", [("0", "none"), ("1", "full")])
def test_recompute_0_and_1_are_the_forks_spellings(base_env, raw, value):
    assert launch(base_env, RECOMPUTE=raw).settings["RECOMPUTE"] == value


def test_two_spellings_of_one_knob_must_agree(base_env):
    with pytest.raises(Refusals, match=r"\[fork_variables\].*SEQ_PARALLEL=1.*SEQUENCE_PARALLEL"):
        launch(base_env, TP=2, GPUS_PER_NODE=2, words=["SEQ_PARALLEL=1", "SEQUENCE_PARALLEL=0"])
    # the word wins over the environment, as for any knob
    result = launch(dict(base_env, SEQ_PARALLEL="0"), TP=2, GPUS_PER_NODE=2,
                    words=["SEQUENCE_PARALLEL=1"])
    assert result.settings["SEQUENCE_PARALLEL"] is True


def _fork_line(result) -> str | None:
    lines = [n.message for n in result.settings.notices if n.guard == "fork_defaults"]
    assert len(lines) <= 1
    return lines[0] if lines else None


def test_one_line_says_where_the_forks_defaults_differ(base_env):
    # someone who never used the fork is not told about it
    assert _fork_line(launch(dict(base_env, GPUS_PER_NODE="8"))) is None
    # a variable of the fork's scripts (its spelling of a toggle, or one of its own) is given
    line = _fork_line(launch(dict(base_env, GPUS_PER_NODE="8", TE_FP8="0")))
    assert line.startswith("the ROCm fork's train_llama3.sh would run MODEL_SIZE=70B TP=8 BS=8 "
                           "SEQ_LENGTH=2048 TOTAL_ITERS=12 with these variables; this launcher "
                           "runs MODEL_SIZE=8B TP=1 BS=128 SEQ_LENGTH=8192 TOTAL_ITERS=20")
    # the command: only what it left unset
    line = _fork_line(launch(dict(base_env, GPUS_PER_NODE="8", TEE_OUTPUT="1", MBS="5",
                                  BS="120", TP="8", TE_FP8="0", SEQ_LENGTH="4096")))
    assert "would run MODEL_SIZE=70B TOTAL_ITERS=12 with" in line
    assert "set MODEL_SIZE=70B TOTAL_ITERS=12 for the fork's run" in line
    everything = dict(base_env, GPUS_PER_NODE="8", MODEL_SIZE="70", TP="8", BS="8",
                      SEQ_LENGTH="2048", TOTAL_ITERS="12")
    assert _fork_line(launch(everything)) is None
    assert _fork_line(launch(dict(base_env, GPUS_PER_NODE="8", GPU_MAX_HW_QUEUES="2")))
    line = _fork_line(launch(dict(base_env, GPUS_PER_NODE="8", TE_FP8="0"), family="llama2"))
    assert "train_llama2.sh" in line and "SEQ_LENGTH" not in line   # 4096 either way


def test_the_page_is_generated_and_names_every_variable():
    assert fork_docs.main(["--check"]) == 0, "run python -m training.launch.fork_docs"
    text = fork_docs.PAGE.read_text()
    for var in fork_vars.FORK_VARS:
        assert f"| `{var.name}` |" in text
    for _source, command, _outcome in fork_vars.DOCUMENTED_COMMANDS:
        assert command.replace("\n", " ⏎ ") in text
