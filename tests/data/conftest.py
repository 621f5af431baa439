"""Fixtures for the data tests: a generated corpus and a small tokenizer trained on it.

Everything is made at test time under tmp paths; nothing is downloaded.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from datatest_utils import make_texts  # noqa: E402


@pytest.fixture(scope="session")
def corpus_texts() -> list[str]:
    return make_texts(120)


@pytest.fixture(scope="session")
def tok_dir(tmp_path_factory, corpus_texts) -> str:
    from training.data.tokenizer import train_bpe

    out = tmp_path_factory.mktemp("tok") / "tokenizer"
    train_bpe(corpus_texts, 400, str(out))
    return str(out)


@pytest.fixture(scope="session")
def tok_info(tok_dir):
    from training.data.tokenizer import load

    return load(tok_dir)
