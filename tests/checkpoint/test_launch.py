"""PRETRAINED_CHECKPOINT: the launch toggle that starts from an import, its guard, and
megatron.training's own load of it with the launcher's arguments."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from training.checkpoint.convert import export_checkpoint
from training.launch.guards import Refusals

from tests.launch.helpers import launch, megatron_args

from .helpers import REPO, assert_bitwise_equal


def _refusal(base_env, **toggles) -> str:
    with pytest.raises(Refusals) as err:
        launch(base_env, **toggles)
    return str(err.value)


def _notices(result, guard):
    return [n.message for n in result.settings.notices if n.guard == guard]


def test_starts_from_the_import_with_megatron_flag(base_env, tiny_ckpt):
    result = launch(base_env, MODEL_SIZE="tiny", PRETRAINED_CHECKPOINT=tiny_ckpt)
    words = result.buckets["OUTPUT_ARGS"]
    assert words[words.index("--pretrained-checkpoint") + 1] == str(tiny_ckpt)
    assert "--load" not in words and "--finetune" not in words   # Megatron sets finetune itself
    (note,) = _notices(result, "pretrained_checkpoint")
    assert "weights only, fresh optimizer, iteration 0" in note and "tiny" in note
    args = megatron_args(result)
    assert args.pretrained_checkpoint == str(tiny_ckpt) and args.load is None


def test_other_preset_or_layer_count_is_refused_with_the_fix(base_env, tiny_ckpt):
    text = _refusal(base_env, MODEL_SIZE="8B", PRETRAINED_CHECKPOINT=tiny_ckpt)
    assert "[pretrained_checkpoint]" in text
    assert "hidden_size: 256 (checkpoint) vs 4096 (launch)" in text
    assert "MODEL_SIZE=tiny NUM_LAYERS=2" in text
    text = _refusal(base_env, MODEL_SIZE="tiny", NUM_LAYERS=4, PRETRAINED_CHECKPOINT=tiny_ckpt)
    assert "num_layers: 2 (checkpoint) vs 4 (launch)" in text


def test_without_model_size_the_launch_takes_the_imports_shape(base_env, tiny_ckpt):
    """No MODEL_SIZE: MODEL_CONFIG is derived from the import (its record), every field's
    source is the checkpoint, and Megatron's parser reads that shape back."""
    result = launch(base_env, PRETRAINED_CHECKPOINT=tiny_ckpt)
    s = result.settings
    assert s.setting("MODEL_CONFIG").source == "derived"
    assert (s["MODEL_SIZE"], s.setting("MODEL_SIZE").source) == ("tiny", "checkpoint")
    assert (s["NUM_LAYERS"], s.setting("NUM_LAYERS").source) == (2, "checkpoint")
    args = megatron_args(result)
    assert (args.hidden_size, args.num_layers, args.ffn_hidden_size) == (256, 2, 704)


def test_a_folder_that_is_not_an_import_is_refused(base_env, tiny_ckpt, tmp_path):
    assert "is not an imported checkpoint" in _refusal(
        base_env, MODEL_SIZE="tiny", PRETRAINED_CHECKPOINT=tmp_path / "nothing")
    copy = shutil.copytree(tiny_ckpt, tmp_path / "no_record")
    (copy / "hf_import.json").unlink()
    assert "is not an imported checkpoint" in _refusal(
        base_env, MODEL_SIZE="tiny", PRETRAINED_CHECKPOINT=copy)


def test_an_import_without_the_final_norms_extra_state_is_refused_off_native(base_env,
                                                                             tiny_ckpt, tmp_path):
    """An import of record format 1 lacks decoder.final_layernorm._extra_state, which TE's
    final norm asks Megatron's load for: refused before torchrun where TE's norm is used."""
    record = json.loads((tiny_ckpt / "hf_import.json").read_text())
    assert record["format"] == 3
    old = shutil.copytree(tiny_ckpt, tmp_path / "format1")
    (old / "hf_import.json").write_text(json.dumps({**record, "format": 1}))
    te = dict(MODEL_SIZE="tiny", PLATFORM="h200", PRETRAINED_CHECKPOINT=old)
    for backend in ("transformer_engine", "local"):
        text = _refusal(base_env, TRANSFORMER_IMPL=backend, **te)
        assert "[pretrained_checkpoint]" in text and "final norm's _extra_state" in text
        assert "import it again with `python -m training.checkpoint import`" in text
    launch(base_env, TRANSFORMER_IMPL="native", **te)
    launch(base_env, TRANSFORMER_IMPL="transformer_engine", **{**te,
                                                               "PRETRAINED_CHECKPOINT": tiny_ckpt})


def test_resuming_is_kept_apart_from_starting(base_env, tiny_ckpt, tmp_path):
    text = _refusal(base_env, MODEL_SIZE="tiny", LOAD=tiny_ckpt)
    assert "is an imported checkpoint; LOAD resumes" in text
    assert f"PRETRAINED_CHECKPOINT={tiny_ckpt}" in text
    text = _refusal(base_env, MODEL_SIZE="tiny", PRETRAINED_CHECKPOINT=tiny_ckpt,
                    SAVE=tiny_ckpt, SAVE_INTERVAL=10)
    assert "SAVE and PRETRAINED_CHECKPOINT are both" in text


def test_an_empty_load_beside_it_is_the_resume_folder(base_env, tiny_ckpt, tmp_path):
    """LOAD=SAVE=<run folder> with PRETRAINED_CHECKPOINT: the first launch starts from the
    import (no RESUME=auto needed), later ones resume; Megatron picks by LOAD's tracker."""
    run = tmp_path / "run_ckpt"
    result = launch(base_env, MODEL_SIZE="tiny", PRETRAINED_CHECKPOINT=tiny_ckpt, LOAD=run,
                    SAVE=run, SAVE_INTERVAL=10)
    assert any("starts from PRETRAINED_CHECKPOINT" in m
               for m in _notices(result, "load_checkpoint"))
    assert "is resumed instead" in _notices(result, "pretrained_checkpoint")[0]
    args = megatron_args(result)
    assert args.load == args.save == str(run) and args.pretrained_checkpoint == str(tiny_ckpt)
    # without PRETRAINED_CHECKPOINT the same empty LOAD is still refused
    assert "[load_checkpoint]" in _refusal(base_env, MODEL_SIZE="tiny", LOAD=run)


@pytest.mark.slow
@pytest.mark.parametrize("te_final_norm", [False, True], ids=["native", "te-final-norm"])
def test_megatron_training_starts_from_it_and_its_save_exports_bitwise(tiny_hf, tiny_ckpt,
                                                                       tmp_path, te_final_norm):
    """PRETRAINED_CHECKPOINT through the launcher's arguments into megatron.training's own
    load_checkpoint: iteration 0, --finetune set by Megatron, HF's logits; then a run's
    save_checkpoint (with its saved arguments) exports without being told the config (the
    saved --pretrained-checkpoint leads back to the import record). te-final-norm: the final
    norm asks for its `_extra_state` as TE's spec's does, under Megatron's default
    --dist-ckpt-strictness (a key the import lacked raised in torch DCP on the GPU)."""
    worker = REPO / "tests/checkpoint/megatron_training_worker.py"
    proc = subprocess.run([sys.executable, str(worker), str(tiny_ckpt), str(tiny_hf),
                           str(tmp_path / "save"), "MODEL_SIZE=tiny",
                           *(["--te-final-norm"] if te_final_norm else [])],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["iteration"] == 0 and result["finetune"] is True
    if te_final_norm:
        assert result["final_norm_extra_states"] == ["None"]   # the import's, TE skips None
    assert result["max_abs_err"] < 1e-4 and result["loss_rel_err"] < 1e-6
    export_checkpoint(tmp_path / "save", tmp_path / "back", progress=False)
    assert_bitwise_equal(tiny_hf, tmp_path / "back")
