"""Fixtures for the trace report tests: real CPU traces from two gloo ranks."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # profiling_testlib, profiling_synthetic

from profiling_testlib import make_traces  # noqa: E402


@pytest.fixture(scope="session")
def cpu_run(tmp_path_factory) -> Path:
    """A run folder whose profile/ holds rank-0.json and rank-1.json from a real 2-process gloo run."""
    run = tmp_path_factory.mktemp("cpu_run")
    profile = run / "profile"
    make_traces(profile, "cpu", world=2)
    assert sorted(p.name for p in profile.iterdir()) == ["rank-0.json", "rank-1.json"]
    return run
