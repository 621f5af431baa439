"""gpt-oss through `python -m training.checkpoint import/export` (training/checkpoint/
gpt_oss_files.py): a bf16 folder round-trips bit for bit and the export gives the original's
logits in transformers; the import loads into our built model; MXFP4 experts are dequantized as
transformers' own function does; bad input exits 2 with one line and leaves nothing."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from training.checkpoint.__main__ import main
from training.checkpoint.gpt_oss_files import dequantize_mxfp4, fp4_values
from training.moe.gpt_oss import TINY_GPT_OSS

from tests.moe.gpt_oss_model import hf_gpt_oss

LAYERS = 2


def _run(*argv) -> int:
    return main([*map(str, argv), "--no-progress"])


@pytest.fixture(scope="module")
def bf16_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("oss") / "tiny-oss"
    hf_gpt_oss(TINY_GPT_OSS, LAYERS, dtype=torch.bfloat16).save_pretrained(folder)
    return folder


def _tensors(folder):
    out = {}
    for path in sorted(folder.glob("*.safetensors")):
        out.update(load_file(path))
    return out


def _mxfp4_folder(bf16_folder, target, seed=0):
    """bf16_folder with its experts' weights as random MXFP4 blocks and scales."""
    shutil.copytree(bf16_folder, target)
    tensors = _tensors(target)
    gen = torch.Generator().manual_seed(seed)
    for name in [n for n in tensors if n.endswith(("gate_up_proj", "down_proj"))]:
        stored = tensors.pop(name)                           # [E, in, out] (x @ W)
        e, width, rows = stored.shape
        tensors[f"{name}_blocks"] = torch.randint(0, 256, (e, rows, width // 32, 16),
                                                  generator=gen, dtype=torch.uint8)
        tensors[f"{name}_scales"] = torch.randint(120, 132, (e, rows, width // 32),
                                                  generator=gen, dtype=torch.uint8)
    for path in target.glob("*.safetensors"):
        path.unlink()
    save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((target / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4",
                                     "modules_to_not_convert": ["model.layers.*.self_attn"]}
    (target / "config.json").write_text(json.dumps(config))
    return target, tensors


def test_bf16_round_trip_is_bit_for_bit_and_gives_the_same_logits(bf16_folder, tmp_path):
    from transformers import GptOssForCausalLM

    assert _run("import", bf16_folder, tmp_path / "ckpt") == 0
    record = json.loads((tmp_path / "ckpt" / "hf_import.json").read_text())
    assert record["preset"] == TINY_GPT_OSS.name and record["family"] == "gpt_oss"
    # the launcher's pretrained_checkpoint guard compares these with the preset's own
    assert {k: getattr(TINY_GPT_OSS, k, None) for k in record["preset_fields"]} == \
        record["preset_fields"]
    assert _run("export", tmp_path / "ckpt", tmp_path / "back") == 0
    original, back = _tensors(bf16_folder), _tensors(tmp_path / "back")
    assert set(back) == set(original)
    for name, tensor in original.items():
        assert back[name].dtype == tensor.dtype and torch.equal(back[name], tensor), name
    tokens = torch.randint(0, TINY_GPT_OSS.vocab_size, (2, 40), generator=torch.Generator()
                           .manual_seed(3))
    logits = []
    for folder in (bf16_folder, tmp_path / "back"):
        model = GptOssForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                  attn_implementation="eager").eval()
        with torch.no_grad():
            logits.append(model(tokens).logits)
    assert torch.equal(logits[0], logits[1])


def test_the_import_loads_into_our_model(bf16_folder, tmp_path):
    """The checkpoint's keys are our GPTModel's sharded state dict's: every weight loads, and
    equals the table's conversion of the folder."""
    from training.checkpoint import gpt_oss, megatron

    from tests.moe.gpt_oss_model import build_gpt_oss

    assert _run("import", bf16_folder, tmp_path / "ckpt") == 0
    gpt, _ = build_gpt_oss(TINY_GPT_OSS, LAYERS)
    gpt = gpt.to(torch.bfloat16)
    megatron.load_weights(gpt, tmp_path / "ckpt")
    config = json.loads((bf16_folder / "config.json").read_text())
    want = gpt_oss.hf_to_megatron(_tensors(bf16_folder), config)
    got = gpt_oss.native_state(gpt)
    assert set(got) == set(want)
    for key, tensor in want.items():
        assert torch.equal(got[key], tensor), key


def test_fp4_values_are_e2m1():
    assert fp4_values().tolist() == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                                     -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
    # one block: byte 0x21 is the values 0.5 (low nibble 1) then 1.0 (high nibble 2), x 2**1
    blocks = torch.zeros((1, 1, 1, 16), dtype=torch.uint8)
    blocks[0, 0, 0, 0] = 0x21
    out = dequantize_mxfp4(blocks, torch.full((1, 1, 1), 128, dtype=torch.uint8))
    assert out.shape == (1, 32, 1) and out[0, :3, 0].tolist() == [1.0, 2.0, 0.0]


def test_mxfp4_experts_import_as_transformers_dequantizes_them(bf16_folder, tmp_path):
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    folder, tensors = _mxfp4_folder(bf16_folder, tmp_path / "mxfp4")
    assert _run("import", folder, tmp_path / "ckpt") == 0
    assert _run("export", tmp_path / "ckpt", tmp_path / "back") == 0
    back = _tensors(tmp_path / "back")
    config = json.loads((tmp_path / "back" / "config.json").read_text())
    assert "quantization_config" not in config
    for name, tensor in tensors.items():
        if name.endswith("_scales"):
            continue
        if name.endswith("_blocks"):
            base = name.removesuffix("_blocks")
            reference = convert_moe_packed_tensors(tensor, tensors[base + "_scales"],
                                                   dtype=torch.bfloat16)
            assert back[base].dtype == torch.bfloat16 and torch.equal(back[base], reference), base
        else:
            assert torch.equal(back[name], tensor), name
    from transformers import GptOssForCausalLM

    GptOssForCausalLM.from_pretrained(tmp_path / "back", dtype=torch.bfloat16)


def _refused(capsys, argv, parent) -> str:
    before = sorted(p.name for p in parent.iterdir())
    assert _run(*argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert sorted(p.name for p in parent.iterdir()) == before   # no output, no staging left
    return err


def test_bad_mxfp4_input_is_refused_in_one_line(bf16_folder, tmp_path, capsys):
    folder, tensors = _mxfp4_folder(bf16_folder, tmp_path / "mxfp4")
    out = tmp_path / "out"
    # missing scales
    name = "model.layers.1.mlp.experts.down_proj_scales"
    save_file({k: v for k, v in tensors.items() if k != name}, str(folder / "model.safetensors"))
    err = _refused(capsys, ["import", folder, out], tmp_path)
    assert name in err and "lacks" in err
    # a blocks tensor one group short
    blocks = "model.layers.0.mlp.experts.gate_up_proj_blocks"
    short = dict(tensors, **{blocks: tensors[blocks][:, :, :-1].contiguous()})
    save_file(short, str(folder / "model.safetensors"))
    err = _refused(capsys, ["import", folder, out], tmp_path)
    assert blocks in err and "config implies" in err
    # a file cut short
    save_file(tensors, str(folder / "model.safetensors"))
    path = folder / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-1000])
    err = _refused(capsys, ["import", folder, out], tmp_path)
    assert "truncated" in err


def test_a_config_megatron_cannot_build_is_refused(bf16_folder, tmp_path, capsys):
    folder = tmp_path / "full"
    shutil.copytree(bf16_folder, folder)
    config = json.loads((folder / "config.json").read_text())
    config["layer_types"] = ["full_attention"] * LAYERS
    (folder / "config.json").write_text(json.dumps(config))
    err = _refused(capsys, ["import", folder, tmp_path / "out"], tmp_path)
    assert "layer_types" in err


def test_a_gpt_oss_run_without_a_config_asks_for_one(base_env):
    """A gpt-oss checkpoint whose run did not start from an import (no config.json beside it)
    is refused in words that say what to give, not as 'not a Llama decoder'; the MLPerf
    variant (plain SwiGLU, vanilla softmax, no biases, but a window every other layer) is
    refused rather than exported as a Llama-family config without its window."""
    from tests.launch.helpers import megatron_args
    from tests.moe.test_gpt_oss_launch import oss
    from training.checkpoint.convert import ConversionError, architecture_from_args

    args = megatron_args(oss(base_env, MODEL_SIZE="tiny", NUM_LAYERS=2))
    with pytest.raises(ConversionError, match="gpt-oss model .* give --hf-config"):
        architecture_from_args(args)
    mlperf = megatron_args(oss(base_env, MODEL_SIZE="20b-mlperf", NUM_LAYERS=2))
    with pytest.raises(ConversionError, match="windowed .* would drop the window"):
        architecture_from_args(mlperf)
