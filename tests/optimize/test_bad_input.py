"""Bad input: one line on stderr, exit status 2, no traceback."""
from __future__ import annotations

import json

import pytest

from .helpers import DRY_ALL_ON, FIXTURE, NATIVE, copy_run, edit_manifest, fixture_levers, run_cli, write_levers


def assert_one_line_error(code, out, err, *needles):
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0]


def test_unknown_path(tmp_path, capsys):
    assert_one_line_error(*run_cli(capsys, tmp_path / "nowhere", "--levers", FIXTURE),
                    "no such file or folder")


def test_run_folder_without_manifest(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text("{}\n")
    assert_one_line_error(*run_cli(capsys, tmp_path / "run", "--levers", FIXTURE),
                    "no manifest.json", "not a run folder")


def test_several_runs_below_a_folder(tmp_path, capsys):
    copy_run(NATIVE, tmp_path / "exp" / "a")
    copy_run(NATIVE, tmp_path / "exp" / "b")
    assert_one_line_error(*run_cli(capsys, tmp_path / "exp", "--levers", FIXTURE), "2 run folders",
                    "name one")


def test_one_run_below_a_folder_is_found(tmp_path, capsys):
    copy_run(NATIVE, tmp_path / "exp" / "bf16" / "1")
    code, out, err = run_cli(capsys, tmp_path / "exp", "--levers", FIXTURE, "--quiet")
    assert code == 0, err
    assert (tmp_path / "exp" / "bf16" / "1" / "optimize.json").is_file()


def test_manifest_that_is_not_json(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text("{not json")
    assert_one_line_error(*run_cli(capsys, run, "--levers", FIXTURE), "invalid or cut-short JSON")


def test_manifest_of_something_else(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({"schema": 1, "model": {}}))
    assert_one_line_error(*run_cli(capsys, run, "--levers", FIXTURE), "not a launcher manifest")


def test_broken_metrics_line(tmp_path, capsys):
    run = copy_run(NATIVE, tmp_path / "run")
    with (run / "metrics.jsonl").open("a") as f:
        f.write("{truncated\n")
    assert_one_line_error(*run_cli(capsys, run, "--levers", FIXTURE), "metrics.jsonl", "not a JSON line")


def test_missing_levers_file(tmp_path, capsys):
    assert_one_line_error(*run_cli(capsys, NATIVE, "--levers", tmp_path / "none.json", "--no-json"),
                    "no such levers file")


@pytest.mark.parametrize("mutate,needle", [
    (lambda d: d.update(schema=2), "schema 2"),
    (lambda d: d["levers"][0].pop("source"), "a measurement but no 'source'"),
    (lambda d: d["levers"][0]["effect"].update(verdict="great"), "verdict 'great'"),
    (lambda d: d["levers"][0].update(kind="magic"), "kind 'magic'"),
    (lambda d: d["levers"][0].update(set="fast please"), "not TOGGLE=VALUE"),
])
def test_levers_file_that_breaks_the_schema(tmp_path, capsys, mutate, needle):
    data = fixture_levers()
    mutate(data)
    levers = write_levers(tmp_path / "levers.json", data)
    assert_one_line_error(*run_cli(capsys, NATIVE, "--levers", levers, "--no-json"), needle)


def test_asked_shape_that_cannot_run(capsys):
    assert_one_line_error(*run_cli(capsys, NATIVE, "--levers", FIXTURE, "--want-mbs", "3",
                             "--no-json"), "not a multiple of MBS*DP")


def test_unknown_platform(capsys):
    assert_one_line_error(*run_cli(capsys, DRY_ALL_ON, "--levers", FIXTURE, "--platform", "tpu9",
                             "--no-json"), "--platform 'tpu9'")


def test_unwritable_json_path(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert_one_line_error(*run_cli(capsys, NATIVE, "--levers", FIXTURE, "--json",
                             blocker / "sub" / "opt.json"), "cannot write the JSON report")


def test_metrics_cut_in_its_last_line_uses_the_complete_lines_and_says_so(tmp_path, capsys):
    """A run killed or still running leaves its last metrics line without its end."""
    run = copy_run(NATIVE, tmp_path / "run")
    metrics = run / "metrics.jsonl"
    complete = metrics.read_text()
    metrics.write_text(complete + '{"iteration": 99, "step_time_s": 1.2')
    code, out, err = run_cli(capsys, run, "--levers", FIXTURE, "--no-json")
    assert code == 0
    n = len([line for line in complete.splitlines() if line.strip()])
    assert err.strip() == (f"note: {metrics}:{n + 1}: the last line is cut off (a run killed or still "
                           f"running); using the {n} complete lines")
    whole = run_cli(capsys, NATIVE, "--levers", FIXTURE, "--no-json")[1]
    assert out.replace(str(run), str(NATIVE)) == whole  # the same advice as from the complete file


@pytest.mark.parametrize("section,key,value", [("model", "hidden_size", 0), ("layout", "mbs", 0),
                                               ("layout", "tp", -1), ("model", "seq_length", "8k")])
def test_manifest_with_a_size_that_is_not_positive(tmp_path, capsys, section, key, value):
    run = copy_run(NATIVE, tmp_path / "run")
    edit_manifest(run, lambda m: m[section].__setitem__(key, value))
    assert_one_line_error(*run_cli(capsys, run, "--levers", FIXTURE, "--no-json"), f"{section}.{key}: ",
                          f"(got {value!r})")


@pytest.mark.parametrize("flag", ["--want-mbs", "--want-seq-length", "--want-global-batch"])
def test_asked_size_zero_is_refused_not_ignored(capsys, flag):
    with pytest.raises(SystemExit) as e:
        run_cli(capsys, NATIVE, "--levers", FIXTURE, "--no-json", flag, "0")
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and f"argument {flag}: must be a whole number >= 1" in err
