"""The record models' rules over their classes (training/records.py; issue 55: a one-line
change to record validation survived a test that checked one value): every count, size and
measure of every model refuses every value of the wrong kind, and accepts its good ones."""
from __future__ import annotations

import math

import pytest

from training import records
from training.reading import RecordError

NOT_WHOLE = ["12", 1.5, True, None, [1], {"n": 1}, math.nan, math.inf]
NOT_FINITE = [math.nan, math.inf, -math.inf]

DATASET = {"format": "training.data.dataset/1", "documents": 4, "tokens": 40, "dtype": "uint16",
           "tokenizer": {"path": "t", "sha256": "a", "config_sha256": "b", "vocab_size": 300,
                         "eod_id": 0}}


def _refused(model, data, field) -> str:
    """The one line that refuses DATA, which names the file and FIELD (else the test fails)."""
    with pytest.raises(RecordError) as err:
        records.validate(data, model, "f.json")
    return str(err.value)


def _names(line: str, field: str) -> bool:
    return line.startswith(f"f.json: {field}: ") and "\n" not in line


def _get(record, dotted: str):
    for key in dotted.split("."):
        record = getattr(record, key)
    return record


def _with(data: dict, dotted: str, value) -> dict:
    import copy

    data = copy.deepcopy(data)
    *parents, last = dotted.split(".")
    node = data
    for key in parents:
        node = node[key]
    node[last] = value
    return data


@pytest.mark.parametrize("field,low", [("documents", 0), ("tokens", 0), ("tokenizer.vocab_size", 1),
                                       ("tokenizer.eod_id", 0), ("bin_bytes", 0), ("idx_bytes", 0),
                                       ("input_lines", 0), ("documents_ending_with_eod", 0)])
def test_every_count_of_the_dataset_record_is_a_whole_number_from_its_floor(field, low):
    record = records.validate(_with(DATASET, field, low), records.DatasetRecord, "f.json")
    assert _get(record, field) == low
    for value in [*NOT_WHOLE, low - 1]:
        if value is None and field not in ("documents", "tokens", "tokenizer.vocab_size", "tokenizer.eod_id"):
            continue   # an optional count may be absent
        assert _names(_refused(records.DatasetRecord, _with(DATASET, field, value), field), field)


@pytest.mark.parametrize("field", ["tokenizer.path", "tokenizer.sha256", "tokenizer.config_sha256", "format"])
def test_every_name_of_the_dataset_record_is_text(field):
    for value in (5, None, [], {}, True, ""):
        assert _names(_refused(records.DatasetRecord, _with(DATASET, field, value), field), field)


@pytest.mark.parametrize("count", [-1, True, "10", None, [1], *NOT_FINITE])
def test_an_evaluation_needs_a_sample_count_that_is_a_number_from_zero(count):
    event = {"key": "eval_accuracy", "value": 3.1, "time_ms": 5, "metadata": {"samples_count": count}}
    with pytest.raises(RecordError, match="metadata"):
        records.validate(event, records.EvalAccuracy, "f.json")


@pytest.mark.parametrize("count", [0, 10, 10.0])
def test_an_evaluation_takes_any_sample_count_from_zero(count):
    event = {"key": "eval_accuracy", "value": 3.1, "time_ms": 5, "metadata": {"samples_count": count}}
    assert records.validate(event, records.EvalAccuracy, "f.json").value == 3.1


@pytest.mark.parametrize("value", ["3.1", None, [3.1], {"v": 3.1}, True])
def test_an_evaluation_value_is_a_number(value):
    event = {"key": "eval_accuracy", "value": value, "time_ms": 5, "metadata": {"samples_count": 1}}
    assert _names(_refused(records.EvalAccuracy, event, "value"), "value")


def test_a_diverged_evaluation_is_read_as_the_nan_it_is():
    """NaN is what a diverged run measured: read (training.mlperf.summary never calls it a
    success), not refused."""
    event = {"key": "eval_accuracy", "value": math.nan, "time_ms": 5, "metadata": {"samples_count": 1}}
    assert math.isnan(records.validate(event, records.EvalAccuracy, "f.json").value)


@pytest.mark.parametrize("value", [0, -1.0, "2.5", True, *NOT_FINITE])
def test_an_mlperf_target_is_a_positive_finite_number(value):
    line = _refused(records.ManifestHead, {"mlperf": {"target_eval_loss": value}},
                    "mlperf.target_eval_loss")
    assert _names(line, "mlperf.target_eval_loss")


@pytest.mark.parametrize("model,base,field", [
    (records.MlperfEvent, {"key": "k"}, "time_ms"),
    (records.MetricsLine, {"iteration": 1}, "step_time_s"),
    (records.BenchPoint, {}, "tokens_per_s_per_gpu")])
@pytest.mark.parametrize("value", ["1.0", True, [1.0], *NOT_FINITE])
def test_every_time_and_speed_is_a_finite_number(model, base, field, value):
    assert _names(_refused(model, {**base, field: value}, field), field)


@pytest.mark.parametrize("field", ["repeats", "steps", "seq_length", "mbs", "global_batch", "tp", "pp"])
def test_every_size_of_a_benchmark_shape_is_a_whole_number_from_one(field):
    for value in [*NOT_WHOLE[:3], 0, -2]:
        line = _refused(records.BenchResult, {"shape": {field: value}}, f"shape.{field}")
        assert _names(line, f"shape.{field}")
