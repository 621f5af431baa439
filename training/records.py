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

from pydantic import (BaseModel, ConfigDict, Field, ValidationError, ValidationInfo,
                      field_validator)

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


# -- a Hugging Face config.json, as the import and MODEL_CONFIG read it -------------------------
# (training/launch/model_config.py, training/checkpoint/gpt_oss_files.py). Strict: JSON's own
# types only ("false" is not a boolean, "4096" and 4096.0 are not whole numbers, true is not 1),
# every number finite (JSON's NaN and Infinity, which Python's reader accepts, are refused).

Whole = Annotated[int, Field(ge=1, strict=True)]
Count = Annotated[int, Field(ge=0, strict=True)]
Positive = Annotated[float, Field(gt=0, allow_inf_nan=False, strict=True)]
NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False, strict=True)]
Flag = Annotated[bool, Field(strict=True)]


class RopeScaling(Record):
    """rope_scaling (transformers 4) or rope_parameters (5): what the readers take from it."""
    model_config = ConfigDict(extra="allow", strict=True)
    rope_type: Optional[str] = None
    type: Optional[str] = None
    factor: Optional[Positive] = None
    low_freq_factor: Optional[Positive] = None
    high_freq_factor: Optional[Positive] = None
    original_max_position_embeddings: Optional[Whole] = None
    rope_theta: Optional[Positive] = None


class HFConfig(Record):
    model_config = ConfigDict(extra="allow", strict=True)
    model_type: Optional[str] = None
    num_hidden_layers: Whole
    hidden_size: Whole
    intermediate_size: Whole
    num_attention_heads: Whole
    vocab_size: Whole
    num_key_value_heads: Optional[Whole] = None
    max_position_embeddings: Optional[Whole] = None
    head_dim: Optional[Whole] = None
    rope_theta: Optional[Positive] = None
    rms_norm_eps: Optional[Positive] = None
    rope_scaling: Optional[RopeScaling] = None
    rope_parameters: Optional[RopeScaling] = None
    tie_word_embeddings: Optional[Flag] = None
    attention_bias: Optional[Flag] = None
    mlp_bias: Optional[Flag] = None
    norm_topk_prob: Optional[Flag] = None
    use_sliding_window: Optional[Flag] = None
    sliding_window: Optional[Whole] = None
    hidden_act: Optional[str] = None
    num_experts: Optional[Count] = None
    num_local_experts: Optional[Count] = None
    num_experts_per_tok: Optional[Whole] = None
    moe_intermediate_size: Optional[Whole] = None
    router_aux_loss_coef: Optional[NonNegative] = None

    @field_validator("num_experts_per_tok")
    @classmethod
    def _routing(cls, v: int | None, info: ValidationInfo) -> int | None:
        experts = info.data.get("num_experts") or info.data.get("num_local_experts")
        if experts and v and v > experts:
            raise ValueError(f"{v} is more than the {experts} experts a token can be routed to")
        return v


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
