"""Issue 26 on an H200: a Hugging Face Llama at the 8-layer Llama3-8B width goes in, trains 20
iterations through the launcher, comes out, and transformers' own forward on the export is ours.

One command on the GPU machine: `bash dev/gpu/checkpoint.sh` (also runs the tiny parity tests,
which go through the same import, on every backend present).
"""
from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from training.launch.presets import PRESETS

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
LAYERS = 8


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _cli(*words, timeout=300) -> str:
    proc = subprocess.run([sys.executable, "-m", "training.checkpoint", *map(str, words),
                           "--no-progress"], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    print(proc.stdout.strip())
    return proc.stdout


def _train(tmp_path: Path, pretrained: Path, save: Path) -> Path:
    env = dict(os.environ, MODEL_SIZE="8B", NUM_LAYERS=str(LAYERS), SEQ_LENGTH="2048",
               BS="8", TOTAL_ITERS="20", LR="1e-5", MIN_LR="1e-6", EVAL_ITERS="0",
               TRANSFORMER_IMPL="native", GPUS_PER_NODE="1", EXP_NAME="from-hf", RUN_ID="run",
               EXPERIMENT_DIR=str(tmp_path / "experiment"), PRETRAINED_CHECKPOINT=str(pretrained),
               SAVE=str(save), SAVE_INTERVAL="20", MASTER_ADDR="127.0.0.1",
               # the export needs the weights only: no 34 GB of optimizer state on the disk
               EXTRA_MEGATRON_ARGS="--no-save-optim --no-save-rng",
               MASTER_PORT=str(_free_port()),
               CUDA_VISIBLE_DEVICES=os.environ.get("CUDA_VISIBLE_DEVICES", "0"))
    proc = subprocess.run(["bash", str(REPO / "examples/llama/train_llama3.sh")], env=env,
                          capture_output=True, text=True, timeout=400)
    log = proc.stdout[-6000:] + proc.stderr[-6000:]
    assert proc.returncode == 0, log
    run = tmp_path / "experiment" / "from-hf" / "bf16" / "run"
    train_log = (run / "train.log").read_text()
    # Megatron's own lines: it read the import as a release checkpoint, weights only, at 0
    assert f"loading release distributed checkpoint from {pretrained}" in train_log, log
    assert "at iteration 0" in train_log
    losses = [json.loads(x)["loss"] for x in (run / "metrics.jsonl").read_text().splitlines()
              if json.loads(x).get("loss") is not None]
    assert len(losses) == 20 and all(map(torch.isfinite, torch.tensor(losses)))
    print(f"\nlosses from the import: {losses[0]:.4f} -> {losses[-1]:.4f}")
    return run


def test_import_train_export_matches_transformers(tmp_path):
    from tests.checkpoint.helpers import safetensors_tensors
    from tests.model.parity import (check_bf16_parity, compare, describe, fp32_logits,
                                    gpt_model, init_single_rank, load_hf, random_tokens)
    from training.checkpoint.bench import synthesise
    from training.checkpoint.megatron import load_weights

    preset = dataclasses.replace(PRESETS["llama3-8B"], num_layers=LAYERS)
    hf_in, imported, save, hf_out = (tmp_path / n for n in ("hf", "imported", "save", "hf_out"))
    synthesise(hf_in, preset, LAYERS, device="cuda")
    _cli("import", hf_in, imported)
    _train(tmp_path, imported, save)
    _cli("export", save, hf_out)   # the config comes back through the run's saved arguments

    before, after = safetensors_tensors(hf_in), safetensors_tensors(hf_out)
    assert sorted(before) == sorted(after)
    changed = [n for n in before if not torch.equal(before[n], after[n])]
    assert len(changed) > len(before) // 2, "training changed (almost) nothing?"

    init_single_rank("cuda")
    ours = gpt_model(preset, LAYERS, "native", "liger", torch.bfloat16)
    ours = ours.to(device="cuda", dtype=torch.bfloat16).eval()
    load_weights(ours, save)
    # transformers' own model on the export, in bf16; its fp32 forward is the yardstick
    theirs = load_hf(hf_out, "cuda", torch.bfloat16)
    tokens = random_tokens(preset.vocab_size, 2, 1024, "cuda")
    result = compare(theirs, ours, tokens, fp32_logits(theirs, tokens))
    print(f"\nexport (transformers) vs ours: {describe(result)}")
    check_bf16_parity(result)
