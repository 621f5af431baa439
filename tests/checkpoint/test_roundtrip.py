"""Hugging Face -> Megatron -> Hugging Face on the CPU: bitwise, at TP=1, TP=2 and PP=2 (the
same through megatron.training's own load and save: tests/checkpoint/test_launch.py)."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
import torch

from training.checkpoint import layout, megatron, record
from training.checkpoint.convert import export_checkpoint, import_checkpoint
from training.launch.presets import PRESETS

from .helpers import REPO, assert_bitwise_equal, save_random_llama


def test_tiny_import_then_export_is_bitwise(tiny_hf, tiny_ckpt, tmp_path):
    out = tmp_path / "hf"
    export_checkpoint(tiny_ckpt, out, progress=False)
    assert_bitwise_equal(tiny_hf, out)
    assert (out / "generation_config.json").read_text() == \
        (tiny_hf / "generation_config.json").read_text()


def test_export_is_what_transformers_loads_and_runs_the_same(tiny_hf, tiny_ckpt, tmp_path):
    from transformers import AutoConfig, LlamaForCausalLM

    out = tmp_path / "hf"
    export_checkpoint(tiny_ckpt, out, progress=False)
    theirs, ours = AutoConfig.from_pretrained(tiny_hf), AutoConfig.from_pretrained(out)
    same = {"_name_or_path": None}
    assert ours.to_dict() | same == theirs.to_dict() | same
    tokens = torch.randint(0, ours.vocab_size, (1, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a = LlamaForCausalLM.from_pretrained(tiny_hf)(input_ids=tokens).logits
        b = LlamaForCausalLM.from_pretrained(out)(input_ids=tokens).logits
    assert torch.equal(a, b)


def test_import_writes_a_release_checkpoint_and_its_record(tiny_hf, tiny_ckpt):
    assert (tiny_ckpt / megatron.TRACKER).read_text() == "release"
    iteration = tiny_ckpt / "release"
    assert json.loads((iteration / "metadata.json").read_text())["sharded_backend"] == "torch_dist"
    assert {p.name for p in iteration.iterdir()} == {".metadata", "__0_0.distcp", "metadata.json"}
    rec = record.read_record(tiny_ckpt)
    assert rec["preset"] == "tiny" and rec["num_layers"] == 2 and rec["dtype"] == "bfloat16"
    assert rec["hf_config"] == json.loads((tiny_hf / "config.json").read_text())
    assert rec["source"] == str(tiny_hf.absolute())
    assert sorted(rec["side_files"]) == ["config.json", "generation_config.json"]
    assert not list(tiny_ckpt.parent.glob(".*partial*"))   # the staging folder was renamed


def test_megatron_reads_the_stacked_layers_and_common_state(tiny_ckpt):
    from training.checkpoint.convert import single_process_group

    with single_process_group():
        reader = megatron.DistCheckpointReader(megatron.iteration_dir(tiny_ckpt))
        assert reader.common["iteration"] == 0 and reader.common["checkpoint_version"] == 3.0
        assert reader.metadata[layout.QKV] == ((2, 512, 256), torch.bfloat16)
        assert reader.metadata[layout.FC1] == ((2, 1408, 256), torch.bfloat16)
        reader.close()


def test_fp32_checkpoint_keeps_its_dtype(tmp_path):
    hf = save_random_llama(tmp_path / "hf", PRESETS["tiny"], dtype=torch.float32)
    import_checkpoint(str(hf), tmp_path / "megatron", progress=False)
    export_checkpoint(tmp_path / "megatron", tmp_path / "back", progress=False,
                      max_shard_bytes=4 << 20)
    assert_bitwise_equal(hf, tmp_path / "back")
    index = json.loads((tmp_path / "back" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1   # sharded at 4 MiB
    assert json.loads((tmp_path / "back" / "config.json").read_text())["torch_dtype"] == "float32"


def test_chunks_in_row_ranges_load_and_export_the_same(tiny_hf, tiny_ckpt_pieces, tmp_path):
    from training.checkpoint.convert import single_process_group

    with single_process_group():
        reader = megatron.DistCheckpointReader(megatron.iteration_dir(tiny_ckpt_pieces))
        assert reader.metadata[layout.EMBEDDING] == ((8192, 256), torch.bfloat16)
        reader.close()
    export_checkpoint(tiny_ckpt_pieces, tmp_path / "back", progress=False)
    assert_bitwise_equal(tiny_hf, tmp_path / "back")


def test_two_writer_threads_give_the_same_checkpoint(tiny_hf, tmp_path):
    import_checkpoint(str(tiny_hf), tmp_path / "megatron", workers=2, progress=False)
    assert len(list((tmp_path / "megatron" / "release").glob("*.distcp"))) == 2
    export_checkpoint(tmp_path / "megatron", tmp_path / "back", progress=False)
    assert_bitwise_equal(tiny_hf, tmp_path / "back")


def test_a_run_without_an_import_record_is_described_by_its_saved_arguments(base_env, tmp_path):
    """The export's last resort: Megatron's saved arguments (here the launcher's own, parsed by
    Megatron's parser), the true vocabulary from the preset of that shape."""
    from tests.launch.helpers import launch, megatron_args
    from training.checkpoint.convert import _describe
    from training.checkpoint.layout import Architecture

    args = megatron_args(launch(base_env, MODEL_SIZE="3.1-8B", NUM_LAYERS=4))
    args.padded_vocab_size = 128256 + 256          # as Megatron pads at some TP
    arch, config, side = _describe(tmp_path, {"args": args}, None)
    expected = Architecture.from_preset(PRESETS["llama3.1-8B"], num_layers=4)
    # Megatron's max_position_embeddings is the launch's max(preset, SEQ_LENGTH)
    assert arch == dataclasses.replace(expected,
                                       max_position_embeddings=args.max_position_embeddings)
    assert config == {} and side is None


def test_saved_arguments_give_their_own_rope_scaling_factor(base_env):
    """At a factor that is not the default 8.0 (Llama 3.2 uses 32): the export's description
    from saved arguments, and the config.json it writes, carry the run's factor."""
    from tests.launch.helpers import launch, megatron_args
    from training.checkpoint.convert import architecture_from_args

    args = megatron_args(launch(base_env, MODEL_SIZE="3.1-8B", NUM_LAYERS=4))
    assert args.rope_scaling_factor == 8.0
    args.rope_scaling_factor = 32.0                # as a run saved with --rope-scaling-factor 32
    fields = architecture_from_args(args).hf_config_fields()
    assert fields["rope_scaling"] == {**layout.LLAMA31_ROPE_SCALING, "factor": 32.0}
    args.use_rope_scaling = False
    assert architecture_from_args(args).hf_config_fields()["rope_scaling"] is None


def test_llama31_rope_scaling_survives_the_round_trip(tmp_path):
    from transformers import AutoConfig

    preset = dataclasses.replace(PRESETS["tiny"], name="tiny-llama3.1-rope", rope_scaling=True,
                                 rotary_base=500000, max_position_embeddings=131072)
    hf = save_random_llama(tmp_path / "hf", preset)
    import_checkpoint(str(hf), tmp_path / "megatron", presets={preset.name: preset},
                      progress=False)
    export_checkpoint(tmp_path / "megatron", tmp_path / "back", progress=False)
    rope = AutoConfig.from_pretrained(tmp_path / "back").rope_parameters
    assert rope["rope_type"] == "llama3" and rope["factor"] == 8.0
    assert rope["original_max_position_embeddings"] == 8192 and rope["rope_theta"] == 500000


def _run(*words, timeout=600):
    proc = subprocess.run([sys.executable, *map(str, words)], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


@pytest.mark.slow
@pytest.mark.parametrize("tp,pp", [(2, 1), (1, 2)])
def test_loads_and_saves_at_another_layout(tiny_hf, tiny_ckpt_pieces, tmp_path, tp, pp):
    """Two gloo processes load the import (its tensors in row ranges, as an 8B import's
    embedding is) at TP=2 (or PP=2) and save it again with Megatron's own
    dist_checkpointing.save, chunked by that layout; the export of that save is bitwise the
    original. At TP=2 the loaded model's logits (fp32 copy, gathered over the vocabulary
    shards) are HF's."""
    logits = tmp_path / "logits.pt"
    _run(REPO / "tests/checkpoint/layout_worker.py", tiny_ckpt_pieces, tmp_path / "save",
         "--tp", tp, "--pp", pp, "--logits", logits)
    files = sorted(p.name for p in (tmp_path / "save" / "iter_0000001").glob("*.distcp"))
    assert files == ["__0_0.distcp", "__1_0.distcp"]   # each rank wrote its own part
    export_checkpoint(tmp_path / "save", tmp_path / "back", hf_config=tiny_hf, progress=False)
    assert_bitwise_equal(tiny_hf, tmp_path / "back")
    if pp == 1:
        from transformers import LlamaForCausalLM

        got = torch.load(logits)
        with torch.no_grad():
            ref = LlamaForCausalLM.from_pretrained(tiny_hf, dtype=torch.float32)(
                input_ids=got["tokens"]).logits
        assert got["logits"].shape == ref.shape
        assert (got["logits"] - ref).abs().max().item() < 1e-4
