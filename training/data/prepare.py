"""Turn JSON lines or plain text into a Megatron indexed dataset (PREFIX.bin + PREFIX.idx).

    python -m training.data.prepare 'c4/en/c4-train.0000[0-3]-of-01024.json.gz' \\
        --tokenizer /models/Llama-3.1-8B --output-prefix data/c4_llama31

Every document is tokenized (with the tokenizer's own special tokens, e.g. Llama 3's BOS,
unless --no-add-special-tokens) and followed by the end-of-document token (the tokenizer's eos
token, which Megatron uses as EOD; --no-append-eod leaves it out). The dataset is written through megatron.core.datasets.indexed_dataset, under
temporary names renamed only when it is complete, with PREFIX.dataset.json beside it
recording the tokenizer and the sizes and hashes of both files (see record.py). Lines that
cannot be a document are skipped and reported with file and line; a file that cannot be
read fails the run.

Exit codes: 0 done, 2 unusable input or arguments (nothing written), 1 the run failed
(nothing written), 128+N stopped by signal N: SIGINT 130, SIGTERM 143, SIGHUP 129 (nothing
written). Publication is exclusive and atomic: training/data/publish.py.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import multiprocessing
import os
import platform
import sys
import time
from collections import Counter, deque
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Callable, Iterator

from training.cli import ArgumentParser, nonnegative_int, positive_float, positive_int
from training.data import record as rec
from training.data import tokenizer as tokmod
from training.data.doc_lengths import LengthStats, describe, document_lengths
from training.data.encode import EncodeSettings, Encoded, Encoder, encode_in_worker, init_worker
from training.data.errors import DataError, InputError, Interrupted, RunError
from training.data.publish import Publisher, check_prefix, deferred_signals, os_error_message
from training.data.sources import EMPTY_FILE, TEXT_UNITS, Chunk, InputFile, Skip, expand_inputs, read_chunks

DEFAULT_CHUNK_MB = 1.0


def default_workers() -> int:
    """One single-threaded worker process per usable core; in-process on one core.

    Measured on a 2-core machine (docs/benchmarks/data_prepare_cpu.json): 2 worker
    processes were faster than 1 process whose tokenizer spreads over both cores with the
    library's own threads (that leaves a core idle while Python reads, parses and writes).
    """
    return max(1, len(os.sched_getaffinity(0)))
SKIP_EXAMPLES_KEPT = 1000  # in the record; the summary prints fewer


@dataclass
class FileStats:
    path: str
    bytes: int
    documents: int = 0
    tokens: int = 0
    lines: int = 0


@dataclass
class Summary:
    prefix: str
    tokenizer: tokmod.TokenizerInfo
    dtype: str
    documents: int = 0
    tokens: int = 0
    lines: int = 0
    input_bytes: int = 0
    seconds: float = 0.0
    skip_counts: Counter = field(default_factory=Counter)
    skip_examples: list[Skip] = field(default_factory=list)
    files: list[FileStats] = field(default_factory=list)
    workers: int = 1
    kept: bool = False  # skip_complete found the dataset complete: nothing was written
    lengths: LengthStats = field(default_factory=LengthStats)  # the documents' lengths

    @property
    def skipped(self) -> int:
        return sum(self.skip_counts.values())

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def docs_per_s(self) -> float:
        return self.documents / self.seconds if self.seconds else 0.0

    def add_skips(self, skips: list[Skip]) -> None:
        for s in skips:
            self.skip_counts[s.reason] += 1
            if len(self.skip_examples) < SKIP_EXAMPLES_KEPT:
                self.skip_examples.append(s)


def resolve_tokenizer(path: str, prefix: str, eod_token: str | None,
                      overwrite: bool = False) -> tokmod.TokenizerInfo:
    """Load the tokenizer; wrap a bare tokenizer.json into PREFIX.tokenizer/ (needs eod_token;
    another tokenizer there is replaced only with overwrite)."""
    directory, loadable = tokmod.locate(path)
    if not loadable:
        if eod_token is None:
            raise tokmod.bare_file_error(path)
        return tokmod.wrap(path, eod_token, prefix + ".tokenizer", overwrite=overwrite)
    info = tokmod.load(directory)
    if eod_token is not None and eod_token != info.eod_token:
        raise InputError(
            f"--eod-token {eod_token!r} disagrees with {info.path}, whose eos token is "
            f"{info.eod_token!r}: Megatron will use {info.eod_token!r} as EOD. Drop --eod-token "
            "or change eos_token in tokenizer_config.json."
        )
    return info


def _chunks(files: list[InputFile], chunk_bytes: int, text_unit: str,
            empty: list[int]) -> Iterator[Chunk]:
    for index, f in enumerate(files):
        got = False
        for chunk in read_chunks(index, f, chunk_bytes, text_unit):
            got = True
            yield chunk
        if not got:
            empty.append(index)


def _encode_stream(files: list[InputFile], settings: EncodeSettings, sha256: str, workers: int,
                   chunk_bytes: int, empty: list[int]) -> Iterator[Encoded]:
    """Encoded chunks in input order: in this process (workers == 1, the tokenizer's own
    threads use the cores) or in `workers` processes, each single-threaded."""
    chunks = _chunks(files, chunk_bytes, settings.text_unit, empty)
    if workers == 1:
        # The tokenizer checked by check_library_agrees, already loaded (cached by content).
        encoder = Encoder(settings, tokmod.library_tokenizer(settings.tokenizer_json, sha256))
        for chunk in chunks:
            yield encoder(chunk, files[chunk.file_index].format)
        return
    ctx = multiprocessing.get_context("spawn")  # no fork of a process holding torch/threads
    window = 2 * workers
    pending: deque[Future] = deque()
    # A signal waits while the pool starts (its queues, manager thread and workers start in the
    # constructor and in submit): cut there, it could neither run nor shut down.
    with deferred_signals():
        pool = ProcessPoolExecutor(workers, mp_context=ctx, initializer=init_worker,
                                   initargs=(settings, False))
    with pool:
        try:
            for chunk in chunks:
                with deferred_signals():
                    pending.append(pool.submit(encode_in_worker, chunk, files[chunk.file_index].format))
                if len(pending) >= window:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        except BrokenProcessPool:
            raise RunError(
                f"a worker process died (killed for memory?) while tokenizing; nothing written. "
                f"Run again with fewer --workers (now {workers})"
            ) from None
        finally:
            for fut in pending:
                fut.cancel()


class _Progress:
    """Progress on stderr: a rich bar on a terminal, a plain line every 10 s otherwise."""

    def __init__(self, total_bytes: int, enabled: bool):
        self.total = max(total_bytes, 1)
        self.start = time.perf_counter()
        self.enabled = enabled
        self.tty = enabled and sys.stderr.isatty()
        self.last_line = self.start
        self.bar = None
        if self.tty:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

            self.bar = Progress(
                TextColumn("prepare"), BarColumn(bar_width=20), TaskProgressColumn(),
                TextColumn("{task.fields[counts]}"), TimeElapsedColumn(), TextColumn("left"),
                TimeRemainingColumn(), console=Console(stderr=True), transient=False,
            )
            self.task = self.bar.add_task("prepare", total=self.total, counts="")
            self.bar.start()

    def _counts(self, docs: int, tokens: int) -> str:
        dt = max(time.perf_counter() - self.start, 1e-9)
        return (f"{docs:,} docs {_si(tokens)} tok | {docs / dt:,.0f} docs/s "
                f"{_si(tokens / dt)} tok/s |")

    def update(self, done_bytes: int, docs: int, tokens: int) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(self.task, completed=min(done_bytes, self.total), counts=self._counts(docs, tokens))
        elif time.perf_counter() - self.last_line >= 10:
            self.last_line = time.perf_counter()
            pct = 100 * min(done_bytes, self.total) / self.total
            print(f"prepare: {pct:5.1f}% {self._counts(docs, tokens)}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def _si(x: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.2f}{unit}"
    return f"{x:.0f}"


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for name in ("megatron-core", "tokenizers", "transformers", "numpy"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "absent"
    return out


def _megatron_indexed_dataset():
    """megatron.core's DType and IndexedDatasetBuilder, imported without the import-time
    warnings about Transformer Engine/Apex/CUDA that do not concern data preparation."""
    import logging
    import warnings

    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder
    return DType, IndexedDatasetBuilder


def _close_quietly(builder) -> None:
    """Close the builder's .bin after a failure (closing flushes, which fails again on a full disk)."""
    try:
        builder.data_file.close()
    except OSError:
        pass


def _input_entries(files: list[InputFile]) -> list[dict]:
    return [{"abspath": os.path.abspath(f.path), "bytes": f.size} for f in files]


def not_the_same(record: dict, files: list[InputFile], info: tokmod.TokenizerInfo,
                 settings: dict) -> str | None:
    """Why the dataset of `record` is not what these inputs, tokenizer and settings would
    make (None when it is)."""
    tok = record.get("tokenizer") or {}
    if (tok.get("sha256"), tok.get("config_sha256")) != (info.sha256, info.config_sha256):
        return f"it was made with another tokenizer ({tok.get('path')})"
    for key, value in settings.items():
        if record.get(key) != value:
            return f"it was made with {key} {record.get(key)!r}, not {value!r}"
    made = [{"abspath": i.get("abspath"), "bytes": i.get("bytes")} for i in record.get("inputs") or []]
    given = _input_entries(files)
    if len(made) != len(given):
        return f"it was made from other inputs ({len(made)} file(s), not these {len(given)})"
    for old, new in zip(made, given):
        if old != new:
            return (f"it was made from other inputs ({old['abspath']} of {old['bytes']} bytes where "
                    f"{new['abspath']} of {new['bytes']} bytes is given now)")
    return None


def prepare(
    inputs: list[str],
    output_prefix: str,
    tokenizer: str,
    *,
    text_key: str = "text",
    fmt: str = "auto",
    text_unit: str = "file",
    workers: int | None = None,
    chunk_mb: float = DEFAULT_CHUNK_MB,
    eod_token: str | None = None,
    add_special_tokens: bool = True,
    append_eod: bool = True,
    overwrite: bool = False,
    skip_complete: bool = False,
    strict: bool = False,
    progress: bool = True,
    command: list[str] | None = None,
    on_chunk: Callable[[Encoded], None] | None = None,
) -> Summary:
    """Build OUTPUT_PREFIX.bin/.idx/.dataset.json from `inputs`. Raises InputError before
    writing anything, RunError (after removing temporary files) when the run fails, and
    Interrupted on SIGINT/SIGTERM/SIGHUP (after removing them too); see publish.py.

    skip_complete: when the prefix already holds a complete dataset that verifies and was
    made from the same inputs, tokenizer and settings, keep it (Summary.kept) and do nothing.
    """
    if workers is None:
        workers = default_workers()
    if workers < 1:
        raise InputError(f"--workers {workers}: must be at least 1")
    if text_unit not in TEXT_UNITS:
        raise InputError(f"--text-unit {text_unit}: choose one of {', '.join(TEXT_UNITS)}")
    if not math.isfinite(chunk_mb) or chunk_mb <= 0:
        raise InputError(f"--chunk-mb {chunk_mb}: must be a positive number of MB, e.g. 1")
    check_prefix(output_prefix)
    files = expand_inputs(inputs, fmt)
    with Publisher(output_prefix) as pub:
        if not skip_complete:
            pub.check_existing(overwrite)
        info = resolve_tokenizer(tokenizer, output_prefix, eod_token, overwrite)
        tokmod.check_library_agrees(info, add_special_tokens)
        settings = {"add_special_tokens": add_special_tokens, "append_eod": append_eod, "text_key": text_key,
                    "text_unit": text_unit}
        if skip_complete:
            why = _why_not_complete(output_prefix, files, info, settings)
            if why is None:
                record = rec.read_record(output_prefix)
                return Summary(output_prefix, info, record["dtype"], documents=record["documents"],
                               tokens=record["tokens"], lines=record.get("input_lines", 0),
                               input_bytes=sum(f.size for f in files), workers=0, kept=True)
            pub.check_existing(overwrite, why)
        return _write(pub, files, info, settings, workers=workers, chunk_mb=chunk_mb, strict=strict,
                      progress=progress, command=command, on_chunk=on_chunk)


def _why_not_complete(prefix: str, files: list[InputFile], info: tokmod.TokenizerInfo,
                      settings: dict) -> str | None:
    from training.data.check import dataset_problem

    try:
        record = rec.read_record(prefix)
    except rec.RecordError as e:
        return str(e)
    return (not_the_same(record, files, info, settings)
            or dataset_problem(prefix, record, hash_bin=True, megatron=True))


def _write(pub: Publisher, files: list[InputFile], info: tokmod.TokenizerInfo, settings: dict, *,
           workers: int, chunk_mb: float, strict: bool, progress: bool, command: list[str] | None,
           on_chunk: Callable[[Encoded], None] | None) -> Summary:
    output_prefix = pub.prefix
    DType, IndexedDatasetBuilder = _megatron_indexed_dataset()
    dtype = DType.optimal_dtype(info.vocab_size)
    summary = Summary(output_prefix, info, dtype.__name__, workers=workers)
    summary.files = [FileStats(f.path, f.size) for f in files]
    summary.input_bytes = sum(f.size for f in files)
    encode = EncodeSettings(info.tokenizer_json, info.eod_id, dtype.__name__, settings["text_key"],
                            settings["text_unit"], settings["add_special_tokens"], settings["append_eod"])
    tmp = pub.tmp
    offsets = [0]
    for f in files:
        offsets.append(offsets[-1] + f.size)

    bar = _Progress(summary.input_bytes, progress)
    start = time.perf_counter()
    builder = None
    bin_hash = hashlib.sha256()
    try:
        builder = IndexedDatasetBuilder(tmp["bin"], dtype=dtype)
        empty: list[int] = []
        for enc in _encode_stream(files, encode, info.sha256, workers, int(chunk_mb * (1 << 20)), empty):
            stats = summary.files[enc.file_index]
            pos = 0
            for n in enc.lengths.tolist():
                builder.add_document(enc.ids[pos:pos + n], [n])
                pos += n
            summary.lengths.add(enc.lengths)
            bin_hash.update(enc.ids.tobytes())  # the bytes add_document wrote, in order
            ndocs, ntok = len(enc.lengths), int(enc.ids.size)
            stats.documents += ndocs
            stats.tokens += ntok
            stats.lines += enc.lines
            summary.documents += ndocs
            summary.tokens += ntok
            summary.lines += enc.lines
            summary.add_skips(enc.skips)
            if strict and enc.skips:
                raise RunError(f"--strict: {enc.skips[0]}")
            if on_chunk is not None:
                on_chunk(enc)
            bar.update(offsets[enc.file_index] + enc.bytes_read, summary.documents, summary.tokens)
        summary.add_skips([Skip(files[i].path, 0, EMPTY_FILE) for i in empty])
        if strict and empty:
            raise RunError(f"--strict: {files[empty[0]].path}: {EMPTY_FILE}")
        if summary.documents == 0:
            raise RunError("no documents in the input: " + _skip_line(summary) + "; nothing written")
        builder.finalize(tmp["idx"])
        builder = None
        summary.seconds = time.perf_counter() - start
        bar.update(summary.input_bytes, summary.documents, summary.tokens)
        bar.close()
        record_dir = os.path.dirname(os.path.abspath(output_prefix))
        inputs = [{**vars(s), **entry} for s, entry in zip(summary.files, _input_entries(files))]
        pub.publish({
            "prefix": os.path.basename(output_prefix),
            "tokenizer": rec.tokenizer_entry(info, record_dir),
            "add_special_tokens": settings["add_special_tokens"],
            "append_eod": settings["append_eod"],
            "dtype": summary.dtype,
            "documents": summary.documents,
            "tokens": summary.tokens,
            "input_lines": summary.lines,
            "document_lengths": summary.lengths.summary(),
            "skipped": dict(summary.skip_counts),
            "skipped_examples": [str(s) for s in summary.skip_examples],
            "inputs": inputs,
            "text_key": settings["text_key"],
            "text_unit": settings["text_unit"],
            "seconds": round(summary.seconds, 3),
            "workers": workers,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "command": command,
            "versions": _versions(),
        }, documents=summary.documents, tokens=summary.tokens, bin_sha256=bin_hash.hexdigest())
        return summary
    except BaseException as e:
        bar.close()
        if builder is not None:
            _close_quietly(builder)
        if isinstance(e, OSError):
            raise RunError(os_error_message(e, output_prefix)) from None
        raise


def _skip_line(summary: Summary) -> str:
    if not summary.skip_counts:
        return "0 lines skipped"
    parts = ", ".join(f"{reason} {n:,}" for reason, n in summary.skip_counts.most_common())
    return f"{summary.skipped:,} skipped: {parts}"


def _lengths_of(s: Summary):
    """The documents' lengths (a kept dataset: its record's, when it has them)."""
    section = s.lengths.summary()
    if section is None and s.kept:
        section = rec.read_record(s.prefix).get("document_lengths")
    return document_lengths({"document_lengths": section}, f"{s.prefix}{rec.SUFFIX}") \
        if section else None


def format_summary(s: Summary, show_skips: int = 10) -> str:
    t = s.tokenizer
    lines = [
        f"prepared {s.prefix}.bin/.idx ({s.dtype}) and {s.prefix}{rec.SUFFIX}",
        f"  inputs     {len(s.files)} file(s), {s.input_bytes / 1e6:,.1f} MB, {s.lines:,} lines",
        f"  documents  {s.documents:,}",
        f"  tokens     {s.tokens:,} (including {s.documents:,} EOD)",
        *([f"  lengths    {describe(lengths)}"] if (lengths := _lengths_of(s)) else []),
        f"  skipped    {_skip_line(s)}",
    ]
    for k in s.skip_examples[:show_skips]:
        lines.append(f"    {k}")
    if s.skipped > show_skips:
        lines.append(f"    ... the first {min(s.skipped, SKIP_EXAMPLES_KEPT)} are listed in {s.prefix}{rec.SUFFIX}")
    lines += [
        f"  time       {s.seconds:.1f} s: {s.docs_per_s:,.0f} docs/s, {_si(s.tokens_per_s)} tokens/s ({s.workers} worker(s))",
        f"  tokenizer  {t.path} (vocab {t.vocab_size:,}, EOD {t.eod_token!r} = {t.eod_id})",
        f"  DATA_PATH={s.prefix} TOKENIZER_MODEL={t.path}",
    ]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="python -m training.data.prepare",
        description="Tokenize JSON lines or plain text into a Megatron indexed dataset "
        "(PREFIX.bin + PREFIX.idx, with PREFIX.dataset.json recording the tokenizer).",
        epilog="Example: python -m training.data.prepare 'c4/en/c4-train.0000*-of-01024.json.gz' "
        "--tokenizer /models/Llama-3.1-8B --output-prefix data/c4_llama31. "
        "Exit codes: 2 bad input or arguments (or another run is writing PREFIX), 1 the run failed, "
        "128+N stopped by signal N (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP); nothing is published "
        "unless the run succeeds (docs/data.md, Guarantees).",
    )
    p.add_argument("inputs", nargs="+", metavar="INPUT",
                   help="files or globs (quote globs): .jsonl/.json/.ndjson or .txt/.md, optionally .gz/.zst/.bz2/.xz")
    p.add_argument("--tokenizer", required=True,
                   help="Hugging Face tokenizer directory (tokenizer.json + tokenizer_config.json) or a tokenizer.json")
    p.add_argument("--output-prefix", required=True, help="writes PREFIX.bin, PREFIX.idx, PREFIX.dataset.json; PREFIX is what DATA_PATH names")
    p.add_argument("--text-key", default="text", help="JSON field holding the document (default: text)")
    p.add_argument("--format", default="auto", choices=("auto", "jsonl", "text"), help="input format (default: from each file name)")
    p.add_argument("--text-unit", default="file", choices=TEXT_UNITS, help="plain text: one document per file (default) or per line")
    p.add_argument("--workers", type=positive_int, default=None,
                   help="N>1: N single-threaded tokenizer processes; 1: tokenize in this process, the tokenizers "
                   f"library's threads using all cores (default: one per usable core, here {default_workers()}; "
                   "the faster choice measured on 2 cores, docs/benchmarks/data_prepare_cpu.json)")
    p.add_argument("--chunk-mb", type=positive_float, default=DEFAULT_CHUNK_MB, help="input read per batch, MB (default 1)")
    p.add_argument("--eod-token", default=None, help="end-of-document token; needed only with a bare tokenizer.json")
    p.add_argument("--add-special-tokens", action=argparse.BooleanOptionalAction, default=True,
                   help="let the tokenizer add its special tokens (Llama 3: BOS) to each document, as Megatron's "
                   "tokenizer.tokenize does (default: yes)")
    p.add_argument("--append-eod", action=argparse.BooleanOptionalAction, default=True,
                   help="end each document with the end-of-document token (default: yes). MLPerf "
                   "llama31_8b's reference data has none and no BOS either (NeMo's preprocessing without "
                   "--append-eod): --no-add-special-tokens --no-append-eod gives its tokens (docs/mlperf.md)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing dataset at PREFIX")
    p.add_argument("--skip-complete", action="store_true",
                   help="exit 0 without work when PREFIX already holds a complete dataset that verifies "
                   "(sizes and SHA-256 of .bin and .idx) and was made from the same inputs, tokenizer and "
                   "settings (for resumable scripts); another dataset there is refused unless --overwrite")
    p.add_argument("--strict", action="store_true", help="fail (exit 1, nothing written) at the first skipped line or empty file")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--show-skips", type=nonnegative_int, default=10,
                   help="skipped lines listed in the summary (default 10)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    command = ["python", "-m", "training.data.prepare", *(sys.argv[1:] if argv is None else argv)]
    try:
        summary = prepare(
            args.inputs, args.output_prefix, args.tokenizer, text_key=args.text_key, fmt=args.format,
            text_unit=args.text_unit, workers=args.workers, chunk_mb=args.chunk_mb,
            eod_token=args.eod_token, add_special_tokens=args.add_special_tokens,
            append_eod=args.append_eod, overwrite=args.overwrite, skip_complete=args.skip_complete,
            strict=args.strict, progress=not args.no_progress, command=command,
        )
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except Interrupted as e:
        print(f"interrupted by {e.name}: nothing written (temporary files removed)", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("interrupted: nothing written (temporary files removed)", file=sys.stderr)
        return 130
    if summary.kept:
        print(f"{summary.prefix}: complete and verified, made from the same {len(args.inputs)} input "
              f"argument(s) with the same tokenizer and settings: kept, nothing to do "
              f"({summary.documents:,} documents, {summary.tokens:,} tokens)")
        return 0
    print(format_summary(summary, args.show_skips))
    return 0


if __name__ == "__main__":
    sys.exit(main())
