"""`python -m training.convergence GRID.yaml` end to end on the CPU, with a stand-in for the
launcher that writes a run folder like the real one (manifest.json with its `run` section,
metrics.jsonl, train.log), and on the real grid file through the real launcher's resolve."""
from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import pytest
import yaml

from training.convergence import __main__ as cli
from training.convergence import runner
from training.convergence.grid import GridError, load

REPO = Path(__file__).resolve().parents[2]

FAKE = r'''#!/usr/bin/env bash
# stand-in for examples/llama/train_llama3.sh: a run folder whose loss depends on ADAM_EPS
set -euo pipefail
echo "$EXP_NAME BS=${BS:-unset}" >> "$CALLS"
[ "${DRY_RUN:-0}" = 1 ] && { echo "dry run"; exit 0; }
[ "${FAIL_EPS:-none}" = "${ADAM_EPS}" ] && { echo "CUDA out of memory" >&2; exit 1; }
exec "$PY" - <<'EOF'
import json, math, os, pathlib
run = pathlib.Path(os.environ["EXPERIMENT_DIR"], os.environ["EXP_NAME"], "bf16", os.environ["RUN_ID"])
run.mkdir(parents=True, exist_ok=True)
floor = 5.9 if os.environ["ADAM_EPS"] == "1e-08" else 3.8
wobble = 0.01 if os.environ["GRAD_REDUCE_IN_BF16"] == "1" else 0.0
with open(run / "metrics.jsonl", "w") as f:
    for i in range(1, 201):
        loss = floor + wobble + (10 - floor) * math.exp(-0.04 * i)
        grad = 1.0 + (8.0 * i / 200 if floor > 5 else 0.0)
        f.write(json.dumps({"iteration": i, "loss": loss, "grad_norm": grad, "lr": 8e-4,
                            "step_time_s": 0.1}) + "\n")
        if i % 20 == 0:
            f.write(json.dumps({"iteration": i, "eval_loss": loss + 0.1}) + "\n")
    f.write(json.dumps({"iteration": 200, "eval_loss": 99.0}) + "\n")  # post-loop validation
(run / "train.log").write_text(" > number of parameters on (tensor, gtp_weight_remat, pipeline) "
                               "model parallel rank (0, 0, 0): 1000000\n")
(run / "manifest.json").write_text(json.dumps({"git_sha": "abc", "values": {"BS": os.environ.get("BS")},
    "run": {"summary": {"tokens_per_s_per_gpu": 1234.0, "device": "stand-in"}}}))
EOF
'''


def grid_file(tmp_path, **extra) -> Path:
    script = tmp_path / "fake_train.sh"
    script.write_text(FAKE)
    data = {"name": "t2x2", "script": str(script),
            "fixed": {"MODEL_SIZE": "tiny", "LR": 8e-4, "SEED": 1234, "BS": 32},
            "axes": {"ADAM_EPS": [1.0e-8, 1.0e-5], "GRAD_REDUCE_IN_BF16": [0, 1]},
            "verdict": {"smooth": 10, "window": 4}, "out": str(tmp_path / "out"), **extra}
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture
def fake_env(tmp_path, monkeypatch):
    monkeypatch.setenv("CALLS", str(tmp_path / "calls.txt"))
    monkeypatch.setenv("PY", sys.executable)
    monkeypatch.setenv("BS", "999")           # an inherited toggle must not reach the cells
    return tmp_path


def calls(tmp_path) -> list[str]:
    path = tmp_path / "calls.txt"
    return path.read_text().splitlines() if path.exists() else []


def run_cli(tmp_path, *extra) -> int:
    return cli.main([str(tmp_path / "grid.yaml"), "--experiment-dir", str(tmp_path / "exp"),
                     *extra])


def test_grid_runs_every_cell_and_writes_table_json_png_with_verdicts(fake_env, capsys):
    tmp = fake_env
    grid_file(tmp)
    assert run_cli(tmp) == 0
    assert len(calls(tmp)) == 4 and all(c.endswith("BS=32") for c in calls(tmp))
    result = json.loads((tmp / "out" / "t2x2.json").read_text())
    verdicts = {c["label"]: c["verdict"] for c in result["cells"]}
    assert verdicts == {"ADAM_EPS=1e-08 GRAD_REDUCE_IN_BF16=0": "plateau",
                        "ADAM_EPS=1e-08 GRAD_REDUCE_IN_BF16=1": "plateau",
                        "ADAM_EPS=1e-05 GRAD_REDUCE_IN_BF16=0": "converged",
                        "ADAM_EPS=1e-05 GRAD_REDUCE_IN_BF16=1": "converged"}
    cell = result["cells"][0]
    assert len(cell["curves"]["train"]) == 200 and len(cell["curves"]["evals"]) == 10
    assert cell["curves"]["evals"][-1][1] < 90          # the post-loop repeat is not a point
    assert cell["parameters"] == 1_000_000 and cell["tokens_per_s_per_gpu"] == 1234.0
    effects = result["main_effects"]["eval_best"]
    eps = effects["ADAM_EPS"]["1e-08"] - effects["ADAM_EPS"]["1e-05"]
    bf16 = abs(effects["GRAD_REDUCE_IN_BF16"]["1"] - effects["GRAD_REDUCE_IN_BF16"]["0"])
    assert eps > 1.5 and bf16 < 0.05
    table = (tmp / "out" / "t2x2.md").read_text()
    assert table.count("**plateau**") == 2 and table.count("**converged**") == 2
    assert "Verdict rules" in table and "last 4 evaluations" in table
    assert (tmp / "out" / "t2x2.png").read_bytes()[:4] == b"\x89PNG"
    assert "plateau" in capsys.readouterr().out


def test_a_finished_grid_is_read_back_not_rerun(fake_env):
    grid_file(fake_env)
    assert run_cli(fake_env) == 0 and len(calls(fake_env)) == 4
    assert run_cli(fake_env) == 0 and len(calls(fake_env)) == 4
    assert run_cli(fake_env, "--no-resume") == 0 and len(calls(fake_env)) == 8


def test_a_failing_cell_is_reported_and_the_others_judged(fake_env, monkeypatch):
    monkeypatch.setenv("FAIL_EPS", "1e-05")
    grid_file(fake_env)
    assert run_cli(fake_env) == 1
    result = json.loads((fake_env / "out" / "t2x2.json").read_text())
    got = {c["label"]: (c["verdict"], c["reason"]) for c in result["cells"]}
    assert got["ADAM_EPS=1e-05 GRAD_REDUCE_IN_BF16=0"][0] == "failed"
    assert "CUDA out of memory" in got["ADAM_EPS=1e-05 GRAD_REDUCE_IN_BF16=0"][1]
    # with the converging cells gone, the grid's best is the eps=1e-8 level: flat there
    assert got["ADAM_EPS=1e-08 GRAD_REDUCE_IN_BF16=0"][0] == "converged"


class CellClock:
    """A fake clock for the harness: each cell the stand-in launcher starts takes 100 s.

    It reads the stand-in's call log, so time moves when (and only when) a cell runs, whatever
    the machine's load; the budgets below are then exact, and the real timeout a cell gets
    from the remaining budget (150 s) is never reached."""

    def __init__(self, tmp_path):
        self.tmp_path = tmp_path

    def time(self) -> float:
        return 100.0 * len(calls(self.tmp_path))


def test_the_time_budget_leaves_cells_for_the_next_invocation(fake_env, monkeypatch):
    """Mutation caught: training/convergence/__main__.py starting a cell while any budget is
    left (`remaining <= 0` alone, not `remaining < 1.1 * max(walls)`): the second cell then
    starts with 50 s left. The old version of this test slept 1 s per cell against a real
    1.5 s budget, which is also the real timeout of the first cell: a race on a loaded host."""
    monkeypatch.setattr(cli, "time", CellClock(fake_env))
    monkeypatch.setattr(runner, "time", CellClock(fake_env))
    grid_file(fake_env)
    assert run_cli(fake_env, "--budget-s", "150") == 3
    assert len(calls(fake_env)) == 1
    assert run_cli(fake_env, "--budget-s", "150") == 3       # resumes: one more cell
    assert len(calls(fake_env)) == 2
    assert run_cli(fake_env, "--budget-s", "3000") == 0
    assert len(calls(fake_env)) == 4
    result = json.loads((fake_env / "out" / "t2x2.json").read_text())
    assert [c["wall_s"] for c in result["cells"]] == [None, None, 100.0, 100.0]  # 2 read back


@pytest.mark.parametrize("change,message", [
    ({"axes": {"SEED": [1, 2]}}, "SEED cannot be an axis"),
    ({"axes": {"ADAM_EPSILON": [1e-8]}}, "not a toggle"),
    ({"fixed": {"ADAM_EPS": 1e-8}, "axes": {"ADAM_EPS": [1e-5]}}, "both fixed and an axis"),
    ({"fixed": {"EXP_NAME": "x"}}, "set by the harness"),
    ({"verdict": {"windw": 3}}, "unknown verdict setting"),
    ({"axes": {}}, "no axes"),
    ({"axes": None, "cells": [{"ADAM_EPS": 1e-8}, {"GRAD_REDUCE_IN_BF16": 0}]},
     "every cell sets the same toggles"),
    ({"axes": None, "cells": [{"ADAM_EPS": 1e-8}, {"ADAM_EPS": 1e-8}]}, "listed twice"),
    ({"cells": [{"ADAM_EPS": 1e-8}]}, "axes or cells, not both"),
    # the MoE layer's toggles belong to the MoE entry points only
    ({"axes": {"MOE_LEAN_STEP": [0, 1]}}, "not a toggle of the launcher's registry for "
                                          ".*fake_train.sh"),
])
def test_bad_grid_files_are_refused_with_what_to_change(tmp_path, change, message):
    path = grid_file(tmp_path)
    data = yaml.safe_load(path.read_text())
    data.update(change)
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(GridError, match=message):
        load(path)


def test_the_committed_2x2_grid_resolves_through_the_launcher_for_every_cell(tmp_path):
    """docs/convergence/grid_adam_eps_x_bf16_reduce.yaml, with small stand-in datasets: every
    cell is a valid launch (guards, Megatron's own parser), DP=2, only the two axes differ."""
    from tests.launch.helpers import megatron_args
    from tests.mlperf.datasets import make_datasets
    from training.launch.resolve import resolve

    grid = load(REPO / "docs" / "convergence" / "grid_adam_eps_x_bf16_reduce.yaml")
    grid.fixed.update(make_datasets(tmp_path))
    cells = grid.cells()
    assert [c.label for c in cells] == [
        "ADAM_EPS=1e-08 GRAD_REDUCE_IN_BF16=0", "ADAM_EPS=1e-08 GRAD_REDUCE_IN_BF16=1",
        "ADAM_EPS=1e-05 GRAD_REDUCE_IN_BF16=0", "ADAM_EPS=1e-05 GRAD_REDUCE_IN_BF16=1"]
    launches = []
    for cell in cells:
        env = runner.cell_env(grid, cell, tmp_path / "exp", dry_run=True,
                              base={"PATH": os.environ.get("PATH", "")})
        launch = resolve("llama3", env)
        assert launch.run.layout.dp == 2 and launch.settings["SEED"] == 1234
        args = megatron_args(launch)
        assert args.adam_eps == float(cell.values["ADAM_EPS"]) and args.lr == 8e-4
        assert args.grad_reduce_in_bf16 == (cell.values["GRAD_REDUCE_IN_BF16"] == "1")
        assert args.train_iters * args.global_batch_size * args.seq_length == 300 * 32 * 1024
        words = [w for b in ("GPT_ARGS", "TRAIN_ARGS", "DATA_ARGS", "EXTRA_ARGS")
                 for w in launch.buckets[b] if w != "--grad-reduce-in-bf16"]
        words[words.index("--adam-eps") + 1] = "EPS"
        launches.append(words)
    assert all(words == launches[0] for words in launches)   # nothing else differs


def test_dry_run_resolves_every_cell_and_trains_nothing(fake_env):
    grid_file(fake_env)
    assert run_cli(fake_env, "--dry-run") == 0
    assert len(calls(fake_env)) == 4
    assert not (fake_env / "out").exists()


def test_the_committed_te_recipe_grid_resolves_for_every_cell_on_hopper(tmp_path):
    """docs/convergence/grid_te_recipes.yaml as the H200 will run it (PLATFORM=h200 stands in
    for a Hopper node with Transformer Engine): one GPU, the TE backend with every default-on
    toggle, each recipe through Megatron's own parser and validate_args; only PRECISION (and
    the format it implies) differs."""
    from tests.launch.helpers import megatron_args
    from tests.mlperf.datasets import make_datasets
    from training.launch.resolve import resolve
    from training.launch.toggles import PERF_TOGGLES

    grid = load(REPO / "docs" / "convergence" / "grid_te_recipes.yaml")
    grid.fixed.update(make_datasets(tmp_path))
    cells = grid.cells()
    assert [c.values["PRECISION"] for c in cells] == ["bf16", "fp8", "fp8_tensorwise",
                                                      "fp8_blockwise"]
    launches = []
    for cell in cells:
        env = runner.cell_env(grid, cell, tmp_path / "exp", dry_run=True,
                              base={"PATH": os.environ.get("PATH", ""), "PLATFORM": "h200"})
        launch = resolve("llama3", env)
        assert launch.settings["TRANSFORMER_IMPL"] == "transformer_engine"
        assert all(launch.settings[t.name] for t in PERF_TOGGLES)
        assert launch.log_dir.parent.name == cell.values["PRECISION"]
        args = megatron_args(launch)
        assert args.world_size == 1 and args.lr == 8e-4 and args.adam_eps == 1e-5
        gpt = launch.buckets["GPT_ARGS"]
        recipe = launch.emitted["PRECISION"]
        start = next(i for i in range(len(gpt)) if gpt[i:i + len(recipe)] == recipe)
        launches.append(gpt[:start] + gpt[start + len(recipe):]
                        + [w for b in ("TRAIN_ARGS", "DATA_ARGS", "EXTRA_ARGS")
                           for w in launch.buckets[b]])
    assert all(words == launches[0] for words in launches)   # nothing else differs


def test_explicit_cells_run_in_their_order_with_their_values_as_axes(tmp_path):
    path = grid_file(tmp_path)
    data = yaml.safe_load(path.read_text())
    data.pop("axes")
    data["cells"] = [{"ADAM_EPS": 1e-5, "GRAD_REDUCE_IN_BF16": 1},
                     {"ADAM_EPS": 1e-8, "GRAD_REDUCE_IN_BF16": 1},
                     {"ADAM_EPS": 1e-8, "GRAD_REDUCE_IN_BF16": 0}]
    path.write_text(yaml.safe_dump(data))
    grid = load(path)
    assert [c.label for c in grid.cells()] == [
        "ADAM_EPS=1e-05 GRAD_REDUCE_IN_BF16=1", "ADAM_EPS=1e-08 GRAD_REDUCE_IN_BF16=1",
        "ADAM_EPS=1e-08 GRAD_REDUCE_IN_BF16=0"]
    assert grid.axes == {"ADAM_EPS": ["1e-05", "1e-08"], "GRAD_REDUCE_IN_BF16": ["1", "0"]}


def test_the_committed_optimizer_state_grid_resolves_through_the_launcher(tmp_path):
    """docs/convergence/grid_optimizer_state.yaml: every cell a valid launch on one GPU; the
    first is Megatron's default optimizer, the others its precision-aware one with the state
    the cell names, and nothing else differs."""
    from tests.launch.helpers import megatron_args
    from tests.mlperf.datasets import make_datasets
    from training.launch.resolve import resolve

    grid = load(REPO / "docs" / "convergence" / "grid_optimizer_state.yaml")
    grid.fixed.update(make_datasets(tmp_path))
    launches = []
    for i, cell in enumerate(grid.cells()):
        env = runner.cell_env(grid, cell, tmp_path / "exp", dry_run=True,
                              base={"PATH": os.environ.get("PATH", "")})
        launch = resolve("llama3", env)
        assert launch.run.layout.dp == 1 and launch.settings["SEED"] == 1234
        args = megatron_args(launch)
        assert args.use_precision_aware_optimizer is (i > 0)
        assert args.master_weights == cell.values["MASTER_WEIGHTS"]
        launches.append([w for b in ("GPT_ARGS", "DATA_ARGS", "EXTRA_ARGS")
                         for w in launch.buckets[b]])
    assert all(words == launches[0] for words in launches)


def test_the_committed_moe_lean_step_grid_resolves_through_the_moe_launcher(tmp_path):
    """docs/convergence/grid_moe_lean_step.yaml: the grid's toggles are the MoE entry point's
    (core registry and MoE layer); every cell a valid launch on one GPU: the core defaults,
    then the lean step with fp32 and with bf16 moments (remainder masters, the counts on the
    GPU; the fused cross-entropy, sync-free since session 14); a user's MoE variable does not
    leak into a cell."""
    from tests.launch.helpers import megatron_args
    from tests.mlperf.datasets import make_datasets
    from training.launch.resolve import resolve
    from training.moe import presets  # noqa: F401 - registers the qwen3_moe family
    from training.moe.layer import MOE

    grid = load(REPO / "docs" / "convergence" / "grid_moe_lean_step.yaml")
    grid.fixed.update(make_datasets(tmp_path))
    rows = []
    for cell in grid.cells():
        env = runner.cell_env(grid, cell, tmp_path / "exp", dry_run=True,
                              base={"PATH": os.environ.get("PATH", ""), "MOE_DEVICE_COUNTS": "0"})
        assert "MOE_DEVICE_COUNTS" not in env
        launch = resolve("qwen3_moe", env, layers=[MOE])
        args = megatron_args(launch)
        s = launch.settings
        rows.append((s["MOE_LEAN_STEP"], args.use_precision_aware_optimizer,
                     s["ADAM_MOMENTS_DTYPE"], s["MASTER_WEIGHTS"],
                     s["CROSS_ENTROPY_LOSS_FUSION"], s["MOE_DEVICE_COUNTS"]))
        assert launch.run.layout.dp == 1 and s["SEED"] == 1234 and s["NUM_LAYERS"] == 2
    assert rows == [(False, False, "fp32", "fp32", True, False),
                    (True, True, "fp32", "remainder", True, True),
                    (True, True, "bf16", "remainder", True, True)]
