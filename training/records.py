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
from typing import Annotated, Any, Literal, Optional, TypeVar, Union

from pydantic import (BaseModel, ConfigDict, Field, Strict, ValidationError, ValidationInfo,
                      field_validator, model_validator)
from pydantic_core import PydanticCustomError

from training.reading import RecordError, read_json, read_jsonl

M = TypeVar("M", bound=BaseModel)
__all__ = ["RecordError", "read_lines", "read_record", "validate"]


class Record(BaseModel):
    model_config = ConfigDict(extra="allow", strict=False)


# Field types of what our writers write: never a string for a number, a bool for a count, a
# fraction for a size, NaN or an infinity (strict: nothing converted on the way in).
Count = Annotated[int, Strict(), Field(ge=0)]
Size = Annotated[int, Strict(), Field(ge=1)]
Number = Annotated[float, Strict(), Field(allow_inf_nan=False)]
Text = Annotated[str, Strict()]
Name = Annotated[str, Strict(), Field(min_length=1)]
Positive = Annotated[float, Strict(), Field(gt=0, allow_inf_nan=False)]
Rate = Annotated[float, Strict(), Field(ge=0, allow_inf_nan=False)]   # a time, a speed
Flag = Annotated[bool, Strict()]


# -- the dataset record: PREFIX.dataset.json (training/data/record.py writes it) --------------

class TokenizerEntry(Record):
    path: Name
    sha256: Name
    config_sha256: Name
    vocab_size: Size
    eod_id: Count
    eod_token: Optional[Text] = None
    bos_id: Optional[Count] = None


class DatasetRecord(Record):
    """What training, `check verify` and the launcher read of PREFIX.dataset.json."""
    format: Literal["training.data.dataset/1"]
    tokenizer: TokenizerEntry
    documents: Count
    tokens: Count
    dtype: Optional[Name] = None
    input_lines: Optional[Count] = None
    bin_bytes: Optional[Count] = None
    idx_bytes: Optional[Count] = None
    bin_sha256: Optional[Name] = None
    idx_sha256: Optional[Name] = None
    documents_ending_with_eod: Optional[Count] = None


def _finite(value: float | None) -> float | None:
    if value is not None and not math.isfinite(value):
        raise ValueError("must be a finite number")
    return value


# -- the import record: OUT/hf_import.json (training/checkpoint/record.py writes it) ----------

class ImportRecord(Record):
    format: Size = 1
    preset: Name
    num_layers: Size
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
    target_eval_loss: Optional[Positive] = None


class ModelSection(Record):
    """manifest.json's model (training.run_description.Model.to_dict)."""
    name: Name
    num_layers: Size
    hidden_size: Size
    ffn_hidden_size: Size
    num_attention_heads: Size
    num_query_groups: Size
    vocab_size: Size
    max_position_embeddings: Size
    seq_length: Size
    rotary_base: Optional[Positive] = None
    norm_epsilon: Optional[Positive] = None
    rope_scaling_factor: Optional[Positive] = None
    num_experts: Optional[Size] = None
    preset_layers: Optional[Size] = None
    kv_channels: Optional[Size] = None
    router_topk: Optional[Count] = None
    moe_ffn_hidden_size: Optional[Count] = None
    shared_expert_ffn_hidden_size: Optional[Count] = None
    sliding_window: Optional[Size] = None
    rope_scaling: Optional[Flag] = None
    qk_layernorm: Optional[Flag] = None
    tied_embeddings: Optional[Flag] = None
    qkv_bias: Optional[Flag] = None


class LayoutSection(Record):
    """manifest.json's layout (training.run_description.Layout.to_dict)."""
    nnodes: Size
    gpus_per_node: Size
    tp: Size
    pp: Size
    cp: Size
    mbs: Size
    global_batch: Size
    world_size: Optional[Size] = None
    dp: Optional[Size] = None
    microbatches: Optional[Size] = None


def toggle_value_problem(name: str, value: Any) -> str | None:
    """Why VALUE cannot be the resolved value of the registry's toggle NAME (its kind, its
    choices, its range: training.launch.toggles, the one definition), or None. Names the
    registry does not hold (a recipe layer's) and unset values (None) pass."""
    from training.launch.toggles import BY_NAME, Range

    toggle = BY_NAME.get(name)
    if toggle is None or value is None:
        return None
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    expected = {"bool": ("true or false", isinstance(value, bool)),
                "int": ("a whole number", number and isinstance(value, int)),
                "float": ("a finite number", number and math.isfinite(value))}.get(
        toggle.kind, ("text", isinstance(value, str)))
    if not expected[1]:
        return f"must be {expected[0]} (got {str(value)[:40]!r})"
    if toggle.kind == "choice" and value not in toggle.choices:
        return f"must be one of {', '.join(toggle.choices)} (got {value[:40]!r})"
    if isinstance(toggle.check, Range) and number and toggle.check.problem(value):
        return f"{toggle.check.problem(value)}: must be {toggle.check.text} (got {value!r})"
    return None


class ValuesSection(Record):
    """manifest.json's values: every toggle's resolved value, each held to the registry's
    kind and range; the ones a run description derives from must be there."""
    NNODES: Size
    GPUS_PER_NODE: Size
    TP: Size
    PP: Size
    CP: Size
    MBS: Size
    BS: Size
    NUM_LAYERS: Size
    SEQ_LENGTH: Size
    PRECISION: Name
    TRANSFORMER_IMPL: Name

    @model_validator(mode="before")
    @classmethod
    def _registry(cls, values: Any) -> Any:
        for name, value in (values.items() if isinstance(values, dict) else ()):
            problem = toggle_value_problem(name, value)
            if problem:
                raise PydanticCustomError("toggle", "{name}: {problem}",
                                          {"name": name, "problem": problem})
        return values


class RunManifest(Record):
    """What the advisor, bench and the tools that read a run folder use of manifest.json:
    the run description's sections (RunDescription.from_dict) typed and bounded."""
    model: ModelSection
    layout: LayoutSection
    values: ValuesSection
    toggles: list[Any] | dict[str, Any]
    family: Optional[Name] = None
    platform: Optional[Text] = None
    dry_run: Optional[Flag] = None
    run: Optional[dict[str, Any]] = None


class ManifestHead(Record):
    """The parts of manifest.json that tools outside the launcher read."""
    schema_: Optional[int] = Field(None, alias="schema")
    dry_run: Optional[bool] = None
    mlperf: Optional[MlperfSection] = None


# -- a benchmark JSON: docs/benchmarks/*.json (training/bench writes it; --resume reads it) -----

class BenchGpu(Record):
    name: Optional[Text] = None


class BenchShapeRecord(Record):
    repeats: Optional[Size] = None
    steps: Optional[Size] = None
    warmup: Optional[Count] = None
    num_layers: Optional[Size] = None
    seq_length: Optional[Size] = None
    mbs: Optional[Size] = None
    global_batch: Optional[Size] = None
    gpus: Optional[Size] = None
    tp: Optional[Size] = None
    pp: Optional[Size] = None


class BenchPoint(Record):
    label: Optional[Text] = None
    repeat: Optional[Count] = None
    config: Optional[Text] = None
    side: Optional[Text] = None
    tokens_per_s_per_gpu: Optional[Rate] = None


class BenchConfig(Record):
    id: Optional[Text] = None
    status: Optional[Text] = None
    env: Optional[dict[str, Any]] = None


def _objects(model: type[M], items: list[Any] | None) -> list[Any] | None:
    """ITEMS with each JSON object held to MODEL (other entries pass); the first problem
    raised with its index in the field's path."""
    for index, item in enumerate(items or []):
        if isinstance(item, dict):
            try:
                model.model_validate(item)
            except ValidationError as err:
                raise _nested(err, index) from None
    return items


def _nested(err: ValidationError, *where: Any) -> PydanticCustomError:
    """A field's error raised from a validator, keeping the path below it (see _where)."""
    first = err.errors()[0]
    loc = ".".join(str(p) for p in (*where, *first.get("loc", ())))
    return PydanticCustomError("nested", "{name}: {problem}",
                               {"name": loc, "problem": first.get("msg", "invalid") + _got(first)})


class BenchResult(Record):
    """What --resume, the table and the lever book read of a benchmark JSON. Entries of
    points and configs that are no objects pass (they are skipped where read); objects are
    held to their models."""
    kind: Optional[Text] = None
    complete: Optional[Flag] = None
    gpu: Optional[BenchGpu] = None
    shape: Optional[BenchShapeRecord] = None
    configs: Optional[list[Any]] = None
    points: Optional[list[Any]] = None

    @field_validator("points")
    @classmethod
    def _points(cls, v: list[Any] | None) -> list[Any] | None:
        return _objects(BenchPoint, v)

    @field_validator("configs")
    @classmethod
    def _configs(cls, v: list[Any] | None) -> list[Any] | None:
        return _objects(BenchConfig, v)


# -- metrics.jsonl: one line per logged iteration (training/metrics.py MetricsWriter) ----------

# A measured value: a number (NaN and infinities are what a diverged run measured; json writes
# them as NaN/Infinity, str() as 'nan'/'inf'), never a list or an object.
Measured = Optional[Union[Annotated[float, Strict()], Text]]


class MetricsLine(Record):
    iteration: Count
    loss: Measured = None
    eval_loss: Measured = None
    grad_norm: Measured = None
    lr: Measured = None
    step_time_s: Optional[Rate] = None
    tokens_per_s_per_gpu: Measured = None
    mem_peak_allocated_gib: Measured = None


# -- MLPerf logs: one :::MLLOG event per line (training/mlperf/events.py writes them) ----------

class MlperfEvent(Record):
    key: Name
    value: Any = None
    time_ms: Number
    event_type: Text = "POINT_IN_TIME"
    metadata: dict[str, Any] = Field(default_factory=dict)


class EvalAccuracy(MlperfEvent):
    """An evaluation: its value is the eval loss, a number (NaN when the run diverged: never a
    success, training.mlperf.summary), at a sample count."""
    value: Annotated[float, Strict()]

    @field_validator("metadata")
    @classmethod
    def _samples(cls, v: dict[str, Any]) -> dict[str, Any]:
        count = v.get("samples_count")
        if not isinstance(count, (int, float)) or isinstance(count, bool) \
                or not math.isfinite(count) or count < 0:
            raise ValueError("samples_count must be a finite number >= 0")
        return v


def _where(err: ValidationError) -> str:
    first = err.errors()[0]
    loc = [str(p) for p in first.get("loc", ()) if p != "__root__"]
    if first.get("type") in ("toggle", "nested"):  # a value checked by a validator
        loc.append(first["ctx"]["name"])
        return f"{'.'.join(loc)}: {first['ctx']['problem']}"
    return f"{'.'.join(loc) or '(top level)'}: {first.get('msg', 'invalid')}{_got(first)}"


def _got(error: dict) -> str:
    """' (got VALUE)' for a scalar input of a pydantic error; '' for a list or object."""
    got = error.get("input")
    return "" if isinstance(got, (dict, list)) else f" (got {repr(got)[:40]})"


def validate(data: Any, model: type[M], path: str | Path) -> M:
    """DATA as MODEL, or RecordError naming PATH and the first field that is wrong."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise RecordError(f"{path}: {_where(err)}") from None


def read_lines(path: str | Path, model: type[M], what: str,
               notes: list[str] | None = None) -> list[dict[str, Any]]:
    """Each line of the JSON-lines file at PATH checked against MODEL (as the dicts they are).
    A last line cut off is left out, its note appended to NOTES; every other problem is
    RecordError naming the file, the line and the field."""
    lines, note = read_jsonl(path, what)
    if note and notes is not None:
        notes.append(note)
    return [validate(value, model, f"{path}:{number}").model_dump(exclude_unset=True)
            for number, value in lines]


def read_record(path: str | Path, model: type[M], what: str | None = None) -> M:
    """The JSON file at PATH as MODEL; RecordError when it is missing, not JSON, too deep or
    does not fit."""
    return validate(read_json(path, what or model.__name__), model, path)
