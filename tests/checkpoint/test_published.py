"""The issue's eleven published models (tests/checkpoint/published.py: their real config.json).

At their real widths, layers cut to 2: MODEL_CONFIG launches each at its own shape (DRY_RUN),
every field read back from the words by Megatron's own parser and validate_args.
At test widths (published.tiny: each config's structure kept), a random Hugging Face model of
each: import, export bitwise with the config and architecture name kept, a DRY_RUN from the
import carrying its shape, and our GPTModel built from that launch's Megatron arguments with
the import's weights computing Hugging Face's logits."""
from __future__ import annotations

import json

import pytest
import torch

import training.moe.presets  # noqa: F401 - registers qwen3_moe and mixtral
from training.checkpoint import record
from training.checkpoint.convert import export_checkpoint, import_checkpoint
from training.moe.layer import MOE

from tests.launch.helpers import launch, megatron_args

from .helpers import assert_bitwise_equal
from .published import (MISTRAL_7B_V01_WINDOW, PUBLISHED, cut, expect_args, launch_config,
                        logits, ours_from_launch, random_hf_model, tiny, write_config)


@pytest.mark.parametrize("hub_id", sorted(PUBLISHED))
def test_model_config_launches_a_published_model_at_its_own_shape(base_env, tmp_path, hub_id):
    config = cut(PUBLISHED[hub_id])
    folder = write_config(tmp_path / hub_id.split("/")[1], config)
    result = launch_config(base_env, config, MODEL_CONFIG=folder)
    s = result.settings
    assert s.setting("MODEL_SIZE").source == "checkpoint"
    # a published shape that is a preset's keeps the preset's name; any other its folder's
    name = {"meta-llama/Llama-3.1-8B": "llama3.1-8B", "meta-llama/Llama-2-7b-hf": "llama2-7B",
            "Qwen/Qwen3-30B-A3B": "qwen3-30B-A3B",
            "mistralai/Mixtral-8x7B-v0.1": "mixtral-8x7B"}.get(hub_id, folder.name)
    cut_of = "-2L" if name != folder.name else ""     # 2 of the preset's layers
    assert s["MODEL_SIZE"] == name and result.ctx.run_name.startswith(f"{name}{cut_of}_")
    assert (s["NUM_LAYERS"], s.setting("NUM_LAYERS").source) == (2, "checkpoint")
    expect_args(megatron_args(result), config)
    from training.launch.manifest import launch_manifest

    rows = launch_manifest(result)["model_config"]["fields"]
    assert {r["source"] for r in rows} == {"checkpoint"}
    assert {r["toggle"].strip(): r["value"] for r in rows}["hidden_size"] == \
        str(config["hidden_size"])


@pytest.mark.parametrize("hub_id", sorted(PUBLISHED))
def test_a_published_family_round_trips_and_computes_hf_logits(base_env, tmp_path, hub_id):
    from transformers import AutoConfig

    from training.checkpoint.megatron import load_weights

    config = tiny(PUBLISHED[hub_id])
    hf_model, hf = random_hf_model(tmp_path, config)
    out = tmp_path / "megatron"
    import_checkpoint(str(hf), out, progress=False)
    rec = record.read_record(out)
    assert rec["family"] == config["model_type"] and rec["name"] == "hf"
    export_checkpoint(out, tmp_path / "back", progress=False)
    assert_bitwise_equal(hf, tmp_path / "back")
    back = json.loads((tmp_path / "back" / "config.json").read_text())
    assert back["architectures"] == config["architectures"]
    same = {"_name_or_path": None, "transformers_version": None}
    assert AutoConfig.from_pretrained(tmp_path / "back").to_dict() | same == \
        AutoConfig.from_pretrained(hf).to_dict() | same

    # a DRY_RUN from the import carries its shape; our model of it computes HF's logits
    result = launch_config(base_env, config, PRETRAINED_CHECKPOINT=out, NATIVE_KERNELS="torch",
                     TRANSFORMER_IMPL="native")
    assert result.settings.setting("MODEL_SIZE").source == "checkpoint"
    gpt = ours_from_launch(result, config["vocab_size"])
    assert load_weights(gpt, out) == []
    theirs, ours = logits(hf_model, gpt.eval(), config["vocab_size"])
    assert (ours - theirs).abs().max().item() < 1e-4 * max(theirs.abs().mean().item(), 1.0)


@pytest.mark.parametrize("hub_id", ["Qwen/Qwen3-30B-A3B", "mistralai/Mixtral-8x7B-v0.1"])
def test_fused_expert_tensors_import_as_per_expert_ones_and_go_back_fused(tmp_path, hub_id):
    """transformers 5 saves a layer's experts fused (save_original_format=False: the router
    mlp.gate, mlp.experts.gate_up_proj, down_proj): the import of that folder writes the same
    Megatron checkpoint as the per-expert folder of the same model, and the export writes the
    fused tensors back, bitwise (the folder transformers wrote)."""
    from .helpers import safetensors_tensors

    config = tiny(PUBLISHED[hub_id])
    hf_model, per_expert = random_hf_model(tmp_path, config)
    fused = tmp_path / "fused"
    hf_model.save_pretrained(fused, save_original_format=False)
    assert "model.layers.1.mlp.experts.gate_up_proj" in safetensors_tensors(fused)
    for folder in (per_expert, fused):
        import_checkpoint(str(folder), tmp_path / f"{folder.name}-megatron", progress=False)
    for name in ("hf", "fused"):
        export_checkpoint(tmp_path / f"{name}-megatron", tmp_path / f"{name}-back",
                          progress=False)
    assert_bitwise_equal(per_expert, tmp_path / "hf-back")
    assert_bitwise_equal(fused, tmp_path / "fused-back")
    ours = {}
    # the two imports hold the same tensors: the fused rows land where the per-expert ones do
    from training.checkpoint.convert import single_process_group
    from training.checkpoint.megatron import DistCheckpointReader, iteration_dir

    with single_process_group():
        for name in ("hf", "fused"):
            reader = DistCheckpointReader(iteration_dir(tmp_path / f"{name}-megatron"))
            try:
                keys = sorted((key, None) for key in reader.metadata)
                ours[name] = dict(zip(keys, reader.read(keys)))
            finally:
                reader.close()
    assert ours["hf"].keys() == ours["fused"].keys()
    for key, tensor in ours["hf"].items():
        assert torch.equal(tensor, ours["fused"][key]), key


def test_a_sliding_window_is_refused_naming_it(base_env, tmp_path):
    folder = write_config(tmp_path / "Mistral-7B-v0.1", cut(MISTRAL_7B_V01_WINDOW))
    from training.launch.settings import BadInput

    with pytest.raises(BadInput, match="sliding_window is 4096"):
        launch(base_env, MODEL_CONFIG=folder)


def test_model_config_and_model_size_are_one_source(base_env, tmp_path):
    from training.launch.guards import Refusals
    from training.launch.settings import BadInput

    folder = write_config(tmp_path / "Llama-3.2-1B", cut(PUBLISHED["meta-llama/Llama-3.2-1B"]))
    with pytest.raises(Refusals, match=r"\[model_config\] MODEL_SIZE=8B and MODEL_CONFIG="):
        launch(base_env, MODEL_CONFIG=folder, MODEL_SIZE="8B")
    with pytest.raises(BadInput, match="launch it with examples/moe/train_mixtral.sh"):
        launch(base_env, MODEL_CONFIG=write_config(tmp_path / "mixtral",
                                             cut(PUBLISHED["mistralai/Mixtral-8x7B-v0.1"])))
    with pytest.raises(BadInput, match="launch it with examples/llama/train_llama3.sh"):
        launch(base_env, family="mixtral", layers=[MOE], MODEL_CONFIG=folder)


def test_the_shape_feeds_flops_memory_and_the_run_folder(base_env, tmp_path):
    """Llama 3.2 1B: the FLOPs count its own widths; the memory estimate counts its tied
    output layer once."""
    from training.metrics import flops_per_token
    from training.optimize.memory import stage_params

    config = cut(PUBLISHED["meta-llama/Llama-3.2-1B"])
    tied = launch(base_env, MODEL_CONFIG=write_config(tmp_path / "Llama-3.2-1B", config))
    untied = launch(base_env, MODEL_CONFIG=write_config(tmp_path / "untied", {
        **config, "tie_word_embeddings": False}))
    h, f, s, v = 2048, 8192, tied.run.model.seq_length, 128256
    per_layer = 2 * h * (h + 2 * 512) + 2 * h * h + 2 * s * h + 6 * h * f
    assert flops_per_token(tied.run.model) == 3 * (2 * per_layer + 2 * h * v)
    assert stage_params(untied.run, "only") - stage_params(tied.run, "only") == \
        tied.run.model.padded_vocab(1) * h
    assert tied.ctx.run_name.startswith("Llama-3.2-1B_")


def test_the_datas_vocabulary_must_hold_the_checkpoints_rows(base_env, tmp_path):
    """With a dataset, Megatron's vocabulary is its tokenizer's (padded): Llama 3.2's 128256
    rows do not fit a 300-token tokenizer's 384 and are refused before torchrun, with both
    fixes; padded to 128256 after the script name, the launch goes on with a warning that
    the token ids name other tokens."""
    from training.launch.guards import Refusals

    from tests.mlperf.datasets import make_datasets

    data = make_datasets(tmp_path / "data")["DATA_PATH"]
    folder = write_config(tmp_path / "Llama-3.2-1B", cut(PUBLISHED["meta-llama/Llama-3.2-1B"]))
    with pytest.raises(Refusals, match=r"\[checkpoint_vocabulary\] .* 128256 rows: the load "
                                       r"would stop.*--make-vocab-size-divisible-by 128256"):
        launch(base_env, MODEL_CONFIG=folder, DATA_PATH=data)
    padded = launch(base_env, words=["--make-vocab-size-divisible-by", "128256"], MODEL_CONFIG=folder,
                    DATA_PATH=data)
    (warning,) = [n.message for n in padded.settings.notices if n.guard == "checkpoint_vocabulary"]
    assert "name other tokens" in warning


def test_an_moe_import_is_refused_on_transformer_engine(base_env, tmp_path):
    """The import writes no _extra_state for TE's expert linears or its separate pre-MLP norm
    (not yet run with TE): refused before torchrun on the TE backend, whatever the experts;
    launched on the native one."""
    from training.launch.guards import Refusals

    config = tiny(PUBLISHED["mistralai/Mixtral-8x7B-v0.1"])
    _, hf = random_hf_model(tmp_path, config)
    import_checkpoint(str(hf), tmp_path / "megatron", progress=False)
    for experts in ("te", "native"):
        with pytest.raises(Refusals, match="expert linears.*TRANSFORMER_IMPL=native"):
            launch_config(base_env, config, PRETRAINED_CHECKPOINT=tmp_path / "megatron",
                          PLATFORM="h200", TRANSFORMER_IMPL="transformer_engine",
                          MOE_EXPERT_IMPL=experts)
    launch_config(base_env, config, PRETRAINED_CHECKPOINT=tmp_path / "megatron",
                  PLATFORM="h200", TRANSFORMER_IMPL="native")


@pytest.mark.parametrize("hub_id", ["meta-llama/Llama-3.2-1B", "Qwen/Qwen2.5-7B",
                                    "Qwen/Qwen3-30B-A3B"])
def test_the_model_a_launch_builds_from_an_import_trains(base_env, tmp_path, hub_id):
    """Tied embeddings, q/k/v biases, experts: our model of the import's launch, loaded from
    the import, learns a token-to-token map on the CPU (torch's AdamW, 8 steps: the loss
    falls). The launcher's whole run on a GPU: tests/gpu/test_byo_model_gpu.py."""
    import torch

    from training.checkpoint.megatron import load_weights

    from tests.moe.model import cpu_dispatcher_streams

    config = tiny(PUBLISHED[hub_id])
    _, hf = random_hf_model(tmp_path, config)
    import_checkpoint(str(hf), tmp_path / "megatron", progress=False)
    result = launch_config(base_env, config, PRETRAINED_CHECKPOINT=tmp_path / "megatron",
                           NATIVE_KERNELS="torch", TRANSFORMER_IMPL="native")
    gpt = ours_from_launch(result, config["vocab_size"])
    load_weights(gpt, tmp_path / "megatron")
    gpt.train()
    optimizer = torch.optim.AdamW(gpt.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    following = torch.randperm(config["vocab_size"], generator=gen)
    tokens = torch.randint(0, config["vocab_size"], (4, 1), generator=gen)
    for _ in range(32):
        tokens = torch.cat([tokens, following[tokens[:, -1:]]], dim=1)
    positions = torch.arange(32).unsqueeze(0).expand(4, 32)
    losses = []
    for _ in range(8):
        with cpu_dispatcher_streams():
            loss = gpt(tokens[:, :-1], positions, None, labels=tokens[:, 1:]).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 1.0, losses


def _published_check():
    """dev/check_published_models.py (the issue's check, kept outside the product) as a
    module."""
    import importlib.util

    from .helpers import REPO

    spec = importlib.util.spec_from_file_location("check_published_models",
                                                  REPO / "dev" / "check_published_models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_docs_table_is_the_recorded_check_of_all_eleven():
    """docs/checkpoints.md's table is generated from the check's record, which holds every
    published model; a failed model shows where it stopped."""
    check = _published_check()
    data = json.loads(check.RECORD.read_text())
    assert set(data["results"]) == set(PUBLISHED)
    assert check.docs_block(data) in check.DOC.read_text(), \
        "docs/checkpoints.md's table is stale: python dev/check_published_models.py --docs"
    hub_id = "Qwen/Qwen3-8B"
    failed = {"layers": 2, "results": {hub_id: {"ok": False, "import": True, "export": True,
                                                "error": "AssertionError"}}}
    row = next(line for line in check.render(failed).splitlines() if hub_id in line)
    assert row.split(" | ")[1:5] == ["pass", "pass", "**fail**", "not run"]
