"""The peer sides: availability probes, the torchtitan side's setup, the peers results."""
from __future__ import annotations

import argparse
import importlib.util

import pytest

from training.bench.analysis import peers_results
from training.bench.runners import availability
from training.bench.shape import BenchShape
from training.bench.suites import peer_configs, run_suite
from training.bench.titan_peer import job_args

from .fakes import HEADER, FakeRunner, fake_precheck


@pytest.mark.slow
def test_torchtitan_on_a_machine_without_a_gpu_is_a_recorded_reason():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the probe may pass")
    reason = availability("torchtitan")
    expected = ("no CUDA device" if importlib.util.find_spec("torchtitan")
                else "torchtitan is not installed")
    assert reason and "not runnable here" in reason and expected in reason


def test_our_sides_need_no_probe():
    assert availability("native") is None


def test_torchtitan_job_matches_the_shape_and_its_best_setup():
    a = argparse.Namespace(mbs=1, global_batch=8, seq_length=8192, warmup=2, steps=5,
                           compile=True)
    words = job_args(a, "/tmp/dump")
    pairs = dict(zip(words[::2], words[1::2]))
    assert pairs["--training.local_batch_size"] == "1"
    assert pairs["--training.global_batch_size"] == "8"
    assert pairs["--training.seq_len"] == "8192" and pairs["--training.steps"] == "7"
    assert pairs["--optimizer.implementation"] == "fused"
    assert pairs["--activation_checkpoint.mode"] == "none"
    assert pairs["--training.mixed_precision_param"] == "bfloat16"
    assert "--compile.enable" in words
    a.compile = False
    assert "--compile.enable" not in job_args(a, "/tmp/dump")


def test_peers_results_orient_ours_over_each_side(tmp_path):
    shape = BenchShape()
    configs = peer_configs(shape, ["native", "hf_liger", "local", "torchtitan"],
                           fake_precheck(), lambda s: "not runnable here: x" if s == "torchtitan"
                           else None)
    result = run_suite("peers", HEADER, shape, configs,
                       FakeRunner(speed={"native": 35000, "hf_liger": 35000 * 1.1,
                                         "local": 14000}, noise=0.002),
                       lambda s: 1.0, tmp_path / "p.json", 1e9, log=lambda _m: None)
    rows = {r["key"]: r for r in peers_results(result)}
    assert rows["peer:hf_liger"]["tokens_per_s_ratio"] == pytest.approx(1 / 1.1, rel=0.01)
    assert rows["peer:hf_liger"]["verdict"] == "slower"
    assert rows["TRANSFORMER_IMPL=local"]["kind"] == "backend"
    assert rows["TRANSFORMER_IMPL=local"]["verdict"] == "faster"
    assert rows["peer:torchtitan"]["verdict"] == "not measured"
    assert "not runnable here: x" in rows["peer:torchtitan"]["notes"][0]
    assert len(result["points"]) == 9   # torchtitan costs no run


def test_a_peer_out_of_memory_reads_as_such_in_the_peers_rows(tmp_path):
    shape = BenchShape()
    configs = peer_configs(shape, ["native", "local"], fake_precheck(), lambda s: None)
    fake = FakeRunner(fail={"local": "torch.OutOfMemoryError: CUDA out of memory."})
    result = run_suite("peers", HEADER, shape, configs, fake, lambda s: 1.0,
                       tmp_path / "p.json", 1e9, log=lambda _m: None)
    (row,) = peers_results(result)
    assert row["key"] == "TRANSFORMER_IMPL=local" and row["verdict"] == "baseline out of memory"
    assert [s.config for s in fake.calls].count("local") == 1
    from training.bench.table import table

    assert "| Megatron-core local spec (stock Megatron without TE), through our launcher | " \
           "out of memory |" in table(result)


@pytest.mark.parametrize("module", ["training.bench.hf_peer", "training.bench.titan_peer"])
def test_peers_profile_only_when_asked_and_need_a_step_before_the_two_recorded(
        tmp_path, module, capsys):
    """Refused at the command line (exit 2, one line) before any model or trainer is built."""
    import importlib

    from training.bench.peer_common import start_profiler

    assert start_profiler(None, 5) is None
    main = importlib.import_module(module).main
    with pytest.raises(SystemExit) as exit_:
        main(["--json-out", str(tmp_path / "x.json"), "--profile-dir", str(tmp_path / "trace"),
              "--warmup", "1", "--steps", "1"])
    assert exit_.value.code == 2
    assert "--profile-dir needs at least 3 steps" in capsys.readouterr().err
    assert not (tmp_path / "trace").exists()
