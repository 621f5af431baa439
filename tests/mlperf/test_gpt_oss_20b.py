"""MLPerf Training gpt_oss_20b on the MLPerf layer: the recipe's values from its config.yaml and
mlperf-logging's RCPs, synthesized runs (the real listener on Megatron args parsed and validated
by megatron-core, the stand-in loop, made-up losses) through the compliance checker in both
divisions, ten closed runs through the package, RCP and recipe checkers, and the data-less
DRY_RUN of the closed launch for PLATFORM=mi355x GPUS_PER_NODE=8."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys

import pytest

from training.mlperf import compliance, rules as rules_mod, submission, summary
from training.mlperf.launch import resolve_mlperf

from .synth import CountedDataset, losses_reaching, run_fake

RULES = rules_mod.load_benchmark("gpt_oss_20b")
REPO = rules_mod.REPO_ROOT


def _env(mlperf_env, **toggles):
    return dict(mlperf_env, GPUS_PER_NODE="8", EP="8", **{k: str(v) for k, v in toggles.items()})


def _value(launch, name):
    return launch.settings[name]


def test_the_recipe_is_the_benchmarks_rules():
    assert (RULES.benchmark, RULES.family, RULES.ruleset) == ("gpt_oss_20b", "gpt_oss", "6.1.0")
    assert RULES.closed["MLPERF_TARGET_LOSS"] == 3.34 and RULES.model["SEQ_LENGTH"] == 8192
    # the compliance checker's own file says the same
    import yaml
    from importlib.util import find_spec

    root = os.path.dirname(find_spec("mlperf_logging").origin)
    text = open(os.path.join(root, "compliance_checker", "training_6.1.0",
                             "closed_gpt_oss_20b.yaml")).read()
    checks = {k["KEY"]["NAME"]: k["KEY"].get("CHECK") for k in yaml.safe_load(text)}
    assert "3.34" in checks["eval_accuracy"]["ATLEAST_ONE_CHECK"] if isinstance(
        checks["eval_accuracy"], dict) else "3.34" in text
    assert "8192" in checks["max_sequence_length"] and "1024" in checks["eval_samples"]
    assert "1_200_000" in checks["opt_learning_rate_decay_steps"]


@pytest.mark.parametrize("bs,lr,warmup", [(16, 4e-4, 128), (32, 8e-4, 128), (64, 1e-3, 192)])
def test_lr_and_warmup_come_from_the_rcp_of_the_batch(mlperf_env, bs, lr, warmup):
    launch, recipe, config = resolve_mlperf(_env(mlperf_env, BS=bs), [], RULES)
    assert (_value(launch, "LR"), _value(launch, "WARMUP_ITERS")) == (lr, warmup)
    assert _value(launch, "MIN_LR") == pytest.approx(lr / 10)
    assert _value(launch, "EVAL_INTERVAL") == 12288 // bs and _value(launch, "EVAL_ITERS") == 1024 // bs
    assert (_value(launch, "MOE_AUX_LOSS_COEFF"), _value(launch, "MOE_LOAD_BALANCING")) == (0.0,
                                                                                          "none")
    assert launch.ctx.preset.name == "gpt-oss-20b-mlperf"
    assert config["benchmark"] == "gpt_oss_20b" and config["target_eval_loss"] == 3.34


def test_a_closed_rule_broken_is_refused_with_this_recipes_files(mlperf_env):
    from training.launch.guards import Refusals

    with pytest.raises(Refusals) as err:
        resolve_mlperf(_env(mlperf_env, MOE_AUX_LOSS_COEFF=0.01), [], RULES)
    text = str(err.value)
    assert "MOE_AUX_LOSS_COEFF=0.01 (rule: 0)" in text
    assert "run_gpt_oss_20b.sh" in text and "examples/mlperf/gpt_oss_20b/config.yaml" in text


def test_closed_run_reaches_the_target_and_passes_the_checker(mlperf_env):
    run, fake, last, log = run_fake(_env(mlperf_env), losses_reaching(3.34, 3), rules=RULES)
    assert last == 3 * 768 and run.result.status == "success"
    events = {e["key"]: e for e in summary.read_events(log)}
    assert events["submission_benchmark"]["value"] == "gpt_oss_20b"
    assert events["opt_learning_rate_decay_steps"]["value"] == 1_200_000 - 128
    report = compliance.check(log, "6.1.0")
    assert report.valid, compliance.render(report)
    assert "training_6.1.0/closed_gpt_oss_20b.yaml" in report.configs


def test_a_run_that_misses_the_target_fails_only_the_target(mlperf_env):
    run, _, _, log = run_fake(_env(mlperf_env, TOTAL_ITERS=2 * 768), [6.0, 5.0], rules=RULES)
    assert run.result.status == "aborted"
    report = compliance.check(log, "6.1.0")
    assert report.failed_keys == ["eval_accuracy"], compliance.render(report)


def test_open_short_run_of_the_tiny_preset_misses_only_the_target(mlperf_env):
    """The GPU's short run (tests/mlperf/test_mlperf_gpu.py's shape for this recipe): the tiny
    preset at the benchmark's sequence length, open division, a target of its own: the open
    rules' checker fails only eval_accuracy (gpt_oss_20b's open rules keep 3.34 and seq 8192)."""
    short = dict(MLPERF_DIVISION="open", MODEL_SIZE="tiny", SEQ_LENGTH=8192, BS=16, MBS=2,
                 GPUS_PER_NODE=8, EP=8, MLPERF_EVAL_EVERY=160, MLPERF_EVAL_SAMPLES=32, MLPERF_TARGET_LOSS=5.5,
                 TOTAL_ITERS=100, WARMUP_ITERS=10)
    run, _, _, log = run_fake(dict(mlperf_env, **{k: str(v) for k, v in short.items()}),
                              losses_reaching(5.5, 2), rules=RULES)
    assert run.result.status == "success"
    report = compliance.check(log, "6.1.0")
    assert "training_6.1.0/open_gpt_oss_20b.yaml" in report.configs
    assert report.failed_keys == ["eval_accuracy"], compliance.render(report)


# The RCP of BS 16 converges in 184,320 to 208,896 samples: the 15th to 17th evaluation.
CONVERGED_AT = [16, 15, 16, 16, 17, 16, 16, 15, 16, 16]


@pytest.mark.slow
def test_ten_closed_runs_pass_the_package_rcp_and_recipe_checkers(mlperf_data, tmp_path):
    env = {k: v for k, v in mlperf_data.items() if k != "SMALL_VALID"}
    ref = RULES.reference_data
    valid = CountedDataset(ref["eval_dataset_documents"], ref["eval_dataset_tokens"])
    logs = []
    for i, at in enumerate(CONVERGED_AT):
        run_env = dict(env, DRY_RUN="1", EXPERIMENT_DIR=str(tmp_path / "exp"), RUN_ID=f"run{i}",
                       MLPERF_ORG="Example Org", MLPERF_PLATFORM="1xAMD MI355X (test)",
                       GPUS_PER_NODE="8", EP="8", MLPERF_CACHE_CLEAR_CMD="true")
        logs.append(run_fake(run_env, losses_reaching(3.34, at), rules=RULES,
                             datasets=(CountedDataset(1000, 10**6), valid))[3])
    root = submission.assemble([log.parent for log in logs], tmp_path / "sub", "Example Org",
                               "1xAMD MI355X (test)")
    assert len(sorted((root / "results").glob("*/gpt_oss_20b/result_*.txt"))) == 10
    checks = {c.name: c for c in submission.check(root)}
    for name in ("package_checker", "rcp_checker", "recipe_rules"):
        assert checks[name].passed, submission.render(list(checks.values()))


def test_data_less_dry_run_of_the_closed_launch_on_mi355x(tmp_path):
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"), "DRY_RUN": "1", "VERBOSE": "1",
           "PLATFORM": "mi355x", "GPUS_PER_NODE": "8", "PYTHON": sys.executable,
           "EXPERIMENT_DIR": str(tmp_path / "exp"), "MLPERF_CACHE_CLEAR_CMD": "true"}
    proc = subprocess.run(["bash", str(REPO / "examples/mlperf/gpt_oss_20b/run_gpt_oss_20b.sh"),
                           "EP=8"], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("torchrun ")]
    words = shlex.split(line)

    def after(flag):
        return words[words.index(flag) + 1]

    assert after("--nproc-per-node") == "8" and after("--expert-model-parallel-size") == "8"
    assert (after("--global-batch-size"), after("--lr"), after("--lr-warmup-iters")) == (
        "16", "0.0004", "128")
    assert (after("--seq-length"), after("--num-experts"), after("--window-size")) == (
        "8192", "32", "128,0")
    assert after("--transformer-impl") == "transformer_engine"      # the MI355X image's TE
    assert "--eod-mask-loss" in words and after("--norm-epsilon") == "1e-06"   # the reference's
    assert "MLPerf gpt_oss_20b (closed division)" in proc.stderr
    assert "mock data" in proc.stderr


def test_without_a_named_platform_a_data_less_closed_launch_is_still_refused(mlperf_env):
    from training.launch.guards import Refusals

    env = {k: v for k, v in mlperf_env.items()
           if k not in ("DATA_PATH", "VALID_DATA_PATH", "TOKENIZER_MODEL")}
    with pytest.raises(Refusals, match="C4 training set"):
        resolve_mlperf(_env(env), [], RULES)
    launch, _, _ = resolve_mlperf(_env(env, PLATFORM="mi355x"), [], RULES)
    assert "--mock-data" in launch.buckets["DATA_ARGS"]
