"""The export streams as the import does: what it holds at once is bounded by a tensor, not
by the checkpoint or a shard (it peaked at the whole checkpoint's size before: 5.6 GB resident
for a 5.42 GiB export)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import save_file

from training.checkpoint import layout
from training.checkpoint.convert import import_checkpoint
from training.checkpoint.layout import Architecture

from .helpers import REPO, assert_bitwise_equal


def _fabricated(folder, arch: Architecture) -> int:
    """A Hugging Face folder of this shape, random fp32 tensors written one file per layer
    range (so this process never holds them all); returns the weights' bytes."""
    folder.mkdir()
    shapes = layout.hf_shapes(arch)
    config = arch.hf_config_fields() | {"torch_dtype": "float32"}
    (folder / "config.json").write_text(json.dumps(config))
    weight_map, total, gen = {}, 0, torch.Generator().manual_seed(0)
    names = list(shapes)
    for i in range(0, len(names), 20):
        part = {n: torch.randn(shapes[n], generator=gen) for n in names[i:i + 20]}
        file = f"model-{i // 20:05d}.safetensors"
        save_file(part, str(folder / file), {"format": "pt"})
        weight_map.update({n: file for n in part})
        total += sum(t.nbytes for t in part.values())
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return total


def test_export_peak_memory_is_a_tensor_not_the_checkpoint(tmp_path, tiny_ckpt):
    arch = Architecture(num_layers=24, hidden_size=256, ffn_hidden_size=1024,
                        num_attention_heads=4, num_query_groups=2, vocab_size=4096,
                        max_position_embeddings=1024, rotary_base=10000.0, norm_epsilon=1e-5)
    total = _fabricated(tmp_path / "hf", arch)
    largest = max(t.numel() for t in layout.megatron_tensors(arch)) * 4
    import_checkpoint(str(tmp_path / "hf"), tmp_path / "ckpt", progress=False)
    run = subprocess.run([sys.executable, str(REPO / "tests/checkpoint/export_memory_worker.py"),
                          tiny_ckpt, tmp_path / "warm", tmp_path / "ckpt", tmp_path / "back"],
                         cwd=REPO, capture_output=True, text=True, timeout=600,
                         env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr[-2000:]
    peak = json.loads(run.stdout.strip().splitlines()[-1])
    if "skip" in peak:
        pytest.skip(peak["skip"])
    grew = peak["after"] - peak["before"]
    # one Megatron tensor, the Hugging Face tensor it fills, a read buffer: a few of the largest
    # tensors, whatever the checkpoint's size (here 24 layers: about 25 times the largest)
    assert total > 20 * largest
    assert grew < 6 * largest, (f"the export's resident peak grew {grew / 2**20:.1f} MiB for a "
                                f"{total / 2**20:.1f} MiB checkpoint whose largest tensor is "
                                f"{largest / 2**20:.1f} MiB")
    assert_bitwise_equal(tmp_path / "hf", tmp_path / "back")
