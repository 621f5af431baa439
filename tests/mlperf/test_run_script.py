"""examples/mlperf/llama31_8b/run_llama31_8b.sh end to end with DRY_RUN=1 (no GPU)."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "mlperf" / "llama31_8b" / "run_llama31_8b.sh"


def _run(cmd, env):
    """The command with only the toggles the test sets (none inherited from this shell)."""
    from training.launch.toggles import BY_NAME

    full = {k: v for k, v in os.environ.items() if k not in BY_NAME}
    full.update({"PYTHON": sys.executable, "COLUMNS": "250", **env})
    return subprocess.run(cmd, env=full, capture_output=True, text=True, timeout=300, cwd=REPO)


def test_dry_run_prints_the_recipe_launch_and_writes_the_mlperf_manifest(mlperf_env):
    env = dict(mlperf_env, RUN_ID="dry")
    proc = _run(["bash", str(SCRIPT)], env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    for words in ("--lr-decay-iters 1200000", "--eval-interval 384", "--eval-iters 32",
                  "--adam-eps 1e-05", "--min-lr 8e-05", "--lr-warmup-iters 128",
                  "--use-rope-scaling", "--seq-length 8192", "--valid-data-path"):
        assert words in out, words
    assert "MLPerf llama31_8b (closed division)" in proc.stderr
    run = Path(mlperf_env["EXPERIMENT_DIR"]) / "mlperf-llama31_8b" / "bf16" / "dry"
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["mlperf"]["division"] == "closed"
    assert {r["name"] for r in manifest["mlperf"]["recipe"]} >= {"ADAM_EPS", "EVAL_INTERVAL"}
    rows = {r["toggle"]: r for r in manifest["toggles"]}
    assert rows["ADAM_EPS"]["source"] == "recipe" and rows["BS"]["source"] == "recipe"


def test_the_launch_exports_what_the_run_needs(mlperf_env):
    env = dict(mlperf_env, MLPERF_DIVISION="open", MLPERF_TARGET_LOSS="5.5", MLPERF_ORG="acme")
    proc = _run([sys.executable, "-m", "training.mlperf.launch"], env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("export MLPERF_RUN="))
    config = json.loads(shlex.split(line.split("=", 1)[1])[0])
    assert config["division"] == "open" and config["target_eval_loss"] == 5.5
    assert config["org"] == "acme" and config["eval_samples"] == 1024


def test_a_closed_rule_break_stops_the_script_before_any_gpu(mlperf_env):
    proc = _run(["bash", str(SCRIPT), "ADAM_EPS=1e-8"], mlperf_env)
    assert proc.returncode == 2
    assert "[mlperf_closed_rules]" in proc.stderr and "ADAM_EPS=1e-08 (rule: 1e-05)" in proc.stderr
    assert "torchrun" not in proc.stdout


@pytest.mark.slow
def test_node_0_builds_the_index_with_the_runs_seed_before_torchrun(mlperf_data, tmp_path):
    """Without DRY_RUN, a fake torchrun (and nvidia-smi) on PATH: the untimed index step runs first, with the
    seed the run gets, into the cache the run reads; its output goes to the run's log."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    recorded = tmp_path / "torchrun.args"
    for tool, body in (("torchrun", f'printf "%s\\n" "$@" > {recorded}'),
                       ("nvidia-smi", "echo 'NVIDIA H200'"),    # one GPU, as detection sees it
                       ("python", f'exec {sys.executable} "$@"')):  # launch.sh puts its dir first
        fake = bin_dir / tool
        fake.write_text(f"#!/bin/sh\n{body}\n")
        fake.chmod(0o755)
    cache = tmp_path / "cache"
    env = {"EXPERIMENT_DIR": str(tmp_path / "exp"), "RUN_ID": "idx", "MLPERF_DIVISION": "open",
           "MODEL_SIZE": "tiny", "SEQ_LENGTH": "64", "BS": "8", "MBS": "8", "GPUS_PER_NODE": "1",
           "TOTAL_ITERS": "30", "WARMUP_ITERS": "2", "MLPERF_EVAL_EVERY": "80",
           "MLPERF_EVAL_SAMPLES": "16",
           "MLPERF_TARGET_LOSS": "5", "MLPERF_CACHE_CLEAR_CMD": "true",
           "DATA_PATH": mlperf_data["DATA_PATH"], "VALID_DATA_PATH": mlperf_data["SMALL_VALID"],
           "TOKENIZER_MODEL": mlperf_data["TOKENIZER_MODEL"],
           "PATH": f"{bin_dir}:{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}
    proc = _run(["bash", str(SCRIPT), "--data-cache-path", str(cache)],
                {**env, "PYTHON": str(bin_dir / "python")})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    args = recorded.read_text().splitlines()
    seed = args[args.index("--seed") + 1]
    log = next((tmp_path / "exp").glob("**/idx/train.log")).read_text()
    assert f"MLPerf data index (untimed, seed {seed})" in log
    assert len(list(cache.glob("*-GPTDataset-train-document_index.npy"))) == 1
