"""The .idx of a Megatron indexed dataset, checked against its .bin before anyone trains on it.

Megatron's reader (megatron.core.datasets.indexed_dataset) trusts the file: a garbage header
is an AssertionError, a truncated .idx a numpy error, and the half-built reader then prints
"Exception ignored in ... __del__" tracebacks; an .idx that does not describe its .bin is
only noticed mid-training. So the launcher's data check and `check verify` read the index
here first, with numpy alone (importing megatron costs seconds, too slow for every launch):

    header   9 bytes MMIDIDX\\0\\0, version (uint64, 1), dtype code (uint8),
             sequence count S, document count D (uint64 each; D is S' + 1 boundaries)
    arrays   sequence lengths int32[S], sequence pointers int64[S] (byte offsets into the
             .bin), document indices int64[D]

and checks that the file is exactly as long as its header says, the dtype is a token dtype,
every pointer is where the lengths before it put it, the document boundaries run from 0 to S
without going back, and the lengths add up to the .bin's size. The layout is megatron-core's
(tests/data read the same files with megatron's IndexedDataset and compare; `adopt` and
`check verify` open datasets with megatron's reader as well).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

import numpy as np

HEADER = b"MMIDIDX\x00\x00"  # megatron.core.datasets.indexed_dataset._INDEX_HEADER
HEADER_BYTES = 34
# megatron.core.datasets.indexed_dataset.DType codes of the integer dtypes (token ids).
TOKEN_DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 8: np.uint16}
FLOAT_CODES = {6: "float64", 7: "float32"}
BLOCK = 1 << 22  # entries per block of the pointer check (bounded memory on 100M-document indices)


class IndexProblem(ValueError):
    """The .idx is not a usable index of the .bin; the message says what is wrong."""


@dataclass(frozen=True)
class IndexFacts:
    dtype: np.dtype
    sequences: int
    documents: int
    tokens: int
    idx_bytes: int


def read_header(idx_path: str) -> tuple[np.dtype, int, int, int]:
    """(dtype, sequence count, document-boundary count, file size), or IndexProblem."""
    size = os.path.getsize(idx_path)
    with open(idx_path, "rb") as f:
        head = f.read(HEADER_BYTES)
    if len(head) < len(HEADER) or head[:len(HEADER)] != HEADER:
        raise IndexProblem(f"{idx_path}: not a Megatron index (it does not start with {HEADER!r})")
    if size < HEADER_BYTES:
        raise IndexProblem(f"{idx_path}: truncated ({size} bytes; an index header alone has {HEADER_BYTES})")
    version, code, sequences, boundaries = struct.unpack("<QBQQ", head[len(HEADER):])
    if version != 1:
        raise IndexProblem(f"{idx_path}: index version {version}; Megatron reads version 1")
    if code in FLOAT_CODES:
        raise IndexProblem(f"{idx_path}: holds {FLOAT_CODES[code]} values, not token ids")
    if code not in TOKEN_DTYPES:
        raise IndexProblem(f"{idx_path}: unknown dtype code {code} (not a Megatron index?)")
    return np.dtype(TOKEN_DTYPES[code]), sequences, boundaries, size


def read_index(idx_path: str, bin_path: str | None = None) -> IndexFacts:
    """Check the index at `idx_path`, and that it describes the file `bin_path` when given."""
    dtype, sequences, boundaries, size = read_header(idx_path)
    expected = HEADER_BYTES + 12 * sequences + 8 * boundaries
    if size != expected:
        if size == expected + sequences:
            raise IndexProblem(f"{idx_path}: a multimodal index (sequence modes after the arrays); "
                               "GPT training reads text datasets")
        what = "truncated" if size < expected else f"{size - expected:,} bytes too long"
        raise IndexProblem(f"{idx_path}: {what}: {size:,} bytes, but its header promises {sequences:,} "
                           f"sequences and {max(boundaries, 1) - 1:,} documents ({expected:,} bytes)")
    if boundaries < 1:
        raise IndexProblem(f"{idx_path}: no document boundaries (an index starts them with 0)")
    mm = np.memmap(idx_path, dtype=np.uint8, mode="r")
    try:
        lengths = mm[HEADER_BYTES:HEADER_BYTES + 4 * sequences].view(np.int32)
        start = HEADER_BYTES + 4 * sequences
        pointers = mm[start:start + 8 * sequences].view(np.int64)
        start += 8 * sequences
        docs = mm[start:start + 8 * boundaries].view(np.int64)
        tokens = _check_arrays(idx_path, dtype.itemsize, lengths, pointers, docs, sequences)
    finally:
        del mm
    if bin_path is not None:
        bin_bytes = os.path.getsize(bin_path)
        if tokens * dtype.itemsize != bin_bytes:
            raise IndexProblem(
                f"{idx_path}: describes {tokens * dtype.itemsize:,} bytes of {dtype.name} tokens but "
                f"{bin_path} has {bin_bytes:,}: the two files are not one dataset")
    return IndexFacts(dtype, sequences, boundaries - 1, tokens, size)


def _check_arrays(idx_path: str, itemsize: int, lengths, pointers, docs, sequences: int) -> int:
    """The number of tokens; IndexProblem when the arrays contradict each other."""
    offset = 0
    for a in range(0, sequences, BLOCK):
        block = lengths[a:a + BLOCK].astype(np.int64)
        if (block < 0).any():
            i = a + int(np.argmax(block < 0))
            raise IndexProblem(f"{idx_path}: sequence {i:,} has a negative length ({int(lengths[i])})")
        ends = offset + np.cumsum(block * itemsize)
        starts = np.concatenate(([offset], ends[:-1]))
        bad = np.flatnonzero(pointers[a:a + BLOCK] != starts)
        if bad.size:
            i = a + int(bad[0])
            raise IndexProblem(f"{idx_path}: sequence {i:,} starts at byte {int(pointers[i]):,}, but the "
                               f"lengths before it end at byte {int(starts[bad[0]]):,}")
        offset = int(ends[-1])
    if int(docs[0]) != 0 or int(docs[-1]) != sequences:
        raise IndexProblem(f"{idx_path}: document boundaries run from {int(docs[0])} to {int(docs[-1])}, "
                           f"not from 0 to its {sequences:,} sequences")
    for a in range(0, len(docs), BLOCK):
        block = docs[a:a + BLOCK + 1]
        if (np.diff(block) < 0).any():
            raise IndexProblem(f"{idx_path}: document boundaries go backwards near document "
                               f"{a + int(np.argmax(np.diff(block) < 0)):,}")
    return offset // itemsize


def open_with_megatron(prefix: str):
    """megatron-core's IndexedDataset of PREFIX (call read_index first: it refuses what makes
    megatron's reader assert), its first and last sequence read once; IndexProblem if it
    cannot. Megatron's import-time warnings (no Transformer Engine/Apex/CUDA) and the
    "Exception ignored in __del__" of a half-built reader are kept off the terminal."""
    import gc
    import logging
    import sys
    import warnings

    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    hook = sys.unraisablehook
    sys.unraisablehook = lambda unraisable: None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # megatron's "could not determine rank", TE/Apex absent
            from megatron.core.datasets.indexed_dataset import IndexedDataset

            try:
                ds = IndexedDataset(prefix, mmap=True)
                if len(ds):
                    ds[0], ds[len(ds) - 1]
            except Exception as e:  # megatron asserts or numpy refuses
                raise IndexProblem(f"{prefix}: megatron-core's IndexedDataset cannot read it ({e})") from None
    finally:
        gc.collect()  # a half-built reader's __del__ runs now, while its complaint is swallowed
        sys.unraisablehook = hook
    return ds
