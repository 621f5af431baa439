"""Bad input exits 2 with one line and writes nothing; a full disk or a signal leaves nothing."""
from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys

import pytest
import torch

from training.checkpoint.__main__ import main
from training.checkpoint.staging import OutputError, Staging

from .helpers import REPO, run_cli


def _refused(capsys, argv) -> str:
    assert main([*map(str, argv), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def _leftovers(folder):
    return sorted(p.name for p in folder.iterdir())


def test_missing_folder(capsys, tmp_path):
    err = _refused(capsys, ["import", tmp_path / "nowhere", tmp_path / "out"])
    assert "no folder" in err and "nowhere" in err
    err = _refused(capsys, ["export", tmp_path / "nowhere", tmp_path / "out"])
    assert "no folder" in err
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("change,named", [
    ({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}, "model_type 'gpt2'"),
    ({"model_type": "mistral", "architectures": ["MistralForCausalLM"], "sliding_window": 4096},
     "sliding_window is 4096"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling type 'yarn'"),
    ({"attention_bias": True}, "attention_bias is true")])
def test_a_family_or_field_megatron_cannot_express_is_refused_by_name(capsys, tmp_path, tiny_hf,
                                                                     change, named):
    hf = shutil.copytree(tiny_hf, tmp_path / "other")
    config = json.loads((hf / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps(config | change))
    err = _refused(capsys, ["import", hf, tmp_path / "out"])
    assert named in err
    assert not (tmp_path / "out").exists()


def test_mismatched_preset_names_the_fields(capsys, tmp_path, tiny_hf):
    err = _refused(capsys, ["import", tiny_hf, tmp_path / "out", "--preset", "llama3-8B"])
    assert "preset llama3-8B" in err and "hidden_size: 4096 vs 256" in err
    assert "vocab_size: 128256 vs 8192" in err
    assert _leftovers(tmp_path) == []


def test_output_that_exists_or_has_no_parent(capsys, tmp_path, tiny_hf, tiny_ckpt):
    (tmp_path / "taken").mkdir()
    assert "exists" in _refused(capsys, ["import", tiny_hf, tmp_path / "taken"])
    assert "exists" in _refused(capsys, ["export", tiny_ckpt, tmp_path / "taken"])
    assert "does not exist" in _refused(capsys, ["import", tiny_hf, tmp_path / "a" / "b"])
    assert _leftovers(tmp_path) == ["taken"] and _leftovers(tmp_path / "taken") == []


def test_not_a_megatron_checkpoint(capsys, tmp_path, tiny_hf):
    err = _refused(capsys, ["export", tiny_hf, tmp_path / "out"])
    assert "is not a Megatron checkpoint" in err


def test_an_hf_config_that_is_not_a_json_object(capsys, tmp_path, tiny_hf, tiny_ckpt):
    (tmp_path / "cut.json").write_text('{"model_type": ')
    (tmp_path / "list.json").write_text("[1]")
    err = _refused(capsys, ["export", tiny_ckpt, tmp_path / "out", "--hf-config", tmp_path / "cut.json"])
    assert "cut.json: not a Hugging Face config.json: invalid or cut-short JSON" in err
    err = _refused(capsys, ["export", tiny_ckpt, tmp_path / "out", "--hf-config", tmp_path / "list.json"])
    assert "list.json: not a Hugging Face config.json: a JSON list, not an object" in err
    hf = shutil.copytree(tiny_hf, tmp_path / "listed")
    (hf / "config.json").write_text("[1]")
    assert "a JSON list, not an object" in _refused(capsys, ["import", hf, tmp_path / "out"])
    assert not (tmp_path / "out").exists()


def test_truncated_or_incomplete_safetensors(capsys, tmp_path, tiny_hf):
    hf = shutil.copytree(tiny_hf, tmp_path / "cut")
    weights = hf / "model.safetensors"
    os.truncate(weights, weights.stat().st_size - 1000)
    assert "beyond the end of the file (truncated download?)" in _refused(capsys, ["import", hf, tmp_path / "out"])
    config = json.loads((tiny_hf / "config.json").read_text())
    more = shutil.copytree(tiny_hf, tmp_path / "more")
    (more / "config.json").write_text(json.dumps(config | {"num_hidden_layers": 3}))
    assert "lacks" in _refused(capsys, ["import", more, tmp_path / "out", "--preset", "tiny"])
    assert not (tmp_path / "out").exists()


def test_hub_id_offline_says_offline_in_one_line(tmp_path):
    proc = run_cli("import", "example-org/no-such-model", tmp_path / "out", "--no-progress",
                   env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hub")})
    assert proc.returncode == 2
    ours = [line for line in proc.stderr.splitlines() if line.startswith("training.checkpoint")]
    assert len(ours) == 1 and "offline" in ours[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_hub_config_is_fetched_and_checked_before_any_weight(capsys, tmp_path, tiny_hf,
                                                             monkeypatch):
    """A mocked Hub: the config.json of a model this does not convert is refused before
    snapshot_download (the weights) is called; a convertible one goes on to the weights."""
    import huggingface_hub

    config = tmp_path / "config.json"
    fetched = []
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", _hub_files(fetched, {
        "config.json": config}))
    monkeypatch.setattr(huggingface_hub, "snapshot_download",
                        lambda repo, **kw: fetched.append("weights") or str(tiny_hf))
    tiny = json.loads((tiny_hf / "config.json").read_text())
    config.write_text(json.dumps(tiny | {"sliding_window": 4096, "model_type": "mistral"}))
    err = _refused(capsys, ["import", "example-org/mistral", tmp_path / "out"])
    assert "sliding_window is 4096" in err and fetched == ["config.json"]
    config.write_text(json.dumps(tiny))
    fetched.clear()
    assert main(["import", "example-org/tiny", str(tmp_path / "out"), "--no-progress"]) == 0
    assert fetched == ["config.json", "model.safetensors.index.json", "weights"]


def _hub_files(fetched: list, files: dict):
    """A mocked hf_hub_download of a repository holding `files` (name -> local path)."""
    from huggingface_hub.errors import RemoteEntryNotFoundError

    def download(repo, name, **kw):
        fetched.append(name)
        if name not in files:   # the Hub's 404 (built without the HTTP response it wraps)
            missing = RemoteEntryNotFoundError.__new__(RemoteEntryNotFoundError)
            Exception.__init__(missing, f"404 Client Error: {name} not found")
            raise missing
        return str(files[name])
    return download


def test_hub_weights_are_the_files_transformers_reads(capsys, tmp_path, tiny_hf, monkeypatch):
    """A repository holding its weights twice (Mistral's consolidated.safetensors beside the
    sharded files): only the files its index names are downloaded; without an index,
    model.safetensors."""
    import huggingface_hub

    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors",
                                                "b": "model-00002-of-00002.safetensors"}}))
    asked = []
    monkeypatch.setattr(huggingface_hub, "snapshot_download",
                        lambda repo, allow_patterns, **kw: asked.append(allow_patterns)
                        or str(tiny_hf))
    for files, weights in (({"model.safetensors.index.json": index},
                            ["model-00001-of-00002.safetensors",
                             "model-00002-of-00002.safetensors"]),
                           ({}, ["model.safetensors"])):
        monkeypatch.setattr(huggingface_hub, "hf_hub_download", _hub_files(
            [], {"config.json": tiny_hf / "config.json", **files}))
        asked.clear()
        out = tmp_path / f"out{len(files)}"
        assert main(["import", "example-org/mistral", str(out), "--no-progress"]) == 0
        (patterns,) = asked
        assert [p for p in patterns if "safetensors" in p] == weights


def test_hub_offline_while_mocked_names_offline(capsys, tmp_path, monkeypatch):
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    def offline(repo, name, **kw):
        raise LocalEntryNotFoundError("Cannot find the requested files in the disk cache and "
                                      "outgoing traffic has been disabled")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", offline)
    err = _refused(capsys, ["import", "example-org/tiny", tmp_path / "out"])
    assert "cannot be reached from here (offline" in err


def test_too_little_space_is_refused_before_writing(tmp_path):
    free = shutil.disk_usage(tmp_path).free
    with pytest.raises(OutputError, match="needs .* free: nothing was written"):
        Staging(tmp_path / "out", needed_bytes=free + (1 << 40))
    assert _leftovers(tmp_path) == []


def _file_size_limit(limit: int):
    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # a write past the limit fails (EFBIG)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_disk_that_fills_while_writing_leaves_nothing(tmp_path, tiny_hf):
    """The writer's files may not grow past 1 MiB (RLIMIT_FSIZE): the tiny checkpoint's 11 MB
    data file fails half-way, as on a full disk."""
    out = tmp_path / "out"
    proc = run_cli("import", tiny_hf, out, "--no-progress", preexec_fn=_file_size_limit(1 << 20))
    assert proc.returncode == 2, proc.stderr[-3000:]
    ours = [line for line in proc.stderr.splitlines() if line.startswith("training.checkpoint")]
    assert len(ours) == 1 and "the disk filled while writing" in ours[0], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert _leftovers(tmp_path) == []


def test_a_signal_removes_the_partial_folder(tmp_path):
    """SIGTERM in the middle of a conversion: the temporary sibling is removed, nothing else."""
    code = f"""
import os, signal, sys, time
from pathlib import Path
from training.checkpoint.staging import Interrupted, Staging
try:
    with Staging(Path({str(tmp_path / 'out')!r}), 0) as stage:
        (stage.path / "half.bin").write_bytes(b"x" * 1000)
        print(stage.path, flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
except Interrupted as err:
    sys.exit(143)
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.returncode == 143, proc.stderr
    assert ".out.partial-" in proc.stdout
    assert _leftovers(tmp_path) == []


def test_a_folder_reads_model_safetensors_as_transformers_does(tmp_path, tiny_hf):
    """Without an index, a folder's model.safetensors is the model (as transformers reads
    it): another safetensors file beside it (Mistral's consolidated.safetensors, other names)
    is left alone, not refused as tensors the config does not imply."""
    from safetensors.torch import save_file

    folder = tmp_path / "hf"
    shutil.copytree(tiny_hf, folder)
    save_file({"layers.0.attention.wq.weight": torch.zeros(2, 2)},
              str(folder / "consolidated.safetensors"))
    assert main(["import", str(folder), str(tmp_path / "out"), "--no-progress"]) == 0
