"""The Transformer Engine backend on a GPU (issue 19): HF parity in bf16 at the native backend's
tolerance, checkpoint save/resume, and each fp8 recipe Hopper runs, through the real launcher.
The tiny preset's TE run with every default-on toggle is test_train_gpu.py's
test_tiny_trains_30_iterations_with_falling_loss[transformer_engine] (it checks the TE path).

Skipped where Transformer Engine does not import (a TE session carries it to the GPU machine:
dev/gpu_runbook.md, then PYTHONPATH=/tmp/tesite:...)."""
from __future__ import annotations

import dataclasses
import importlib.util
import json

import pytest

from tests.gpu.test_train_gpu import _losses, _train, check_resume_continues_the_loss_curve
from tests.model.parity import bf16_parity, check_bf16_parity
from training.launch.presets import PRESETS


def _te_imports() -> bool:
    if importlib.util.find_spec("transformer_engine") is None:
        return False
    try:
        import transformer_engine.pytorch  # noqa: F401
    except Exception:  # noqa: BLE001 - a broken TE install is common
        return False
    return True


pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not _te_imports(),
                                 reason="Transformer Engine does not import here (on the GPU "
                                        "machine: the TE carry of dev/gpu_runbook.md, then "
                                        "PYTHONPATH=/tmp/tesite:$PYTHONPATH)")]

# Llama 3 8B's layer widths (every GEMM dimension a multiple of 128, as TE's block scaling
# needs; the tiny preset's FFN of 704 is not) with one layer and the corpus' 8192-token
# vocabulary: ~0.3 B parameters, seconds of training after the start-up.
RECIPE_SHAPE = {"MODEL_SIZE": "8B", "NUM_LAYERS": 1, "SEQ_LENGTH": 512, "MBS": 2, "BS": 8,
                "TOTAL_ITERS": 20, "LR": "3e-4", "MIN_LR": "3e-5"}


@pytest.mark.parametrize("preset_name,layers", [("tiny", 2), ("llama3-8B", 2)])
def test_te_bf16_parity_with_hf(preset_name, layers):
    """The native backend's bound (tests/model/parity.py check_bf16_parity: our bf16 logits
    within 3x HF's own bf16 rounding error of HF's, measured in the same call), on TE's spec
    (TE's fused QKV RoPE, its LayerNorm-linears holding HF's RMSNorm weights)."""
    preset = dataclasses.replace(PRESETS[preset_name], num_layers=layers)
    result = bf16_parity(preset, layers, "transformer_engine", "torch", "cuda", batch=2, seq=1024)
    print(f"\n{preset_name}/transformer_engine: mean abs err {result['mean_abs_err']:.3e} "
          f"(HF's own bf16 error {result['baseline_abs_err']:.3e}), loss HF "
          f"{result['loss_hf']:.5f} ours {result['loss_ours']:.5f}")
    check_bf16_parity(result)


def test_te_tiny_run_starts_from_an_import(tmp_path):
    """PRETRAINED_CHECKPOINT on TE's spec through the launcher (issues 26 and 19): Megatron's
    own load, at its default --dist-ckpt-strictness, of an import into TE's linears and final
    norm, whose `_extra_state` the import writes as None (before, torch DCP stopped on
    "Missing key in checkpoint state_dict: decoder.final_layernorm._extra_state/shard_0_1")."""
    from tests.checkpoint.helpers import save_random_llama
    from training.checkpoint.convert import import_checkpoint

    imported = tmp_path / "imported"
    import_checkpoint(str(save_random_llama(tmp_path / "hf", PRESETS["tiny"])), imported,
                      progress=False)
    run = _train(tmp_path, "te-from-hf", TRANSFORMER_IMPL="transformer_engine",
                 PRETRAINED_CHECKPOINT=imported, TOTAL_ITERS=5)
    train_log = (run / "train.log").read_text()
    assert f"loading release distributed checkpoint from {imported}" in train_log
    assert "at iteration 0" in train_log
    losses = _losses(run)
    assert sorted(losses) == [1, 2, 3, 4, 5] and all(v == v and v < 20 for v in losses.values())
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["run"]["transformer_engine"]["wgrad_megatron_linears"]   # TE's spec ran


def test_te_checkpoint_resume_continues_the_loss_curve(tmp_path):
    check_resume_continues_the_loss_curve(tmp_path, TRANSFORMER_IMPL="transformer_engine")


def test_te_moe_checkpoint_resume_continues_the_loss_curve(tmp_path):
    check_resume_continues_the_loss_curve(tmp_path, script="examples/moe/train_qwen3_moe.sh",
                                          TRANSFORMER_IMPL="transformer_engine")


@pytest.mark.parametrize("precision", ["fp8", "fp8_tensorwise", "fp8_blockwise"])
def test_each_hopper_fp8_recipe_trains(tmp_path, precision):
    run = _train(tmp_path, f"te-{precision}", TRANSFORMER_IMPL="transformer_engine",
                 PRECISION=precision, **RECIPE_SHAPE)
    losses = _losses(run)
    assert sorted(losses) == list(range(1, 21))
    first = sum(losses[i] for i in range(1, 6)) / 5
    last = sum(losses[i] for i in range(16, 21)) / 5
    manifest = json.loads((run / "manifest.json").read_text())
    summary = manifest["run"]["summary"]
    print(f"\n{precision}: loss {first:.3f} (iters 1-5) -> {last:.3f} (iters 16-20), "
          f"{summary.get('tokens_per_s_per_gpu', 0):,.0f} tokens/s/GPU, "
          f"{summary.get('peak_allocated_gib_max_over_ranks', 0):.1f} GiB")
    assert manifest["precision"] == precision and run.parent.name == precision
    assert all(v == v and v < 20 for v in losses.values())      # finite, no blow-up
    assert last < first - 0.5
    assert manifest["run"]["transformer_engine"]["wgrad_megatron_linears"]
