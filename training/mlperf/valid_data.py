"""The MLPerf evaluation set: the first sequences of the validation set, in file order, every time.

Megatron's GPTDataset shuffles the documents and the samples of every split (numpy RandomState
seeded with --seed), and its validation loader continues where the last evaluation stopped
(MegatronPretrainingSampler from args.consumed_valid_samples): evaluation k reads samples
[k*E, (k+1)*E) of a shuffled order, E = eval_iters * eval_global_batch_size. --full-validation
reads the whole set (5760 sequences of C4's 91205-document validation file, not 1024), also
shuffled. Neither is "the first 1024 sequences, the same ones at every evaluation".

`in_order_validation(cls, period)` returns a subclass of the dataset class whose *validation*
split
  - builds its sample index over the documents in file order (no shuffle), one pass: sample i is
    tokens [i*seq, (i+1)*seq + 1) of the documents concatenated (Megatron's own
    helpers.build_sample_idx, so a sample is exactly what GPTDataset would cut);
  - reads sample i as sample i % period, with period = E, so whatever consumed_valid_samples
    an evaluation starts at (always a multiple of E), it reads samples 0..E-1 in the same order;
  - reports the length Megatron asks for (its sampler needs that many indices).
Training and test splits are the parent class's, unchanged. The class keeps the parent's name:
Megatron names its cached indices after the class, so the training index cached by an ordinary
run is reused (the validation index is cheap, built each time, never cached).
"""
from __future__ import annotations

import numpy


def in_order_indices(dataset, period: int):
    """(document_index, sample_index, shuffle_index) of one in-order pass; at least `period`."""
    from megatron.core.datasets import helpers

    documents = numpy.asarray(dataset.indices, dtype=numpy.int32)   # file order
    lengths = dataset.dataset.sequence_lengths
    tokens = int(numpy.sum(lengths[documents]))
    sample_index = helpers.build_sample_idx(
        lengths, documents, dataset.config.sequence_length, 1, tokens, True,
        dataset.config.add_extra_token_to_sequence)
    available = sample_index.shape[0] - 1
    if available < period:
        raise ValueError(
            f"the validation set {dataset.dataset_path} holds {available} sequences of "
            f"{dataset.config.sequence_length} tokens; each MLPerf evaluation reads the first "
            f"{period} (EVAL_ITERS x BS). Use a larger validation set, a shorter SEQ_LENGTH, or "
            "fewer MLPERF_EVAL_SAMPLES (open division).")
    return documents, sample_index, numpy.arange(available, dtype=numpy.uint32)


def in_order_validation(base, period: int):
    """A subclass of `base` (GPTDataset or a subclass) with the in-order validation split."""
    from megatron.core.datasets.utils import Split

    if period < 1:
        raise ValueError(f"period={period}: an evaluation reads at least one sequence")

    class InOrderValidation(base):
        def _is_valid(self) -> bool:
            return self.index_split == Split.valid

        def _build_document_sample_shuffle_indices(self):
            if self._is_valid():
                return in_order_indices(self, period)
            return super()._build_document_sample_shuffle_indices()

        def __len__(self) -> int:
            if self._is_valid():
                return max(self.num_samples or 0, period)
            return super().__len__()

        def __getitem__(self, idx):
            if self._is_valid() and idx is not None:
                idx = int(idx) % period
            return super().__getitem__(idx)

    InOrderValidation.__name__ = base.__name__
    InOrderValidation.__qualname__ = base.__qualname__
    InOrderValidation.period = period
    return InOrderValidation
