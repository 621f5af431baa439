"""Input files for data preparation: which files, how to open them, how lines become documents.

Inputs are files or globs. Each file is JSON lines (one object per line, the document in a
text field) or plain text (the whole file is one document, or each line is one), optionally
compressed (.gz, .zst, .bz2, .xz). The format comes from the file name unless `--format`
says it; a name that says neither is refused rather than guessed.

Reading happens in the main process (`read_chunks`: raw lines, in order, with their line
numbers); parsing happens wherever the chunk is tokenized (`parse_chunk`: bytes to texts,
plus one `Skip` for every line that cannot be a document and why). Lines that cannot be a
document are skipped and reported; a file that cannot be read at all fails the run.
"""

from __future__ import annotations

import bz2
import glob
import gzip
import io
import json
import lzma
import os
from dataclasses import dataclass, field
from typing import BinaryIO, Iterator

import zstandard

from training.data.errors import InputError, RunError

COMPRESSION_SUFFIXES = (".gz", ".zst", ".bz2", ".xz")
JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
TEXT_SUFFIXES = (".txt", ".text", ".md")
FORMATS = ("auto", "jsonl", "text")
TEXT_UNITS = ("file", "line")

# Why a line is not a document. The summary and the dataset record count by these names.
BLANK = "blank line"
INVALID_UTF8 = "invalid UTF-8"
INVALID_UNICODE = "invalid Unicode (unpaired surrogate)"
MALFORMED_JSON = "malformed JSON"
NOT_AN_OBJECT = "not a JSON object"
MISSING_KEY = "missing text key"
NOT_A_STRING = "text is not a string"
EMPTY_TEXT = "empty text"
EMPTY_FILE = "empty file"


@dataclass(frozen=True)
class InputFile:
    path: str
    format: str  # "jsonl" or "text"
    compression: str | None  # suffix such as ".gz", or None
    size: int  # bytes on disk (compressed size for compressed files)


@dataclass(frozen=True)
class Skip:
    """One input line that did not become a document."""

    path: str
    line: int  # 1-based; 0 when the reason concerns the whole file
    reason: str
    detail: str = ""

    def __str__(self) -> str:
        detail = f" ({self.detail})" if self.detail else ""
        where = f"{self.path}:{self.line}" if self.line else self.path
        return f"{where}: {self.reason}{detail}"


@dataclass
class Chunk:
    """Consecutive raw lines of one file, in order. `lines[i]` is line `first_line + i`."""

    file_index: int
    path: str
    first_line: int
    lines: list[bytes]
    bytes_read: int = 0  # position in the (compressed) file after this chunk, for progress


@dataclass
class Parsed:
    texts: list[str] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)  # line number of each text
    skips: list[Skip] = field(default_factory=list)


def _has_glob(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


def _split_suffixes(name: str) -> tuple[str, str | None]:
    """('a.jsonl', '.zst') for 'a.jsonl.zst'; ('a.txt', None) for 'a.txt'."""
    lower = name.lower()
    for suffix in COMPRESSION_SUFFIXES:
        if lower.endswith(suffix):
            return name[: -len(suffix)], suffix
    return name, None


def detect_format(path: str, fmt: str = "auto") -> tuple[str, str | None]:
    """The (format, compression) of `path`; `fmt` other than 'auto' overrides the name."""
    if fmt not in FORMATS:
        raise InputError(f"--format {fmt}: choose one of {', '.join(FORMATS)}")
    stem, compression = _split_suffixes(os.path.basename(path))
    if fmt != "auto":
        return fmt, compression
    lower = stem.lower()
    if lower.endswith(JSONL_SUFFIXES):
        return "jsonl", compression
    if lower.endswith(TEXT_SUFFIXES):
        return "text", compression
    raise InputError(
        f"{path}: cannot tell from the name whether this is JSON lines "
        f"({', '.join(JSONL_SUFFIXES)}) or plain text ({', '.join(TEXT_SUFFIXES)}); "
        "pass --format jsonl or --format text"
    )


def expand_inputs(patterns: list[str], fmt: str = "auto") -> list[InputFile]:
    """Files named by `patterns` (paths or globs), in the order given, globs sorted.

    Raises InputError for a path that does not exist, a directory, a glob matching no
    file, an unreadable file, or a file named twice.
    """
    if not patterns:
        raise InputError("no input given: pass files or globs, e.g. 'c4/en/c4-train.*.json.gz'")
    files: list[InputFile] = []
    seen: dict[str, str] = {}
    for pattern in patterns:
        if _has_glob(pattern):
            matches = sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
            if not matches:
                raise InputError(f"{pattern}: no file matches this glob")
        else:
            if not os.path.exists(pattern):
                raise InputError(f"{pattern}: no such file")
            if os.path.isdir(pattern):
                raise InputError(
                    f"{pattern}: is a directory; give the files or a glob such as "
                    f"'{os.path.join(pattern, '*.jsonl.zst')}'"
                )
            matches = [pattern]
        for path in matches:
            real = os.path.realpath(path)
            if real in seen:
                raise InputError(
                    f"{path}: given twice (also as {seen[real]}); each input file is read once, "
                    "so list it once (to weight data sources, build one dataset per source and "
                    "blend them in DATA_PATH)"
                )
            seen[real] = path
            if not os.access(path, os.R_OK):
                raise InputError(f"{path}: not readable (permission denied)")
            file_format, compression = detect_format(path, fmt)
            files.append(InputFile(path, file_format, compression, os.path.getsize(path)))
    return files


class ZstdFrames(io.RawIOBase):
    """The decompressed bytes of a .zst file, frame after frame, refusing a file that ends
    inside a frame. (zstandard's stream_reader returns the bytes it has and stops there: a
    shard cut in half would read as a shorter shard, one cut early as an empty file. gzip,
    bz2 and lzma raise EOFError for the same cut; this raises ZstdError.)"""

    READ = 1 << 17  # compressed bytes per step: bounded output even for very compressible text

    def __init__(self, raw: BinaryIO):
        self._raw = raw
        self._dctx = zstandard.ZstdDecompressor()
        self._frame = None  # decompressobj of the frame being read; None between frames
        self._left = b""  # compressed bytes after the end of the previous frame
        self._out = memoryview(b"")
        self._eof = False

    def readable(self) -> bool:
        return True

    def _step(self) -> None:
        data, self._left = self._left or self._raw.read(self.READ), b""
        if not data:
            if self._frame is not None:
                raise zstandard.ZstdError("the file ends inside a zstd frame: truncated")
            self._eof = True
            return
        if self._frame is None:
            self._frame = self._dctx.decompressobj()
        self._out = memoryview(self._frame.decompress(data))
        if self._frame.eof:
            self._left, self._frame = self._frame.unused_data, None

    def readinto(self, buffer) -> int:
        while not self._out and not self._eof:
            self._step()
        n = min(len(buffer), len(self._out))
        buffer[:n] = self._out[:n]
        self._out = self._out[n:]
        return n


def open_binary(f: InputFile) -> tuple[BinaryIO, BinaryIO]:
    """(decompressed stream, raw file). `raw.tell()` is the progress through the file."""
    try:
        raw = open(f.path, "rb")
    except OSError as e:
        raise InputError(f"{f.path}: cannot open ({e.strerror or e})") from None
    if f.compression is None:
        return raw, raw
    if f.compression == ".gz":
        return gzip.GzipFile(fileobj=raw, mode="rb"), raw
    if f.compression == ".zst":
        return io.BufferedReader(ZstdFrames(raw), buffer_size=1 << 20), raw
    if f.compression == ".bz2":
        return bz2.BZ2File(raw, mode="rb"), raw
    if f.compression == ".xz":
        return lzma.LZMAFile(raw, mode="rb"), raw
    raise AssertionError(f.compression)


_READ_ERRORS = (OSError, EOFError, zstandard.ZstdError, lzma.LZMAError, ValueError)


def read_chunks(
    file_index: int, f: InputFile, chunk_bytes: int = 1 << 20, text_unit: str = "file"
) -> Iterator[Chunk]:
    """The lines of `f` in chunks of about `chunk_bytes`.

    A plain-text file read with text_unit='file' is one chunk of one 'line' (the whole
    file). Raises RunError, naming the file and the last line read, when the file cannot
    be read to its end (a truncated or corrupt compressed file, an I/O error).
    """
    stream, raw = open_binary(f)
    line_no = 0
    try:
        with stream, raw:
            if f.format == "text" and text_unit == "file":
                data = stream.read()
                if data:
                    yield Chunk(file_index, f.path, 1, [data], raw.tell())
                return
            lines: list[bytes] = []
            size = 0
            first = 1
            for line in stream:
                line_no += 1
                lines.append(line)
                size += len(line)
                if size >= chunk_bytes:
                    yield Chunk(file_index, f.path, first, lines, raw.tell())
                    first = line_no + 1
                    lines, size = [], 0
            if lines:
                yield Chunk(file_index, f.path, first, lines, raw.tell())
    except _READ_ERRORS as e:
        where = f"after line {line_no}" if line_no else "at the start"
        kind = f.compression[1:] + " " if f.compression else ""
        raise RunError(f"{f.path}: cannot read the {kind}file {where}: {e}") from None


def _describe_json_error(e: json.JSONDecodeError) -> str:
    return f"{e.msg} at column {e.colno}"


def parse_chunk(chunk: Chunk, fmt: str, text_key: str = "text", text_unit: str = "file") -> Parsed:
    """Documents in `chunk` and a Skip for every line that is not one."""
    out = Parsed()
    path = chunk.path
    if fmt == "text" and text_unit == "file":
        for i, blob in enumerate(chunk.lines):
            line = chunk.first_line + i
            try:
                text = blob.decode("utf-8")
            except UnicodeDecodeError as e:
                bad_line = blob.count(b"\n", 0, e.start) + 1
                out.skips.append(Skip(path, bad_line, INVALID_UTF8, f"byte {e.start}; whole file skipped"))
                continue
            if not text.strip():
                out.skips.append(Skip(path, line, EMPTY_TEXT, "file has only whitespace"))
                continue
            out.texts.append(text)
            out.lines.append(line)
        return out

    for i, raw in enumerate(chunk.lines):
        line = chunk.first_line + i
        stripped = raw.rstrip(b"\r\n")
        if not stripped.strip():
            out.skips.append(Skip(path, line, BLANK))
            continue
        try:
            decoded = stripped.decode("utf-8")
        except UnicodeDecodeError as e:
            out.skips.append(Skip(path, line, INVALID_UTF8, f"byte {e.start + 1} of the line"))
            continue
        if fmt == "text":  # text_unit == "line"
            out.texts.append(decoded)
            out.lines.append(line)
            continue
        try:
            obj = json.loads(decoded)
        except json.JSONDecodeError as e:
            out.skips.append(Skip(path, line, MALFORMED_JSON, _describe_json_error(e)))
            continue
        except RecursionError:
            out.skips.append(Skip(path, line, MALFORMED_JSON, "nested too deeply"))
            continue
        if not isinstance(obj, dict):
            out.skips.append(Skip(path, line, NOT_AN_OBJECT, f"a JSON {type(obj).__name__}"))
            continue
        if text_key not in obj:
            keys = ", ".join(sorted(obj)[:8]) or "none"
            out.skips.append(Skip(path, line, MISSING_KEY, f"no '{text_key}'; keys: {keys}"))
            continue
        text = obj[text_key]
        if not isinstance(text, str):
            out.skips.append(
                Skip(path, line, NOT_A_STRING, f"'{text_key}' is a JSON {type(text).__name__}")
            )
            continue
        if not text:
            out.skips.append(Skip(path, line, EMPTY_TEXT))
            continue
        out.texts.append(text)
        out.lines.append(line)
    return out


def find_unencodable(text: str) -> int | None:
    """Index of the first character that UTF-8 cannot encode (an unpaired surrogate)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return e.start
    return None


def iter_texts(files: list[InputFile], text_key: str = "text", text_unit: str = "file",
               skips: list[Skip] | None = None) -> Iterator[str]:
    """Every document of `files`, in order (for tokenizer training). Skips go to `skips`."""
    for index, f in enumerate(files):
        empty = True
        for chunk in read_chunks(index, f, text_unit=text_unit):
            empty = False
            parsed = parse_chunk(chunk, f.format, text_key, text_unit)
            if skips is not None:
                skips.extend(parsed.skips)
            for text, line in zip(parsed.texts, parsed.lines):
                bad = find_unencodable(text)
                if bad is None:
                    yield text
                elif skips is not None:
                    skips.append(Skip(f.path, line, INVALID_UNICODE, f"character {bad}"))
        if empty and skips is not None:
            skips.append(Skip(f.path, 0, EMPTY_FILE))
