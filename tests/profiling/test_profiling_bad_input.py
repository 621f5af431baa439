"""Bad input: one clear line on stderr, exit status 2, no traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import profiling_synthetic as synthetic
from profiling_testlib import REPO

from training.profiling import trace_report


def run(capsys, *args) -> str:
    rc = trace_report.main([str(a) for a in args])
    captured = capsys.readouterr()
    assert rc == 2, captured
    err = captured.err.strip()
    assert err.startswith("trace_report: error: ") and "\n" not in err, err
    assert "Traceback" not in captured.err + captured.out
    return err


def test_missing_path(tmp_path, capsys):
    err = run(capsys, tmp_path / "nope")
    assert "nope does not exist" in err


def test_empty_folder(tmp_path, capsys):
    err = run(capsys, tmp_path)
    assert f"no torch profiler traces (*.json, *.json.gz) in {tmp_path}" in err
    assert "PROFILE=torch" in err


def test_run_folder_with_empty_profile(tmp_path, capsys):
    (tmp_path / "profile").mkdir()
    err = run(capsys, tmp_path)
    assert f"in {tmp_path} or {tmp_path / 'profile'}" in err


def test_run_folder_without_profile(tmp_path, capsys):
    (tmp_path / "manifest.json").write_text("{}")
    err = run(capsys, tmp_path)
    assert "is a run folder without profile/: nothing was profiled (run with PROFILE=torch)" in err


def test_report_outputs_alone_are_not_traces(tmp_path, capsys):
    (tmp_path / "trace_report.json").write_text("{}")
    assert "no torch profiler traces" in run(capsys, tmp_path)


def test_nsys_capture_only(tmp_path, capsys):
    (tmp_path / "profile").mkdir()
    (tmp_path / "profile" / "rank0.nsys-rep").write_bytes(b"\0")
    err = run(capsys, tmp_path)
    assert "nsys captures (rank0.nsys-rep)" in err and "PROFILE=torch" in err


def test_truncated_json(tmp_path, capsys):
    good = synthetic.write(tmp_path / "rank-0.json", synthetic.COMM_HEAVY, rank=0).read_text()
    (tmp_path / "rank-0.json").write_text(good[: len(good) // 2])
    synthetic.write(tmp_path / "rank-1.json", synthetic.COMM_HEAVY, rank=1)
    err = run(capsys, tmp_path)
    assert "cannot read trace: rank-0.json is truncated or not valid JSON" in err


def test_truncated_gzip(tmp_path, capsys):
    path = synthetic.write(tmp_path / "rank-0.json.gz", synthetic.COMM_HEAVY, rank=0, gz=True)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])
    err = run(capsys, tmp_path)
    assert "rank-0.json.gz is truncated or not a gzip file" in err


def test_gzip_truncated_before_the_rank(tmp_path, capsys):
    path = synthetic.write(tmp_path / "rank-0.json.gz", synthetic.COMM_HEAVY, rank=0, gz=True)
    path.write_bytes(path.read_bytes()[:20])
    err = run(capsys, tmp_path)
    assert "rank-0.json.gz" in err and "truncated" in err


def test_not_a_chrome_trace(tmp_path, capsys):
    (tmp_path / "rank-0.json").write_text(json.dumps({"hello": "world"}))
    err = run(capsys, tmp_path)
    assert "rank-0.json" in err


def test_no_trace_events(tmp_path, capsys):
    (tmp_path / "rank-0.json").write_text(json.dumps({"distributedInfo": {"rank": 0}, "traceEvents": []}))
    err = run(capsys, tmp_path)
    assert "rank-0.json has no trace events" in err


def test_no_gpu_events_names_the_cpu_option(tmp_path, capsys):
    synthetic.write(tmp_path / "rank-0.json", [], rank=0)  # CPU events only
    err = run(capsys, tmp_path)
    assert "no GPU events" in err and "--device cpu" in err


def test_two_traces_of_one_rank(tmp_path, capsys):
    synthetic.write(tmp_path / "rank-0.json", synthetic.COMM_HEAVY, rank=0)
    synthetic.write(tmp_path / "old-rank-0.json.gz", synthetic.COMM_HEAVY, rank=0, gz=True)
    err = run(capsys, tmp_path)
    assert "both hold rank 0" in err


def test_traces_without_rank_info(tmp_path, capsys):
    synthetic.write(tmp_path / "a.json", synthetic.COMM_HEAVY, rank=None)
    synthetic.write(tmp_path / "b.json", synthetic.COMM_HEAVY, rank=None)
    assert "both hold rank 0" in run(capsys, tmp_path)


def test_top_must_be_positive(tmp_path, capsys):
    synthetic.write(tmp_path / "rank-0.json", synthetic.COMM_HEAVY, rank=0)
    assert "--top must be at least 1" in run(capsys, tmp_path, "--top", "0")


def test_unwritable_out(tmp_path, capsys):
    synthetic.write(tmp_path / "rank-0.json", synthetic.COMM_HEAVY, rank=0)
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert f"cannot write the report into {blocker}" in run(capsys, tmp_path, "--out", blocker)


def test_hta_missing(tmp_path, capsys, monkeypatch):
    synthetic.write(tmp_path / "rank-0.json", synthetic.COMM_HEAVY, rank=0)
    monkeypatch.setitem(sys.modules, "hta.trace_analysis", None)  # as if the `profile` extra were absent
    err = run(capsys, tmp_path)
    assert "needs HolisticTraceAnalysis" in err and ".[profile]" in err


@pytest.mark.slow
def test_command_line_exit_status_and_stderr(tmp_path):
    """The real command: exit 2, one line, no traceback."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-m", "training.profiling.trace_report", str(tmp_path / "missing")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        f"trace_report: error: {tmp_path / 'missing'} does not exist (give a run folder or a folder of torch "
        "profiler traces)"
    ]
