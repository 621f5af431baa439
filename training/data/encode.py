"""Tokenize chunks of input lines: the work a preparation worker does.

Kept free of torch and megatron imports so that worker processes start fast. A chunk
becomes one flat array of token ids (each document followed by the end-of-document token,
unless append_eod is off) plus the length of each document and the lines that were skipped.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field
from itertools import chain

import numpy as np

from training.data.sources import (EMPTY_TEXT, INVALID_UNICODE, Chunk, Skip, find_unencodable,
                                   parse_chunk)


@dataclass(frozen=True)
class EncodeSettings:
    tokenizer_json: str
    eod_id: int
    dtype: str  # numpy dtype name of the dataset's tokens ("uint16" or "int32")
    text_key: str = "text"
    text_unit: str = "file"
    add_special_tokens: bool = True
    append_eod: bool = True  # False: documents end where their text ends (NeMo without --append-eod)


@dataclass
class Encoded:
    file_index: int
    ids: np.ndarray  # all documents of the chunk, each ending with EOD
    lengths: np.ndarray  # tokens per document (EOD included)
    skips: list[Skip] = field(default_factory=list)
    lines: int = 0
    bytes_read: int = 0


class Encoder:
    def __init__(self, settings: EncodeSettings, tokenizer=None):
        """`tokenizer`: the tokenizers.Tokenizer of settings.tokenizer_json, if already loaded."""
        from tokenizers import Tokenizer

        self.settings = settings
        self.tokenizer = tokenizer or Tokenizer.from_file(settings.tokenizer_json)
        self.dtype = np.dtype(settings.dtype)

    def _encode(self, texts: list[str]) -> list[list[int]]:
        add = self.settings.add_special_tokens
        return [e.ids for e in self.tokenizer.encode_batch_fast(texts, add_special_tokens=add)]

    def __call__(self, chunk: Chunk, fmt: str) -> Encoded:
        s = self.settings
        parsed = parse_chunk(chunk, fmt, s.text_key, s.text_unit)
        texts, lines, skips = parsed.texts, parsed.lines, parsed.skips
        try:
            ids = self._encode(texts)
        except Exception:
            # Rust strings cannot hold unpaired surrogates (valid in JSON, "\ud800");
            # find them, skip those documents, encode the rest.
            keep, kept_lines = [], []
            for text, line in zip(texts, lines):
                bad = find_unencodable(text)
                if bad is None:
                    keep.append(text)
                    kept_lines.append(line)
                else:
                    skips.append(Skip(chunk.path, line, INVALID_UNICODE, f"character {bad}"))
            ids, lines = self._encode(keep), kept_lines
        eod = s.eod_id
        if s.append_eod:
            for doc in ids:
                # A tokenizer whose post-processor already appends EOD gets no second one.
                if not doc or doc[-1] != eod:
                    doc.append(eod)
        elif not all(ids):  # a document of no tokens is no document (NeMo skips it too)
            skips += [Skip(chunk.path, line, EMPTY_TEXT, "no tokens")
                      for line, doc in zip(lines, ids) if not doc]
            ids = [doc for doc in ids if doc]
        lengths = np.fromiter((len(d) for d in ids), dtype=np.int64, count=len(ids))
        flat = np.fromiter(chain.from_iterable(ids), dtype=self.dtype, count=int(lengths.sum()))
        skips.sort(key=lambda k: k.line)
        return Encoded(chunk.file_index, flat, lengths, skips, len(chunk.lines), chunk.bytes_read)


# Worker-process state for multiprocessing (one Encoder per process).
_ENCODER: Encoder | None = None


def init_worker(settings: EncodeSettings, tokenizer_threads: bool) -> None:
    """Pool initializer. With tokenizer_threads False the tokenizers library stays on one
    thread, so that N worker processes use N cores rather than N x cores threads."""
    # Ctrl-C reaches the whole process group: the main process stops the run and removes
    # its temporary files; workers just finish their chunk instead of printing tracebacks.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if not tokenizer_threads:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    global _ENCODER
    _ENCODER = Encoder(settings)


def encode_in_worker(chunk: Chunk, fmt: str) -> Encoded:
    assert _ENCODER is not None, "init_worker was not called"
    return _ENCODER(chunk, fmt)
