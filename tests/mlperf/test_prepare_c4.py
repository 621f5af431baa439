"""examples/mlperf/llama31_8b/prepare_c4.sh on C4-shaped shards (small, made here)."""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy
import pytest

from .datasets import texts

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "mlperf" / "llama31_8b" / "prepare_c4.sh"


def _shard(path: Path, docs: list[str]) -> None:
    with gzip.open(path, "wt") as f:
        for i, text in enumerate(docs):
            f.write(json.dumps({"text": text, "timestamp": "2019-04-25T12:57:54Z",
                                "url": f"https://example.org/{path.name}/{i}"}) + "\n")


def _run(env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=600)


def test_prepare_c4_checks_every_setting_before_the_long_work(tmp_path, mlperf_data):
    c4, out = tmp_path / "c4", tmp_path / "out"
    c4.mkdir()
    for i in (768, 769):
        _shard(c4 / f"c4-train.{i:05d}-of-01024.json.gz", texts(3, i))
    for i in range(7):  # the last validation shard is missing
        _shard(c4 / f"c4-validation.{i:05d}-of-00008.json.gz", texts(3, i))
    env = dict(os.environ, C4_DIR=str(c4), OUT=str(out), PYTHON=sys.executable,
               TOKENIZER=mlperf_data["TOKENIZER_MODEL"], FIRST_SHARD="768", LAST_SHARD="769")
    proc = _run(env)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"error: C4_DIR={c4}: c4-validation.00007-of-00008.json.gz not found; "
                                   "download them first (docs/mlperf.md, Data)")
    assert not out.exists()  # nothing made before the check


@pytest.mark.slow
def test_prepare_c4_builds_train_shards_and_the_first_validation_documents_and_resumes(
        tmp_path, mlperf_data):
    """A first run fails in step 2 (a validation shard cut short); once the shard is downloaded
    again, the second run keeps the training set (complete, verified, same shards) and finishes."""
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
    whole = (c4 / "c4-validation.00001-of-00008.json.gz").read_bytes()
    (c4 / "c4-validation.00001-of-00008.json.gz").write_bytes(whole[: len(whole) // 2])
    env = dict(os.environ, C4_DIR=str(c4), OUT=str(out), PYTHON=sys.executable,
               TOKENIZER=mlperf_data["TOKENIZER_MODEL"], FIRST_SHARD="768", LAST_SHARD="769",
               VALID_DOCS="12")
    first = _run(env)
    assert first.returncode == 1
    assert "c4-validation.00001-of-00008.json.gz: cannot read the gz file" in first.stderr
    train_bin = out / "c4-train.en_6.bin"
    stamp = train_bin.stat().st_mtime_ns
    assert sorted(p.name for p in out.iterdir()) == [f"c4-train.en_6{e}" for e in (".bin", ".dataset.json", ".idx")]

    (c4 / "c4-validation.00001-of-00008.json.gz").write_bytes(whole)
    proc = _run(env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"{out}/c4-train.en_6: complete and verified" in proc.stdout and "kept, nothing to do" in proc.stdout
    assert train_bin.stat().st_mtime_ns == stamp
    assert f"VALID_DATA_PATH={out}/c4-validation-12" in proc.stdout
    assert not [p for p in out.iterdir() if ".tmp-" in p.name or p.name.endswith(".lock")]

    train = IndexedDataset(str(out / "c4-train.en_6"))
    assert len(train) == 12                                  # shards 768 and 769, not 770
    valid = IndexedDataset(str(out / "c4-validation-12"))
    first12 = [d for shard in valid_docs for d in shard][:12]  # shard 0, 1, then 2 of shard 2
    tok = Tokenizer.from_file(str(Path(mlperf_data["TOKENIZER_MODEL"]) / "tokenizer.json"))
    assert len(valid) == 12
    for i in (0, 5, 11):   # the reference's tokens: no BOS before, no EOD after
        ids = valid[i]
        assert numpy.array_equal(ids, tok.encode(first12[i], add_special_tokens=False).ids), i
