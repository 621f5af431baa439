"""The import record: OUT/hf_import.json names the preset and the Hugging Face config.

Written by the import; read by the export (which writes the same config back) and, as plain
JSON, by the launcher's pretrained_checkpoint guard (training/launch/guards.py: the launcher
imports no feature family), which compares `preset`, `num_layers` and `preset_fields` with
the launch's preset.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from training.launch.guards import IMPORT_FORMAT as FORMAT
from training.launch.guards import IMPORT_RECORD as RECORD

from .layout import Architecture

# The preset's fields that fix the model's tensors and numerics (not its training defaults)
PRESET_FIELDS = ("hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
                 "vocab_size", "max_position_embeddings", "rotary_base", "norm_epsilon",
                 "rope_scaling")
SIDE_DIR = "hf"             # config.json, generation_config.json, tokenizer files of the source


class RecordError(ValueError):
    """An unreadable record (message printed as is)."""


def write_record(folder: Path, *, preset, arch: Architecture, hf_config: dict, source: str,
                 dtype: str, tensors: int, nbytes: int, side_files: list[str],
                 versions: dict[str, str]) -> dict:
    record = {"format": FORMAT, "written_by": "python -m training.checkpoint import",
              "preset": preset.name, "num_layers": arch.num_layers,
              "preset_fields": {key: getattr(preset, key) for key in PRESET_FIELDS},
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
    except (ValueError, KeyError, TypeError, RecursionError) as err:   # JSON, fields, nesting
        raise RecordError(f"{path} is not a readable import record ({err})") from None
    return record
