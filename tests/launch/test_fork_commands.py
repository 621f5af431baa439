"""Every command the ROCm fork's README and AMD's docs give, run verbatim with DRY_RUN=1 on an
8-GPU MI355X description: it runs, or is refused in one line by the guard fork_vars names
(issue 20). Each is a real bash process: the command line is the user's, unchanged."""
from __future__ import annotations

import os
import sys

import pytest

from training.launch.fork_vars import DOCUMENTED_COMMANDS

from .test_dry_run import REPO

pytestmark = pytest.mark.slow


def _run(command: str, tmp_path):
    import subprocess

    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PYTHON": sys.executable,
           "DRY_RUN": "1", "PLATFORM": "mi355x", "GPUS_PER_NODE": "8", "COLUMNS": "300",
           "EXPERIMENT_DIR": str(tmp_path / "experiment"), "HF_HUB_OFFLINE": "1",
           "HF_HOME": str(tmp_path / "hf")}
    return subprocess.run(["bash", "-c", command], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("source,command,outcome", DOCUMENTED_COMMANDS,
                         ids=[f"{s}:{c.split(' bash ')[0][:60]}" for s, c, _ in DOCUMENTED_COMMANDS])
def test_a_documented_command_does_what_the_page_says(tmp_path, source, command, outcome):
    proc = _run(command, tmp_path)
    assert "Traceback" not in proc.stderr
    if outcome == "runs":
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert [line for line in proc.stdout.splitlines() if line.startswith("torchrun ")]
        return
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and proc.stderr.strip().count("\n") == 0, proc.stderr
    if outcome == "bad input":
        assert not errors[0].startswith("error: [")
    else:
        assert errors[0].startswith(f"error: [{outcome}]"), errors[0]


def test_the_issues_command_says_the_fork_trains_70b(tmp_path):
    command = next(c for s, c, _ in DOCUMENTED_COMMANDS if s == "issue 20")
    proc = _run(command, tmp_path)
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stderr.split())
    assert "[fork_defaults] the ROCm fork's train_llama3.sh would run MODEL_SIZE=70B" in text
    assert "this launcher runs MODEL_SIZE=8B" in text
