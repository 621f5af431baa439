"""How long a dataset's documents are, and whether keeping them apart matters for a run.

Megatron packs documents end to end into sequences of SEQ_LENGTH tokens. Where documents are
much shorter than a sequence, each sequence holds several, and unless attention is masked at
their boundaries (document masking) every token also attends to the unrelated documents
before it in the sequence. Where documents are longer than a sequence, most sequences hold a
piece of one document and the mask changes little. The numbers that say which:

    LengthStats().add(lengths) ... .summary()  -> the record's "document_lengths" section:
        documents, tokens, mean, min, p10, median, p90, max (exact, nearest rank), and
        shorter_than {bound: [documents, tokens]} for bounds 128 ... 131072 (powers of two)
    from_index(prefix)                        -> the same from PREFIX.idx (datasets prepared
                                                 before the record had it, adopted ones)
    document_lengths(record)                  -> the section, checked (training/records.py),
                                                 or None for a record without one
    masking_verdict(lengths, seq_length, masked) -> one line for the DRY_RUN

training.data.prepare records the section while it writes (bounded memory: an exact count
per length up to 2**20 tokens, the rare longer documents kept one by one); `check verify`
prints it.
"""
from __future__ import annotations

import numpy as np

EXACT = 1 << 20                 # lengths counted one by one below this
BOUNDS = tuple(1 << k for k in range(7, 18))   # 128 ... 131072
QUANTILES = (("p10", 0.10), ("median", 0.50), ("p90", 0.90))


class LengthStats:
    """Streaming document-length statistics (exact, memory bounded by EXACT counters)."""

    def __init__(self) -> None:
        self.counts = np.zeros(0, dtype=np.int64)   # counts[n]: documents of n tokens (< EXACT)
        self.long: list[np.ndarray] = []             # lengths >= EXACT, as they come

    def add(self, lengths) -> "LengthStats":
        lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)
        if lengths.size and lengths.min() < 0:
            raise ValueError("a document length is negative")
        short = lengths[lengths < EXACT]
        if short.size:
            counts = np.bincount(short)
            if counts.size > self.counts.size:
                counts[:self.counts.size] += self.counts
                self.counts = counts
            else:
                self.counts[:counts.size] += counts
        if short.size < lengths.size:
            self.long.append(lengths[lengths >= EXACT])
        return self

    def summary(self) -> dict | None:
        """The record's section, or None without documents."""
        long = np.sort(np.concatenate(self.long)) if self.long else np.zeros(0, np.int64)
        values = np.arange(self.counts.size, dtype=np.int64)
        short_docs = int(self.counts.sum())
        documents = short_docs + int(long.size)
        if not documents:
            return None
        short_tokens = int((self.counts * values).sum())
        tokens = short_tokens + int(long.sum())
        nonzero = np.flatnonzero(self.counts)
        low = int(nonzero[0]) if nonzero.size else int(long[0])
        high = int(long[-1]) if long.size else int(nonzero[-1])
        cumulative = np.cumsum(self.counts)

        def nearest_rank(q: float) -> int:
            rank = max(1, int(np.ceil(q * documents)))   # the rank-th shortest document
            if rank <= short_docs:
                return int(np.searchsorted(cumulative, rank))
            return int(long[rank - short_docs - 1])

        shorter = {}
        token_cumulative = np.cumsum(self.counts * values)
        for bound in BOUNDS:
            end = min(bound, self.counts.size)          # lengths 0 .. bound-1
            docs = int(cumulative[end - 1]) if end else 0
            toks = int(token_cumulative[end - 1]) if end else 0
            shorter[str(bound)] = [docs, toks]          # every bound is < EXACT
        return {"documents": documents, "tokens": tokens,
                "mean": round(tokens / documents, 2), "min": low,
                **{name: nearest_rank(q) for name, q in QUANTILES}, "max": high,
                "shorter_than": shorter}


def from_index(prefix: str) -> dict | None:
    """The section computed from PREFIX.idx (each sequence one document, as prepare writes
    them; Megatron's preprocess_data.py writes the same for unsplit documents)."""
    from training.data.index import read_header

    dtype, sequences, _boundaries, _size = read_header(prefix + ".idx")
    lengths = np.memmap(prefix + ".idx", dtype=np.int32, mode="r", offset=34, shape=(sequences,))
    stats = LengthStats()
    for start in range(0, sequences, 1 << 22):       # bounded memory on large indices
        stats.add(lengths[start:start + (1 << 22)])
    return stats.summary()


def document_lengths(record: dict, where: str = "dataset record"):
    """The record's document-length section as training.records.DocumentLengths (checked:
    RecordError naming the field), or None when the record has none (made before it)."""
    from training.records import DocumentLengths, validate

    section = record.get("document_lengths") if isinstance(record, dict) else None
    if section is None:
        return None
    return validate(section, DocumentLengths, where)


def shorter_than(lengths, seq_length: int) -> tuple[int, float, float]:
    """(bound, share of documents, share of tokens) in documents shorter than the largest
    recorded bound <= seq_length (a power of two; the smallest bound for a shorter sequence)."""
    fitting = [b for b in BOUNDS if b <= seq_length] or [BOUNDS[0]]
    bound = fitting[-1]
    docs, toks = lengths.shorter_than[str(bound)]
    return bound, docs / lengths.documents, (toks / lengths.tokens if lengths.tokens else 0.0)


def describe(lengths) -> str:
    """The distribution in one line (prepare's summary and `check verify`)."""
    return (f"{lengths.documents:,} documents: mean {lengths.mean:,.0f} tokens, median "
            f"{lengths.median:,} (p10 {lengths.p10:,}, p90 {lengths.p90:,}), max {lengths.max:,}")


def boundaries_per_sequence(lengths, seq_length: int) -> float:
    """Document ends in a sequence of SEQ_LENGTH packed tokens, on average (seq / mean)."""
    return seq_length / lengths.mean if lengths.mean else 0.0


def packs_documents(lengths, seq_length: int) -> bool:
    """Whether an average sequence holds a document boundary or more: there, without document
    masking, the tokens after a boundary attend to the unrelated document before it."""
    return boundaries_per_sequence(lengths, seq_length) >= 1


def masking_verdict(lengths, seq_length: int, masked: bool | None) -> str:
    """One line for the DRY_RUN: how the documents sit in a sequence, and what document
    masking does for them (masked: whether it is on; None: this launch has none)."""
    bound, docs, toks = shorter_than(lengths, seq_length)
    per_sequence = boundaries_per_sequence(lengths, seq_length)
    facts = (f"median document {lengths.median:,} tokens (p10 {lengths.p10:,}, p90 "
             f"{lengths.p90:,}); {docs:.0%} of the documents ({toks:.0%} of the tokens) are "
             f"shorter than {bound:,} tokens; {per_sequence:.1f} document boundaries per "
             f"sequence of SEQ_LENGTH={seq_length:,} on average")
    if per_sequence < 0.25:
        return f"{facts}: few sequences cross a document, so document masking changes little."
    where = ("sequences pack several documents" if per_sequence >= 1 else
             f"about {per_sequence:.0%} of the sequences cross a document boundary")
    if masked:
        return f"{facts}: {where}, and they are kept apart."
    if masked is False:
        return (f"{facts}: {where}, where tokens attend to the document before theirs with "
                "DOCUMENT_MASK=0 (DOCUMENT_MASK=1 keeps them apart).")
    return (f"{facts}: {where}, where tokens attend to the document before theirs (this "
            "launch has no document masking).")
