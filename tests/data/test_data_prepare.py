"""training.data.prepare: round trip through Megatron's reader, bad input, atomic output."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from datatest_utils import expected_ids, run_cli, write_jsonl, write_jsonl_gz

from training.data import prepare as prep
from training.data import sources as src
from training.data.check import DataPathError, check_data_path, megatron_tokenizer_args

# megatron warns when it reads a dataset outside torch.distributed; not a concern here.
pytestmark = pytest.mark.filterwarnings("ignore:Could not determine rank")


def _read_docs(prefix):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    ds = IndexedDataset(prefix, mmap=True)
    docs = ds.document_indices
    assert list(docs) == list(range(len(ds) + 1)), "one sequence per document"
    return [ds[i].tolist() for i in range(len(ds))], ds


def test_round_trip_matches_direct_tokenization(tmp_path, corpus_texts, tok_dir, tok_info, capsys):
    a = write_jsonl_gz(tmp_path / "a.jsonl.gz", corpus_texts[:70])
    b = write_jsonl(tmp_path / "b.jsonl", corpus_texts[70:])
    prefix = str(tmp_path / "out" / "ds")
    rc, out, _ = run_cli(prep.main, [a, b, "--tokenizer", tok_dir, "--output-prefix", prefix, "--no-progress"], capsys)
    assert rc == 0
    docs, ds = _read_docs(prefix)
    assert docs == [expected_ids(tok_info, t) for t in corpus_texts]
    assert ds.index.dtype == np.uint16
    record = json.load(open(prefix + ".dataset.json"))
    assert record["documents"] == len(corpus_texts)
    assert record["tokens"] == sum(len(d) for d in docs)
    assert record["tokenizer"]["sha256"] == tok_info.sha256
    assert record["tokenizer"]["eod_id"] == tok_info.eod_id
    assert [i["documents"] for i in record["inputs"]] == [70, len(corpus_texts) - 70]
    assert f"documents  {len(corpus_texts):,}" in out and "DATA_PATH=" in out
    assert not [p for p in os.listdir(tmp_path / "out") if ".tmp-" in p]


def test_every_document_starts_with_bos_and_ends_with_one_eod(tmp_path, corpus_texts, tok_dir, tok_info):
    path = write_jsonl(tmp_path / "a.jsonl", corpus_texts[:20])
    prep.prepare([path], str(tmp_path / "ds"), tok_dir, progress=False)
    docs, _ = _read_docs(str(tmp_path / "ds"))
    for d in docs:
        assert d[0] == tok_info.bos_id and d[-1] == tok_info.eod_id
        assert tok_info.eod_id not in d[:-1]
    prep.prepare([path], str(tmp_path / "nobos"), tok_dir, progress=False, add_special_tokens=False)
    assert all(d[0] != tok_info.bos_id for d in _read_docs(str(tmp_path / "nobos"))[0])


def test_workers_give_identical_output(tmp_path, corpus_texts, tok_dir):
    path = write_jsonl(tmp_path / "a.jsonl", corpus_texts * 3)
    one = prep.prepare([path], str(tmp_path / "w1"), tok_dir, workers=1, chunk_mb=0.01, progress=False)
    two = prep.prepare([path], str(tmp_path / "w2"), tok_dir, workers=2, chunk_mb=0.01, progress=False)
    assert one.tokens == two.tokens
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"w1{ext}").read_bytes() == (tmp_path / f"w2{ext}").read_bytes()


def test_bad_lines_are_skipped_and_reported_with_file_and_line(tmp_path, tok_dir, tok_info, capsys):
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(b"\n".join([
        b'{"text": "alpha"}', b'{"text": "beta', b'{"txt": "gamma"}', b'{"text": "d\xe9lta"}',
        b'{"text": "lone \\ud800 surrogate"}', b'{"text": "omega"}']) + b"\n")
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    prefix = str(tmp_path / "ds")
    rc, out, err = run_cli(prep.main, [str(path), str(empty), "--tokenizer", tok_dir, "--output-prefix", prefix,
                                       "--no-progress"], capsys)
    assert rc == 0, err
    assert [d[:-1] for d in _read_docs(prefix)[0]] == [expected_ids(tok_info, t)[:-1] for t in ("alpha", "omega")]
    for needle in (f"{path}:2: malformed JSON", f"{path}:3: missing text key", f"{path}:4: invalid UTF-8",
                   f"{path}:5: invalid Unicode", f"{empty}: empty file"):
        assert needle in out
    record = json.load(open(prefix + ".dataset.json"))
    assert record["skipped"] == {src.MALFORMED_JSON: 1, src.MISSING_KEY: 1, src.INVALID_UTF8: 1,
                                 src.INVALID_UNICODE: 1, src.EMPTY_FILE: 1}


def _outputs(tmp_path, name="ds"):
    return sorted(p for p in os.listdir(tmp_path) if p.startswith(name + "."))


@pytest.mark.parametrize("setup,argv_extra,code,message", [
    ("missing", [], 2, "nope.jsonl: no such file"),
    ("glob", [], 2, "no file matches this glob"),
    ("bad_format", [], 2, "pass --format jsonl or --format text"),
    ("all_bad", [], 1, "no documents in the input: 2 skipped: malformed JSON 2; nothing written"),
    ("strict", ["--strict"], 1, "--strict: {dir}/s.jsonl:2: missing text key"),
    ("truncated", [], 1, "{dir}/t.jsonl.gz: cannot read the gz file after line"),
    ("bad_workers", ["--workers", "0"], 2, "--workers: must be a whole number >= 1, not '0'"),
])
def test_bad_input_exits_clearly_and_writes_nothing(tmp_path, tok_dir, capsys, setup, argv_extra, code, message):
    import gzip

    inputs = {"missing": [str(tmp_path / "nope.jsonl")], "glob": [str(tmp_path / "*.zst")]}.get(setup)
    if setup == "bad_format":
        (tmp_path / "x.dat").write_text("{}\n")
        inputs = [str(tmp_path / "x.dat")]
    elif setup == "all_bad":
        (tmp_path / "b.jsonl").write_text("{bad\n[1,\n")
        inputs = [str(tmp_path / "b.jsonl")]
    elif setup in ("strict", "bad_workers"):
        (tmp_path / "s.jsonl").write_text('{"text": "fine"}\n{"body": "x"}\n')
        inputs = [str(tmp_path / "s.jsonl")]
    elif setup == "truncated":
        blob = gzip.compress("".join(f'{{"text": "doc {i} words words"}}\n' for i in range(20000)).encode())
        (tmp_path / "t.jsonl.gz").write_bytes(blob[: len(blob) * 2 // 3])
        inputs = [str(tmp_path / "t.jsonl.gz")]
    rc, out, err = run_cli(prep.main, [*inputs, "--tokenizer", tok_dir, "--output-prefix", str(tmp_path / "ds"),
                                       "--no-progress", *argv_extra], capsys)
    assert rc == code
    assert message.format(dir=tmp_path) in err
    assert len(err.strip().splitlines()) <= 3
    assert _outputs(tmp_path) == []


def test_existing_output_needs_overwrite(tmp_path, corpus_texts, tok_dir, capsys):
    path = write_jsonl(tmp_path / "a.jsonl", corpus_texts[:5])
    argv = [path, "--tokenizer", tok_dir, "--output-prefix", str(tmp_path / "ds"), "--no-progress"]
    assert run_cli(prep.main, argv, capsys)[0] == 0
    rc, _, err = run_cli(prep.main, argv, capsys)
    assert rc == 2 and "ds.bin already exists; pass --overwrite" in err
    assert run_cli(prep.main, argv + ["--overwrite"], capsys)[0] == 0
    rc, _, err = run_cli(prep.main, [path, "--tokenizer", tok_dir, "--output-prefix", str(tmp_path / "ds.bin")], capsys)
    assert rc == 2 and "without .bin/.idx" in err


def test_interrupted_run_leaves_nothing_that_looks_complete(tmp_path, corpus_texts, tok_dir):
    path = write_jsonl(tmp_path / "a.jsonl", corpus_texts * 2)
    seen = []

    def interrupt(enc):
        seen.append(enc)
        if len(seen) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        prep.prepare([path], str(tmp_path / "ds"), tok_dir, chunk_mb=0.01, progress=False, on_chunk=interrupt)
    assert len(seen) == 2
    assert _outputs(tmp_path) == []  # temporaries removed, nothing published


def test_crash_between_renames_never_leaves_a_complete_looking_pair(tmp_path, corpus_texts, tok_dir, monkeypatch):
    path = write_jsonl(tmp_path / "a.jsonl", corpus_texts[:10])
    prefix = str(tmp_path / "ds")
    real_replace = os.replace

    def replace(src_path, dst):
        if str(dst).endswith(".idx"):
            raise OSError(28, "No space left on device")
        return real_replace(src_path, dst)

    monkeypatch.setattr(prep.os, "replace", replace)
    with pytest.raises(prep.RunError, match="No space left on device"):
        prep.prepare([path], prefix, tok_dir, progress=False)
    assert not os.path.exists(prefix + ".idx")
    assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p]
    with pytest.raises(DataPathError, match=r"ds\.idx not found"):
        check_data_path(prefix, None)


def test_plain_text_inputs(tmp_path, tok_dir, tok_info):
    (tmp_path / "a.txt").write_text("The first book.\nTwo lines.\n")
    (tmp_path / "b.txt").write_text("one\ntwo\n\nthree\n")
    prep.prepare([str(tmp_path / "a.txt")], str(tmp_path / "files"), tok_dir, progress=False)
    assert _read_docs(str(tmp_path / "files"))[0] == [expected_ids(tok_info, "The first book.\nTwo lines.\n")]
    prep.prepare([str(tmp_path / "b.txt")], str(tmp_path / "lines"), tok_dir, progress=False, text_unit="line")
    assert _read_docs(str(tmp_path / "lines"))[0] == [expected_ids(tok_info, t) for t in ("one", "two", "three")]


def test_bare_tokenizer_json_needs_eod_token_then_gets_a_loadable_directory(tmp_path, corpus_texts, tok_info, capsys):
    import shutil

    bare = tmp_path / "bare" / "my-tokenizer.json"
    bare.parent.mkdir()
    shutil.copy(tok_info.tokenizer_json, bare)
    path = write_jsonl(tmp_path / "a.jsonl", corpus_texts[:5])
    prefix = str(tmp_path / "ds")
    rc, _, err = run_cli(prep.main, [path, "--tokenizer", str(bare), "--output-prefix", prefix], capsys)
    assert rc == 2 and "--eod-token" in err
    rc, _, err = run_cli(prep.main, [path, "--tokenizer", str(bare), "--output-prefix", prefix,
                                     "--eod-token", "<|nope|>"], capsys)
    assert rc == 2 and "'<|nope|>' is not in the vocabulary" in err
    rc, out, err = run_cli(prep.main, [path, "--tokenizer", str(bare), "--output-prefix", prefix, "--no-progress",
                                       "--eod-token", tok_info.eod_token], capsys)
    assert rc == 0, err
    info = check_data_path(prefix, None)
    assert info.tokenizer_model == os.path.abspath(prefix + ".tokenizer")
    assert (info.vocab_size, info.eod_id) == (tok_info.vocab_size, tok_info.eod_id)
    # Same tokenizer.json content as the original directory: the same tokenizer.
    assert check_data_path(prefix, tok_info.path).eod_id == tok_info.eod_id
    assert megatron_tokenizer_args(info.tokenizer_model)[-1] == info.tokenizer_model
    with pytest.raises(DataPathError, match="bare tokenizer file"):
        megatron_tokenizer_args(str(bare))
    docs = _read_docs(prefix)[0]
    # BOS comes from tokenizer.json's post-processor, as with the directory.
    assert docs == [expected_ids(tok_info, t) for t in corpus_texts[:5]]


def test_eod_token_must_match_the_directory(tmp_path, corpus_texts, tok_dir, capsys):
    path = write_jsonl(tmp_path / "a.jsonl", corpus_texts[:2])
    rc, _, err = run_cli(prep.main, [path, "--tokenizer", tok_dir, "--output-prefix", str(tmp_path / "ds"),
                                     "--eod-token", "<|pad|>"], capsys)
    assert rc == 2 and "whose eos token is '<|end_of_text|>'" in err


def test_tokenizer_that_appends_eos_itself_gets_no_second_eod(tmp_path, corpus_texts, tok_info):
    from tokenizers import Tokenizer, processors

    from training.data.tokenizer import wrap

    tok = Tokenizer.from_file(tok_info.tokenizer_json)
    tok.post_processor = processors.TemplateProcessing(
        single="$A <|end_of_text|>", special_tokens=[("<|end_of_text|>", tok_info.eod_id)])
    tok.save(str(tmp_path / "eos.json"))
    wrapped = wrap(str(tmp_path / "eos.json"), "<|end_of_text|>", str(tmp_path / "eos_tok"))
    path = write_jsonl(tmp_path / "a.jsonl", corpus_texts[:5])
    prep.prepare([path], str(tmp_path / "ds"), wrapped.path, progress=False)
    docs = _read_docs(str(tmp_path / "ds"))[0]
    assert docs == [tok.encode(t).ids for t in corpus_texts[:5]]
    assert all(d[-1] == tok_info.eod_id and d[-2] != tok_info.eod_id for d in docs)



def test_large_vocabulary_is_stored_as_int32(tmp_path, corpus_texts, tok_info):
    """Llama 3 has 128256 tokens: more than uint16 holds. Same tokenizer with every ordinary
    token's id moved up by 65536 (the free ids filled with unused tokens)."""
    from tokenizers import Tokenizer

    from training.data.tokenizer import wrap

    spec = json.load(open(tok_info.tokenizer_json))
    special = {t["content"] for t in spec["added_tokens"]}
    shift = 65536
    vocab = {k: (v if k in special else v + shift) for k, v in spec["model"]["vocab"].items()}
    vocab.update({f"<unused{i}>": 3 + i for i in range(shift)})
    spec["model"]["vocab"] = vocab
    (tmp_path / "big.json").write_text(json.dumps(spec))
    big = wrap(str(tmp_path / "big.json"), "<|end_of_text|>", str(tmp_path / "bigtok"), "<|begin_of_text|>")
    assert big.vocab_size == tok_info.vocab_size + shift
    path = write_jsonl(tmp_path / "a.jsonl", corpus_texts[:8])
    prep.prepare([path], str(tmp_path / "ds"), big.path, workers=1, progress=False)
    docs, ds = _read_docs(str(tmp_path / "ds"))
    assert ds.index.dtype == np.int32
    lib = Tokenizer.from_file(big.tokenizer_json)
    assert docs == [lib.encode(t).ids + [big.eod_id] for t in corpus_texts[:8]]
    assert max(max(d) for d in docs) > 65535
