"""Helpers for the data tests (imported by conftest.py and the test modules)."""

from __future__ import annotations

import gzip
import json
import random

SYLLABLES = ["ka", "lo", "mi", "ne", "tor", "va", "sh", "in", "qu", "el", "rho", "st", "ae", "ü", "é"]
EXTRAS = ["東京", "naïve", "😀", "—", "Ωmega", "\t", "  "]


def make_texts(n: int, seed: int = 0) -> list[str]:
    """`n` documents of 1 to ~400 pseudo-words, with punctuation, newlines and non-ASCII."""
    rng = random.Random(seed)
    texts = []
    for i in range(n):
        words = []
        for _ in range(rng.choice([1, 3, 20, 80, 400])):
            if rng.random() < 0.03:
                words.append(rng.choice(EXTRAS))
            else:
                words.append("".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 4))))
            if rng.random() < 0.08:
                words[-1] += rng.choice([".", ",", "!", "?\n", "\n\n"])
        texts.append(f"Doc {i}: " + " ".join(words))
    return texts


def write_jsonl(path, texts, key="text", opener=open) -> str:
    with opener(path, "wt", encoding="utf-8") as f:
        for i, t in enumerate(texts):
            f.write(json.dumps({key: t, "id": i}, ensure_ascii=False) + "\n")
    return str(path)


def write_jsonl_gz(path, texts) -> str:
    return write_jsonl(path, texts, opener=gzip.open)


def expected_ids(tok_info, text: str) -> list[int]:
    """Direct tokenization with the tokenizers library, plus EOD."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(tok_info.tokenizer_json).encode(text).ids + [tok_info.eod_id]


def run_cli(main, argv, capsys) -> tuple[int, str, str]:
    """Run a module's main(argv); return (exit code, stdout, stderr). Never a traceback."""
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse
        rc = e.code
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return rc, out, err
