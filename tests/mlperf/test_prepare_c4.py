"""examples/mlperf/llama31_8b/prepare_c4.sh on C4-shaped shards (small, made here)."""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy

from .datasets import texts

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "mlperf" / "llama31_8b" / "prepare_c4.sh"


def _shard(path: Path, docs: list[str]) -> None:
    with gzip.open(path, "wt") as f:
        for i, text in enumerate(docs):
            f.write(json.dumps({"text": text, "timestamp": "2019-04-25T12:57:54Z",
                                "url": f"https://example.org/{path.name}/{i}"}) + "\n")


def test_prepare_c4_builds_train_shards_and_the_first_validation_documents(tmp_path, mlperf_data):
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    from tokenizers import Tokenizer

    c4, out = tmp_path / "c4", tmp_path / "out"
    c4.mkdir()
    train_docs = {i: texts(6, i) for i in (768, 769, 770)}
    for i, docs in train_docs.items():
        _shard(c4 / f"c4-train.{i:05d}-of-01024.json.gz", docs)
    valid_docs = [texts(5, 100 + i) for i in range(8)]
    for i, docs in enumerate(valid_docs):
        _shard(c4 / f"c4-validation.{i:05d}-of-00008.json.gz", docs)
    env = dict(os.environ, C4_DIR=str(c4), OUT=str(out), PYTHON=sys.executable,
               TOKENIZER=mlperf_data["TOKENIZER_MODEL"], FIRST_SHARD="768", LAST_SHARD="769",
               VALID_DOCS="12")
    proc = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"VALID_DATA_PATH={out}/c4-validation-12" in proc.stdout

    train = IndexedDataset(str(out / "c4-train.en_6"))
    assert len(train) == 12                                  # shards 768 and 769, not 770
    valid = IndexedDataset(str(out / "c4-validation-12"))
    first12 = [d for shard in valid_docs for d in shard][:12]  # shard 0, 1, then 2 of shard 2
    tok = Tokenizer.from_file(str(Path(mlperf_data["TOKENIZER_MODEL"]) / "tokenizer.json"))
    assert len(valid) == 12
    for i in (0, 5, 11):   # the reference's tokens: no BOS before, no EOD after
        ids = valid[i]
        assert numpy.array_equal(ids, tok.encode(first12[i], add_special_tokens=False).ids), i
