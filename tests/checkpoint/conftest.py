"""A tiny random Hugging Face Llama and its import, shared by the checkpoint tests."""
from __future__ import annotations

import pytest

from training.launch.presets import PRESETS

from .helpers import save_random_llama


@pytest.fixture(scope="session")
def tiny_hf(tmp_path_factory):
    return save_random_llama(tmp_path_factory.mktemp("hf") / "tiny", PRESETS["tiny"])


@pytest.fixture(scope="session")
def tiny_ckpt(tiny_hf, tmp_path_factory):
    from training.checkpoint.convert import import_checkpoint

    out = tmp_path_factory.mktemp("megatron") / "tiny"
    import_checkpoint(str(tiny_hf), out, progress=False)
    return out


@pytest.fixture(scope="session")
def tiny_ckpt_pieces(tiny_hf, tmp_path_factory):
    """The same import with every tensor over 64 KiB written in row ranges (an 8B import cuts
    its embedding and output layer so, at 256 MiB)."""
    from training.checkpoint.convert import import_checkpoint

    out = tmp_path_factory.mktemp("megatron") / "tiny_pieces"
    import_checkpoint(str(tiny_hf), out, progress=False, max_chunk_bytes=64 << 10)
    return out
