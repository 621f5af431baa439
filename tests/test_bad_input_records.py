"""Our own records read back as hostile input (issue 55): each tool that reads a dataset
record, a manifest, an MLPerf log, a benchmark JSON, a metrics.jsonl or a grid refuses a bad
one in one line that names the file and the field, exit 2, never a traceback. The cases are
the class's examples; tests/test_reading_properties.py generates the rest.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest

from tests.bad_input import Case, check_case, mlperf_log, write
from tests.test_bad_input_catalogue import FX, RUN, _dataset_copy, _opt, _run_copy, fixtures  # noqa: F401
from tests.test_bad_input_launcher import DRY, LAUNCH, _l3

CHECK = "training.data.check"
OPT = "training.optimize.__main__"
SUMMARY = "training.mlperf.summary"
BENCH = "training.bench.__main__"
CONV = "training.convergence.__main__"
DEEP = "[" * 100_000 + "]" * 100_000
BOMB = "name: g\naxes: {ADAM_EPS: [1.0e-8]}\n" + "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]\n" for i in range(1, 9))


def _record(path: str, value: Any) -> Callable[[Path], None]:
    """The dataset copy with one field of ds.dataset.json set (path: dotted)."""
    def edit(tmp: Path) -> None:
        file = tmp / "ds.dataset.json"
        data = json.loads(file.read_text())
        *parents, last = path.split(".")
        node = data
        for key in parents:
            node = node[key]
        node[last] = value
        file.write_text(json.dumps(data))
    return _dataset_copy(edit=edit)


def _set(section: str, key: str, value: Any) -> Callable[[dict], None]:
    return lambda m: m[section].__setitem__(key, value)


RECORD_EDITS = (("documents", "many"), ("tokens", None), ("tokenizer.path", 5),
                ("tokenizer.vocab_size", 0), ("documents", -1), ("tokens", 1.5))

CASES: list[Case] = [
    # -- the dataset record, in `check verify` and the launcher -----------------------------------
    *[Case(f"check verify: record {field} = {value!r}", CHECK, ["verify", "{tmp}/ds"],
           f"ds.dataset.json: {field}: ", setup=_record(field, value)) for field, value in RECORD_EDITS],
    *[Case(f"launch: DATA_PATH whose record has {field} = {value!r}", LAUNCH,
           _l3("DATA_PATH={tmp}/ds", "TOKENIZER_MODEL={tok}"), f"ds.dataset.json: {field}: ",
           setup=_record(field, value), env=DRY) for field, value in RECORD_EDITS[:3]],
    Case("check verify: record nested 100,000 deep", CHECK, ["verify", "{tmp}/ds"], "nested too deep",
         setup=_dataset_copy(edit=lambda t: (t / "ds.dataset.json").write_text(DEEP))),
    Case("check verify: record not UTF-8", CHECK, ["verify", "{tmp}/ds"], "not UTF-8",
         setup=_dataset_copy(edit=lambda t: (t / "ds.dataset.json").write_bytes(b'{"format": "\xff"}'))),
    # -- manifests given to the advisor -----------------------------------------------------------
    *[Case(f"optimize: manifest {section}.{key} = {value!r}", OPT, _opt(), f"manifest.json: {section}.{key}: ",
           setup=_run_copy(_set(section, key, value)))
      for section, key, value in (("values", "TP", 0), ("values", "MBS", 0), ("model", "name", []),
                                  ("values", "NUM_LAYERS", float("inf")), ("values", "LR", float("nan")),
                                  ("values", "PRECISION", 3), ("values", "ADAM_EPS", "small"),
                                  ("layout", "tp", True))],
    Case("optimize: manifest nested 100,000 deep", OPT, _opt(), "nested too deep",
         setup=lambda t: (_run_copy()(t), (t / "run" / "manifest.json").write_text(DEEP))),
    Case("optimize: metrics.jsonl not UTF-8", OPT, _opt(), "metrics.jsonl:2: not UTF-8",
         setup=lambda t: (_run_copy()(t), (t / "run" / "metrics.jsonl").write_bytes(
             b'{"iteration": 1}\n{"iteration": 2, "loss": "\xff\xfe"}\n'))),
    Case("optimize: metrics line with a string iteration", OPT, _opt(), "metrics.jsonl:1: iteration: ",
         setup=_run_copy(metrics=lambda t: '{"iteration": "one"}\n' + t)),
    # -- MLPerf logs --------------------------------------------------------------------------------
    *[Case(f"mlperf summary: eval_accuracy {value!r}", SUMMARY, ["{tmp}/mlperf.log", "--out", "{tmp}/o"],
           "mlperf.log:3: value: ", setup=write("mlperf.log", mlperf_log(value)))
      for value in ("3.1", None, [3.1], {"loss": 3.1}, True)],
    Case("mlperf summary: an event nested 100,000 deep", SUMMARY, ["{tmp}/mlperf.log", "--out", "{tmp}/o"],
         "nested too deep", setup=write("mlperf.log", ":::MLLOG " + DEEP + "\n" + mlperf_log())),
    Case("mlperf summary: not UTF-8", SUMMARY, ["{tmp}/mlperf.log", "--out", "{tmp}/o"], "not UTF-8",
         setup=write("mlperf.log", mlperf_log().encode() + b":::MLLOG {\"key\": \"\xff\"}\n")),
    Case("mlperf rcp: --ruleset 99.0.0", "training.mlperf.rcp", ["--ruleset", "99.0.0"], "99.0.0"),
    Case("mlperf compliance: --ruleset 99.0.0", "training.mlperf.compliance",
         ["{tmp}/mlperf.log", "--ruleset", "99.0.0"], "99.0.0", setup=write("mlperf.log", mlperf_log())),
    # -- benchmark JSON ---------------------------------------------------------------------------
    Case("bench table: nested 100,000 deep", BENCH, ["table", "{tmp}/d.json"], "nested too deep",
         setup=write("d.json", DEEP)),
    Case("bench table: a point's tokens/s a string", BENCH, ["table", "{tmp}/p.json"],
         "p.json: points.0.tokens_per_s_per_gpu: ",
         setup=write("p.json", json.dumps({"kind": "toggles", "points": [{"tokens_per_s_per_gpu": "fast"}]}))),
    # -- convergence grids --------------------------------------------------------------------------
    Case("convergence: YAML alias bomb", CONV, ["{tmp}/grid.yaml", "--dry-run", "--experiment-dir", "{tmp}/exp"],
         "alias", setup=write("grid.yaml", BOMB)),
    Case("convergence: YAML nested 100,000 deep", CONV,
         ["{tmp}/grid.yaml", "--dry-run", "--experiment-dir", "{tmp}/exp"], "nested too deep",
         setup=write("grid.yaml", DEEP)),
    Case("convergence: grid not UTF-8", CONV, ["{tmp}/grid.yaml", "--dry-run", "--experiment-dir", "{tmp}/exp"],
         "not UTF-8", setup=write("grid.yaml", b"name: g\xff\n")),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_bad_record_is_one_line_naming_the_field(case, fixtures, tmp_path, monkeypatch):  # noqa: F811
    check_case(case, tmp_path, monkeypatch, {"tok": FX["tok"]}, quiet_stdout=case.tool == LAUNCH)
