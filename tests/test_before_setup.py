"""A README command run before `make setup` ends with one line that says what to run."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# rich missing: its import fails as on a Python without the project's dependencies
WITHOUT_RICH = ("import runpy, sys; sys.modules['rich'] = None; "
                "runpy.run_module('training.optimize.preflight', run_name='__main__')")


def test_a_missing_dependency_is_one_line_naming_make_setup():
    proc = subprocess.run([sys.executable, "-c", WITHOUT_RICH, "--family", "llama3"], cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=str(REPO), DRY_RUN="1"),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: the Python package 'rich' is not installed for ")
    assert "run `make setup`" in line


def test_other_errors_keep_their_traceback():
    proc = subprocess.run([sys.executable, "-c", "import training; raise ValueError('x')"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "Traceback" in proc.stderr and "ValueError: x" in proc.stderr
