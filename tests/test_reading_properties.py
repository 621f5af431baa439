"""Every reader of the schema layer, fed what hypothesis generates: wrong types in every field,
NaN and infinities, deep nesting, cut files, invalid UTF-8, YAML aliases. The property: the
reader returns, or raises the one user error (training.reading.RecordError) whose one line
names the file; never another exception. A reader added to READERS is held to it too.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable

import pytest
from hypothesis import HealthCheck, given, settings   # pyproject's dev extra
from hypothesis import strategies as st

from training import reading, records
from training.reading import RecordError

RUN = Path(__file__).parent / "data" / "runs" / "h200_l8_native"
SETTINGS = settings(max_examples=40, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# -- what a hostile file holds -------------------------------------------------------------------

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.text(max_size=12),
                    st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -1.0, 1e308, 0.5]))
ANY_JSON = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                         st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                        max_leaves=8)


def _good_dataset_record() -> dict:
    return {"format": "training.data.dataset/1", "documents": 40, "tokens": 1200, "dtype": "uint16",
            "tokenizer": {"path": "tok", "sha256": "a" * 64, "config_sha256": "b" * 64,
                          "vocab_size": 300, "eod_id": 0, "eod_token": "<eod>", "bos_id": None},
            "bin_bytes": 2400, "idx_bytes": 1000}


def _good_manifest() -> dict:
    return json.loads((RUN / "manifest.json").read_text())


def _good_bench() -> dict:
    return {"kind": "toggles", "complete": True, "gpu": {"name": "NVIDIA H200"},
            "shape": {"repeats": 2, "steps": 3, "warmup": 4, "seq_length": 8192},
            "configs": [{"id": "a", "status": "planned", "env": {}}],
            "points": [{"label": "a-r0", "repeat": 0, "tokens_per_s_per_gpu": 1000.0}]}


def _paths(data: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path to a value in DATA (keys and list indices)."""
    out = [prefix] if prefix else []
    if isinstance(data, dict):
        for key, value in data.items():
            out += _paths(value, (*prefix, key))
    elif isinstance(data, list):
        for index, value in enumerate(data[:3]):
            out += _paths(value, (*prefix, index))
    return out


def _replaced(data: Any, path: tuple, value: Any) -> Any:
    data = json.loads(json.dumps(data))
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return data


# -- the readers: (name, file name, the good document, read(path)) -----------------------------------

def _read_dataset(path: Path) -> Any:
    from training.data import record
    return record.read_record(str(path)[: -len(record.SUFFIX)])


def _read_manifest(path: Path) -> Any:
    from training.optimize.inputs import load_run
    return load_run(path)


def _read_bench(path: Path) -> Any:
    from training.bench.suites import saved_result
    return saved_result(path)


def _read_metrics(path: Path) -> Any:
    from training.metrics import read_metrics
    return read_metrics(path)


def _read_mlperf(path: Path) -> Any:
    from training.mlperf.summary import read_events
    return read_events(path)


def _read_grid(path: Path) -> Any:
    from training.convergence.grid import load
    return load(path)


READERS: dict[str, tuple[str, Callable[[], Any], Callable[[Path], Any], str]] = {
    # name: (file name, good document, reader, how the document is written: json | jsonl | mllog | yaml)
    "dataset record": ("ds.dataset.json", _good_dataset_record, _read_dataset, "json"),
    "run manifest": ("manifest.json", _good_manifest, _read_manifest, "json"),
    "benchmark JSON": ("bench.json", _good_bench, _read_bench, "json"),
    "metrics.jsonl": ("metrics.jsonl", lambda: [{"iteration": 1, "loss": 3.2, "step_time_s": 1.0}],
                      _read_metrics, "jsonl"),
    "mlperf.log": ("mlperf.log", lambda: [{"key": "eval_accuracy", "value": 3.1, "time_ms": 5,
                                           "metadata": {"samples_count": 10}}], _read_mlperf, "mllog"),
    "convergence grid": ("grid.yaml", lambda: {"name": "g", "fixed": {"NUM_LAYERS": 2},
                                               "axes": {"ADAM_EPS": [1e-8, 1e-5]}}, _read_grid, "yaml"),
}


def _text(how: str, data: Any) -> str:
    if how == "jsonl":
        return "".join(json.dumps(d) + "\n" for d in data)
    if how == "mllog":
        return "".join(":::MLLOG " + json.dumps(d) + "\n" for d in data)
    if how == "yaml":
        return json.dumps(data) + "\n"   # JSON is YAML
    return json.dumps(data)


READ = "read"   # the outcome of a document the reader took


def _outcome(name: str, tmp: Path, content: bytes) -> str:
    """READ where the reader of NAME takes CONTENT, else the RecordError's line (any other
    exception escapes and fails the test)."""
    file, _, read, _ = READERS[name]
    path = tmp / file
    path.write_bytes(content)
    try:
        read(path)
        return READ
    except RecordError as err:
        return str(err)
    finally:
        path.unlink()


def _one_line_naming(line: str, name: str, tmp: Path) -> bool:
    """A refusal is one line that names the file."""
    return "\n" not in line.strip() and str(tmp / READERS[name][0]) in line


NAMES = sorted(READERS)


def test_every_reader_takes_its_good_document(tmp_path):
    """The fixtures are good (else every property below would pass by refusing everything)."""
    for name in NAMES:
        file, good, read, how = READERS[name]
        (tmp_path / file).write_text(_text(how, good()))
        assert read(tmp_path / file) is not None, name


@pytest.mark.parametrize("name", NAMES)
@SETTINGS
@given(data=st.data(), value=ANY_JSON)
def test_a_field_of_any_type_is_read_or_refused_in_one_line(tmp_path, name, data, value):
    """One field (any of the good document's, at any depth) replaced by any JSON value."""
    _, good, _, how = READERS[name]
    document = good()
    path = data.draw(st.sampled_from(_paths(document)))
    line = _outcome(name, tmp_path, _text(how, _replaced(document, path, value)).encode())
    assert line == READ or _one_line_naming(line, name, tmp_path), line


@pytest.mark.parametrize("name", NAMES)
@SETTINGS
@given(cut=st.floats(0, 1))
def test_a_cut_file_is_read_or_refused_in_one_line(tmp_path, name, cut):
    _, good, _, how = READERS[name]
    whole = _text(how, good()).encode()
    line = _outcome(name, tmp_path, whole[: int(len(whole) * cut)])
    assert line == READ or _one_line_naming(line, name, tmp_path), line


@pytest.mark.parametrize("name", NAMES)
@SETTINGS
@given(at=st.floats(0, 1), junk=st.binary(min_size=1, max_size=4).filter(
    lambda b: _not_utf8(b)))
def test_invalid_utf8_is_refused_in_one_line(tmp_path, name, at, junk):
    _, good, _, how = READERS[name]
    whole = _text(how, good()).encode()
    cut = int(len(whole) * at)
    line = _outcome(name, tmp_path, whole[:cut] + junk + whole[cut:])
    assert line != READ and _one_line_naming(line, name, tmp_path), line


def _not_utf8(data: bytes) -> bool:
    try:
        data.decode()
    except UnicodeDecodeError:
        return True
    return False


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=6, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(depth=st.sampled_from([reading.MAX_DEPTH + 1, 5_000, 100_000]), opener=st.sampled_from(["[", '{"a":']))
def test_deep_nesting_is_refused_before_the_parser_recurses(tmp_path, name, depth, opener):
    closer = "]" if opener == "[" else "}"
    _, good, _, how = READERS[name]
    deep = opener * depth + "1" + closer * depth
    if how == "mllog":
        content = ":::MLLOG " + deep + "\n"
    elif how == "jsonl":
        content = deep + "\n"
    else:
        content = deep
    line = _outcome(name, tmp_path, content.encode())
    assert line != READ and _one_line_naming(line, name, tmp_path), line


def test_a_json_nesting_limit_counts_brackets_outside_strings_only():
    assert not reading.too_deep(json.dumps({"a": "[" * 10_000}))
    assert reading.too_deep("[" * (reading.MAX_DEPTH + 1) + "]" * (reading.MAX_DEPTH + 1))
    assert not reading.too_deep("[" * reading.MAX_DEPTH + "]" * reading.MAX_DEPTH)
    assert not reading.too_deep(json.dumps([[1], [2]] * 1000))   # many, not deep


@SETTINGS
@given(depth=st.integers(1, 3), copies=st.integers(2, 10))
def test_yaml_aliases_are_refused_at_any_size(tmp_path, depth, copies):
    """An alias is refused whatever it expands to (the bomb is only the largest case)."""
    text = "name: g\nbase: &a0 [x]\n" + "".join(
        f"l{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * copies) + "]\n" for i in range(1, depth + 1))
    (tmp_path / "g.yaml").write_text(text)
    with pytest.raises(RecordError, match=r"alias \(\*a0\) is not accepted"):
        reading.read_yaml(tmp_path / "g.yaml", "grid")


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("model,field,good", [
    (records.ModelSection, "norm_epsilon", None), (records.ModelSection, "rotary_base", None),
    (records.MlperfEvent, "time_ms", {"key": "k"}), (records.BenchPoint, "tokens_per_s_per_gpu", {}),
    (records.MetricsLine, "step_time_s", {"iteration": 1})])
def test_every_non_finite_number_is_refused_where_a_measure_goes(model, field, good, value):
    base = good if good is not None else {k: v for k, v in _good_manifest()["model"].items()}
    with pytest.raises(RecordError, match=field):
        records.validate({**base, field: value}, model, "f.json")


@pytest.mark.parametrize("name", ["TP", "PP", "CP", "MBS", "BS", "NNODES", "GPUS_PER_NODE", "NUM_LAYERS",
                                  "SEQ_LENGTH"])
@pytest.mark.parametrize("value", [0, -1, 1.5, "2", True, None, math.inf, [2]])
def test_every_size_a_run_is_derived_from_is_a_whole_number_at_least_one(name, value):
    manifest = _good_manifest()
    manifest["values"][name] = value
    with pytest.raises(RecordError, match=f"values.{name}: "):
        records.validate(manifest, records.RunManifest, "manifest.json")


def test_every_registry_value_is_held_to_its_kind():
    """Each toggle of the registry, given a value of another kind in a manifest, is refused by
    name (the rule, over the whole registry: not one example)."""
    from training.launch.toggles import REGISTRY

    manifest = _good_manifest()
    wrong = {"bool": "yes", "int": 2.5, "float": "fast", "choice": 7, "str": 7, "path": 7}
    for toggle in REGISTRY:
        if toggle.kind not in wrong:
            continue
        for value in (wrong[toggle.kind], *(["no-such-choice"] if toggle.kind == "choice" else [])):
            bad = _replaced(manifest, ("values", toggle.name), value)
            with pytest.raises(RecordError, match=f"values.{toggle.name}"):
                records.validate(bad, records.RunManifest, "manifest.json")
