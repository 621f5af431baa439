"""Shared pieces for the launcher tests: the repository, a subprocess environment, fake tools."""
from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable   # the interpreter running the tests (the venv's under make test)

FAKE_SCONTROL = """#!/usr/bin/env bash
# fake `scontrol show hostnames NODELIST`: gpu[001-002] -> two hosts, anything else fails
[ "$1 $2" = "show hostnames" ] || { echo "unexpected: $*" >&2; exit 1; }
case "$3" in
  "gpu[001-002]") printf 'gpu001\\ngpu002\\n' ;;
  "gpu001") printf 'gpu001\\n' ;;
  *) echo "invalid hostlist: $3" >&2; exit 1 ;;
esac
"""

RECORDER = """#!/usr/bin/env bash
# fake {name}: record the arguments, one per line, and succeed
printf '%s\\n' "$@" > "{out}"
"""


def write_tool(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


@pytest.fixture
def fake_bin(tmp_path) -> Path:
    """A folder on PATH with a fake scontrol (and room for more fakes)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    write_tool(folder, "scontrol", FAKE_SCONTROL)
    return folder


def subprocess_env(tmp_path: Path, fake_bin: Path | None = None, **values) -> dict[str, str]:
    """A clean environment (no inherited toggles or SLURM_*), plus the given values."""
    path = os.environ.get("PATH", "/usr/bin:/bin")
    env = {"PATH": f"{fake_bin}:{path}" if fake_bin else path, "HOME": str(tmp_path),
           "PYTHON": PYTHON, "EXPERIMENT_DIR": str(tmp_path / "experiment")}
    env.update({k: str(v) for k, v in values.items()})
    return env


SLURM_TWO_NODES = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "gpu[001-002]",
                   "SLURM_JOB_NUM_NODES": "2", "SLURM_NODEID": "0",
                   "SLURM_SUBMIT_DIR": str(REPO)}
