"""TOKENIZER_MODEL as a Hugging Face hub id (the ROCm fork's default form): a cached hub id
resolves offline to its snapshot folder, which Megatron then loads; offline without the cache
it is one line, exit 2, no traceback (issue 20)."""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from training.data.hub import looks_like_hub_id

REPO = Path(__file__).resolve().parents[2]
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _hub_cache(root: Path, repo_id: str, tok_dir: str) -> Path:
    """huggingface_hub's cache layout for one repository holding a tokenizer."""
    folder = root / f"models--{repo_id.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(COMMIT)
    snapshot = folder / "snapshots" / COMMIT
    shutil.copytree(tok_dir, snapshot)
    return snapshot


def _dry_run(tmp_path: Path, *words: str, **env):
    full = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PYTHON": sys.executable,
            "VERBOSE": "1",
            "DRY_RUN": "1", "EXPERIMENT_DIR": str(tmp_path / "experiment"),
            "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub"), **env}
    return subprocess.run(["bash", str(REPO / "examples/llama/train_llama3.sh"), *words],
                          env=full, capture_output=True, text=True, timeout=120, cwd=tmp_path)


def test_a_cached_hub_id_resolves_offline_to_its_snapshot(tmp_path, tok_dir):
    snapshot = _hub_cache(tmp_path / "hub", "acme/tiny-tokenizer", tok_dir)
    proc = _dry_run(tmp_path, "MODEL_SIZE=tiny", "TOKENIZER_MODEL=acme/tiny-tokenizer")
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("torchrun "))
    words = shlex.split(line)
    assert words[words.index("--tokenizer-model") + 1] == str(snapshot)
    assert words[words.index("--tokenizer-type") + 1] == "HuggingFaceTokenizer"


def test_offline_without_the_cache_is_one_line(tmp_path):
    proc = _dry_run(tmp_path, "TOKENIZER_MODEL=acme/not-cached")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert "[tokenizer_model]" in proc.stderr and "acme/not-cached" in proc.stderr
    assert "HF_HUB_OFFLINE=1" in proc.stderr and "hf download acme/not-cached" in proc.stderr


def test_what_reads_as_a_hub_id(tmp_path):
    (tmp_path / "org").mkdir()
    (tmp_path / "org" / "tok").mkdir()
    assert looks_like_hub_id("NousResearch/Meta-Llama-3-8B")
    assert looks_like_hub_id("meta-llama/Llama-3.1-8B")
    assert not looks_like_hub_id(str(tmp_path / "org" / "tok"))      # a folder here
    assert not looks_like_hub_id("./tok") and not looks_like_hub_id("/abs/tok")
    assert not looks_like_hub_id("a/b/c") and not looks_like_hub_id("org/tokenizer.json")
    cwd = os.getcwd()
    try:
        os.chdir(tmp_path)
        assert not looks_like_hub_id("org/tok")                       # relative, exists
    finally:
        os.chdir(cwd)


@pytest.mark.parametrize("name", ["acme/x", "NousResearch/Llama-2-7b-chat-hf"])
def test_hub_ids_reach_the_data_checks_too(tmp_path, name):
    """training.data.check resolves the same way (a bad one is its usual one-line error)."""
    from training.data.check import DataPathError, megatron_tokenizer_args

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataPathError, match=f"TOKENIZER_MODEL: {name} is not a folder here"):
        megatron_tokenizer_args(name)
