"""training.data.tokenizer: training a BPE, identity, and tokenizers that cannot be used."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from datatest_utils import run_cli, write_jsonl

from training.data import tokenizer as tokmod
from training.data.errors import InputError


def test_trained_tokenizer_is_a_loadable_directory(tok_dir, tok_info, corpus_texts):
    from transformers import AutoTokenizer

    assert sorted(os.listdir(tok_dir)) == ["tokenizer.json", "tokenizer_config.json"]
    auto = AutoTokenizer.from_pretrained(tok_dir)
    assert len(auto) == tok_info.vocab_size == 400
    assert (auto.eos_token, auto.bos_token) == (tokmod.EOS_TOKEN, tokmod.BOS_TOKEN)
    assert (tok_info.bos_id, tok_info.eod_id) == (0, 1)
    ids = auto(corpus_texts[3])["input_ids"]
    assert ids[0] == tok_info.bos_id and tok_info.eod_id not in ids
    assert auto.decode(ids, skip_special_tokens=True) == corpus_texts[3]  # byte-level: lossless
    assert tok_info.sha256 == tokmod.file_sha256(os.path.join(tok_dir, "tokenizer.json"))


def test_training_is_deterministic(tmp_path, corpus_texts, tok_info):
    again = tokmod.train_bpe(corpus_texts, 400, str(tmp_path / "again"))
    assert again.sha256 == tok_info.sha256


def test_vocab_too_small(tmp_path):
    with pytest.raises(InputError, match="at least 259"):
        tokmod.train_bpe(["a b c"], 100, str(tmp_path / "t"))


def test_unusable_tokenizers_are_refused(tmp_path, tok_info):
    with pytest.raises(InputError, match="no such file or directory"):
        tokmod.load(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "tokenizer.model").write_bytes(b"sp")
    with pytest.raises(InputError, match="no tokenizer.json.*SentencePiece"):
        tokmod.load(str(tmp_path / "empty"))
    no_eos = tmp_path / "no_eos"
    no_eos.mkdir()
    shutil.copy(tok_info.tokenizer_json, no_eos / "tokenizer.json")
    (no_eos / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    with pytest.raises(InputError, match="no eos_token in tokenizer_config.json"):
        tokmod.load(str(no_eos))
    with pytest.raises(InputError, match="bare tokenizer file"):
        tokmod.load(_bare(tmp_path, tok_info))


def _bare(tmp_path, tok_info):
    path = tmp_path / "bare.json"
    shutil.copy(tok_info.tokenizer_json, path)
    return str(path)


def test_wrap_keeps_the_identity(tmp_path, tok_info):
    wrapped = tokmod.wrap(_bare(tmp_path, tok_info), tokmod.EOS_TOKEN, str(tmp_path / "w"), tokmod.BOS_TOKEN)
    assert (wrapped.sha256, wrapped.vocab_size, wrapped.eod_id, wrapped.bos_id) == (
        tok_info.sha256, tok_info.vocab_size, tok_info.eod_id, tok_info.bos_id)


def test_library_and_autotokenizer_disagreement_is_refused(tmp_path, tok_info):
    """A config that makes AutoTokenizer encode differently from tokenizer.json (here: an
    added token that tokenizer.json lacks) must stop preparation."""
    odd = tmp_path / "odd"
    shutil.copytree(tok_info.path, odd)
    cfg = json.load(open(odd / "tokenizer_config.json"))
    cfg["added_tokens_decoder"] = {"400": {"content": "Hello", "special": True, "lstrip": False,
                                           "rstrip": False, "normalized": False, "single_word": False}}
    json.dump(cfg, open(odd / "tokenizer_config.json", "w"))
    info = tokmod.load(str(odd))
    tokmod.check_library_agrees(tok_info)  # the original agrees
    with pytest.raises(InputError, match="encode a probe text differently"):
        tokmod.check_library_agrees(info)


def test_cli_train_and_info(tmp_path, corpus_texts, capsys):
    from training.data.check import megatron_tokenizer_args

    path = write_jsonl(tmp_path / "c.jsonl", corpus_texts[:40])
    (tmp_path / "bad.jsonl").write_text('{"text": "fine words"}\nnot json\n')
    out_dir = str(tmp_path / "tok")
    rc, out, _ = run_cli(tokmod.main, ["train", path, str(tmp_path / "bad.jsonl"), "--vocab-size", "300",
                                       "--out", out_dir], capsys)
    assert rc == 0
    assert "vocab size    300" in out and "skipped 1 line(s); first: " in out and "bad.jsonl:2" in out
    assert " ".join(megatron_tokenizer_args(out_dir)) in out
    rc, _, err = run_cli(tokmod.main, ["train", path, "--vocab-size", "300", "--out", out_dir], capsys)
    assert rc == 2 and "--overwrite" in err
    rc, out, _ = run_cli(tokmod.main, ["train", path, "--vocab-size", "60000", "--out", str(tmp_path / "t2")], capsys)
    assert rc == 0 and "note: learned" in out and "fewer than the 60000 asked" in out
    rc, out, _ = run_cli(tokmod.main, ["info", out_dir], capsys)
    assert rc == 0 and "EOD           '<|end_of_text|>' = 1" in out
