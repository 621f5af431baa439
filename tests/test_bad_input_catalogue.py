"""Every command-line tool on bad input: exit 2 (1 for a run that starts and fails on its input),
one line on stderr that says what is wrong, and no traceback (the bar: zero).

Each case runs the tool's main(argv) in this process (stdout/stderr captured, the environment
patched, "Exception ignored in ... __del__" reports collected), or a bash entry point as a
subprocess. A traceback, an exception that escapes main(), a stray __del__ report, a second
line on stderr, another exit status, or a line that lacks the expected words fails the case.
The entry points are found by listing the repository (test_every_entry_point_is_catalogued):
a new `python -m training.<x>` tool, examples/*.sh or launchers/ script must be added here.
"""
from __future__ import annotations

import bz2
import gzip
import json
import lzma
import os
import shutil
from pathlib import Path
from typing import Callable

import pytest

from tests.bad_input import REPO, Case, check_case, write
from tests.test_bad_input_launcher import CASES as LAUNCHER_CASES
RUN = REPO / "tests" / "data" / "runs" / "h200_l8_native"
LEVERS = REPO / "tests" / "data" / "levers_fixture.json"
TRACE = REPO / "tests" / "data" / "profiling" / "h200_ddp2" / "rank-0.json.gz"
MLPERF_LOG = REPO / "tests" / "mlperf" / "data" / "h200_short_run.mlperf.log"
DOCS = [f"document {i}: " + " ".join(["words", "and", "more", "words"] * (i % 7 + 1)) for i in range(40)]

pytestmark = pytest.mark.filterwarnings("ignore:Could not determine rank")


# ----------------------------------------------------------------------------- setups

def _all(*setups) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        for s in setups:
            s(tmp)
    return setup


JSONL = "".join(json.dumps({"text": t}) + "\n" for t in DOCS * 30).encode()
COMPRESS = {".gz": gzip.compress, ".bz2": bz2.compress, ".xz": lzma.compress}


def _cut(suffix: str, keep: float) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        if suffix == ".zst":
            import zstandard
            blob = zstandard.ZstdCompressor().compress(JSONL)
        else:
            blob = COMPRESS[suffix](JSONL)
        (tmp / f"cut.jsonl{suffix}").write_bytes(blob[: max(8, int(len(blob) * keep))])
    return setup


def _dataset_copy(name: str = "ds", edit: Callable[[Path], None] | None = None):
    def setup(tmp: Path) -> None:
        for ext in (".bin", ".idx", ".dataset.json"):
            shutil.copy(FX["ds"] + ext, tmp / f"{name}{ext}")
        if edit:
            edit(tmp)
    return setup


def _unrecorded(edit: Callable[[Path], None] | None = None):
    """A .bin/.idx pair made elsewhere (no record), for `adopt`."""
    def setup(tmp: Path) -> None:
        for ext in (".bin", ".idx"):
            shutil.copy(FX["ds"] + ext, tmp / f"ext{ext}")
        if edit:
            edit(tmp)
    return setup


def _run_copy(edit: Callable[[dict], None] | None = None, metrics: Callable[[str], str] | None = None):
    def setup(tmp: Path) -> None:
        shutil.copytree(RUN, tmp / "run")
        if edit:
            m = json.loads((tmp / "run" / "manifest.json").read_text())
            edit(m)
            (tmp / "run" / "manifest.json").write_text(json.dumps(m))
        if metrics:
            p = tmp / "run" / "metrics.jsonl"
            p.write_text(metrics(p.read_text()))
    return setup


def _set(section: str, key: str, value):
    return lambda m: m[section].__setitem__(key, value)


def _c4(first=768, last=769, valid=True, train=True) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        (tmp / "c4").mkdir()
        line = json.dumps({"text": "a document", "url": "u", "timestamp": "t"}) + "\n"
        shards = ([f"c4-train.{i:05d}-of-01024.json.gz" for i in range(first, last + 1)] if train else [])
        shards += [f"c4-validation.{i:05d}-of-00008.json.gz" for i in range(8)] if valid else []
        for name in shards:
            (tmp / "c4" / name).write_bytes(gzip.compress((line * 3).encode()))
    return setup


def _c4_env(**over) -> dict[str, str]:
    env = {"C4_DIR": "{tmp}/c4", "TOKENIZER": "{tok}", "OUT": "{tmp}/out", "FIRST_SHARD": "768",
           "LAST_SHARD": "769", "VALID_DOCS": "5"}
    env.update(over)
    return env


def _tiny_hf(weights: bytes, index: str | None = None) -> Callable[[Path], None]:
    """A Hugging Face folder whose config.json is the tiny preset's, with the given weights file
    (and safetensors index)."""
    def setup(tmp: Path) -> None:
        from training.checkpoint.layout import Architecture
        from training.launch.presets import PRESETS

        (tmp / "hf").mkdir()
        config = Architecture.from_preset(PRESETS["tiny"]).hf_config_fields()
        (tmp / "hf" / "config.json").write_text(json.dumps(config))
        (tmp / "hf" / "model.safetensors").write_bytes(weights)
        if index is not None:
            (tmp / "hf" / "model.safetensors.index.json").write_text(index)
    return setup


GRID_OK = "name: g\nfixed: {NUM_LAYERS: 2}\naxes: {ADAM_EPS: [1.0e-8, 1.0e-5]}\n"
PREP = "training.data.prepare"
CHECK = "training.data.check"
TOK = "training.data.tokenizer"
OPT = "training.optimize.__main__"
BENCH = "training.bench.__main__"
CONV = "training.convergence.__main__"
TRACE_REPORT = "training.profiling.trace_report"
C4 = "training.data.c4"
PREPARE_C4 = "examples/mlperf/llama31_8b/prepare_c4.sh"


def _prep(*inputs: str, prefix: str = "{tmp}/out/ds", extra=()) -> list[str]:
    return [*inputs, "--tokenizer", "{tok}", "--output-prefix", prefix, "--no-progress", *extra]


def _opt(run: str = "{tmp}/run", *extra: str) -> list[str]:
    return [run, "--levers", str(LEVERS), "--no-json", "--quiet", *extra]


GRID = ["{tmp}/grid.yaml", "--dry-run", "--experiment-dir", "{tmp}/exp"]


def _grid(text: str) -> Callable[[Path], None]:
    return write("grid.yaml", text)


CASES: list[Case] = [
    # -- training.data.prepare -------------------------------------------------------------
    Case("prepare: --output-prefix ''", PREP, _prep("{tmp}/a.jsonl", prefix=""), "empty",
         setup=write("a.jsonl", JSONL)),
    Case("prepare: prefix with a space", PREP, _prep("{tmp}/a.jsonl", prefix="{tmp}/my data/x"),
         "contains whitespace", setup=write("a.jsonl", JSONL)),
    Case("prepare: prefix that reads as a number", PREP, _prep("{tmp}/a.jsonl", prefix="0.5"),
         "would read it as a weight", setup=write("a.jsonl", JSONL)),
    Case("prepare: prefix names a folder", PREP, _prep("{tmp}/a.jsonl", prefix="{tmp}/"), "is a directory",
         setup=write("a.jsonl", JSONL)),
    Case("prepare: prefix with .bin", PREP, _prep("{tmp}/a.jsonl", prefix="{tmp}/x.bin"), "without .bin/.idx",
         setup=write("a.jsonl", JSONL)),
    Case("prepare: --chunk-mb nan", PREP, _prep("{tmp}/a.jsonl", extra=["--chunk-mb", "nan"]),
         "--chunk-mb: must be a positive number", setup=write("a.jsonl", JSONL)),
    Case("prepare: --chunk-mb -1", PREP, _prep("{tmp}/a.jsonl", extra=["--chunk-mb", "-1"]),
         "--chunk-mb: must be a positive number", setup=write("a.jsonl", JSONL)),
    Case("prepare: --workers 0", PREP, _prep("{tmp}/a.jsonl", extra=["--workers", "0"]), "--workers",
         setup=write("a.jsonl", JSONL)),
    Case("prepare: --workers two", PREP, _prep("{tmp}/a.jsonl", extra=["--workers", "two"]), "--workers",
         setup=write("a.jsonl", JSONL)),
    Case("prepare: --show-skips -1", PREP, _prep("{tmp}/a.jsonl", extra=["--show-skips", "-1"]),
         "--show-skips", setup=write("a.jsonl", JSONL)),
    Case("prepare: no input", PREP, ["--tokenizer", "{tok}", "--output-prefix", "{tmp}/ds"], "INPUT"),
    Case("prepare: missing input", PREP, _prep("{tmp}/nope.jsonl"), "no such file"),
    Case("prepare: glob matching nothing", PREP, _prep("{tmp}/*.zst"), "no file matches"),
    Case("prepare: input is a folder", PREP, _prep("{tmp}/sub"), "is a directory",
         setup=write("sub/a.jsonl", JSONL)),
    Case("prepare: unknown file type", PREP, _prep("{tmp}/a.dat"), "--format", setup=write("a.dat", JSONL)),
    Case("prepare: input named twice", PREP, _prep("{tmp}/a.jsonl", "{tmp}/a.jsonl"), "given twice",
         setup=write("a.jsonl", JSONL)),
    Case("prepare: missing tokenizer", PREP, ["{tmp}/a.jsonl", "--tokenizer", "{tmp}/none", "--output-prefix",
                                               "{tmp}/ds"], "no such file", setup=write("a.jsonl", JSONL)),
    Case("prepare: tokenizer folder without tokenizer.json", PREP,
         ["{tmp}/a.jsonl", "--tokenizer", "{tmp}/emptytok", "--output-prefix", "{tmp}/ds"],
         "no tokenizer.json", setup=_all(write("a.jsonl", JSONL), write("emptytok/x", ""))),
    Case("prepare: existing output", PREP, _prep("{tmp}/a.jsonl", prefix="{tmp}/ds"), "pass --overwrite",
         setup=_all(write("a.jsonl", JSONL), _dataset_copy())),
    Case("prepare: every line bad", PREP, _prep("{tmp}/bad.jsonl"), "no documents in the input", code=1,
         setup=write("bad.jsonl", "{bad\n[1,\n")),
    *[Case(f"prepare: {s} cut {how}", PREP, _prep(f"{{tmp}}/cut.jsonl{s}"), "cannot read the", code=1,
           setup=_cut(s, keep)) for s in (".gz", ".zst", ".bz2", ".xz")
      for how, keep in (("in half", 0.5), ("early", 0.0))],
    # -- training.data.check ---------------------------------------------------------------
    Case("check: no command", CHECK, [], "required"),
    Case("check verify: empty DATA_PATH", CHECK, ["verify", ""], "DATA_PATH is empty"),
    Case("check verify: weights out of pairs", CHECK, ["verify", "0.5 {tmp}/a 0.3"], "pairs"),
    Case("check verify: missing dataset", CHECK, ["verify", "{tmp}/nothing"], "not found"),
    Case("check verify: truncated .idx", CHECK, ["verify", "{tmp}/ds"], "ds.idx",
         setup=_dataset_copy(edit=lambda t: (t / "ds.idx").write_bytes((t / "ds.idx").read_bytes()[:200]))),
    Case("check verify: garbage .idx", CHECK, ["verify", "{tmp}/ds"], "ds.idx",
         setup=_dataset_copy(edit=lambda t: (t / "ds.idx").write_bytes(os.urandom(2000)))),
    Case("check verify: .idx of another dataset", CHECK, ["verify", "{tmp}/ds"], "ds.idx",
         setup=_dataset_copy(edit=lambda t: shutil.copy(FX["other"] + ".idx", t / "ds.idx"))),
    Case("check verify: .idx with its record's size but another run's content", CHECK, ["verify", "{tmp}/ds"],
         "two preparations", setup=_dataset_copy(edit=lambda t: _flip_pointer(t / "ds.idx"))),
    Case("check verify: cut .bin", CHECK, ["verify", "{tmp}/ds"], "ds.bin",
         setup=_dataset_copy(edit=lambda t: (t / "ds.bin").write_bytes((t / "ds.bin").read_bytes()[:100]))),
    Case("check verify --full: .bin changed in place", CHECK, ["verify", "{tmp}/ds", "--full"], "SHA-256",
         setup=_dataset_copy(edit=lambda t: _flip_byte(t / "ds.bin"))),
    Case("check verify: tokenizer that does not exist", CHECK,
         ["verify", "{tmp}/ds", "--tokenizer-model", "{tmp}/none"], "no such file", setup=_dataset_copy()),
    Case("check adopt: truncated .idx", CHECK, ["adopt", "{tmp}/ext", "--tokenizer-model", "{tok}"], "truncated",
         setup=_unrecorded(lambda t: (t / "ext.idx").write_bytes((t / "ext.idx").read_bytes()[:100]))),
    Case("check adopt: garbage .idx", CHECK, ["adopt", "{tmp}/ext", "--tokenizer-model", "{tok}"],
         "not a Megatron index", setup=_unrecorded(lambda t: (t / "ext.idx").write_bytes(os.urandom(5000)))),
    Case("check adopt: empty .bin", CHECK, ["adopt", "{tmp}/ext", "--tokenizer-model", "{tok}"], "ext.bin has 0",
         setup=_unrecorded(lambda t: (t / "ext.bin").write_bytes(b""))),
    Case("check adopt: .idx of another dataset", CHECK, ["adopt", "{tmp}/ext", "--tokenizer-model", "{tok}"],
         "not one dataset", setup=_unrecorded(lambda t: shutil.copy(FX["other"] + ".idx", t / "ext.idx"))),
    Case("check adopt: missing files", CHECK, ["adopt", "{tmp}/none", "--tokenizer-model", "{tok}"], "not found"),
    Case("check adopt: record exists", CHECK, ["adopt", "{tmp}/ds", "--tokenizer-model", "{tok}"],
         "--overwrite", setup=_dataset_copy()),
    # -- training.data.tokenizer -----------------------------------------------------------
    Case("tokenizer train: empty corpus", TOK, ["train", "{tmp}/e.jsonl", "--out", "{tmp}/t"], "no documents",
         setup=write("e.jsonl", "")),
    Case("tokenizer train: garbage corpus", TOK, ["train", "{tmp}/g.txt", "--out", "{tmp}/t"], "no documents",
         setup=write("g.txt", b"\xff\xfe\x00garbage\xc3")),
    Case("tokenizer train: --vocab-size 1e9", TOK,
         ["train", "{tmp}/a.jsonl", "--out", "{tmp}/t", "--vocab-size", "1000000000"], "at most",
         setup=write("a.jsonl", JSONL)),
    Case("tokenizer train: --vocab-size 10", TOK, ["train", "{tmp}/a.jsonl", "--out", "{tmp}/t", "--vocab-size",
                                                   "10"], "at least", setup=write("a.jsonl", JSONL)),
    Case("tokenizer train: --min-frequency -3", TOK,
         ["train", "{tmp}/a.jsonl", "--out", "{tmp}/t", "--min-frequency", "-3"], "--min-frequency",
         setup=write("a.jsonl", JSONL)),
    Case("tokenizer train: --out is a file", TOK, ["train", "{tmp}/a.jsonl", "--out", "{tmp}/a.jsonl"], "is a file",
         setup=write("a.jsonl", JSONL)),
    Case("tokenizer info: missing", TOK, ["info", "{tmp}/none"], "no such file"),
    Case("tokenizer info: garbage tokenizer.json", TOK, ["info", "{tmp}/bad"], "cannot load",
         setup=_all(write("bad/tokenizer.json", "{nope"), write("bad/tokenizer_config.json", "{}"))),
    Case("tokenizer wrap: garbage file", TOK, ["wrap", "{tmp}/x.json", "--eod-token", "e", "--out", "{tmp}/w"],
         "not a tokenizers JSON", setup=write("x.json", "[]")),
    # -- training.data.sample ------------------------------------------------------------
    Case("sample: --out is a file", "training.data.sample", ["--out", "{tmp}/f"], "is a file",
         setup=write("f", "")),
    Case("sample: --vocab-size 5", "training.data.sample", ["--out", "{tmp}/s", "--vocab-size", "5"], "at least"),
    Case("sample: --valid-fraction 2", "training.data.sample", ["--out", "{tmp}/s", "--valid-fraction", "2"],
         "between 0 and 1"),
    Case("sample: --valid-fraction nan", "training.data.sample",
         ["--out", "{tmp}/s", "--valid-fraction", "nan"], "between 0 and 1"),
    Case("sample: --workers 0", "training.data.sample", ["--out", "{tmp}/s", "--workers", "0"], "--workers"),
    # -- training.data.bench_prepare ---------------------------------------------------
    Case("bench_prepare: --repeats 0", "training.data.bench_prepare", ["--repeats", "0"], "--repeats"),
    Case("bench_prepare: missing tokenizer", "training.data.bench_prepare",
         ["--tokenizer", "{tmp}/none", "--cache", "{tmp}", "--out", "{tmp}/b.json"], "{tmp}/none"),
    # -- training.data.c4 (prepare_c4.sh's checks) ------------------------------------
    Case("c4 check: settings missing", C4, ["check"], "set C4_DIR"),
    Case("c4 check: reversed shard range", C4, ["check"], "FIRST_SHARD=895 is after LAST_SHARD=768",
         env=_c4_env(FIRST_SHARD="895", LAST_SHARD="768")),
    Case("c4 check: shard not a number", C4, ["check"], "FIRST_SHARD='7x'", env=_c4_env(FIRST_SHARD="7x")),
    Case("c4 check: shard past 1023", C4, ["check"], "LAST_SHARD", env=_c4_env(LAST_SHARD="1024")),
    Case("c4 check: VALID_DOCS 0", C4, ["check"], "VALID_DOCS", env=_c4_env(VALID_DOCS="0")),
    Case("c4 check: C4_DIR missing", C4, ["check"], "not a folder", env=_c4_env()),
    Case("c4 check: a validation shard missing", C4, ["check"], "c4-validation.00000-of-00008.json.gz",
         setup=_c4(valid=False), env=_c4_env()),
    Case("c4 check: OUT is a file", C4, ["check"], "is a file", setup=_all(_c4(), write("o", "")),
         env=_c4_env(OUT="{tmp}/o")),
    Case("c4 check: OUT with a space", C4, ["check"], "whitespace", setup=_c4(), env=_c4_env(OUT="{tmp}/o o")),
    Case("c4 valid-json: a shard cut in half", C4, ["valid-json", "{tmp}/v.jsonl"], "cannot read", code=1,
         setup=lambda t: (_c4()(t), (t / "c4/c4-validation.00000-of-00008.json.gz").write_bytes(
             gzip.compress(JSONL)[:300])), env=_c4_env(VALID_DOCS="200")),
    Case("prepare_c4.sh: reversed shard range", PREPARE_C4, [], "FIRST_SHARD=895 is after LAST_SHARD=768",
         env=_c4_env(FIRST_SHARD="895", LAST_SHARD="768")),
    Case("prepare_c4.sh: C4_DIR unset", PREPARE_C4, [], "set C4_DIR", env={"TOKENIZER": "{tok}", "OUT": "{tmp}/out"}),
    # -- training.bench ----------------------------------------------------------------
    Case("bench table: missing JSON", BENCH, ["table", "{tmp}/none.json"], "no such file"),
    Case("bench table: empty JSON", BENCH, ["table", "{tmp}/e.json"], "e.json", setup=write("e.json", "")),
    Case("bench table: truncated JSON", BENCH, ["table", "{tmp}/t.json"], "t.json",
         setup=write("t.json", '{"name": "x", "points": [')),
    Case("bench table: not a benchmark JSON", BENCH, ["table", "{tmp}/o.json"], "not a benchmark",
         setup=write("o.json", '{"hello": 1}')),
    Case("bench table: a JSON list", BENCH, ["table", "{tmp}/l.json"], "not a benchmark",
         setup=write("l.json", "[1, 2]")),
    Case("bench table: a folder", BENCH, ["table", "{tmp}"], "folder"),
    Case("bench: no command", BENCH, [], "required"),
    Case("bench levers: --bench-dir missing", BENCH, ["levers", "--bench-dir", "{tmp}/none", "--docs-dir", "{tmp}/d"],
         "no such folder"),
    Case("bench all: --slot 2/2", BENCH, ["all", "--plan", "--slot", "2/2"], "--slot"),
    Case("bench toggles: --steps 0", BENCH, ["toggles", "--plan", "--steps", "0"], "--steps"),
    Case("bench toggles: --repeats -1", BENCH, ["toggles", "--plan", "--repeats", "-1"], "--repeats"),
    Case("bench toggles: --budget-s nan", BENCH, ["toggles", "--plan", "--budget-s", "nan"], "--budget-s"),
    # -- training.convergence ----------------------------------------------------------
    Case("convergence: missing grid", CONV, ["{tmp}/none.yaml", "--dry-run"], "none.yaml"),
    Case("convergence: broken YAML", CONV, GRID, "YAML", setup=_grid("name: [x\n  bad: :")),
    Case("convergence: empty grid file", CONV, GRID, "mapping", setup=_grid("")),
    Case("convergence: fixed is a number", CONV, GRID, "fixed",
         setup=_grid("name: g\nfixed: 3\naxes: {ADAM_EPS: [1]}\n")),
    Case("convergence: axes is a list", CONV, GRID, "axes", setup=_grid("name: g\naxes: [1, 2]\n")),
    Case("convergence: timeout_s -5", CONV, GRID, "timeout_s", setup=_grid(GRID_OK + "timeout_s: -5\n")),
    Case("convergence: timeout_s abc", CONV, GRID, "timeout_s", setup=_grid(GRID_OK + "timeout_s: abc\n")),
    Case("convergence: budget_s -1", CONV, GRID, "budget_s", setup=_grid(GRID_OK + "budget_s: -1\n")),
    Case("convergence: args is a string", CONV, GRID, "args", setup=_grid(GRID_OK + "args: --foo\n")),
    Case("convergence: script missing", CONV, GRID, "nowhere/train.sh",
         setup=_grid(GRID_OK + "script: nowhere/train.sh\n")),
    Case("convergence: unknown toggle", CONV, GRID, "NOPE", setup=_grid("name: g\naxes: {NOPE: [1]}\n")),
    Case("convergence: --budget-s nan", CONV, ["{tmp}/grid.yaml", "--dry-run", "--budget-s", "nan"], "--budget-s",
         setup=write("grid.yaml", GRID_OK)),
    # -- training.profiling.trace_report ----------------------------------------------
    Case("trace_report: empty trace file", TRACE_REPORT, ["{tmp}/t.json"], "empty", setup=write("t.json", "")),
    Case("trace_report: garbage trace", TRACE_REPORT, ["{tmp}/t.json"], "t.json", setup=write("t.json", "{x")),
    Case("trace_report: truncated .json.gz", TRACE_REPORT, ["{tmp}/t.json.gz"], "t.json.gz",
         setup=lambda t: (t / "t.json.gz").write_bytes(TRACE.read_bytes()[:500])),
    Case("trace_report: missing path", TRACE_REPORT, ["{tmp}/none"], "does not exist"),
    Case("trace_report: --top 0", TRACE_REPORT, [str(TRACE), "--top", "0"], "--top"),
    # -- training.optimize --------------------------------------------------------------
    *[Case(f"optimize: manifest {section}.{key} = {value}", OPT, _opt(), f"{section}.{key}",
           setup=_run_copy(_set(section, key, value)))
      for section, key, value in (("model", "hidden_size", 0), ("model", "num_layers", 0),
                                  ("model", "seq_length", 0), ("model", "num_attention_heads", 0),
                                  ("layout", "mbs", 0), ("layout", "tp", 0), ("layout", "global_batch", 0),
                                  ("model", "hidden_size", -4096), ("model", "vocab_size", "big"))],
    *[Case(f"optimize: --want-{w} {v}", OPT, _opt(str(RUN), f"--want-{w}", v), f"--want-{w}")
      for w, v in (("mbs", "0"), ("seq-length", "-5"), ("global-batch", "0"), ("mbs", "two"))],
    Case("optimize: a metrics line broken in the middle", OPT, _opt(), "not a JSON line",
         setup=_run_copy(metrics=lambda t: "{cut\n" + t)),
    Case("optimize: missing run", OPT, _opt("{tmp}/none"), "no such file"),
    Case("optimize calibration: missing run", "training.optimize.calibration", ["{tmp}/none"], "no such file"),
    # -- training.metrics ---------------------------------------------------------------
    Case("metrics flops: --seq-length 0", "training.metrics", ["flops", "--model", "llama3-8B", "--seq-length", "0"],
         "--seq-length"),
    Case("metrics flops: --num-layers -2", "training.metrics",
         ["flops", "--model", "llama3-8B", "--num-layers", "-2"], "--num-layers"),
    Case("metrics flops: unknown model", "training.metrics", ["flops", "--model", "gpt9"], "unknown model"),
    Case("native op_timing: --repeats 0", "training.native.op_timing", ["--repeats", "0"], "--repeats"),
    Case("native op_timing: --device gpu9", "training.native.op_timing", ["--device", "gpu9"], "not a torch device"),
    Case("native wgrad_timing: --shapes llama", "training.native.wgrad_timing", ["--shapes", "llama", "--device", "cpu"], "matches none of"),
    Case("native wgrad_timing: --iters 0", "training.native.wgrad_timing", ["--iters", "0"], "--iters"),
    Case("native wgrad_timing: --table missing", "training.native.wgrad_timing", ["--table", "{tmp}/none.json"], "no such file"),
    Case("native wgrad_timing: --table not its JSON", "training.native.wgrad_timing", ["--check", "--table", "{tmp}/other.json"], "not a kernels-moe-wgrad JSON", setup=lambda tmp: (tmp / "other.json").write_text('{"shapes": 3}')),
    # -- training.mlperf ----------------------------------------------------------------
    Case("mlperf summary: missing log", "training.mlperf.summary", ["{tmp}/none"], "no mlperf.log"),
    Case("mlperf summary: empty log", "training.mlperf.summary", ["{tmp}/mlperf.log", "--out", "{tmp}/o"],
         "mlperf.log", setup=write("mlperf.log", "")),
    Case("mlperf summary: garbage log", "training.mlperf.summary", ["{tmp}/mlperf.log", "--out", "{tmp}/o"],
         "mlperf.log", setup=write("mlperf.log", ":::MLLOG {broken\n")),
    Case("mlperf summary: --target nan", "training.mlperf.summary", [str(MLPERF_LOG), "--target", "nan"],
         "--target"),
    Case("mlperf compliance: missing log", "training.mlperf.compliance", ["{tmp}/none"], "not a file"),
    Case("mlperf compliance: not an mlperf.log", "training.mlperf.compliance", ["{tmp}/x.log"], "no :::MLLOG",
         setup=write("x.log", "hello\n")),
    Case("mlperf compliance: --json into a missing folder", "training.mlperf.compliance",
         [str(MLPERF_LOG), "--json", "{tmp}/no/where.json"], "where.json"),
    Case("mlperf rcp: unknown ruleset", "training.mlperf.rcp", ["--ruleset", "9.9.9"], "9.9.9"),
    Case("mlperf token_routes: no inputs", "training.mlperf.token_routes", ["--out", "{tmp}/o.json"],
         "--tokenizer"),
    Case("mlperf token_routes: missing tokenizer", "training.mlperf.token_routes",
         ["{tmp}/x.jsonl", "--tokenizer", "{tmp}/notok", "--out", "{tmp}/o.json"], "notok",
         setup=write("x.jsonl", JSONL)),
    Case("mlperf token_routes: missing input", "training.mlperf.token_routes",
         ["{tmp}/none.jsonl", "--tokenizer", "{tok}", "--out", "{tmp}/o.json"], "none.jsonl"),
    Case("mlperf index: no --world-size", "training.mlperf.index", ["--seed", "3"], "--world-size"),
    Case("mlperf index: not an MLPerf run", "training.mlperf.index", ["--world-size", "1", "--seed", "3"],
         "MLPERF_RUN", env={"MLPERF_RUN": ""}),
    Case("mlperf submission: --runs 0", "training.mlperf.submission",
         ["run", "--org", "a", "--platform", "h200", "--out", "{tmp}/sub", "--runs", "0"], "--runs"),
    Case("mlperf submission: missing --system-json", "training.mlperf.submission",
         ["assemble", "--org", "a", "--platform", "h200", "--out", "{tmp}/sub", "--system-json",
          "{tmp}/none.json", "{tmp}/run"], "none.json"),
    Case("mlperf submission: --system-json not an object", "training.mlperf.submission",
         ["assemble", "--org", "a", "--platform", "h200", "--out", "{tmp}/sub", "--system-json",
          "{tmp}/s.json", "{tmp}/run"], "s.json", setup=write("s.json", "[1]")),
    Case("mlperf submission check: no results folder", "training.mlperf.submission", ["check", "{tmp}"],
         "results/"),
    # -- training.optimize.preflight (the launcher's command line with the memory check) --------
    Case("preflight: PREFLIGHT_MEMORY=bogus", "training.optimize.preflight",
         ["--family", "llama3", "PREFLIGHT_MEMORY=bogus"], "PREFLIGHT_MEMORY",
         env={"DRY_RUN": "1", "EXPERIMENT_DIR": "{tmp}/exp"}),
    Case("preflight --recommend: --family without a value", "training.optimize.preflight",
         ["--recommend", "--family"], "--family"),
    # -- the projection's tools (docs/scale.md) ----------------------------------------------
    Case("project: unknown platform", "training.optimize.project", ["PLATFORM=nope"], "PLATFORM"),
    Case("project: fp4 where the GPU does not run it", "training.optimize.project",
         ["PLATFORM=h100", "PRECISION=nvfp4"], "PRECISION=nvfp4"),
    Case("search: unknown model size", "training.optimize.search", ["MODEL_SIZE=nope"],
         "MODEL_SIZE"),
    Case("time_to_train: unknown platform", "training.optimize.time_to_train", ["PLATFORM=nope"],
         "PLATFORM"),
    Case("references: missing file", "training.optimize.references",
         ["--references", "{tmp}/none.json"], "none.json"),
    Case("references: not a list of references", "training.optimize.references",
         ["--references", "{tmp}/r.json"], "'references'", setup=write("r.json", "[1]")),
    Case("references: a figure that is no positive number", "training.optimize.references",
         ["--references", "{tmp}/r.json"], "tokens_per_s_per_gpu",
         setup=write("r.json", '{"references": [{"id": "x", "family": "llama3", "source": "s", '
                               '"setup": "s", "words": ["PLATFORM=h100"], '
                               '"tokens_per_s_per_gpu": -3}]}')),
    Case("references: words that are no KEY=VALUE list", "training.optimize.references",
         ["--references", "{tmp}/r.json"], "words",
         setup=write("r.json", '{"references": [{"id": "x", "family": "llama3", "source": "s", '
                               '"setup": "s", "words": "PLATFORM=h100", '
                               '"tokens_per_s_per_gpu": 3}]}')),
    # -- training.numerics, training.versions ------------------------------------------
    Case("numerics table: missing JSON", "training.numerics", ["table", "{tmp}/none.json"], "none.json"),
    Case("numerics table: garbage JSON", "training.numerics", ["table", "{tmp}/g.json"], "g.json",
         setup=write("g.json", "{")),
    Case("numerics run: unknown part", "training.numerics", ["run", "shapes", "--out", "{tmp}"], "part"),
    Case("versions unchanged: missing snapshot", "training.versions",
         ["--no-torch", "unchanged", "{tmp}/none.json", "torch"], "none.json"),
    Case("versions unchanged: garbage snapshot", "training.versions",
         ["--no-torch", "unchanged", "{tmp}/g.json", "torch"], "g.json", setup=write("g.json", "{")),
    Case("versions snapshot: into a missing folder", "training.versions",
         ["--no-torch", "snapshot", "{tmp}/no/where.json"], "where.json"),
    # -- training.launch and friends ---------------------------------------------------
    # training.launch, train_llama3.sh and train_llama2.sh: tests/test_bad_input_launcher.py
    Case("docker_run.sh: DATA_PATH not on this host", "launchers/docker_run.sh", ["DATA_PATH={tmp}/none"],
         "not found on this host", env={"DRY_RUN": "1", "PLATFORM": "h200"}),
    Case("run_llama31_8b.sh: MLPERF_DIVISION=semi", "examples/mlperf/llama31_8b/run_llama31_8b.sh",
         ["MLPERF_DIVISION=semi"], "MLPERF_DIVISION", env={"DRY_RUN": "1", "EXPERIMENT_DIR": "{tmp}/exp"}),
    Case("launch.docs: --readme missing", "training.launch.docs", ["--check", "--readme", "{tmp}/none.md"],
         "none.md"),
    Case("deploy.image: unknown action", "training.deploy.image", ["frobnicate"], "frobnicate"),
    Case("deploy.image: check-megatron for an unknown platform", "training.deploy.image",
         ["check-megatron", "cuda"], "check-megatron cuda"),
    Case("deploy.cluster: unknown command", "training.deploy.cluster", ["deploy"], "deploy"),
    Case("deploy.docker: missing script", "training.deploy.docker", ["{tmp}/none.sh"], "none.sh",
         env={"DRY_RUN": "1", "PLATFORM": "h200"}),
    Case("floors: unknown option", "training.floors", ["--frobnicate"], "--frobnicate"),
    # -- training.checkpoint (Hugging Face import/export), its benchmark -----------------
    Case("checkpoint: unknown command", "training.checkpoint.__main__", ["convert"], "convert"),
    Case("checkpoint import: config.json not an object", "training.checkpoint.__main__",
         ["import", "{tmp}/hf", "{tmp}/out"], "not an object", setup=write("hf/config.json", "[1]")),
    Case("checkpoint import: config.json cut short", "training.checkpoint.__main__",
         ["import", "{tmp}/hf", "{tmp}/out"], "config.json", setup=write("hf/config.json", '{"model_type": ')),
    Case("checkpoint import: safetensors header not an object", "training.checkpoint.__main__",
         ["import", "{tmp}/hf", "{tmp}/out", "--no-progress"], "not a safetensors file",
         setup=_tiny_hf(b"\x02" + b"\0" * 7 + b"[]")),
    Case("checkpoint import: safetensors entry without offsets", "training.checkpoint.__main__",
         ["import", "{tmp}/hf", "{tmp}/out", "--no-progress"], "data_offsets",
         setup=_tiny_hf(len(b'{"w": {"dtype": "BF16"}}').to_bytes(8, "little") + b'{"w": {"dtype": "BF16"}}')),
    Case("checkpoint import: garbage safetensors index", "training.checkpoint.__main__",
         ["import", "{tmp}/hf", "{tmp}/out", "--no-progress"], "safetensors index",
         setup=_tiny_hf(b"", index="{")),
    Case("checkpoint import: --workers 0", "training.checkpoint.__main__",
         ["import", "{tmp}/hf", "{tmp}/out", "--workers", "0"], "--workers"),
    Case("checkpoint export: --max-shard-size 0", "training.checkpoint.__main__",
         ["export", "{tmp}", "{tmp}/hf", "--max-shard-size", "0"], "--max-shard-size"),
    Case("checkpoint.bench: --repeats 0", "training.checkpoint.bench", ["--repeats", "0"], "--repeats"),
    Case("checkpoint.bench: --out in a missing folder", "training.checkpoint.bench",
         ["--out", "{tmp}/no/where.json", "--dir", "{tmp}/work"], "no/where.json"),
    # -- the run side's own command lines (the image build runs them) -------------------
    Case("arguments parse: TP=abc", "training.arguments", ["parse", "--tensor-model-parallel-size", "abc"],
         "--tensor-model-parallel-size"),
    Case("arguments: no command", "training.arguments", [], "parse"),
    Case("megatron_patches: unknown command", "training.megatron_patches", ["apply"], "check"),
    Case("mlperf.docs: --readme missing", "training.mlperf.docs", ["--check", "--readme", "{tmp}/none.md"],
         "none.md"),
    # -- the MoE family (issue 25): its launcher, docs, FLOPs command and train scripts ----
    Case("moe launch: EP=3 for 8 experts", "training.moe.launch", ["--family", "mixtral", "EP=3"], "EP=3",
         env={"DRY_RUN": "1", "EXPERIMENT_DIR": "{tmp}/exp"}),
    Case("moe launch: MOE_AUX_LOSS_COEFF=nan", "training.moe.launch",
         ["--family", "qwen3_moe", "MOE_AUX_LOSS_COEFF=nan"], "MOE_AUX_LOSS_COEFF",
         env={"DRY_RUN": "1", "EXPERIMENT_DIR": "{tmp}/exp"}),
    Case("moe flops: unknown model", "training.moe.__main__", ["flops", "--model", "nope"], "nope"),
    Case("moe flops: --num-layers 0", "training.moe.__main__",
         ["flops", "--model", "qwen3-30B-A3B", "--num-layers", "0"], "--num-layers"),
    Case("moe.docs: --readme missing", "training.moe.docs", ["--check", "--readme", "{tmp}/none.md"], "none.md"),
    Case("train_mixtral.sh: EP=abc", "examples/moe/train_mixtral.sh", ["EP=abc"], "EP",
         env={"DRY_RUN": "1", "EXPERIMENT_DIR": "{tmp}/exp"}),
    Case("train_qwen3_moe.sh: MODEL_SIZE=nope", "examples/moe/train_qwen3_moe.sh", ["MODEL_SIZE=nope"],
         "MODEL_SIZE", env={"DRY_RUN": "1", "EXPERIMENT_DIR": "{tmp}/exp"}),
    Case("mlperf launch: TP=abc", "training.mlperf.launch", ["TP=abc"], "TP",
         env={"DRY_RUN": "1", "EXPERIMENT_DIR": "{tmp}/exp"}),
    # -- training.resilience ---------------------------------------------------------------
    Case("supervise: no -- before the command", "training.resilience.supervise",
         ["--run-dir", "{tmp}/run", "torchrun"], "-- COMMAND"),
    Case("supervise: --restarts -1", "training.resilience.supervise",
         ["--run-dir", "{tmp}/run", "--restarts", "-1", "--", "torchrun"], "--restarts"),
    Case("supervise: nothing after --", "training.resilience.supervise",
         ["--run-dir", "{tmp}/run", "--"], "no command after --"),
    Case("rehearsal: --iters 5", "training.resilience.rehearsal", ["--out", "{tmp}/r", "--iters", "5"],
         "--iters must be at least 15"),
    Case("rehearsal: --seed x", "training.resilience.rehearsal", ["--out", "{tmp}/r", "--seed", "x"],
         "--seed"),
]


# ----------------------------------------------------------------------------- fixtures and running

FX: dict[str, str] = {}


def _flip_pointer(idx: Path) -> None:
    """An index of the same size and counts that still describes its .bin, but not the one its
    record names: the first document one token longer, the last one shorter (uint16 tokens)."""
    import numpy as np

    data = bytearray(idx.read_bytes())
    seqs = int.from_bytes(data[18:26], "little")
    lengths = np.frombuffer(data, np.int32, seqs, 34).copy()
    pointers = np.frombuffer(data, np.int64, seqs, 34 + 4 * seqs).copy()
    lengths[0] += 1
    lengths[-1] -= 1
    pointers[1:] += 2
    data[34:34 + 4 * seqs] = lengths.tobytes()
    data[34 + 4 * seqs:34 + 12 * seqs] = pointers.tobytes()
    idx.write_bytes(bytes(data))


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory):
    """A tokenizer and two datasets (made here; nothing downloaded)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from training.data import prepare as prep
    from training.data.tokenizer import train_bpe

    root = tmp_path_factory.mktemp("catalogue")
    tok = str(root / "tok")
    train_bpe(DOCS, 300, tok)
    for name, docs in (("ds", DOCS), ("other", DOCS[:25])):
        src = root / f"{name}.jsonl"
        src.write_text("".join(json.dumps({"text": t}) + "\n" for t in docs))
        prep.prepare([str(src)], str(root / name), tok, progress=False, workers=1)
    FX.update(tok=tok, ds=str(root / "ds"), other=str(root / "other"))
    return FX


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_line_without_traceback(case, fixtures, tmp_path, monkeypatch):
    check_case(case, tmp_path, monkeypatch, {"tok": FX["tok"]})


# ----------------------------------------------------------------------------- coverage of entry points

def _entry_points() -> set[str]:
    modules = set()
    for path in (REPO / "training").rglob("*.py"):
        text = path.read_text()
        if 'if __name__ == "__main__":' in text or path.name == "__main__.py":
            rel = path.relative_to(REPO).with_suffix("")
            modules.add(".".join(rel.parts))
    scripts = {str(p.relative_to(REPO)) for folder in ("examples", "launchers")
               for p in (REPO / folder).rglob("*") if p.suffix in (".sh", ".sbatch")}
    return modules | scripts


# Entry points without a bad-input case here, and why.
NOT_CATALOGUED = {
    "training.bench.hf_peer": "run by the bench harness under torchrun with arguments it builds",
    "training.bench.titan_peer": "run by the bench harness under torchrun with arguments it builds",
    "training.pretrain_gpt": "run by the launcher under torchrun; Megatron's own parser takes its arguments",
    "training.launch.environment": "takes no arguments (prints the preset table)",
    "training.deploy.gpu_check": "takes no arguments (make train's GPU check)",
    "training.launch.megatron_flags": "takes no arguments (rewrites the recorded Megatron parser)",
    "training.resilience.torchrun": "torch's torchrun (its own parser), run by the supervisor",
    "examples/lib/launch.sh": "sourced by the train scripts, not run",
    "launchers/slurm/train.sbatch": "needs a Slurm allocation; its checks are python -m training.deploy.cluster's",
    "launchers/slurm/node.sh": "run by train.sbatch on each node; python -m training.deploy.cluster checks",
    "examples/mlperf/llama31_8b/short_run.sh": "a fixed GPU demo (its one argument is OUTDIR); runs the launch, "
                                                "compliance and summary tools, each catalogued",
}


def test_every_entry_point_is_catalogued():
    covered = {c.tool for c in CASES + LAUNCHER_CASES}
    missing = sorted(_entry_points() - covered - set(NOT_CATALOGUED))
    assert not missing, f"entry points without a bad-input case: {missing}"
    assert not set(NOT_CATALOGUED) - _entry_points(), "NOT_CATALOGUED names something that is gone"
