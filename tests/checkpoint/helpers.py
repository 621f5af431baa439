"""Random Hugging Face Llamas on disk, the CLI in a subprocess, and bitwise comparisons."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]


def save_random_llama(folder: Path, preset, num_layers: int | None = None,
                      dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> Path:
    """A randomly initialised LlamaForCausalLM of the preset's shape, saved as transformers
    saves it (safetensors, config.json, generation_config.json)."""
    from transformers import LlamaForCausalLM

    from tests.model.parity import hf_config

    torch.manual_seed(seed)
    model = LlamaForCausalLM(hf_config(preset, num_layers or preset.num_layers)).to(dtype)
    model.save_pretrained(folder)
    return folder


def safetensors_tensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out = {}
    for path in sorted(folder.glob("*.safetensors")):
        out.update(load_file(path))
    return out


def assert_bitwise_equal(a: Path, b: Path) -> None:
    """Same tensor names, dtypes, shapes and bytes in two Hugging Face folders."""
    ta, tb = safetensors_tensors(a), safetensors_tensors(b)
    assert sorted(ta) == sorted(tb)
    for name, x in ta.items():
        y = tb[name]
        assert x.dtype == y.dtype and x.shape == y.shape, name
        assert torch.equal(x.view(torch.uint8), y.view(torch.uint8)), name


def run_cli(*args: str, env: dict | None = None, preexec_fn=None, timeout: int = 300):
    """`python -m training.checkpoint ARGS` in a fresh interpreter."""
    full_env = dict(os.environ, PYTHONPATH=str(REPO), **(env or {}))
    return subprocess.run([sys.executable, "-m", "training.checkpoint", *map(str, args)],
                          cwd=REPO, env=full_env, capture_output=True, text=True,
                          timeout=timeout, preexec_fn=preexec_fn)


class _ExtraState:
    """Transformer Engine's modules (TENorm's RMSNorm, the TE linears) keep their fp8 metadata
    as a module's extra state: an empty uint8 tensor without fp8; loading None is a no-op.
    Mixed into a built module, Megatron's sharded_state_dict asks for its `_extra_state` as it
    does for TE's; what a load hands it is kept in `extra_states_set`."""

    def get_extra_state(self):
        return torch.empty(0, dtype=torch.uint8)

    def set_extra_state(self, state):
        self.__dict__.setdefault("extra_states_set", []).append(state)


def give_extra_state(module: torch.nn.Module) -> torch.nn.Module:
    """`module` (its weights and forward unchanged) with TE's extra-state hooks, in place."""
    cls = type(module)
    module.__class__ = type(f"ExtraState{cls.__name__}", (_ExtraState, cls), {})
    return module
