"""The mllog event sequence of a short run, the stop at the target, and what the compliance
checker says about the log.

The run is Megatron's loop as a stand-in (fake_megatron.py, checked below against Megatron's
source) driven through the loop entries of training/megatron_patches with the real listener
(training.mlperf.events.MLPerfRun), on Megatron args parsed and validated by megatron-core
from the recipe's launch. Only the losses are made up.
"""
from __future__ import annotations

import inspect
import json

import pytest

from training.mlperf import compliance, events, summary
from training.mlperf.launch import resolve_mlperf

from .synth import keys, run_fake

CLOSED_LOSSES = [7.9, 5.2, 4.1, 3.6, 3.31, 3.27, 3.2]   # the 6th evaluation reaches 3.3
SHORT_RUN = {"MLPERF_DIVISION": "open", "MODEL_SIZE": "3.1-8B", "NUM_LAYERS": "2",
             "SEQ_LENGTH": "1024", "BS": "32", "MBS": "4", "GPUS_PER_NODE": "2",
             "MLPERF_EVAL_EVERY": "800", "MLPERF_EVAL_SAMPLES": "64", "WARMUP_ITERS": "30",
             "MLPERF_TARGET_LOSS": "5.5", "TOTAL_ITERS": "400"}


def test_closed_run_stops_at_the_target_and_its_log_passes_the_checker(mlperf_env):
    run, fake, last, log = run_fake(mlperf_env, CLOSED_LOSSES, save="/ckpt", GPUS_PER_NODE=8)
    # the sixth evaluation (iteration 6 * 384) reached 3.27 <= 3.3: the loop ended right there
    assert last == 6 * 384 and fake.evaluations == [384 * k for k in range(1, 7)]
    assert fake.saves == [last]                 # the final checkpoint, at the stop
    assert run.result.status == "success" and run.result.samples_to_converge == 6 * 384 * 32

    # the clock started before the first reading of the data, the block after it
    (logged_when_read,) = fake.data_reads
    assert logged_when_read[-2:] == ["init_stop", "run_start"]
    seq = keys(log)
    head = [k for _, k in seq[:seq.index(("E", "init_stop"))]]
    assert head[:2] == ["cache_clear", "init_start"]
    for key in ("submission_benchmark", "submission_division", "global_batch_size",
                "opt_adamw_epsilon", "opt_learning_rate_decay_steps", "max_steps",
                "eval_samples", "lowest_numerical_precision_in_comm", "config_filename"):
        assert key in head, key
    body = seq[seq.index(("E", "init_stop")):]
    one_eval = [("E", "block_stop"), ("S", "eval_start"), ("P", "eval_accuracy"),
                ("E", "eval_stop")]
    expected = [("E", "init_stop"), ("S", "run_start"), ("S", "block_start")]
    for k in range(6):
        expected += one_eval + ([("S", "block_start")] if k < 5 else [])
    expected += [("E", "run_stop"), ("P", "train_samples")]
    assert body == expected

    ev = {e["key"]: e for e in summary.read_events(log)}
    assert ev["run_stop"]["metadata"]["status"] == "success"
    assert ev["train_samples"]["value"] == 6 * 384 * 32
    assert ev["opt_learning_rate_decay_steps"]["value"] == 1_200_000 - 128
    assert ev["gradient_accumulation_steps"]["value"] == 4         # 32 / (MBS 1 x DP 8)
    accuracies = [e for e in summary.read_events(log) if e["key"] == "eval_accuracy"]
    assert [e["metadata"]["samples_count"] for e in accuracies] == [384 * 32 * k for k in range(1, 7)]

    report = compliance.check(log, "6.1.0")
    assert report.valid, compliance.render(report)
    assert "training_6.1.0/closed_llama31_8b.yaml" in report.configs


def test_run_that_misses_the_target_is_aborted_and_fails_only_the_target_check(mlperf_env):
    run, fake, last, log = run_fake(mlperf_env, [6.0, 5.0, 4.5], TOTAL_ITERS=3 * 384,
                                    GPUS_PER_NODE=8)
    assert last == 3 * 384 and run.result.status == "aborted"
    # Megatron's post-training validation ran (iteration 1152 again) but is not in the log
    assert fake.evaluations == [384, 768, 1152, 1152]
    accuracies = [e for e in summary.read_events(log) if e["key"] == "eval_accuracy"]
    assert len(accuracies) == 3
    ev = {e["key"]: e for e in summary.read_events(log)}
    assert ev["run_stop"]["metadata"]["status"] == "aborted"
    report = compliance.check(log)
    assert not report.valid
    assert report.failed_keys == ["eval_accuracy"], compliance.render(report)


def test_short_open_run_log_what_passes_and_what_cannot(mlperf_env):
    """The planned H200 short run (2 layers, seq 1024, 64 eval sequences, open): the open
    ruleset's only failure is its placeholder target (an eval loss below 1.0); as closed, the
    rules a short run cannot meet."""
    run, fake, last, log = run_fake(mlperf_env, [6.9, 6.0, 5.6, 5.4], **SHORT_RUN)
    assert run.result.status == "success" and last == 4 * 25       # ceil(800/32) = 25
    assert fake.evaluations == [25, 50, 75, 100]

    open_report = compliance.check(log)
    assert open_report.division == "open"
    assert open_report.failed_keys == ["eval_accuracy"]
    assert any("< 1.0" in f.message for f in open_report.failures)

    closed = compliance.check_as_closed(log)
    assert closed.failed_keys == ["eval_accuracy", "eval_samples", "max_sequence_length"], \
        compliance.render(closed)


def test_summary_reports_time_samples_and_draws_the_curve(mlperf_env, tmp_path):
    _, _, _, log = run_fake(mlperf_env, CLOSED_LOSSES, GPUS_PER_NODE=8)
    s = summary.summarize(log, target=3.3)
    assert s["status"] == "success" and s["samples_to_converge"] == 6 * 384 * 32
    assert s["evaluations"] == 6 and s["final_eval_loss"] == 3.27
    assert s["time_to_train_min"] is not None and s["time_to_train_min"] >= 0
    assert summary.main([str(log), "--out", str(tmp_path)]) == 0
    png = tmp_path / "eval_loss.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "samples to converge | 73728" in (tmp_path / "mlperf_summary.md").read_text()


def test_nothing_is_logged_without_mlperf_run(mlperf_env):
    from tests.launch.helpers import megatron_args

    launch, _, _ = resolve_mlperf(mlperf_env, [])
    assert events.start(megatron_args(launch), {"RANK": "0"}) is None


def test_only_rank_zero_writes(mlperf_env, tmp_path):
    from tests.launch.helpers import megatron_args

    launch, _, config = resolve_mlperf(mlperf_env, [])
    args = megatron_args(launch)
    run = events.start(args, {events.RUN_ENV: json.dumps(config), "RANK": "3"})
    assert run is not None and run.log.path is None
    assert not (launch.log_dir / "mlperf.log").exists()


def test_megatron_loop_still_behaves_as_the_stand_in_assumes():
    """The stop rule and the stand-in rest on these lines of megatron-core's train/pretrain."""
    from megatron.training import training

    train = inspect.getsource(training.train)
    assert "while iteration < args.train_iters:" in train
    assert "iteration % args.eval_interval == 0 and args.do_valid" in train
    assert "evaluate_and_print_results(prefix" in train
    pretrain = inspect.getsource(training.pretrain)
    assert "iteration = train(" in pretrain or "= train(\n" in pretrain
    # the data is first read by build_train_valid_test_data_iterators: after the model and
    # optimizer set-up, before train() (run_start is logged right before it)
    setup = pretrain.index("setup_model_and_optimizer(")
    data = pretrain.index("build_train_valid_test_data_iterators(")
    assert setup < data < pretrain.index("= train(")
    # and nothing before uses the dataset provider (the only way pretrain() reaches the data)
    import ast
    import textwrap

    tree = ast.parse(textwrap.dedent(pretrain))
    uses = [n.lineno for n in ast.walk(tree)
            if isinstance(n, ast.Name) and n.id == "train_valid_test_dataset_provider"]
    calls = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call)
             and getattr(n.func, "id", None) == "setup_model_and_optimizer"]
    assert uses and calls and min(uses) > min(calls)
    assert "iteration % cfg_container.checkpoint.save_interval != 0" in pretrain
    assert "if args.do_valid:" in pretrain
    assert "evaluate(" in inspect.getsource(training.evaluate_and_print_results)


def test_the_short_run_tested_here_is_the_one_short_run_sh_launches():
    """SHORT_RUN above mirrors examples/mlperf/llama31_8b/short_run.sh's knobs."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "examples" / "mlperf" / "llama31_8b"
            / "short_run.sh").read_text()
    block = text[text.index("EXPERIMENT_DIR="):text.index("timeout 480")]
    knobs = {}
    for name, value in re.findall(r"\b([A-Z][A-Z0-9_]+)=(\"[^\"]*\"|\S+)", block):
        value = value.strip('"')
        default = re.fullmatch(r"\$\{\w+:-(\w+)\}", value)
        if default:
            value = default.group(1)
        if "$" not in value:
            knobs[name] = value
    knobs.pop("RUN_ID")
    knobs.pop("SAVE_INTERVAL")
    assert knobs == SHORT_RUN
