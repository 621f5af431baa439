"""A Hugging Face folder is untrusted input: links out of it, special files, tensors in two
shards, an index that disagrees with its files and tensors its config does not imply are each
refused in one line (exit 2), and nothing is written."""
from __future__ import annotations

import json
import os
import shutil
import struct

import pytest
import torch
from safetensors.torch import load_file, save_file

from training.checkpoint.__main__ import main


def _refused(capsys, tmp_path, folder) -> str:
    assert main(["import", str(folder), str(tmp_path / "out"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()
    return err


def _sharded(tiny_hf, folder, move: str | None = None):
    """tiny_hf as two shards with an index (the first tensor alone in the second file)."""
    shutil.copytree(tiny_hf, folder)
    tensors = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    first = next(iter(tensors))
    one = {k: v for k, v in tensors.items() if k != first}
    two = {first: tensors[first]}
    save_file(one, str(folder / "model-00001-of-00002.safetensors"), {"format": "pt"})
    save_file(two, str(folder / "model-00002-of-00002.safetensors"), {"format": "pt"})
    weight_map = {k: "model-00001-of-00002.safetensors" for k in one}
    weight_map[first] = "model-00002-of-00002.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return folder, first, tensors


def test_a_tensor_in_two_shards_is_refused_whatever_its_values(capsys, tmp_path, tiny_hf):
    folder, first, tensors = _sharded(tiny_hf, tmp_path / "two")
    rest = {k: v for k, v in tensors.items() if k != first}
    for values in (tensors[first], torch.zeros_like(tensors[first])):   # same, and different
        save_file({**rest, first: values}, str(folder / "model-00001-of-00002.safetensors"))
        err = _refused(capsys, tmp_path, folder)
        assert f"tensor {first} is in both" in err


def test_an_index_that_disagrees_with_its_files_is_refused(capsys, tmp_path, tiny_hf):
    folder, first, _ = _sharded(tiny_hf, tmp_path / "idx")
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    index["weight_map"][first] = "model-00001-of-00002.safetensors"   # it is in file 2
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    assert f"places {first} in model-00001-of-00002.safetensors, which does not hold it" in \
        _refused(capsys, tmp_path, folder)
    index["weight_map"] = {**index["weight_map"], first: "../model-00002-of-00002.safetensors"}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    assert "not a file of the folder" in _refused(capsys, tmp_path, folder)


def test_the_sharded_folder_itself_imports(tmp_path, tiny_hf):
    folder, _, _ = _sharded(tiny_hf, tmp_path / "ok")
    assert main(["import", str(folder), str(tmp_path / "out"), "--no-progress"]) == 0


@pytest.mark.parametrize("name", ["tokenizer.model", "config.json", "model.safetensors",
                                  "tokenizer.json"])
def test_a_link_out_of_the_folder_is_never_followed(capsys, tmp_path, tiny_hf, name):
    """A private file linked in as a side file, the config or the weights is not read, so it
    cannot land in the output (the import copies side files and keeps config.json's text)."""
    folder = shutil.copytree(tiny_hf, tmp_path / "linked")
    private = tmp_path / "private"
    private.write_bytes((folder / name).read_bytes() if (folder / name).exists()
                        else b"SECRET-KEY-123")
    (folder / name).unlink(missing_ok=True)
    os.symlink(private, folder / name)
    err = _refused(capsys, tmp_path, folder)
    assert f"{folder / name} is a link to {private}, outside {folder}" in err


def test_a_link_inside_the_folder_and_the_hub_cache_layout_are_read(tmp_path, tiny_hf):
    """Links that stay in the folder are fine, and so are a Hub snapshot's links into its
    repository's blobs/ (huggingface_hub's cache)."""
    repo = tmp_path / "models--org--tiny"
    blobs, snap = repo / "blobs", repo / "snapshots" / "abc123"
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    for i, path in enumerate(sorted(tiny_hf.iterdir())):
        shutil.copyfile(path, blobs / f"blob{i}")
        os.symlink(f"../../blobs/blob{i}", snap / path.name)
    os.symlink("config.json", snap / "tokenizer_config.json")   # a link within the folder
    assert main(["import", str(snap), str(tmp_path / "out"), "--no-progress"]) == 0
    assert (tmp_path / "out" / "hf" / "tokenizer_config.json").is_file()


@pytest.mark.parametrize("name", ["model.safetensors", "tokenizer.model", "config.json"])
def test_a_fifo_in_the_folder_is_refused_not_waited_on(capsys, tmp_path, tiny_hf, name):
    folder = shutil.copytree(tiny_hf, tmp_path / "fifo")
    (folder / name).unlink(missing_ok=True)
    os.mkfifo(folder / name)
    assert "FIFO" in _refused(capsys, tmp_path, folder)


def test_a_tensor_the_config_does_not_imply_is_refused(capsys, tmp_path, tiny_hf):
    folder = shutil.copytree(tiny_hf, tmp_path / "extra")
    tensors = load_file(folder / "model.safetensors")
    tensors["model.layers.0.self_attn.backdoor.weight"] = torch.zeros(2, 2, dtype=torch.bfloat16)
    save_file(tensors, str(folder / "model.safetensors"), {"format": "pt"})
    assert "does not imply, e.g. model.layers.0.self_attn.backdoor.weight" in _refused(
        capsys, tmp_path, folder)


def test_a_header_that_aliases_tensors_is_refused_by_the_import(capsys, tmp_path, tiny_hf):
    """The header rules (test_safetensors_header) hold on the import's path: two tensors made
    to share one byte range."""
    folder = shutil.copytree(tiny_hf, tmp_path / "alias")
    raw = (folder / "model.safetensors").read_bytes()
    length = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + length])
    names = sorted((n for n in header if n != "__metadata__" and
                    header[n]["shape"] == header["model.norm.weight"]["shape"]),
                   key=lambda n: header[n]["data_offsets"])   # the later one's digits fit
    header[names[1]]["data_offsets"] = header[names[0]]["data_offsets"]
    text = json.dumps(header, separators=(",", ":")).encode().ljust(length)
    (folder / "model.safetensors").write_bytes(raw[:8] + text + raw[8 + length:])
    assert "overlaps the tensor before it" in _refused(capsys, tmp_path, folder)
