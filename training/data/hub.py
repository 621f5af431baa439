"""A Hugging Face hub id as TOKENIZER_MODEL (the ROCm fork's default form, e.g.
NousResearch/Meta-Llama-3-8B): resolved to a local folder before torchrun.

    tokenizer_folder("NousResearch/Meta-Llama-3-8B") -> ".../snapshots/<commit>"

A snapshot in huggingface_hub's cache (HF_HUB_CACHE, HF_HOME; where transformers'
AutoTokenizer caches too) resolves offline; otherwise, unless HF_HUB_OFFLINE=1, the tokenizer's
files alone are downloaded where the hub is reachable (HF_TOKEN for a gated one). Anything
else is HubError, one line that says how to get the tokenizer. Megatron then loads the folder:
the run never reaches for the network.
"""
from __future__ import annotations

import os
import re

from training.data.errors import InputError

# AutoTokenizer reads these (config.json: the tokenizer class when tokenizer_config.json
# does not name it); the weights are never fetched.
TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "tokenizer.model", "config.json"]
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class HubError(InputError):
    """A hub id that cannot be resolved here; the message is the one line to print."""


def looks_like_hub_id(name: str) -> bool:
    """'org/name' that is no path on this machine."""
    return bool(_HUB_ID.match(name)) and not os.path.exists(name) and not name.endswith(".json")


def tokenizer_folder(repo_id: str) -> str:
    """The local folder holding the tokenizer of a hub repository (see the module docstring)."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:   # pragma: no cover - a dependency of transformers
        raise HubError(f"{repo_id} looks like a Hugging Face hub id, but huggingface_hub is not "
                       "installed: point TOKENIZER_MODEL at a tokenizer folder") from None
    try:
        return snapshot_download(repo_id, allow_patterns=TOKENIZER_FILES, local_files_only=True)
    except Exception:   # noqa: BLE001 - not cached (or a partial snapshot): try the hub
        pass
    get = (f"download it where the hub is reachable (hf download {repo_id} --include "
           "'tokenizer*' 'special_tokens_map.json' 'config.json'), or point TOKENIZER_MODEL at "
           "a tokenizer folder")
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        raise HubError(f"{repo_id} is not a folder here and is not in the Hugging Face cache, "
                       f"and HF_HUB_OFFLINE=1 keeps the hub out of reach: {get}")
    try:
        return snapshot_download(repo_id, allow_patterns=TOKENIZER_FILES)
    except Exception as err:   # noqa: BLE001 - any hub failure is one line for the user
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        gated = "gated" in first.lower() or "401" in first or "403" in first
        raise HubError(f"{repo_id} is not a folder here and the Hugging Face hub did not give "
                       f"its tokenizer ({type(err).__name__}: {first[:200]})"
                       + ("; a gated repository needs HF_TOKEN" if gated else "")
                       + f": {get}") from None
