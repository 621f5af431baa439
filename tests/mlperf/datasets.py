"""Two small real indexed datasets (train + valid) and their tokenizer, made at test time."""
from __future__ import annotations

import json
import random
from pathlib import Path


def texts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    words = ["thou", "art", "the", "king", "of", "night", "and", "day", "speak", "love", "sword",
             "crown", "fair", "foul", "sleep", "dream", "o", "my", "lord", "lady"]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(20, 400))) + "."
            for _ in range(n)]


def make_datasets(root: Path) -> dict[str, str]:
    """DATA_PATH / VALID_DATA_PATH / TOKENIZER_MODEL under `root`."""
    from training.data import prepare as prep
    from training.data.tokenizer import train_bpe

    train, valid = texts(300, 0), texts(60, 1)
    tok = str(root / "tokenizer")
    train_bpe(train, 300, tok)
    for name, docs in (("train", train), ("valid", valid)):
        path = root / f"{name}.jsonl"
        path.write_text("".join(json.dumps({"text": t}) + "\n" for t in docs))
        prep.prepare([str(path)], str(root / name), tok, progress=False, workers=1)
    return {"DATA_PATH": str(root / "train"), "VALID_DATA_PATH": str(root / "valid"),
            "TOKENIZER_MODEL": tok}


def make_large_valid(root: Path, tokenizer: str, sequences: int = 1100, seq: int = 8192,
                     documents: int = 64) -> str:
    """A validation set big enough for `sequences` sequences of `seq` tokens: the closed
    division's evaluation reads 1024 (1056 at BS 96) at sequence 8192."""
    per_doc = -(-(sequences * seq + 1) // documents)
    return make_valid(root, tokenizer, per_doc * documents, documents)


def make_valid(root: Path, tokenizer: str, tokens: int, documents: int = 64,
               name: str = "valid_large") -> str:
    """A validation set of exactly `tokens` tokens in `documents` documents (random ids of the
    tokenizer's vocabulary, written directly and adopted)."""
    import numpy
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    from training.data.check import adopt

    prefix = root / name
    rng = numpy.random.default_rng(0)
    builder = IndexedDatasetBuilder(str(prefix) + ".bin", dtype=numpy.uint16)
    for d in range(documents):
        size = tokens // documents + (d < tokens % documents)
        ids = rng.integers(3, 300, size, dtype=numpy.int64)
        builder.add_document(torch.from_numpy(ids.astype(numpy.int32)), [size])
    builder.finalize(str(prefix) + ".idx")
    adopt(str(prefix), tokenizer)
    return str(prefix)
