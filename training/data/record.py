"""The record written beside every dataset: PREFIX.dataset.json.

It says which tokenizer made PREFIX.bin/.idx (path, SHA-256 of tokenizer.json, Megatron's
vocabulary size and EOD id), how big the dataset is (documents, tokens, and the size and
SHA-256 of the .bin and the .idx: the record is written last, so it names the files of its
own run), and what was skipped. The launcher
reads it to refuse a TOKENIZER_MODEL that disagrees with the data before torchrun starts.

The tokenizer path is stored relative to the record when the tokenizer lives under the
record's directory (so a data/ folder can be moved as a whole), absolute otherwise.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

from training import records as schema
from training.records import RecordError  # noqa: F401 - the readers' `rec.RecordError`

if TYPE_CHECKING:          # only a type: record.py imports no other module of training.data
    from training.data.tokenizer import TokenizerInfo

FORMAT = "training.data.dataset/1"
SUFFIX = ".dataset.json"


def record_path(prefix: str) -> str:
    return prefix + SUFFIX


def tokenizer_entry(info: "TokenizerInfo", record_dir: str) -> dict[str, Any]:
    entry = info.to_dict()
    path = os.path.abspath(info.path)
    base = os.path.abspath(record_dir)
    if os.path.commonpath([path, base]) == base:
        entry["path"] = os.path.relpath(path, base)
    else:
        entry["path"] = path
    return entry


def stamp(record: dict[str, Any]) -> dict[str, Any]:
    return {"format": FORMAT, **{k: v for k, v in record.items() if k != "format"}}


def write_json(path: str, data: dict[str, Any]) -> None:
    """Write `data` to `path` and fsync it."""
    from training.safe_files import open_write

    with open_write(path, "dataset record") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())


def write_record(path: str, record: dict[str, Any]) -> None:
    """Write the record under a temporary name and rename it into place (never half-written)."""
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        write_json(tmp, stamp(record))
        os.replace(tmp, path)
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise


def read_record(prefix: str) -> dict[str, Any]:
    """The record of `prefix` (training.records.DatasetRecord), with tokenizer.path made
    absolute. RecordError (one line naming the file and field) if unusable."""
    path = record_path(prefix)
    record = schema.read_record(path, schema.DatasetRecord, "dataset record").model_dump()
    tok = record["tokenizer"]
    if not os.path.isabs(tok["path"]):
        tok["path"] = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(path)), tok["path"]))
    return record
