"""The llama31_8b recipe and the guard mlperf_closed_rules: closed refuses a break, open warns."""
from __future__ import annotations

import math
import re

import pytest
import yaml

from training.launch.guards import Refusals
from training.launch.resolve import resolve
from training.mlperf import rcp as rcp_mod
from training.mlperf import rules as rules_mod
from training.mlperf.launch import resolve_mlperf

RULES = rules_mod.load()


def mlperf(env, words=(), **toggles):
    environ = dict(env, **{k: str(v) for k, v in toggles.items()})
    return resolve_mlperf(environ, list(words))


def refusal_of(env, words=(), **toggles) -> str:
    with pytest.raises(Refusals) as err:
        mlperf(env, words, **toggles)
    refusals = err.value.refusals
    mine = [str(r) for r in refusals if r.guard == "mlperf_closed_rules"]
    assert mine, [str(r) for r in refusals]
    return mine[0]


def test_recipe_defaults_are_the_reference_and_shown_as_recipe(mlperf_env):
    launch, recipe, config = mlperf(mlperf_env)
    s = launch.settings
    expected = {"MLPERF_DIVISION": "closed", "MODEL_SIZE": "3.1-8B", "BS": 32, "LR": 8e-4,
                "MIN_LR": 8e-5, "WARMUP_ITERS": 128, "EVAL_INTERVAL": 384, "EVAL_ITERS": 32,
                "LR_DECAY_ITERS": 1_200_000, "LR_DECAY_STYLE": "cosine", "ADAM_EPS": 1e-5,
                "ADAM_BETA1": 0.9, "ADAM_BETA2": 0.95, "WEIGHT_DECAY": 0.1, "CLIP_GRAD": 1.0,
                "MLPERF_TARGET_LOSS": 3.3, "MLPERF_EVAL_SAMPLES": 1024,
                "MLPERF_EVAL_EVERY": 12288, "NUM_LAYERS": 32, "SEQ_LENGTH": 8192}
    for name, value in expected.items():
        assert s[name] == pytest.approx(value) if isinstance(value, float) else s[name] == value, name
    assert s.setting("ADAM_EPS").source == "recipe"
    assert "ceil(MLPERF_EVAL_EVERY 12288 / BS 32)" in s.setting("EVAL_INTERVAL").reason
    assert launch.ctx.preset.name == "llama3.1-8B"
    words = launch.buckets["TRAIN_ARGS"]
    assert words[words.index("--lr-decay-iters") + 1] == "1200000"
    assert config == {**config, "division": "closed", "target_eval_loss": 3.3,
                      "eval_samples": 1024, "benchmark": "llama31_8b"}
    assert not [n for n in s.notices if n.guard == "mlperf_closed_rules"]
    # the tests' validation set is not the reference's: named, with the reference's counts
    (other,) = [n.message for n in s.notices if n.guard == "mlperf_reference_data"]
    assert f"{RULES.reference_data['eval_dataset_tokens']:,}" in other


@pytest.mark.parametrize("name,value", [
    ("ADAM_EPS", "1e-8"), ("ADAM_BETA1", "0.8"), ("ADAM_BETA2", "0.999"),
    ("WEIGHT_DECAY", "0.0"), ("CLIP_GRAD", "0.5"), ("LR_DECAY_STYLE", "linear"),
    ("LR_DECAY_ITERS", "5000"), ("MLPERF_TARGET_LOSS", "3.5"), ("MLPERF_EVAL_EVERY", "6144"),
    ("MLPERF_EVAL_SAMPLES", "512"), ("MIN_LR", "0.0"), ("MODEL_SIZE", "8B"),
    ("NUM_LAYERS", "16"), ("SEQ_LENGTH", "4096"),
])
def test_a_closed_rule_broken_is_refused_and_open_warns(mlperf_env, name, value):
    message = refusal_of(mlperf_env, **{name: value})
    assert f"{name}=" in message and "MLPERF_DIVISION=open" in message
    launch, _, _ = mlperf(mlperf_env, MLPERF_DIVISION="open", **{name: value})
    warned = [n.message for n in launch.settings.notices if n.guard == "mlperf_closed_rules"]
    assert len(warned) == 1 and f"{name}=" in warned[0], warned


@pytest.mark.parametrize("rcp", rcp_mod.load(rules_mod.load().ruleset), ids=lambda r: r.name)
def test_free_batch_sizes_take_their_rcps_lr_and_warmup_and_rederive_the_cadence(mlperf_env, rcp):
    bs = rcp.batch_size
    launch, _, _ = mlperf(mlperf_env, BS=bs, GPUS_PER_NODE=8)
    s = launch.settings
    assert s["LR"] == pytest.approx(rcp.lr) and s["MIN_LR"] == pytest.approx(0.1 * rcp.lr)
    assert s["WARMUP_ITERS"] == math.ceil(rcp.warmup_samples / bs)
    assert (s["EVAL_INTERVAL"], s["EVAL_ITERS"]) == (math.ceil(12288 / bs), math.ceil(1024 / bs))
    assert f"the RCP of BS {bs}" in s.setting("LR").reason
    assert s["MLPERF_DIVISION"] == "closed"
    assert not [n for n in s.notices if n.guard == "mlperf_rcp"]


def test_a_batch_size_without_rcp_or_another_lr_is_named(mlperf_env):
    rcps = rcp_mod.load(rules_mod.load().ruleset)
    between = rcps[0].batch_size + 1
    launch, _, _ = mlperf(mlperf_env, BS=between, GPUS_PER_NODE=1)
    warned = [n.message for n in launch.settings.notices if n.guard == "mlperf_rcp"]
    assert len(warned) == 1 and f"no RCP for BS {between}" in warned[0]
    assert launch.settings["LR"] == pytest.approx(rcps[0].lr)
    launch, _, _ = mlperf(mlperf_env, BS=rcps[1].batch_size, LR=rcps[1].lr * 2, GPUS_PER_NODE=8)
    s = launch.settings
    warned = [n.message for n in s.notices if n.guard == "mlperf_rcp"]
    assert len(warned) == 1 and warned[0].startswith("LR=") and "RCP checker" in warned[0]
    assert s["MIN_LR"] == pytest.approx(0.2 * rcps[1].lr)      # 0.1 x the user's LR


def test_each_launch_draws_its_own_seed_and_closed_refuses_a_fixed_one(mlperf_env):
    seeds = {mlperf(mlperf_env)[0].settings["SEED"] for _ in range(3)}
    assert len(seeds) == 3
    launch, _, _ = mlperf(mlperf_env)
    assert launch.settings.setting("SEED").source == "recipe"
    words = launch.buckets["TRAIN_ARGS"]
    assert words[words.index("--seed") + 1] == str(launch.settings["SEED"])
    for env, words in (({"SEED": "1234"}, []), ({}, ["--seed", "7"])):
        with pytest.raises(Refusals) as err:
            resolve_mlperf({**mlperf_env, **env}, words)
        assert any(r.guard == "mlperf_seed" for r in err.value.refusals)
    launch, _, _ = mlperf(mlperf_env, SEED=1234, MLPERF_DIVISION="open")
    assert launch.settings["SEED"] == 1234
    assert any(n.guard == "mlperf_seed" for n in launch.settings.notices)


def test_closed_refuses_a_launch_that_cannot_drop_the_page_cache(mlperf_env):
    launch, _, config = mlperf(mlperf_env, MLPERF_CACHE_CLEAR_CMD="sudo -n /sbin/drop")
    assert (config["cache_clear"], config["cache_clear_cmd"]) == ("hook", "sudo -n /sbin/drop")
    with pytest.raises(Refusals) as err:
        resolve_mlperf({**mlperf_env, "MLPERF_CACHE_CLEAR_CMD": "'unbalanced"}, [])
    assert any(r.guard == "mlperf_cache_clear" for r in err.value.refusals)
    launch, _, config = mlperf(mlperf_env, MLPERF_CACHE_CLEAR_CMD="'unbalanced",
                               MLPERF_DIVISION="open")
    assert config["cache_clear"] == "none"
    assert any(n.guard == "mlperf_cache_clear" and n.level == "warning"
               for n in launch.settings.notices)


def test_eval_knobs_must_agree_with_the_mlperf_cadence_in_either_division(mlperf_env):
    for division in ("closed", "open"):
        message = refusal_of(mlperf_env, MLPERF_DIVISION=division, EVAL_INTERVAL=100)
        assert "EVAL_INTERVAL=100" in message and "MLPERF_EVAL_EVERY" in message
    message = refusal_of(mlperf_env, MLPERF_DIVISION="open", EVAL_ITERS=3)
    assert "EVAL_ITERS=3" in message and "= 32" in message


def test_closed_needs_separate_train_and_validation_sets(mlperf_env):
    env = {k: v for k, v in mlperf_env.items() if k != "VALID_DATA_PATH"}
    assert "VALID_DATA_PATH" in refusal_of(env)
    mock = {k: v for k, v in env.items() if k not in ("DATA_PATH", "TOKENIZER_MODEL")}
    launch, _, _ = mlperf(mock, MLPERF_DIVISION="open", MODEL_SIZE="tiny", SEQ_LENGTH=256)
    assert "--mock-data" in launch.buckets["DATA_ARGS"]


def test_a_blended_validation_set_is_refused(mlperf_env):
    valid = mlperf_env["VALID_DATA_PATH"]
    message = refusal_of(mlperf_env, MLPERF_DIVISION="open", VALID_DATA_PATH=f"0.5 {valid} 0.5 {valid}")
    assert "blend" in message


def test_rule_changing_megatron_flags_are_refused_in_closed_only(mlperf_env):
    assert "--hidden-dropout" in refusal_of(mlperf_env, ["--hidden-dropout", "0.1"])
    launch, _, _ = mlperf(mlperf_env, ["--hidden-dropout", "0.1"], MLPERF_DIVISION="open")
    assert launch.user_args == ["--hidden-dropout", "0.1"]
    launch, _, _ = mlperf(mlperf_env, ["--log-params-norm"])  # not a rule: allowed
    assert launch.user_args == ["--log-params-norm"]


def test_without_the_recipe_layer_the_core_knows_no_mlperf_knob(mlperf_env):
    """train_llama3.sh has no MLPerf knobs: the recipe (values, knobs, guard) comes with
    run_llama31_8b.sh's layer only. MLPERF_DIVISION given to it, in the environment or as a
    word, is refused with that script's name (it was silently ignored), never applied."""
    by_hand = {"MODEL_SIZE": "3.1-8B", "ADAM_EPS": "1e-5", "LR_DECAY_ITERS": "1200000"}
    launch = resolve("llama3", dict(mlperf_env, **by_hand))
    assert "MLPERF_DIVISION" not in launch.settings.values
    assert not [n for n in launch.settings.notices if n.guard == "mlperf_closed_rules"]
    assert launch.settings["LR_DECAY_ITERS"] == 1_200_000          # a core knob
    for env, words in (({"MLPERF_DIVISION": "closed"}, []), ({}, ["MLPERF_DIVISION=closed"])):
        with pytest.raises(Refusals) as err:
            resolve("llama3", dict(mlperf_env, **by_hand, **env), words)
        assert [r.guard for r in err.value.refusals] == ["layer_variables"]
        assert "run_llama31_8b.sh" in str(err.value)


def test_megatron_accepts_the_recipe_launch(mlperf_env):
    from tests.launch.helpers import megatron_args

    launch, _, _ = mlperf(mlperf_env, GPUS_PER_NODE=8)
    args = megatron_args(launch)
    assert (args.lr_decay_iters, args.lr_warmup_iters, args.train_iters) == (1_200_000, 128, 1_200_000)
    assert (args.eval_interval, args.eval_iters, args.global_batch_size) == (384, 32, 32)
    assert (args.adam_eps, args.min_lr, args.lr_decay_style) == (1e-5, 8e-5, "cosine")
    assert args.hidden_dropout == args.attention_dropout == RULES.dropout == 0.0
    assert args.use_rope_scaling and args.seq_length == 8192


def test_the_config_agrees_with_the_compliance_checkers_closed_rules():
    """config.yaml against mlperf-logging's own copy of the closed rules (ruleset 6.1.0)."""
    import importlib.resources

    text = (importlib.resources.files("mlperf_logging.compliance_checker")
            / f"training_{RULES.ruleset}" / "closed_llama31_8b.yaml").read_text()
    checks = {rec["KEY"]["NAME"]: rec["KEY"] for rec in yaml.safe_load(text) if "KEY" in rec}

    def number(key):
        found = re.search(r"==\s*([0-9][0-9_.]*(?:e-?[0-9]+)?)", checks[key]["CHECK"])
        return float(found.group(1).replace("_", ""))

    assert number("opt_adamw_epsilon") == RULES.closed["ADAM_EPS"]
    assert number("opt_adamw_beta_1") == RULES.closed["ADAM_BETA1"]
    assert number("opt_adamw_beta_2") == RULES.closed["ADAM_BETA2"]
    assert number("opt_adamw_weight_decay") == RULES.closed["WEIGHT_DECAY"]
    assert number("opt_gradient_clip_norm") == RULES.closed["CLIP_GRAD"]
    assert number("max_sequence_length") == RULES.model["SEQ_LENGTH"]
    assert number("eval_samples") == RULES.closed["MLPERF_EVAL_SAMPLES"]
    assert number("max_steps") == RULES.closed["LR_DECAY_ITERS"]
    assert number("opt_learning_rate_decay_steps") == RULES.closed["LR_DECAY_ITERS"]
    assert "cosine" in checks["opt_learning_rate_decay_schedule"]["CHECK"]
    assert f"<= {RULES.closed['MLPERF_TARGET_LOSS']}" in checks["eval_accuracy"]["ATLEAST_ONE_CHECK"]


def test_a_validation_set_smaller_than_one_evaluation_is_refused_before_the_run(mlperf_env,
                                                                                 mlperf_data):
    small = dict(mlperf_env, VALID_DATA_PATH=mlperf_data["SMALL_VALID"])
    message = refusal_of(small)
    assert "holds" in message and "first 1024 (EVAL_ITERS 32 x BS 32)" in message
    # open division with a shorter sequence and fewer evaluation samples fits it
    launch, _, _ = mlperf(small, MLPERF_DIVISION="open", SEQ_LENGTH=128, MLPERF_EVAL_SAMPLES=16,
                          BS=8)
    assert launch.settings["EVAL_ITERS"] == 2


def test_the_validation_size_check_sits_at_its_boundary(mlperf_env, mlperf_data, tmp_path):
    """One evaluation here reads 16 sequences of 128 tokens, each with its next token
    (consecutive sequences share one): 16 x 128 + 1 tokens. Exactly 16 x 128 is refused."""
    from .datasets import make_valid

    open_run = {"MLPERF_DIVISION": "open", "SEQ_LENGTH": 128, "MLPERF_EVAL_SAMPLES": 16, "BS": 8}
    for tokens in (16 * 128, 16 * 128 + 1):
        valid = make_valid(tmp_path, mlperf_data["TOKENIZER_MODEL"], tokens, documents=3,
                           name=f"valid_{tokens}")
        env = dict(mlperf_env, VALID_DATA_PATH=valid)
        if tokens == 16 * 128:
            message = refusal_of(env, **open_run)
            assert "holds 15 sequences of 128 tokens (2,048 tokens)" in message
        else:
            launch, _, _ = mlperf(env, **open_run)
            assert launch.settings["EVAL_ITERS"] == 2
