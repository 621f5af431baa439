"""The import record: OUT/hf_import.json names the shape and holds the Hugging Face config.

Written by the import; read by the export (which writes the same config back) and, as plain
JSON, by the launcher's pretrained_checkpoint guard (training/launch/guards.py: the launcher
imports no feature family), which compares `num_layers` and `preset_fields` (the whole shape)
with the launch's, and by MODEL_CONFIG (training/launch/model_config.py), which launches an
import at its own shape.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from training.launch.guards import IMPORT_FORMAT as FORMAT
from training.launch.guards import IMPORT_RECORD as RECORD
from training.reading import RecordError, read_json
from training.records import ImportRecord, validate

from .layout import Architecture

SIDE_DIR = "hf"             # config.json, generation_config.json, tokenizer files of the source


def write_record(folder: Path, *, name: str, arch: Architecture, hf_config: dict, source: str,
                 dtype: str, tensors: int, nbytes: int, side_files: list[str],
                 versions: dict[str, str]) -> dict:
    """`preset` is the shape's name (a preset's where the shape is one: MODEL_SIZE), and
    `preset_fields` every field of the shape as training.run_description.Model spells them:
    what the launcher's guard compares with the launch's."""
    record = {"format": FORMAT, "written_by": "python -m training.checkpoint import",
              "preset": name, "name": name, "family": arch.family,
              "num_layers": arch.num_layers, "preset_fields": arch.to_model_fields(),
              "architecture": dataclasses.asdict(arch), "dtype": dtype, "source": source,
              "tensors": tensors, "bytes": nbytes, "side_files": side_files,
              "versions": versions, "hf_config": hf_config}
    from training.safe_files import write_text

    write_text(folder / RECORD, json.dumps(record, indent=1) + "\n", RECORD)
    return record


def read_record(folder: Path) -> dict | None:
    """The record of an imported checkpoint; None when the folder holds none. (Records of
    format 1 and 2, Llama only, carried two fields no longer kept: linear_bias, activation.)"""
    path = Path(folder) / RECORD
    if not path.is_file():
        return None
    known = {f.name for f in dataclasses.fields(Architecture)}
    record = validate(read_json(path, "import record"), ImportRecord, path).model_dump()
    if not isinstance(record.get("architecture"), dict):
        raise RecordError(f"{path}: architecture: missing; import the checkpoint again "
                          "(python -m training.checkpoint import)")
    try:
        record["architecture"] = Architecture(**{k: v for k, v in record["architecture"].items()
                                                 if k in known})
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise RecordError(f"{path}: architecture: not a readable import record ({err})") from None
    return record
