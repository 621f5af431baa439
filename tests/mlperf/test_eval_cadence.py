"""Evaluation cadence: sequences -> Megatron iterations, and the same first validation sequences
at every evaluation, through Megatron's own dataset builder and sampler (CPU)."""
from __future__ import annotations

import warnings

import numpy
import pytest

from training.mlperf import rules

pytestmark = [pytest.mark.filterwarnings("ignore:Could not determine rank")]

SEQ = 16


@pytest.mark.parametrize("gbs,interval,iters,evaluated", [
    (32, 384, 32, 1024),    # the reference: every 384 iterations, 32 batches
    (16, 768, 64, 1024),
    (64, 192, 16, 1024),
    (96, 128, 11, 1056),    # 1024/96 is not whole: 11 batches, the first 1056 sequences
    (48, 256, 22, 1056),
    (1000, 13, 2, 2000),    # 12288/1000: an evaluation at least every 12288 sequences
])
def test_eval_cadence_in_iterations(gbs, interval, iters, evaluated):
    assert rules.eval_interval(12288, gbs) == interval
    assert rules.eval_iters(1024, gbs) == iters
    assert rules.evaluated_sequences(1024, gbs) == evaluated
    # never evaluated later than every 12288 sequences, never on fewer than 1024
    assert (interval - 1) * gbs < 12288 <= interval * gbs
    assert (iters - 1) * gbs < 1024 <= iters * gbs


def test_warmup_and_min_lr_arithmetic():
    r = rules.load()
    assert rules.warmup_iters(4096, 32) == 128 and rules.warmup_iters(4096, 96) == 43
    assert rules.min_lr(r, 8e-4) == 8e-5 and rules.min_lr(r, 1e-3) == 1e-4


class _Tokenizer:
    vocab_size, eod, pad = 1000, 0, 999
    unique_identifiers = {"class": "test tokenizer"}


@pytest.fixture(scope="module")
def documents(tmp_path_factory):
    """Two indexed datasets of known tokens: document d of the valid set holds d*100 + 1, +2, ..."""
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    root = tmp_path_factory.mktemp("docs")
    rng = numpy.random.default_rng(0)
    out = {}
    for name, count in (("train", 40), ("valid", 30)):
        docs = [list(range(d * 100 + 1, d * 100 + 1 + int(rng.integers(5, 40)))) + [0]
                for d in range(count)]
        builder = IndexedDatasetBuilder(str(root / f"{name}.bin"), dtype=numpy.int32)
        for doc in docs:
            builder.add_document(torch.tensor(doc, dtype=torch.int32), [len(doc)])
        builder.finalize(str(root / f"{name}.idx"))
        out[name] = (str(root / name), docs)
    return out


def _build(cls, documents, sizes, cache):
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig

    from training import megatron_patches
    from training.run import Run

    megatron_patches.apply(Run(args=None), names=("dataset_helpers",))
    config = GPTDatasetConfig(
        random_seed=1234, sequence_length=SEQ, path_to_cache=str(cache),
        blend_per_split=[([documents["train"][0]], None), ([documents["valid"][0]], None), None],
        tokenizer=_Tokenizer(), reset_position_ids=False, reset_attention_mask=False,
        eod_mask_loss=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return BlendedMegatronDatasetBuilder(cls, sizes, lambda: True, config).build()


def _evaluations(valid, eval_iters, gbs, dp, count):
    """The sample ids Megatron's sampler hands each DP rank at each of `count` evaluations, as
    train() would: consumed_valid_samples grows by eval_iters*gbs per evaluation."""
    from megatron.training.datasets.data_samplers import MegatronPretrainingSampler

    mbs = gbs // dp
    reads = []
    for k in range(count):
        per_eval = []
        for rank in range(dp):
            sampler = iter(MegatronPretrainingSampler(len(valid), k * eval_iters * gbs, mbs, rank, dp))
            per_eval += [i for _ in range(eval_iters) for i in next(sampler)]
        reads.append(per_eval)
    return reads


def test_every_evaluation_reads_the_same_first_sequences_in_file_order(documents, tmp_path):
    from megatron.core.datasets.gpt_dataset import GPTDataset

    from training.mlperf.valid_data import in_order_validation

    gbs, dp, eval_iters, evals = 8, 2, 2, 5
    period = eval_iters * gbs                          # 16 sequences per evaluation
    cls = in_order_validation(GPTDataset, period)
    train, valid, _ = _build(cls, documents, [400, evals * period, 0], tmp_path / "cache")
    assert len(valid) >= evals * period                # what Megatron's sampler asks for

    stream = numpy.concatenate([numpy.array(d) for d in documents["valid"][1]])  # file order
    first = [stream[i * SEQ:(i + 1) * SEQ + 1].tolist() for i in range(period)]
    reads = _evaluations(valid, eval_iters, gbs, dp, evals)
    for ids in reads:
        tokens = sorted(valid[i]["tokens"].tolist() + [valid[i]["labels"][-1].item()] for i in ids)
        assert tokens == sorted(first), "an evaluation read other sequences"
    # and in the same order: the sample behind each id of each evaluation is identical
    for ids in reads[1:]:
        for a, b in zip(reads[0], ids):
            assert valid[a]["tokens"].tolist() == valid[b]["tokens"].tolist()
    assert valid[0]["tokens"].tolist() == first[0][:SEQ]

    # the training split is untouched: the same shuffled samples as a plain GPTDataset
    plain_train, plain_valid, _ = _build(GPTDataset, documents, [400, evals * period, 0],
                                         tmp_path / "cache")
    for i in (0, 7, 123, 399):
        assert train[i]["tokens"].tolist() == plain_train[i]["tokens"].tolist()
    # ... while Megatron's own validation split would have moved on between evaluations
    plain = _evaluations(plain_valid, eval_iters, gbs, dp, 2)
    assert sorted(plain[0]) != sorted(plain[1])
    assert plain_valid[0]["tokens"].tolist() != first[0][:SEQ]


def test_a_validation_set_too_small_for_one_evaluation_is_refused(documents, tmp_path):
    from megatron.core.datasets.gpt_dataset import GPTDataset

    from training.mlperf.valid_data import in_order_validation

    total = sum(len(d) for d in documents["valid"][1])
    too_many = total // SEQ + 1
    with pytest.raises(ValueError, match=f"holds {total // SEQ - 1}|holds {total // SEQ}"):
        _build(in_order_validation(GPTDataset, too_many), documents, [10, too_many, 0],
               tmp_path / "cache")
