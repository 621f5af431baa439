"""The document-length distribution of a dataset: computed exactly while prepare writes,
recorded through the schema layer, shown by prepare and `check verify`, and turned into the
DRY_RUN's line on whether document masking matters for the data (issue 51, the data side)."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from datatest_utils import run_cli, write_jsonl
from training.data import check
from training.data import doc_lengths as dl
from training.data import prepare as prep
from training.data import record as rec


def _brute(lengths: np.ndarray) -> dict:
    q = {name: int(np.percentile(lengths, 100 * p, method="inverted_cdf"))
         for name, p in dl.QUANTILES}
    shorter = {str(b): [int((lengths < b).sum()), int(lengths[lengths < b].sum())]
               for b in dl.BOUNDS}
    return {"documents": int(lengths.size), "tokens": int(lengths.sum()),
            "mean": round(float(lengths.mean()), 2), "min": int(lengths.min()), **q,
            "max": int(lengths.max()), "shorter_than": shorter}


@pytest.mark.parametrize("seed", range(4))
def test_the_streaming_summary_is_exact(seed):
    rng = np.random.default_rng(seed)
    lengths = np.concatenate([rng.integers(1, 3000, 5000), rng.integers(0, 40, 300),
                              rng.integers(dl.EXACT, 3 * dl.EXACT, 3 + seed)])
    rng.shuffle(lengths)
    stats = dl.LengthStats()
    for part in np.array_split(lengths, 1 + seed * 3):
        stats.add(part)
    assert stats.summary() == _brute(lengths)


def test_one_document_and_none():
    assert dl.LengthStats().summary() is None
    one = dl.LengthStats().add([7]).summary()
    assert (one["min"], one["p10"], one["median"], one["p90"], one["max"]) == (7, 7, 7, 7, 7)


def _corpus(tmp_path, texts):
    return write_jsonl(tmp_path / "in.jsonl", texts)


def test_prepare_records_the_lengths_megatron_reads(tmp_path, corpus_texts, tok_dir, capsys):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    prefix = str(tmp_path / "ds")
    summary = prep.prepare([_corpus(tmp_path, corpus_texts)], prefix, tok_dir, progress=False)
    record = rec.read_record(prefix)
    dataset = IndexedDataset(prefix)        # kept: its index is a view of its mmap
    lengths = dataset.index.sequence_lengths.astype(np.int64)
    del dataset
    assert record["document_lengths"] == _brute(lengths)
    assert dl.from_index(prefix) == record["document_lengths"]
    text = prep.format_summary(summary)
    assert f"lengths    {len(lengths):,} documents: mean" in text
    assert f"median {int(np.percentile(lengths, 50, method='inverted_cdf')):,}" in text


def test_check_verify_shows_them_also_for_an_older_record(tmp_path, corpus_texts, tok_dir,
                                                         capsys):
    prefix = str(tmp_path / "ds")
    prep.prepare([_corpus(tmp_path, corpus_texts)], prefix, tok_dir, progress=False)
    rc, out, _ = run_cli(check.main, ["verify", prefix], capsys)
    assert rc == 0 and "lengths: " in out and " documents: mean " in out
    record = json.loads(open(rec.record_path(prefix)).read())
    del record["document_lengths"]                  # a record written before the lengths
    rec.write_json(rec.record_path(prefix), record)
    assert check.check_data_path(prefix, None).document_lengths == [None]
    rc, older, _ = run_cli(check.main, ["verify", prefix], capsys)
    assert rc == 0 and older == out


@pytest.mark.parametrize("field,value", [("documents", "many"), ("p10", 10 ** 9),
                                         ("mean", float("nan")), ("shorter_than", {"x": [1, 1]}),
                                         ("max", None)])
def test_a_bad_section_is_refused_naming_the_field(tmp_path, corpus_texts, tok_dir, field, value):
    prefix = str(tmp_path / "ds")
    prep.prepare([_corpus(tmp_path, corpus_texts)], prefix, tok_dir, progress=False)
    record = json.loads(open(rec.record_path(prefix)).read())
    record["document_lengths"][field] = value
    with open(rec.record_path(prefix), "w") as f:
        f.write(json.dumps(record).replace("NaN", "NaN"))
    with pytest.raises(check.DataPathError, match=r"dataset\.json"):
        check.check_data_path(prefix, None)


def _lengths(values):
    return dl.document_lengths({"document_lengths": dl.LengthStats().add(values).summary()})


@pytest.mark.parametrize("masked,needle", [(None, "no document masking"),
                                           (False, "DOCUMENT_MASK=1 keeps them apart"),
                                           (True, "they are kept apart")])
def test_the_verdict_for_short_documents(masked, needle):
    short = _lengths(np.full(1000, 256))
    line = dl.masking_verdict(short, 4096, masked)
    assert "100% of the documents (100% of the tokens) are shorter than 4,096" in line
    assert "16.0 document boundaries per sequence of SEQ_LENGTH=4,096" in line
    assert "sequences pack several documents" in line and needle in line


def test_the_verdict_for_long_documents_and_an_odd_sequence_length():
    long = _lengths(np.full(1000, 40000))
    line = dl.masking_verdict(long, 5000, None)
    assert "shorter than 4,096 tokens; 0.1 document boundaries per sequence" in line
    assert "changes little" in line and not dl.packs_documents(long, 5000)
    # most documents short, most tokens in long ones: some sequences cross a boundary
    mixed = _lengths(np.concatenate([np.full(90, 100), np.full(10, 100_000)]))
    assert dl.shorter_than(mixed, 4096)[1] == 0.9
    assert "about 41% of the sequences cross a document boundary" in dl.masking_verdict(
        mixed, 4096, None)


def test_the_dry_run_says_it(tmp_path, corpus_texts, tok_dir):
    from tests.launch.helpers import launch

    prefix = str(tmp_path / "ds")
    prep.prepare([_corpus(tmp_path, corpus_texts)], prefix, tok_dir, progress=False)
    env = {"EXPERIMENT_DIR": str(tmp_path / "exp"), "PATH": os.environ.get("PATH", "")}
    notices = {}
    for seq, mask in ((64, None), (4096, None), (4096, "1")):
        words = {"DOCUMENT_MASK": mask} if mask else {}
        result = launch(env, DATA_PATH=prefix, MODEL_SIZE="tiny", SEQ_LENGTH=seq, **words)
        notices[seq, mask] = [n.message for n in result.settings.notices
                              if n.guard == "documents_in_a_sequence"]
    lengths = dl.document_lengths(rec.read_record(prefix))
    # the registry has DOCUMENT_MASK (default 0): the line says what it does for these documents
    assert notices[4096, None] == [f"{prefix}: " + dl.masking_verdict(lengths, 4096, False)]
    assert "sequences pack several documents" in notices[4096, None][0]
    assert "DOCUMENT_MASK=1 keeps them apart" in notices[4096, None][0]
    assert notices[4096, "1"] == [f"{prefix}: " + dl.masking_verdict(lengths, 4096, True)]
    assert len(notices[64, None]) == 1
    assert "boundaries per sequence of SEQ_LENGTH=64" in notices[64, None][0]
    assert notices[64, None] == [f"{prefix}: " + dl.masking_verdict(lengths, 64, False)]
