"""The tiny preset trains for real through the launcher on a GPU: falling loss per backend,
and checkpoint save/resume continuing the same loss curve."""
from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "data" / "shakespeare"
BACKENDS = ["native", "local"] + (["transformer_engine"]
                                  if importlib.util.find_spec("transformer_engine") else [])


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _train(tmp_path: Path, name: str, *words: str, **toggles) -> Path:
    if not (SAMPLE / "train.bin").exists():
        pytest.skip("the shipped corpus is not built: run `make data-sample` first")
    env = dict(os.environ, MODEL_SIZE="tiny", GPUS_PER_NODE="1", EXP_NAME=name, RUN_ID="run",
               EXPERIMENT_DIR=str(tmp_path / "experiment"), DATA_PATH=str(SAMPLE / "train"),
               EVAL_ITERS="0", LR="1e-3", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), MIN_LR="1e-4", CUDA_VISIBLE_DEVICES=os.environ.get(
                   "CUDA_VISIBLE_DEVICES", "0"))
    env.update({k: str(v) for k, v in toggles.items()})
    proc = subprocess.run(["bash", str(REPO / "examples/llama/train_llama3.sh"), *words],
                          env=env, capture_output=True, text=True, timeout=600)
    run = tmp_path / "experiment" / name / "bf16" / "run"
    log = proc.stdout[-4000:] + proc.stderr[-4000:]
    assert (run / "metrics.jsonl").exists(), log
    return run


def _losses(run: Path) -> dict[int, float]:
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return {m["iteration"]: m["loss"] for m in lines if m.get("loss") is not None}


@pytest.mark.parametrize("backend", BACKENDS)
def test_tiny_trains_30_iterations_with_falling_loss(tmp_path, backend):
    run = _train(tmp_path, f"tiny-{backend}", TRANSFORMER_IMPL=backend, TOTAL_ITERS=30)
    losses = _losses(run)
    assert sorted(losses) == list(range(1, 31))
    first, last = sum(losses[i] for i in range(1, 6)) / 5, sum(losses[i] for i in range(26, 31)) / 5
    print(f"\n{backend}: loss {first:.3f} (iters 1-5) -> {last:.3f} (iters 26-30)")
    assert last < first - 1.0
    summary = json.loads((run / "manifest.json").read_text())["run"]["summary"]
    assert summary["measured"] and summary["tokens_per_s_per_gpu"] > 0


def test_checkpoint_resume_continues_the_loss_curve(tmp_path):
    ckpt = tmp_path / "ckpt"
    full = _train(tmp_path, "full", TOTAL_ITERS=20, SAVE=ckpt, SAVE_INTERVAL=10)
    assert (ckpt / "latest_checkpointed_iteration.txt").exists()
    resumed = _train(tmp_path, "resumed", "--ckpt-step", "10", TOTAL_ITERS=20, LOAD=ckpt)
    a, b = _losses(full), _losses(resumed)
    assert sorted(b) == list(range(11, 21)), sorted(b)
    worst = max(abs(a[i] - b[i]) / a[i] for i in range(11, 21))
    print(f"\nresume: worst relative loss difference over iterations 11-20: {worst:.2e}")
    assert worst < 1e-3


def test_empty_load_is_refused_before_training(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    env = dict(os.environ, MODEL_SIZE="tiny", LOAD=str(empty),
               EXPERIMENT_DIR=str(tmp_path / "experiment"))
    proc = subprocess.run(["bash", str(REPO / "examples/llama/train_llama3.sh")], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "[load_checkpoint]" in proc.stderr and "RESUME=auto" in proc.stderr
