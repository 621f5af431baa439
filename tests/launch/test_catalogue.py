"""The DRY_RUN output of a catalogue of launches is what catalogue.json recorded.

The catalogue (tests/launch/catalogue.py) covers families, sizes, precisions (refused ones'
messages too), platforms, TP/PP/CP, recompute, profiling, data paths and MLPerf. A change of
the launcher's shape that changes nothing a user sees leaves this test green; a change a user
sees shows up here as a diff, to be looked at and, where intended, recorded again with
`python -m tests.launch.catalogue --write`.
"""
from __future__ import annotations

import difflib
import json
import subprocess
import sys

import pytest

from .catalogue import FIXTURE, LAUNCHES, REPO

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def now() -> dict:
    proc = subprocess.run([sys.executable, "-m", "tests.launch.catalogue"], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def recorded() -> dict:
    return json.loads(FIXTURE.read_text())


def test_the_catalogue_is_recorded_whole(recorded):
    assert sorted(recorded["launches"]) == sorted(name for name, *_ in LAUNCHES)
    assert len(LAUNCHES) >= 30
    codes = {entry["rc"] for entry in recorded["launches"].values()}
    assert codes == {0, 2}   # launches that run and launches that are refused


@pytest.mark.parametrize("name", [name for name, *_ in LAUNCHES])
def test_dry_run_output_is_unchanged(now, recorded, name):
    was, got = recorded["launches"][name], now["launches"][name]
    if was["auto"] and now["detected"] != recorded["detected"]:
        pytest.skip("PLATFORM=auto: this machine's capabilities differ from the recorded ones")
    for stream in ("stdout", "stderr"):
        if got[stream] != was[stream]:
            diff = "\n".join(difflib.unified_diff(was[stream].splitlines(),
                                                  got[stream].splitlines(), "recorded", "now",
                                                  lineterm="", n=1))
            pytest.fail(f"{name}: {stream} differs\n{diff[:6000]}")
    assert got["rc"] == was["rc"]
