"""`python -m training.bench ...` end to end with the fake runner: plan, JSON schema,
`all` (skipping complete parts, slots, budget), `table`."""
from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from training.bench import __main__ as cli
from training.bench import plan, sweep
from training.bench.ours import precheck
from training.bench.sweep import Config

from .fakes import FakeRunner

BENCH = Path(__file__).resolve().parents[2] / "docs" / "benchmarks"
TAG = "llama3-8B-8L_seq8192"
FIRST_PEERS = BENCH / "earlier" / f"peers_h200_{TAG}_1repeat.json"  # fixed figures


@pytest.fixture
def fake_tools(monkeypatch, tmp_path, base_env):
    """The fake runner, with the real precheck: the launcher's own resolve and guards on this
    node (no GPU, no Transformer Engine, as the H200 image the benchmarks ran on has none).

    Mutation caught: the guard renamed in training/launch/guards.py (`low_precision_needs_te`
    -> `low_precision_needs_transformer_engine`): the plan test's "[low_precision_needs_te]"
    is then missing. With the fake precheck (a hand-copied guard name) it passed."""
    runner = FakeRunner(speed={"default": 35000.0, "native": 35000.0, "hf": 32000.0,
                               "hf_liger": 35200.0, "GRAD_REDUCE_IN_BF16": 34000.0})

    def tools(_args):
        return (functools.partial(precheck, environ=base_env), lambda side: None, runner,
                plan.calibrate(BENCH))

    monkeypatch.setattr(cli, "_tools", tools)
    monkeypatch.setattr(cli.record, "BENCH_DIR", tmp_path / "committed")  # none done yet
    monkeypatch.setattr(cli.record, "gpu_info", lambda: {"name": "NVIDIA H200", "count": 1,
                                                         "driver": "580.0"})
    return runner


def test_plan_prints_the_runs_and_runs_nothing(fake_tools, tmp_path, capsys):
    out = tmp_path / "t.json"
    assert cli.main(["toggles", "--plan", "--only", "GRAD_REDUCE_IN_BF16", "--levers",
                     "precision", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "6 runs, estimated" in text
    assert "PRECISION=nvfp4: refused: [low_precision_needs_te]" in text
    assert not out.exists() and fake_tools.calls == []


def test_toggles_json_schema(fake_tools, tmp_path, capsys):
    out = tmp_path / "t.json"
    assert cli.main(["toggles", "--only", "GRAD_REDUCE_IN_BF16", "--levers", "precision",
                     "--out", str(out), "--name", "t"]) == 0
    data = json.loads(out.read_text())
    for key in ("name", "created", "command", "git_sha", "host", "gpu", "versions", "kind",
                "shape", "plan", "configs", "points", "results", "verdict_rule", "complete",
                "default_resolved", "elapsed_s"):
        assert key in data, key
    assert data["kind"] == "toggles" and data["complete"] is True
    assert data["command"].startswith("python -m training.bench")
    assert {"name", "count", "driver"} <= set(data["gpu"])
    assert {"torch", "megatron-core", "liger-kernel", "torch_runtime", "cuda"} <= set(data["versions"])
    assert {"model", "num_layers", "seq_length", "mbs", "global_batch", "gpus", "tp", "pp", "dp",
            "steps", "warmup", "repeats", "note"} <= set(data["shape"])
    assert len(data["points"]) == 6 and len(data["plan"]["order"]) == 6
    point = data["points"][0]
    assert {"label", "config", "repeat", "order_index", "samples", "tokens_per_s_per_gpu",
            "model_tflops_per_gpu", "peak_memory_gib", "wall_s"} <= set(point)
    assert len(point["samples"]["step_time_s"]) == 7
    refused = [c for c in data["configs"] if c["status"] == "refused"]
    from training.launch.recipes import RECIPES

    assert len(refused) == len(RECIPES) - 1 and all(c["message"] for c in refused)
    rows = {r["key"]: r for r in data["results"]}
    assert rows["PRECISION=fp8"]["verdict"] == "refused"
    assert rows["GRAD_REDUCE_IN_BF16"]["verdict"] == "faster"
    printed = capsys.readouterr().out
    assert "| GRAD_REDUCE_IN_BF16 | `GRAD_REDUCE_IN_BF16=1` | `GRAD_REDUCE_IN_BF16=0` |" in printed


def test_all_runs_what_fits_and_skips_what_is_done(fake_tools, tmp_path, capsys, monkeypatch):
    now = [0.0]
    monkeypatch.setattr(cli, "clock", lambda: now[0])
    real_call = type(fake_tools).__call__

    def timed(self, spec):          # every run takes 40 s of the fake clock
        now[0] += 40.0
        return real_call(self, spec)

    monkeypatch.setattr(type(fake_tools), "__call__", timed)
    out_dir = tmp_path / "out"
    assert cli.main(["all", "--budget-s", "400", "--out-dir", str(out_dir)]) == 0
    text = capsys.readouterr().out
    written = sorted(p.name for p in out_dir.glob("*.json"))
    assert written == [f"peers_h200_{TAG}.json"]
    peers = json.loads((out_dir / written[0]).read_text())
    assert peers["complete"] and len(peers["points"]) == 9 and peers["part"] == "peers"
    assert f"toggles-a_h200_{TAG}: left for a later session" in text
    # the next session: the peers part is done, the toggles part runs
    assert cli.main(["all", "--budget-s", "500", "--out-dir", str(out_dir)]) == 0
    text = capsys.readouterr().out
    assert f"peers_h200_{TAG}: done" in text
    assert (out_dir / f"toggles-a_h200_{TAG}.json").exists()


def test_all_slots_split_the_parts(fake_tools, tmp_path, capsys):
    out_dir = tmp_path / "out"
    cli.main(["all", "--plan", "--slot", "1/2", "--out-dir", str(out_dir)])
    text = capsys.readouterr().out
    assert f"peers_h200_{TAG}: slot 0/2" in text
    assert f"toggles-a_h200_{TAG}: 9 runs" in text
    assert f"toggles-b_h200_{TAG}: slot 0/2" in text
    assert not list(out_dir.glob("*.json"))


def test_nothing_runs_when_no_side_can_be_compared(tmp_path):
    configs = [Config("native", "ours"), Config("torchtitan", "torchtitan",
                                                status="not runnable", message="no")]
    assert sweep.order(configs, cli.BenchShape()) == []


def test_table_of_the_real_peers_json(capsys):
    assert cli.main(["table", str(FIRST_PEERS)]) == 0
    text = capsys.readouterr().out
    assert "0.995x" in text and "within noise" in text and "30.9" in text


def test_all_parts_selects_named_parts_and_refuses_unknown_ones(fake_tools, tmp_path, capsys):
    out_dir = tmp_path / "out"
    assert cli.main(["all", "--plan", "--parts", "levers-ddp-gc,toggles-b",
                     "--out-dir", str(out_dir)]) == 0
    text = capsys.readouterr().out
    assert f"toggles-b_h200_{TAG}: 9 runs" in text and f"levers-ddp-gc_h200_{TAG}" in text
    listed = text.split("parts in order:")[1].split("[bench all]")[0]
    assert "toggles-a" not in listed and "peers_h200" not in listed
    assert cli.main(["all", "--plan", "--parts", "levers-nope", "--out-dir", str(out_dir)]) == 2
    assert "unknown part(s) levers-nope" in capsys.readouterr().err


def test_a_part_with_its_own_shape_takes_the_given_run_counts_and_says_what_it_keeps(
        fake_tools, tmp_path, capsys):
    """Session 10 ran `bench all --parts moe-levers-sync --repeats 1` and got 2 repeats without a
    word: the MoE parts' own shape fixed them. The counts given now reach the part; an option of
    the model or layout does not, and the plan says so."""
    out_dir = tmp_path / "out"
    moe = "moe-levers-sync_h200_qwen3-30B-A3B-8L_seq4096"
    assert cli.main(["all", "--plan", "--parts", "moe-levers-sync", "--repeats", "1",
                     "--steps", "4", "--num-layers", "4", "--out-dir", str(out_dir)]) == 0
    text = capsys.readouterr().out
    assert f"{moe}: 2 runs" in text         # one repeat of the default and the lever
    assert (f"{moe}: keeps its own qwen3-30B-A3B-8L_seq4096 shape; the given --num-layers "
            "shape the other parts only") in text
    part, note = cli._part_shape("moe-levers-sync", cli.BenchShape(),
                                 {"repeats": 1, "steps": 4, "model_size": "30B-A3B"})
    assert (part.repeats, part.steps, part.num_layers, part.family) == (1, 4, 8, "qwen3_moe")
    assert note is None                     # the given value is the part's own: nothing lost
    # without counts on the command line the part keeps its own (2 repeats)
    assert cli.main(["all", "--plan", "--parts", "moe-levers-sync", "--out-dir",
                     str(out_dir)]) == 0
    assert f"{moe}: 4 runs" in capsys.readouterr().out
