"""One schema layer for the files the project writes and reads back.

    read_record(path, Model)  -> the file's JSON checked against Model (pydantic), or
    validate(data, Model, path)  RecordError: one line naming the file, the field and what is
                                 wrong ("run/manifest.json: mlperf.target_eval_loss: Input
                                 should be a valid number (got 'abc')")

RecordError is the project's user error for a file (training.cli.BadFile, a ValueError, and
training.launch.settings.LaunchError): every tool prints it as `error: <line>` and exits 2.
The models below describe what the readers use (other keys pass: the writers add sections
over time); values a writer never produces (a string where a number goes, NaN, a negative
time) are refused where the file is read, never discovered as a traceback later.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, Optional, TypeVar

from pydantic import (BaseModel, ConfigDict, Field, ValidationError, field_validator,
                      model_validator)

from training.cli import BadFile, read_json
from training.launch.settings import LaunchError

M = TypeVar("M", bound=BaseModel)


class RecordError(BadFile, LaunchError):
    """A file the project wrote (or should have) that cannot be used: one line, exit 2."""

    exit_code = 2


class Record(BaseModel):
    model_config = ConfigDict(extra="allow", strict=False)


def _finite(value: float | None) -> float | None:
    if value is not None and not math.isfinite(value):
        raise ValueError("must be a finite number")
    return value


# -- the import record: OUT/hf_import.json (training/checkpoint/record.py writes it) ----------

class ImportRecord(Record):
    format: int = Field(1, ge=1)
    preset: str
    num_layers: int = Field(ge=1)
    preset_fields: dict[str, Any]
    source: Optional[str] = None
    architecture: Optional[dict[str, Any]] = None


# -- a Hugging Face Llama config.json, as the import reads it (training/checkpoint/layout.py) ---

class HFConfig(Record):
    num_hidden_layers: int = Field(ge=1)
    hidden_size: int = Field(ge=1)
    intermediate_size: int = Field(ge=1)
    num_attention_heads: int = Field(ge=1)
    vocab_size: int = Field(ge=1)
    num_key_value_heads: Optional[int] = Field(None, ge=1)
    max_position_embeddings: Optional[int] = Field(None, ge=1)
    head_dim: Optional[int] = Field(None, ge=1)
    rope_theta: Optional[float] = Field(None, gt=0)
    rms_norm_eps: Optional[float] = Field(None, gt=0)
    rope_scaling: Optional[dict[str, Any]] = None
    rope_parameters: Optional[dict[str, Any]] = None
    tie_word_embeddings: Optional[bool] = None
    attention_bias: Optional[bool] = None
    mlp_bias: Optional[bool] = None
    hidden_act: Optional[str] = None
    _finite = field_validator("rope_theta", "rms_norm_eps")(classmethod(lambda cls, v: _finite(v)))


# -- a dataset record's document lengths: PREFIX.dataset.json (training/data/doc_lengths.py) ---

Tokens = Annotated[int, Field(ge=0)]


class DocumentLengths(Record):
    """How long the documents are, in tokens (training.data.doc_lengths.LengthStats)."""
    documents: int = Field(ge=1)
    tokens: Tokens
    mean: float = Field(ge=0)
    min: Tokens
    p10: Tokens
    median: Tokens
    p90: Tokens
    max: Tokens
    shorter_than: dict[str, tuple[int, int]]
    _finite = field_validator("mean")(classmethod(lambda cls, v: _finite(v)))

    @field_validator("shorter_than")
    @classmethod
    def _bounds(cls, v: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
        for bound, (docs, tokens) in v.items():
            if not bound.isdigit() or docs < 0 or tokens < 0:
                raise ValueError("each bound is a whole number of tokens, each count >= 0")
        return v

    @model_validator(mode="after")
    def _ordered(self) -> "DocumentLengths":
        if not self.min <= self.p10 <= self.median <= self.p90 <= self.max:
            raise ValueError("min <= p10 <= median <= p90 <= max does not hold")
        if any(d > self.documents or t > self.tokens for d, t in self.shorter_than.values()):
            raise ValueError("shorter_than counts more documents or tokens than there are")
        return self


# -- the launch manifest: RUN/manifest.json (training/launch/manifest.py writes it) -----------

class MlperfSection(Record):
    target_eval_loss: Optional[float] = Field(None, gt=0)
    _finite = field_validator("target_eval_loss")(classmethod(lambda cls, v: _finite(v)))


class ManifestHead(Record):
    """The parts of manifest.json that tools outside the launcher read."""
    schema_: Optional[int] = Field(None, alias="schema")
    dry_run: Optional[bool] = None
    mlperf: Optional[MlperfSection] = None


# -- MLPerf logs: one :::MLLOG event per line (training/mlperf/events.py writes them) ----------

class MlperfEvent(Record):
    key: str
    value: Any = None
    time_ms: float
    event_type: str = "POINT_IN_TIME"
    metadata: dict[str, Any] = Field(default_factory=dict)
    _finite = field_validator("time_ms")(classmethod(lambda cls, v: _finite(v)))


class EvalAccuracy(MlperfEvent):
    """An evaluation: its value is the eval loss, a number (NaN when the run diverged: never a
    success, training.mlperf.summary), at a sample count."""
    value: float

    @field_validator("metadata")
    @classmethod
    def _samples(cls, v: dict[str, Any]) -> dict[str, Any]:
        count = v.get("samples_count")
        if not isinstance(count, (int, float)) or isinstance(count, bool) or count < 0:
            raise ValueError("samples_count must be a number >= 0")
        return v


def _where(err: ValidationError) -> str:
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first.get("loc", ()) if p != "__root__") or "(top level)"
    got = first.get("input")
    shown = "" if isinstance(got, (dict, list)) else f" (got {str(got)[:40]!r})"
    return f"{loc}: {first.get('msg', 'invalid')}{shown}"


def validate(data: Any, model: type[M], path: str | Path) -> M:
    """DATA as MODEL, or RecordError naming PATH and the first field that is wrong."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise RecordError(f"{path}: {_where(err)}") from None


def read_record(path: str | Path, model: type[M], what: str | None = None) -> M:
    """The JSON file at PATH as MODEL; RecordError when it is missing, not JSON, too deep or
    does not fit."""
    try:
        data = read_json(path, what or model.__name__)
    except BadFile as err:
        raise RecordError(str(err)) from None
    return validate(data, model, path)
