"""Our side: a run folder read back, the launcher's refusal recorded, a hung run ended."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from training.bench.ours import read_run, run_logged, run_point
from training.bench.shape import BenchShape

RUNS = Path(__file__).resolve().parents[1] / "data" / "runs"


def test_read_run_of_a_real_h200_run_folder():
    point = read_run(RUNS / "h200_l8_native")
    assert point["tokens_per_s_per_gpu"] == pytest.approx(34967.19, rel=1e-6)
    assert point["peak_memory_gib"] == pytest.approx(54.095, rel=1e-4)
    assert len(point["samples"]["step_time_s"]) == 20
    assert point["samples"]["warmup"][:6] == [True] * 5 + [False]
    assert point["backend"] == "native" and point["layout"]["dp"] == 1
    assert point["corrections"] == []
    assert "distributed optimizer" in point["optimizer_state"]
    assert "error" not in point


def test_the_launchers_refusal_is_recorded_instead_of_a_number(tmp_path):
    """The real launcher (bash + training.launch) refuses before torchrun: exit 2."""
    toggles = {**BenchShape().env(), "PLATFORM": "h200", "PRECISION": "mxfp8"}
    point = run_point("mxfp8-r0", toggles, tmp_path / "exp", tmp_path / "logs", timeout_s=120)
    assert point["returncode"] == 2
    assert point["refusal"].startswith("error: [precision_needs_hardware]")
    assert "tokens_per_s_per_gpu" not in point


def _wait_for(condition, limit_s: float = 30.0) -> bool:
    """Poll until `condition()` holds; False if it still does not after `limit_s` (a bound
    on a failure, not on speed)."""
    deadline = time.monotonic() + limit_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_run_past_its_limit_is_ended_with_its_children(tmp_path, monkeypatch):
    """The limit expires as an event, not on the wall clock: the run's first wait times out
    once the run has started its child (the pid file is written), however loaded the host.
    Then the child must end (it would sleep 120 s).

    Mutation caught: training/bench/ours.py run_logged signalling only the launcher
    (`os.kill(proc.pid, sig)` for `os.killpg(proc.pid, sig)`): the child outlives it. The old
    version of this test raced: a 1.5 s real limit against bash starting its child, and a
    0.2 s sleep before asking whether the child was gone."""
    import subprocess

    pidfile = tmp_path / "child.pid"

    class StartedThenLate(subprocess.Popen):
        first = True

        def wait(self, timeout=None):
            if StartedThenLate.first and timeout is not None:
                StartedThenLate.first = False
                assert _wait_for(lambda: pidfile.exists() and pidfile.read_text().strip())
                raise subprocess.TimeoutExpired(self.args, timeout)
            return super().wait(timeout)

    monkeypatch.setattr(subprocess, "Popen", StartedThenLate)
    rc, timed_out = run_logged(["bash", "-c", f"sleep 120 & echo $! > {pidfile}; wait"],
                               dict(os.environ), tmp_path / "hang.log", timeout_s=1.5)
    assert timed_out and rc != 0
    child = int(pidfile.read_text())
    try:
        assert _wait_for(lambda: not _alive(child)), f"child {child} outlived the run"
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """Running (a zombie left for a non-reaping init counts as ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def test_startup_breakdown_splits_the_wall_time():
    from training.bench.ours import startup_breakdown

    point = {"started": 100.0, "ended": 146.0}
    timeline = {"worker_start": 104.0, "imports_done": 112.5, "first_step_start": 126.0,
                "training_done": 140.0}
    parts = startup_breakdown(point, timeline)
    assert parts == {"launcher_and_torchrun_s": 4.0, "imports_s": 8.5,
                     "init_to_first_step_s": 13.5, "training_s": 14.0, "finish_and_exit_s": 6.0}
    assert sum(parts.values()) == point["ended"] - point["started"]
    assert startup_breakdown(point, {**timeline, "first_step_start": None}) is None
    split = startup_breakdown(point, {**timeline, "torch_imported": 106.0})
    assert split["torch_import_s"] == 2.0 and split["megatron_and_project_imports_s"] == 6.5
    assert "imports_s" not in split and sum(split.values()) == point["ended"] - point["started"]
