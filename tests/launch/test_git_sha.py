"""The commit a run or benchmark names: git's HEAD here, GIT_SHA where the caller says it."""
from __future__ import annotations

import subprocess
from pathlib import Path

from training.launch.runfolder import git_sha

REPO = Path(__file__).resolve().parents[2]


def test_head_of_the_checkout_without_the_variable(monkeypatch):
    monkeypatch.delenv("GIT_SHA", raising=False)
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    assert git_sha(REPO).removesuffix("-dirty") == head


def test_the_variable_wins_over_a_stale_git(monkeypatch, tmp_path):
    monkeypatch.setenv("GIT_SHA", "2fbc3f0")
    assert git_sha(REPO) == "2fbc3f0"
    monkeypatch.delenv("GIT_SHA")
    assert git_sha(tmp_path) is None  # no .git, no variable: unknown, not a guess
