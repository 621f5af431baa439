"""A safetensors header is untrusted input: the reader is at least as strict as the safetensors
library, over the whole class of broken headers, and our streaming writer writes what the
library reads."""
from __future__ import annotations

import json
import random
import struct
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from training.checkpoint.safetensors_file import HeaderError, read_header, write


def _file(path: Path, header: dict, data: bytes) -> Path:
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return path


def _valid() -> tuple[dict, bytes]:
    """Two F32 tensors [2, 3] and [4], back to back."""
    return ({"__metadata__": {"format": "pt"},
             "a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
             "b": {"dtype": "F32", "shape": [4], "data_offsets": [24, 40]}}, bytes(range(40)))


def _library_accepts(path: Path) -> bool:
    try:
        with safe_open(str(path), "pt") as f:
            for name in f.keys():
                f.get_tensor(name)
        return True
    except Exception:
        return False


def _edit(**entries):
    def apply(header, data):
        header = json.loads(json.dumps(header))
        for name, change in entries.items():
            if change is None:
                header.pop(name)
            elif isinstance(change, dict) and name in header:
                header[name].update(change)
            else:
                header[name] = change
        return header, data
    return apply


def _replace(name, value):
    return lambda header, data: ({**header, name: value}, data)


# Every way a header can lie about its data, with the words the refusal carries.
BROKEN = {
    "overlapping ranges": (_edit(b={"data_offsets": [20, 36]}), "overlaps"),
    "two tensors aliasing one range": (_edit(b={"shape": [6], "data_offsets": [0, 24]}),
                                       "overlaps"),
    "a gap between tensors": (_edit(b={"shape": [3], "data_offsets": [28, 40]}), "gap"),
    "a range past the end of the file": (_edit(b={"shape": [6], "data_offsets": [24, 48]}),
                                         "beyond the end"),
    "bytes after the last tensor": (_edit(b={"shape": [3], "data_offsets": [24, 36]}),
                                    "after the last tensor"),
    "a byte length that does not fit dtype and shape": (_edit(a={"shape": [2, 2]}),
                                                        "bytes, and its data_offsets span"),
    "a fractional shape": (_edit(a={"shape": [2.5, 2.4]}), "not a list of whole numbers"),
    "a float-valued whole shape": (_edit(a={"shape": [2.0, 3]}), "not a list of whole numbers"),
    "a string shape": (_edit(a={"shape": ["2", 3]}), "not a list of whole numbers"),
    "a boolean shape": (_edit(b={"shape": [True, 4]}), "not a list of whole numbers"),
    "a negative shape": (_edit(a={"shape": [-2, -3]}), "not a list of whole numbers"),
    "a null shape": (_edit(a={"shape": None}), "not a list of whole numbers"),
    "offsets reversed": (_edit(a={"data_offsets": [24, 0]}), "begin <= end"),
    "offsets not two": (_edit(a={"data_offsets": [0, 12, 24]}), "begin <= end"),
    "fractional offsets": (_edit(a={"data_offsets": [0, 24.0]}), "begin <= end"),
    "an unknown dtype": (_edit(a={"dtype": "F48"}), "dtype 'F48'"),
    "an entry with a key too many": (_edit(a={"extra": 1}), "not exactly dtype"),
    "an entry without its offsets": (_replace("a", {"dtype": "F32", "shape": [2, 3]}),
                                     "not exactly dtype"),
    "an entry that is no object": (_edit(a=[1, 2]), "not exactly dtype"),
    "metadata that is not strings": (_edit(__metadata__={"format": 1}), "__metadata__"),
}


def _duplicate(path: Path) -> Path:
    """The name 'a' twice in the JSON text (a dict cannot say it)."""
    text = (b'{"a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}, '
            b'"a": {"dtype": "F32", "shape": [4], "data_offsets": [24, 40]}}')
    path.write_bytes(struct.pack("<Q", len(text)) + text + bytes(40))
    return path


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_every_broken_header_is_refused_naming_the_rule(tmp_path, case):
    mutate, words = BROKEN[case]
    path = _file(tmp_path / "x.safetensors", *mutate(*_valid()))
    with pytest.raises(HeaderError) as err:
        read_header(path)
    assert words in str(err.value) and str(path) in str(err.value), case


def test_a_name_twice_is_refused(tmp_path):
    with pytest.raises(HeaderError, match="'a' appears twice"):
        read_header(_duplicate(tmp_path / "dup.safetensors"))


def test_header_lengths_that_lie_are_refused(tmp_path):
    header, data = _valid()
    good = _file(tmp_path / "good.safetensors", header, data).read_bytes()
    for length, words in ((0, "header length of 0"), (len(good), "header length"),
                          (200_000_000, "the format allows")):
        path = tmp_path / f"len{length}.safetensors"
        path.write_bytes(struct.pack("<Q", length) + good[8:])
        with pytest.raises(HeaderError, match=words):
            read_header(path)
    (tmp_path / "short").write_bytes(b"\x01\x02")
    with pytest.raises(HeaderError, match="shorter than"):
        read_header(tmp_path / "short")
    for body, words in ((b"[1, 2]", "start with '{'"), (b"{\"a\": ", "not JSON"),
                        (b"{\xff\xfe}", "not JSON")):
        path = tmp_path / "body.safetensors"
        path.write_bytes(struct.pack("<Q", len(body)) + body)
        with pytest.raises(HeaderError, match=words.replace("'", ".")):
            read_header(path)


def test_a_valid_file_reads_as_the_library_reads_it(tmp_path):
    tensors = {"w": torch.randn(5, 7, dtype=torch.float32).to(torch.bfloat16),
               "b": torch.arange(3, dtype=torch.float32), "e": torch.empty(0, 4)}
    save_file(tensors, str(tmp_path / "m.safetensors"), metadata={"format": "pt"})
    entries = read_header(tmp_path / "m.safetensors")
    raw = (tmp_path / "m.safetensors").read_bytes()
    for name, tensor in tensors.items():
        e = entries[name]
        assert e.shape == tuple(tensor.shape) and e.nbytes == tensor.nbytes
        assert raw[e.begin:e.begin + e.nbytes] == tensor.contiguous().view(torch.uint8).numpy(
        ).tobytes()


def test_nothing_the_library_refuses_is_accepted(tmp_path):
    """The rule, over a generated class: random edits of a valid header's numbers, names and
    types. Whatever our reader accepts, the safetensors library reads too."""
    rng = random.Random(55)
    values = [0, 1, 2, 3, 4, 6, 12, 20, 24, 28, 36, 40, 44, -1, 2.0, 2.5, "2", True, None, [],
              [2], [2, 3], [3, 2], [6], [0, 24], [24, 40], [0, 40], [24, 24]]
    accepted = 0
    for i in range(300):
        header, data = _valid()
        for _ in range(rng.randint(1, 3)):
            name = rng.choice(["a", "b"])
            field = rng.choice(["shape", "data_offsets", "dtype"])
            header[name][field] = rng.choice(
                values if field != "dtype" else ["F32", "I32", "F16", "BF16", "U8", "X"])
        if rng.random() < 0.2:
            data = data[:rng.randint(0, 40)]
        path = _file(tmp_path / f"f{i}.safetensors", header, data)
        try:
            read_header(path)
        except HeaderError:
            continue
        accepted += 1
        assert _library_accepts(path), header
    assert accepted > 5   # the generator also makes valid files, so the rule is exercised


def test_the_streaming_writer_writes_what_the_library_reads(tmp_path):
    tensors = {"x": torch.randn(4, 3).to(torch.bfloat16), "y": torch.arange(10.0),
               "z": torch.ones(2, 2, 2, dtype=torch.float16)}
    made = []

    def produce(name):
        made.append(name)
        return tensors[name]

    spec = [(n, {torch.bfloat16: "BF16", torch.float32: "F32", torch.float16: "F16"}[t.dtype],
             tuple(t.shape)) for n, t in tensors.items()]
    write(tmp_path / "s.safetensors", spec, produce, {"format": "pt"})
    assert made == list(tensors)           # each asked for once, in order
    read_header(tmp_path / "s.safetensors")
    with safe_open(str(tmp_path / "s.safetensors"), "pt") as f:
        assert f.metadata() == {"format": "pt"}
        for name, tensor in tensors.items():
            assert torch.equal(f.get_tensor(name), tensor)
