"""Issue 39 on an H200: Llama-3.2-1B in, 50 iterations on Shakespeare from its import, out.

The model: meta-llama/Llama-3.2-1B's own config.json (16 layers at full width, tied
embeddings, Llama 3 RoPE scaling with factor 32), with its published weights when
LLAMA32_1B names a local copy, else random weights of that config (the lent machine reaches no
network). Imported with `python -m training.checkpoint import`, launched with
PRETRAINED_CHECKPOINT alone (no MODEL_SIZE: the launch takes the import's shape, source
checkpoint), trained 50 iterations on the shipped Shakespeare corpus (its 8192-token tokenizer
is not Llama's: the vocabulary is padded to the checkpoint's 128256 rows with
--make-vocab-size-divisible-by, the guard checkpoint_vocabulary's fix), the loss falling;
exported; transformers' LlamaForCausalLM on the export computes our model's logits (bf16
yardstick of tests/model/parity.py).

One command on the GPU machine: `GIT_SHA=<sha> bash dev/gpu/byo_model.sh` (carry: .whl, data).
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from tests.gpu.test_checkpoint_gpu import _cli, _free_port   # the same CLI call and port

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "data" / "shakespeare"
ITERS = 50
VOCAB_ROWS = 128256


def _llama32(folder: Path) -> Path:
    """A local Llama-3.2-1B (LLAMA32_1B), or random weights of its config.json."""
    if os.environ.get("LLAMA32_1B"):
        return Path(os.environ["LLAMA32_1B"])
    from transformers import AutoConfig, AutoModelForCausalLM

    from tests.checkpoint.published import LLAMA_3_2_1B

    (folder / "config").mkdir(parents=True)
    (folder / "config" / "config.json").write_text(json.dumps(LLAMA_3_2_1B))
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(folder / "config")
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(folder / "Llama-3.2-1B")
    del model
    torch.cuda.empty_cache()
    return folder / "Llama-3.2-1B"


def _env(tmp_path: Path, imported: Path, save: Path) -> dict:
    return dict(os.environ, PRETRAINED_CHECKPOINT=str(imported), DATA_PATH=str(SAMPLE / "train"),
                SEQ_LENGTH="2048", BS="8", MBS="2", TOTAL_ITERS=str(ITERS), LR="3e-4",
                MIN_LR="3e-5", EVAL_ITERS="0", TRANSFORMER_IMPL="native", GPUS_PER_NODE="1",
                EXP_NAME="llama32-1b", RUN_ID="run", EXPERIMENT_DIR=str(tmp_path / "experiment"),
                SAVE=str(save), SAVE_INTERVAL=str(ITERS), MASTER_ADDR="127.0.0.1",
                EXTRA_MEGATRON_ARGS="--no-save-optim --no-save-rng",
                MASTER_PORT=str(_free_port()),
                CUDA_VISIBLE_DEVICES=os.environ.get("CUDA_VISIBLE_DEVICES", "0"))


def test_llama32_1b_imports_trains_on_shakespeare_and_exports(tmp_path):
    from tests.launch.helpers import megatron_args
    from tests.model.parity import (check_bf16_parity, compare, describe, fp32_logits,
                                    init_single_rank, load_hf, random_tokens)
    from training.checkpoint.megatron import load_weights
    from training.launch.resolve import resolve

    if not (SAMPLE / "train.bin").exists():
        pytest.skip("the shipped corpus is not built: run `make data-sample` first (carry data)")
    hf_in = _llama32(tmp_path)
    imported, save, hf_out = (tmp_path / n for n in ("imported", "save", "hf_out"))
    _cli("import", hf_in, imported)
    words = ["--make-vocab-size-divisible-by", str(VOCAB_ROWS)]
    env = _env(tmp_path, imported, save)
    proc = subprocess.run(["bash", str(REPO / "examples/llama/train_llama3.sh"), *words],
                          env=env, capture_output=True, text=True, timeout=480)
    log = proc.stdout[-6000:] + proc.stderr[-6000:]
    assert proc.returncode == 0, log
    run = tmp_path / "experiment" / "llama32-1b" / "bf16" / "run"
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["model"]["hidden_size"] == 2048 and manifest["model"]["tied_embeddings"]
    assert manifest["model"]["rope_scaling_factor"] == 32.0
    assert {r["source"] for r in manifest["model_config"]["fields"]} == {"checkpoint"}
    train_log = (run / "train.log").read_text()
    assert f"loading release distributed checkpoint from {imported}" in train_log, log
    losses = [json.loads(x)["loss"] for x in (run / "metrics.jsonl").read_text().splitlines()
              if json.loads(x).get("loss") is not None]
    assert len(losses) == ITERS and all(map(torch.isfinite, torch.tensor(losses)))
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    print(f"\nLlama-3.2-1B from its import on Shakespeare: loss {first:.3f} (iterations 1-5) "
          f"-> {last:.3f} ({ITERS - 4}-{ITERS})")
    assert last < first - 1.0, losses

    _cli("export", save, hf_out)
    config = json.loads((hf_out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"]
    assert config["rope_scaling"]["factor"] == 32.0

    # our model as the run built it (its launch's Megatron arguments), loaded from SAVE
    from megatron.training.argument_utils import core_transformer_config_from_args

    from training import specs
    from training.pretrain_gpt import build_gpt_model
    from training.run import Run

    init_single_rank("cuda")
    dry = {k: v for k, v in env.items() if k not in ("SAVE", "SAVE_INTERVAL")}
    launch = resolve("llama3", {**dry, "DRY_RUN": "1", "RUN_ID": "dry"}, words)
    args = megatron_args(launch)
    args.padded_vocab_size = VOCAB_ROWS
    specs.install_native(Run(args=args))
    ours = build_gpt_model(args, core_transformer_config_from_args(args))
    ours = ours.to(device="cuda", dtype=torch.bfloat16).eval()
    assert load_weights(ours, save) == []
    theirs = load_hf(hf_out, "cuda", torch.bfloat16)
    tokens = random_tokens(8192, 2, 1024, "cuda")        # the corpus' token ids
    result = compare(theirs, ours, tokens, fp32_logits(theirs, tokens))
    print(f"\nexport (transformers) vs ours: {describe(result)}")
    check_bf16_parity(result)
