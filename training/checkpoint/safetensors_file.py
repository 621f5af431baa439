"""The safetensors format read as untrusted input, and written one tensor at a time.

A file is an 8-byte little-endian header length N, N bytes of JSON, then the data buffer. The
JSON maps each tensor's name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets into
the buffer), beside an optional "__metadata__" of strings. `read_header` holds a header to the
rules the safetensors library validates (safetensors/src/tensor.rs: Metadata::validate) and
some it does not:

  - N at most 100 MB (the library's limit) and within the file; the JSON an object, UTF-8,
    starting with '{'
  - every name once (the library's JSON map keeps the last of two: here two are refused)
  - each entry exactly dtype, shape and data_offsets; shape a list of whole numbers >= 0 (JSON
    integers: 2.5, 2.0, true and "2" are refused); offsets two whole numbers, begin <= end
  - the byte length end - begin equal to the shape's elements times the dtype's size
  - the ranges, in order, contiguous from 0 to the end of the file: no gap, no overlap, no two
    tensors aliasing one range, nothing outside the file and nothing after the last tensor
  - __metadata__ an object of strings

`write` lays out the same format from the names, dtypes and shapes alone, then asks for each
tensor in order and writes its bytes before asking for the next: the export holds one tensor,
not a shard (safetensors.torch.save_file needs every tensor of a file in memory, and copies
them into one buffer besides). The files it writes are read back by safe_open in the tests.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

MAX_HEADER_BYTES = 100_000_000      # safetensors' own limit (MAX_HEADER_SIZE)
# bytes per element of each dtype the format names (sub-byte dtypes have no whole size and are
# refused where they are read: a checkpoint here is bf16/fp16/fp32, and uint8 for MXFP4)
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
               "I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4,
               "I64": 8, "U64": 8, "F64": 8}
ENTRY_KEYS = {"dtype", "shape", "data_offsets"}
ALIGN = 8                           # the library pads the header to a multiple of 8 bytes


class HeaderError(ValueError):
    """A header that breaks the format's rules (message names the file and the tensor)."""


@dataclass(frozen=True)
class Entry:
    dtype: str
    shape: tuple[int, ...]
    begin: int          # absolute byte offset of the tensor's data in the file
    nbytes: int


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _unique_object(pairs: list) -> dict:
    seen: dict = {}
    for key, value in pairs:
        if key in seen:
            raise HeaderError(f"the name {key!r} appears twice")
        seen[key] = value
    return seen


def read_header(path: Path, fd: int | None = None) -> dict[str, Entry]:
    """Every tensor of a safetensors file, after checking the header (the rules above);
    HeaderError, naming the file and the first rule broken, otherwise."""
    def bad(why: str) -> HeaderError:
        return HeaderError(f"{path} is not a safetensors file: {why}")

    own = fd is None
    if own:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        size = os.fstat(fd).st_size
        head = os.pread(fd, 8, 0)
        if len(head) < 8:
            raise bad("shorter than its 8-byte header length")
        length = int.from_bytes(head, "little")
        if length > MAX_HEADER_BYTES:
            raise bad(f"a header of {length} bytes (the format allows {MAX_HEADER_BYTES})")
        if length < 2 or 8 + length > size:
            raise bad(f"a header length of {length} bytes in a file of {size}")
        raw = os.pread(fd, length, 8)
    finally:
        if own:
            os.close(fd)
    if not raw.startswith(b"{"):
        raise bad("the header does not start with '{'")
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_unique_object)
    except HeaderError as err:
        raise bad(f"{err} in the header") from None
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise bad("the header is not JSON") from None
    if not isinstance(header, dict):
        raise bad("the header is not a JSON object")
    meta = header.pop("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise bad("__metadata__ is not an object of strings")
    base = 8 + length
    ranges = []
    entries = {}
    for name, info in header.items():
        if not isinstance(info, dict) or set(info) != ENTRY_KEYS:
            raise bad(f"tensor {name}'s entry is not exactly dtype, shape and data_offsets")
        dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if dtype not in DTYPE_BYTES:
            raise bad(f"tensor {name} has dtype {dtype!r}, which the format does not name "
                      "with a whole byte size")
        if not isinstance(shape, list) or not all(_whole(d) for d in shape):
            raise bad(f"tensor {name}'s shape {shape!r} is not a list of whole numbers >= 0")
        if not isinstance(offsets, list) or len(offsets) != 2 or \
                not all(_whole(o) for o in offsets) or offsets[0] > offsets[1]:
            raise bad(f"tensor {name}'s data_offsets {offsets!r} are not [begin, end] whole "
                      "numbers with begin <= end")
        numel = 1
        for d in shape:
            numel *= d
        if offsets[1] - offsets[0] != numel * DTYPE_BYTES[dtype]:
            raise bad(f"tensor {name} is {dtype} {tuple(shape)}: {numel * DTYPE_BYTES[dtype]} "
                      f"bytes, and its data_offsets span {offsets[1] - offsets[0]}")
        ranges.append((offsets[0], offsets[1], name))
        entries[name] = Entry(dtype, tuple(shape), base + offsets[0], offsets[1] - offsets[0])
    end = 0
    for begin, stop, name in sorted(ranges):
        if begin != end:
            what = "overlaps the tensor before it" if begin < end else \
                f"leaves a gap of {begin - end} bytes before it"
            raise bad(f"tensor {name}'s bytes [{begin}, {stop}) {what} (each tensor's range "
                      "must start where the previous one ends)")
        end = stop
    if base + end != size:
        what = "beyond the end of the file (truncated download?)" if base + end > size else \
            f"{size - base - end} bytes after the last tensor"
        raise bad(f"the tensors' bytes end at {base + end} of a file of {size} bytes: {what}")
    return entries


def header_bytes(tensors: list[tuple[str, str, tuple[int, ...]]],
                 metadata: dict[str, str] | None = None) -> tuple[bytes, list[int]]:
    """The length-prefixed, padded header of tensors (name, dtype, shape) laid out in order, and
    each one's byte length."""
    header: dict = {"__metadata__": dict(metadata)} if metadata else {}
    sizes, at = [], 0
    for name, dtype, shape in tensors:
        numel = 1
        for d in shape:
            numel *= d
        nbytes = numel * DTYPE_BYTES[dtype]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [at, at + nbytes]}
        sizes.append(nbytes)
        at += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % ALIGN)
    return len(text).to_bytes(8, "little") + text, sizes


def write(path: Path, tensors: list[tuple[str, str, tuple[int, ...]]],
          produce: Callable[[str], "object"], metadata: dict[str, str] | None = None) -> int:
    """A safetensors file of tensors (name, dtype as the format spells it, shape), each made by
    `produce(name)` (a contiguous CPU torch tensor of that shape) only when its turn comes and
    dropped once written. Returns the bytes of tensor data written."""
    from training.safe_files import open_write

    head, sizes = header_bytes(tensors, metadata)
    total = 0
    with open_write(path, "safetensors file", binary=True) as out:
        out.write(head)
        for (name, _dtype, shape), nbytes in zip(tensors, sizes):
            tensor = produce(name)
            if tuple(tensor.shape) != tuple(shape) or tensor.nbytes != nbytes:
                raise ValueError(f"{name}: made {tuple(tensor.shape)}, the header says {shape}")
            out.write(memoryview(tensor.contiguous().view(-1).view(_byte_dtype()).numpy()))
            total += nbytes
            del tensor
    return total


def _byte_dtype():
    import torch

    return torch.uint8
