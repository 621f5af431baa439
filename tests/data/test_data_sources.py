"""Input handling: file expansion, formats, compression, and every kind of bad line."""

from __future__ import annotations

import bz2
import gzip
import lzma
import os

import pytest
import zstandard

from training.data import sources as src
from training.data.errors import InputError, RunError


def _parse_file(path, fmt="auto", text_unit="file", text_key="text"):
    f = src.expand_inputs([str(path)], fmt)[0]
    texts, lines, skips = [], [], []
    for chunk in src.read_chunks(0, f, chunk_bytes=64, text_unit=text_unit):
        p = src.parse_chunk(chunk, f.format, text_key, text_unit)
        texts += p.texts
        lines += p.lines
        skips += p.skips
    return texts, lines, skips


@pytest.mark.parametrize("name,fmt,comp", [
    ("a.jsonl", "jsonl", None), ("a.json.gz", "jsonl", ".gz"), ("c4-train.00000-of-01024.json.gz", "jsonl", ".gz"),
    ("a.JSONL.ZST", "jsonl", ".ZST"), ("b.ndjson.xz", "jsonl", ".xz"), ("b.txt", "text", None),
    ("b.md.bz2", "text", ".bz2"),
])
def test_detect_format_from_name(name, fmt, comp):
    got_fmt, got_comp = src.detect_format(name)
    assert got_fmt == fmt
    assert (got_comp or "").lower() == (comp or "").lower()


def test_unknown_format_is_refused_not_guessed():
    with pytest.raises(InputError, match="--format jsonl or --format text"):
        src.detect_format("shard.data")
    assert src.detect_format("shard.data", "jsonl") == ("jsonl", None)


def test_expand_inputs_errors(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"text": "x"}\n')
    with pytest.raises(InputError, match="missing.jsonl: no such file"):
        src.expand_inputs([str(tmp_path / "missing.jsonl")])
    with pytest.raises(InputError, match="no file matches this glob"):
        src.expand_inputs([str(tmp_path / "*.zst")])
    with pytest.raises(InputError, match="is a directory"):
        src.expand_inputs([str(tmp_path)])
    with pytest.raises(InputError, match="given twice"):
        src.expand_inputs([str(tmp_path / "a.jsonl"), str(tmp_path / "*.jsonl")])
    with pytest.raises(InputError, match="no input given"):
        src.expand_inputs([])


def test_glob_is_sorted_and_order_kept(tmp_path):
    for name in ("b.jsonl", "a.jsonl", "c.txt"):
        (tmp_path / name).write_text("{}\n")
    files = src.expand_inputs([str(tmp_path / "c.txt"), str(tmp_path / "*.jsonl")])
    assert [os.path.basename(f.path) for f in files] == ["c.txt", "a.jsonl", "b.jsonl"]
    assert [f.format for f in files] == ["text", "jsonl", "jsonl"]


def test_every_bad_line_is_skipped_with_its_line_number(tmp_path):
    lines = [
        b'{"text": "good one"}',  # 1
        b'{"text": "broken"',  # 2 malformed
        b'{"body": "no text key"}',  # 3
        b'{"text": "bad \xff\xfe utf8"}',  # 4
        b"",  # 5 blank
        b'["a", "list"]',  # 6
        b'{"text": 42}',  # 7
        b'{"text": ""}',  # 8
        b'{"text": "good two", "text2": 1}',  # 9
    ]
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    texts, good_lines, skips = _parse_file(path)
    assert texts == ["good one", "good two"]
    assert good_lines == [1, 9]
    got = {(s.line, s.reason) for s in skips}
    assert got == {
        (2, src.MALFORMED_JSON), (3, src.MISSING_KEY), (4, src.INVALID_UTF8), (5, src.BLANK),
        (6, src.NOT_AN_OBJECT), (7, src.NOT_A_STRING), (8, src.EMPTY_TEXT),
    }
    by_line = {s.line: str(s) for s in skips}
    assert by_line[2].startswith(f"{path}:2: malformed JSON")
    assert "keys: body" in by_line[3]
    assert "byte 15" in by_line[4]


def test_text_key_is_configurable(tmp_path):
    path = tmp_path / "k.jsonl"
    path.write_text('{"content": "a"}\n{"text": "b"}\n')
    texts, _, skips = _parse_file(path, text_key="content")
    assert texts == ["a"]
    assert [s.line for s in skips] == [2] and "no 'content'" in str(skips[0])


def test_crlf_lines(tmp_path):
    path = tmp_path / "w.jsonl"
    path.write_bytes(b'{"text": "a"}\r\n{"text": "b"}\r\n')
    assert _parse_file(path)[0] == ["a", "b"]


@pytest.mark.parametrize("suffix,compress", [
    (".gz", gzip.compress), (".zst", lambda b: zstandard.ZstdCompressor().compress(b)),
    (".bz2", bz2.compress), (".xz", lzma.compress),
])
def test_compressed_inputs(tmp_path, suffix, compress):
    data = "".join(f'{{"text": "doc {i} ü"}}\n' for i in range(50)).encode()
    path = tmp_path / f"c.jsonl{suffix}"
    path.write_bytes(compress(data))
    texts, lines, skips = _parse_file(path)
    assert texts == [f"doc {i} ü" for i in range(50)]
    assert lines == list(range(1, 51)) and not skips


def test_truncated_gzip_fails_the_run_naming_file_and_line(tmp_path):
    data = "".join(f'{{"text": "document number {i} " }}\n' for i in range(5000)).encode()
    blob = gzip.compress(data)
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(blob[: len(blob) // 2])
    with pytest.raises(RunError, match=r"cut.jsonl.gz: cannot read the gz file after line \d+"):
        _parse_file(path)


def test_corrupt_zstd_fails_the_run(tmp_path):
    path = tmp_path / "bad.jsonl.zst"
    path.write_bytes(b"this is not zstd at all" * 10)
    with pytest.raises(RunError, match="bad.jsonl.zst: cannot read the zst file at the start"):
        _parse_file(path)


def test_plain_text_file_is_one_document_and_bad_utf8_names_the_line(tmp_path):
    good = tmp_path / "good.txt"
    good.write_text("first line\nsecond line\n")
    assert _parse_file(good)[0] == ["first line\nsecond line\n"]
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ok\nok\nbad \xc3\x28 here\n")
    texts, _, skips = _parse_file(bad)
    assert texts == [] and skips[0].line == 3 and skips[0].reason == src.INVALID_UTF8


def test_plain_text_lines(tmp_path):
    path = tmp_path / "l.txt"
    path.write_bytes(b"one\n\ntwo\n\xff\n")
    texts, lines, skips = _parse_file(path, text_unit="line")
    assert texts == ["one", "two"] and lines == [1, 3]
    assert {(s.line, s.reason) for s in skips} == {(2, src.BLANK), (4, src.INVALID_UTF8)}


def test_iter_texts_reports_empty_files_and_surrogates(tmp_path):
    (tmp_path / "empty.jsonl").write_bytes(b"")
    (tmp_path / "s.jsonl").write_text('{"text": "ok"}\n{"text": "lone \\ud800"}\n')
    skips = []
    files = src.expand_inputs([str(tmp_path / "empty.jsonl"), str(tmp_path / "s.jsonl")])
    assert list(src.iter_texts(files, skips=skips)) == ["ok"]
    assert [(os.path.basename(s.path), s.line, s.reason) for s in skips] == [
        ("empty.jsonl", 0, src.EMPTY_FILE), ("s.jsonl", 2, src.INVALID_UNICODE)]
    assert str(skips[0]).endswith("empty.jsonl: empty file")
