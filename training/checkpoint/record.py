"""The import record: OUT/hf_import.json names the preset and the Hugging Face config.

Written by the import, read by the launcher's pretrained_checkpoint guard (before any GPU work,
so this module imports no torch) and by the export (which writes the same config back).
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from .layout import Architecture

RECORD = "hf_import.json"
SIDE_DIR = "hf"             # config.json, generation_config.json, tokenizer files of the source
FORMAT = 1


class RecordError(ValueError):
    """An unreadable record (message printed as is)."""


def write_record(folder: Path, *, preset: str, arch: Architecture, hf_config: dict, source: str,
                 dtype: str, tensors: int, nbytes: int, side_files: list[str],
                 versions: dict[str, str]) -> dict:
    record = {"format": FORMAT, "written_by": "python -m training.checkpoint import",
              "preset": preset, "num_layers": arch.num_layers,
              "architecture": dataclasses.asdict(arch), "dtype": dtype, "source": source,
              "tensors": tensors, "bytes": nbytes, "side_files": side_files,
              "versions": versions, "hf_config": hf_config}
    (folder / RECORD).write_text(json.dumps(record, indent=1) + "\n")
    return record


def read_record(folder: Path) -> dict | None:
    """The record of an imported checkpoint; None when the folder holds none."""
    path = Path(folder) / RECORD
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
        record["architecture"] = Architecture(**record["architecture"])
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as err:
        raise RecordError(f"{path} is not a readable import record ({err})") from None
    return record


def launch_mismatch(record: dict, preset, num_layers: int) -> list[str]:
    """What differs between an imported checkpoint and a launch (preset, layer count, and the
    preset's architecture if its definition changed since the import)."""
    out = []
    if record["preset"] != preset.name:
        out.append(f"preset: {record['preset']} (checkpoint) vs {preset.name} (launch)")
    if record["num_layers"] != num_layers:
        out.append(f"num_layers: {record['num_layers']} (checkpoint) vs {num_layers} (launch)")
    if not out:
        out += [f"{d} (checkpoint vs launch)" for d in record["architecture"].differences(
            Architecture.from_preset(preset, num_layers))]
    return out
