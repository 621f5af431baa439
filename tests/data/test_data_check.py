"""DATA_PATH checks before torchrun: blend syntax, files, tokenizer agreement, adopt."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from datatest_utils import make_texts, run_cli, write_jsonl

from training.data import check
from training.data import prepare as prep
from training.data.check import DataPathError, check_data_path, parse_data_path, parse_split
from training.data.tokenizer import train_bpe

# megatron warns when it reads a dataset outside torch.distributed; not a concern here.
pytestmark = pytest.mark.filterwarnings("ignore:Could not determine rank")


# ----------------------------------------------------------------------------- blend syntax

@pytest.mark.parametrize("value,expected", [
    ("data/c4", [(None, "data/c4")]),
    ("  data/a   data/b ", [(None, "data/a"), (None, "data/b")]),
    ("0.7 data/a 0.3 data/b", [(0.7, "data/a"), (0.3, "data/b")]),
    ("30 a 70 b", [(30.0, "a"), (70.0, "b")]),
    ("1e-1 a", [(0.1, "a")]),
    ("1 ./2024", [(1.0, "./2024")]),
])
def test_parse_data_path(value, expected):
    assert parse_data_path(value) == expected


@pytest.mark.parametrize("value,message", [
    ("", "DATA_PATH is empty"),
    ("   ", "DATA_PATH is empty"),
    ("0.7 data/a 0.3", "must come in pairs"),
    ("0.7 data/a data/b 0.3", "item 3 ('data/b') should be a weight"),
    ("data/a 0.5", "item 1 ('data/a') should be a weight"),
    ("0.5 0.5", "should be a prefix but is a number"),
    ("0 data/a 1 data/b", "weight '0' of 'data/a' must be a positive number"),
    ("-1 data/a", "must be a positive number"),
    ("nan data/a", "must be a positive number"),
    ("inf data/a", "must be a positive number"),
    ("data/a.bin", "give the prefix without .bin/.idx ('data/a')"),
])
def test_parse_data_path_errors_say_what_to_write(value, message):
    with pytest.raises(DataPathError) as e:
        parse_data_path(value)
    assert message in str(e.value)
    assert isinstance(e.value, ValueError)


@pytest.mark.parametrize("value,expected", [
    ("949,50,1", (949.0, 50.0, 1.0)), ("98,2", (98.0, 2.0, 0.0)), ("1", (1.0, 0.0, 0.0)),
    ("0.9/0.1/0", (0.9, 0.1, 0.0)),
])
def test_parse_split(value, expected):
    assert parse_split(value) == expected


@pytest.mark.parametrize("value", ["", "1,2,3,4", "a,b,c", "0,50,50", "90,-5,15", "90,,10"])
def test_parse_split_errors(value):
    with pytest.raises(DataPathError, match="SPLIT"):
        parse_split(value)


def test_megatron_data_args_round_trip():
    info = check.DataInfo(["a", "b"], [0.7, 30.0], "tok", 10, 1)
    assert info.megatron_data_args() == ["0.7", "a", "30", "b"]
    assert parse_data_path(" ".join(info.megatron_data_args())) == [(0.7, "a"), (30.0, "b")]
    assert check.DataInfo(["a"], None, "tok", 10, 1).megatron_data_args() == ["a"]


# ----------------------------------------------------------------------------- files and tokenizers

@pytest.fixture(scope="module")
def datasets(tmp_path_factory, corpus_texts, tok_dir):
    """Two datasets with the shared tokenizer and one with a different tokenizer."""
    root = tmp_path_factory.mktemp("check")
    other_tok = train_bpe(make_texts(60, seed=7), 300, str(root / "other_tok"))
    a = write_jsonl(root / "a.jsonl", corpus_texts[:30])
    b = write_jsonl(root / "b.jsonl", corpus_texts[30:60])
    prep.prepare([a], str(root / "a"), tok_dir, progress=False)
    prep.prepare([b], str(root / "b"), tok_dir, progress=False)
    prep.prepare([b], str(root / "c"), other_tok.path, progress=False)
    return root, other_tok


def test_blend_of_good_datasets(datasets, tok_info):
    root, _ = datasets
    info = check_data_path(f"0.25 {root}/a 0.75 {root}/b", None)
    assert info.prefixes == [f"{root}/a", f"{root}/b"]
    assert info.weights == [0.25, 0.75]
    assert (info.tokenizer_model, info.vocab_size, info.eod_id) == (tok_info.path, tok_info.vocab_size, tok_info.eod_id)
    assert info.documents == [30, 30] and all(t > 0 for t in info.tokens)
    assert check_data_path(f"{root}/a {root}/b", tok_info.path).weights is None


def test_missing_files_are_named(datasets):
    root, _ = datasets
    with pytest.raises(DataPathError) as e:
        check_data_path(f"0.5 {root}/a 0.5 {root}/nope", None)
    assert f"{root}/nope.bin and {root}/nope.idx not found" in str(e.value)
    assert "--output-prefix" in str(e.value)
    shutil.copy(f"{root}/a.bin", f"{root}/half.bin")
    with pytest.raises(DataPathError, match=f"{root}/half.idx not found"):
        check_data_path(f"{root}/half", None)


def test_missing_record_points_to_adopt(datasets, tmp_path):
    root, _ = datasets
    for ext in (".bin", ".idx"):
        shutil.copy(f"{root}/a{ext}", tmp_path / f"foreign{ext}")
    with pytest.raises(DataPathError, match="training.data.check adopt"):
        check_data_path(str(tmp_path / "foreign"), None)


def test_changed_bin_is_refused(datasets, tmp_path):
    root, _ = datasets
    for ext in (".bin", ".idx", ".dataset.json"):
        shutil.copy(f"{root}/a{ext}", tmp_path / f"a{ext}")
    with open(tmp_path / "a.bin", "ab") as f:
        f.write(b"\0\0")
    with pytest.raises(DataPathError, match="record says"):
        check_data_path(str(tmp_path / "a"), None)


def test_blend_of_different_tokenizers_is_refused(datasets):
    root, other = datasets
    with pytest.raises(DataPathError) as e:
        check_data_path(f"{root}/a {root}/c", None)
    msg = str(e.value)
    assert "different tokenizers" in msg and other.path in msg and "vocab 300" in msg


def test_tokenizer_model_mismatch_is_refused(datasets, tok_info):
    root, other = datasets
    with pytest.raises(DataPathError) as e:
        check_data_path(f"{root}/a", other.path)
    msg = str(e.value)
    assert f"TOKENIZER_MODEL={other.path} is not the tokenizer" in msg
    assert f"set TOKENIZER_MODEL={tok_info.path}" in msg


def test_same_tokenizer_elsewhere_is_accepted_by_content(datasets, tmp_path, tok_info):
    root, _ = datasets
    copy = tmp_path / "copied_tok"
    shutil.copytree(tok_info.path, copy)
    info = check_data_path(f"{root}/a", str(copy))
    assert info.tokenizer_model == str(copy)
    info = check_data_path(f"{root}/a", str(copy / "tokenizer.json"))  # the file inside a directory
    assert info.tokenizer_model == str(copy)


def test_same_tokenizer_json_but_other_eos_is_refused(datasets, tmp_path, tok_info):
    root, _ = datasets
    copy = tmp_path / "other_eos"
    shutil.copytree(tok_info.path, copy)
    cfg = json.load(open(copy / "tokenizer_config.json"))
    cfg["eos_token"] = "<|pad|>"
    json.dump(cfg, open(copy / "tokenizer_config.json", "w"))
    with pytest.raises(DataPathError, match=r"makes Megatron see vocab size \d+ and EOD 2"):
        check_data_path(f"{root}/a", str(copy))
    # A config change that leaves vocab and EOD alone (here: a chat template) is accepted.
    cfg["eos_token"] = "<|end_of_text|>"
    cfg["chat_template"] = "{{ messages }}"
    json.dump(cfg, open(copy / "tokenizer_config.json", "w"))
    assert check_data_path(f"{root}/a", str(copy)).eod_id == tok_info.eod_id


def test_train_and_valid_paths_must_share_a_tokenizer(datasets, tok_info):
    root, _ = datasets
    infos = check.check_data_paths([f"{root}/a", f"{root}/b"], None)
    assert [i.tokenizer_model for i in infos] == [tok_info.path, tok_info.path]
    with pytest.raises(DataPathError, match="is not the tokenizer"):
        check.check_data_paths([f"{root}/a", f"{root}/c"], None)
    with pytest.raises(DataPathError, match="is not the tokenizer"):
        check.check_data_paths([f"{root}/c", f"{root}/a"], None)


def test_vocab_size_must_match_the_data(datasets, tok_info):
    root, _ = datasets
    info = check_data_path(f"{root}/a", None)
    check.check_vocab_size(info, None)
    check.check_vocab_size(info, tok_info.vocab_size)
    with pytest.raises(DataPathError, match=f"vocabulary size 128256 disagrees.*set the vocabulary size to {tok_info.vocab_size}"):
        check.check_vocab_size(info, 128256)


def test_recorded_tokenizer_that_moved_away(datasets, tmp_path, corpus_texts):
    tok = train_bpe(corpus_texts, 300, str(tmp_path / "tok"))
    prep.prepare([write_jsonl(tmp_path / "x.jsonl", corpus_texts[:3])], str(tmp_path / "x"), tok.path, progress=False)
    shutil.rmtree(tok.path)
    with pytest.raises(DataPathError, match="which is not there any more; set TOKENIZER_MODEL"):
        check_data_path(str(tmp_path / "x"), None)


def test_cli_verify(datasets, capsys, tok_info):
    root, other = datasets
    rc, out, _ = run_cli(check.main, ["verify", f"0.5 {root}/a 0.5 {root}/b"], capsys)
    assert rc == 0
    assert f"--data-path 0.5 {root}/a 0.5 {root}/b --tokenizer-type HuggingFaceTokenizer --tokenizer-model {tok_info.path}" in out
    rc, _, err = run_cli(check.main, ["verify", f"{root}/a", "--tokenizer-model", other.path], capsys)
    assert rc == 2 and err.startswith("error: TOKENIZER_MODEL=")


# ----------------------------------------------------------------------------- adopt

def test_adopt_a_foreign_dataset(datasets, tmp_path, tok_info, capsys):
    root, other = datasets
    for ext in (".bin", ".idx"):
        shutil.copy(f"{root}/a{ext}", tmp_path / f"f{ext}")
    prefix = str(tmp_path / "f")
    # Ids up to the big tokenizer's vocabulary do not fit the small one: refused.
    rc, _, err = run_cli(check.main, ["adopt", prefix, "--tokenizer-model", other.path], capsys)
    assert rc == 2 and "outside the vocabulary" in err and not os.path.exists(prefix + ".dataset.json")
    rc, out, err = run_cli(check.main, ["adopt", prefix, "--tokenizer-model", tok_info.path], capsys)
    assert rc == 0 and "warning" not in err
    record = json.load(open(prefix + ".dataset.json"))
    assert record["documents"] == record["documents_ending_with_eod"] == 30
    assert check_data_path(prefix, tok_info.path).documents == [30]


def test_adopt_warns_about_documents_without_eod(tmp_path, tok_info, capsys):
    import numpy as np
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    b = IndexedDatasetBuilder(str(tmp_path / "n.bin"), dtype=np.uint16)
    b.add_document(np.array([5, 6, tok_info.eod_id]), [3])
    b.add_document(np.array([7, 8]), [2])
    b.finalize(str(tmp_path / "n.idx"))
    rc, out, err = run_cli(check.main, ["adopt", str(tmp_path / "n"), "--tokenizer-model", tok_info.path], capsys)
    assert rc == 0 and "1 of 2 documents do not end with EOD" in err


def test_the_launch_check_stays_light(datasets, tok_info):
    """Before torchrun: an agreeing DATA_PATH is checked from the records and file hashes
    alone, without importing torch, megatron or transformers (tens of milliseconds)."""
    import subprocess
    import sys

    root, _ = datasets
    code = ("import sys; from training.data.check import check_data_path; "
            f"check_data_path('0.5 {root}/a 0.5 {root}/b', {tok_info.path!r}); "
            "print(sorted(m for m in ('torch', 'megatron', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert out.stdout.strip() == "[]"
