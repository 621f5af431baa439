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
