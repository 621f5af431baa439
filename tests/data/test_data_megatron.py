"""The prepared data as Megatron itself sees it, on the CPU.

- megatron_tokenizer_args() parsed by megatron.training's own argument parser and built by
  its build_tokenizer(): same vocabulary size, EOD id and token ids as the dataset record.
- The dataset read back through BlendedMegatronDatasetBuilder + GPTDataset (the training
  data path; helpers_cpp ships prebuilt in the wheel): every sample is the expected window
  of the documents, tokenized directly, each followed by EOD.
"""

from __future__ import annotations

import argparse
import logging
import warnings

import numpy as np
import pytest
from datatest_utils import write_jsonl

from training.data import prepare as prep
from training.data.check import check_data_path, megatron_tokenizer_args

# megatron warns when it reads a dataset outside torch.distributed; not a concern here.
pytestmark = [pytest.mark.filterwarnings("ignore:Could not determine rank"),
              pytest.mark.filterwarnings("ignore:'type' is deprecated:DeprecationWarning")]

SEQ = 64


@pytest.fixture(scope="module")
def megatron_tokenizer(tok_dir):
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.tokenizers.utils.build_tokenizer import build_tokenizer
        from megatron.training.arguments import add_megatron_arguments

    parser = add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
    args = parser.parse_args(megatron_tokenizer_args(tok_dir))
    args.rank = 0  # parse_args() sets it from RANK; build_tokenizer logs with it
    tokenizer = build_tokenizer(args)
    return tokenizer, args


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, corpus_texts, tok_dir):
    root = tmp_path_factory.mktemp("meg")
    prep.prepare([write_jsonl(root / "a.jsonl", corpus_texts[:60])], str(root / "a"), tok_dir, progress=False)
    prep.prepare([write_jsonl(root / "b.jsonl", corpus_texts[60:])], str(root / "b"), tok_dir, progress=False)
    return root


def test_megatron_builds_the_recorded_tokenizer(megatron_tokenizer, prepared, corpus_texts):
    tokenizer, args = megatron_tokenizer
    info = check_data_path(f"{prepared}/a", None)
    assert tokenizer.vocab_size == info.vocab_size
    assert tokenizer.eod == info.eod_id
    assert args.padded_vocab_size % args.make_vocab_size_divisible_by == 0
    assert args.padded_vocab_size >= info.vocab_size
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    ds = IndexedDataset(f"{prepared}/a")
    for i in (0, 7, 59):
        assert ds[i].tolist() == tokenizer.tokenize(corpus_texts[i]) + [tokenizer.eod]


def _build(prefixes, weights, tokenizer, cache, num_samples, seed=1234):
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    config = GPTDatasetConfig(
        random_seed=seed, sequence_length=SEQ, blend=(prefixes, weights), split="1,0,0",
        path_to_cache=str(cache), tokenizer=tokenizer, reset_position_ids=False,
        reset_attention_mask=False, eod_mask_loss=False,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        train, valid, test = BlendedMegatronDatasetBuilder(
            GPTDataset, [num_samples, 0, 0], lambda: True, config).build()
    assert valid is None and test is None
    return train


def test_gpt_dataset_samples_are_windows_of_the_tokenized_documents(megatron_tokenizer, prepared, corpus_texts,
                                                                    tok_info, tmp_path):
    from tokenizers import Tokenizer

    tokenizer, _ = megatron_tokenizer
    lib = Tokenizer.from_file(tok_info.tokenizer_json)
    expected_docs = [lib.encode(t).ids + [tok_info.eod_id] for t in corpus_texts[:60]]
    total = sum(map(len, expected_docs))
    num_samples = 2 * total // SEQ  # about two epochs
    ds = _build([f"{prepared}/a"], None, tokenizer, tmp_path, num_samples)
    assert len(ds) >= num_samples
    stream = np.concatenate([expected_docs[d] for d in ds.document_index])
    eod_seen = 0
    for i in range(len(ds)):
        sample = ds[i]
        j = int(ds.shuffle_index[i])
        window = stream[j * SEQ: j * SEQ + SEQ + 1]
        assert sample["tokens"].tolist() == window[:-1].tolist(), f"sample {i}"
        assert sample["labels"].tolist() == window[1:].tolist(), f"sample {i}"
        eod_seen += int((sample["tokens"] == tok_info.eod_id).sum())
    assert eod_seen > 0
    assert sorted(set(ds.document_index.tolist())) == list(range(60))


def test_weighted_blend_reaches_megatron(megatron_tokenizer, prepared, tmp_path):
    tokenizer, _ = megatron_tokenizer
    info = check_data_path(f"0.2 {prepared}/a 0.8 {prepared}/b", None)
    blended = _build(info.prefixes, info.weights, tokenizer, tmp_path, 500)
    ids = np.asarray(blended.dataset_index[:500])
    share_b = float((ids == 1).mean())
    assert 0.75 <= share_b <= 0.85
    assert blended[0]["tokens"].shape[0] == SEQ
