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
           "PYTHON": PYTHON, "EXPERIMENT_DIR": str(tmp_path / "experiment"), "VERBOSE": "1"}
    env.update({k: str(v) for k, v in values.items()})
    return env


SLURM_TWO_NODES = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "gpu[001-002]",
                   "SLURM_JOB_NUM_NODES": "2", "SLURM_NODEID": "0",
                   "SLURM_SUBMIT_DIR": str(REPO)}


# Two Slurm "nodes" on one host (issue 27): scontrol names this host once per node, srun starts
# launchers/slurm/node.sh once per node as a real srun would (one task per node, its
# SLURM_NODEID), each on its own GPU (CUDA_VISIBLE_DEVICES=rank), plus ONE_HOST_NODE_ENV's
# words (DRY_RUN=1 on the CPU). Its exit status is the worst node's.
ONE_HOST_SCONTROL = """#!/usr/bin/env bash
[ "$1 $2" = "show hostnames" ] || { echo "unexpected: $*" >&2; exit 1; }
for _ in $(seq "$ONE_HOST_NODES"); do echo "$ONE_HOST_ADDR"; done
"""
ONE_HOST_SRUN = """#!/usr/bin/env bash
while [ $# -gt 0 ] && [ "$1" != bash ]; do shift; done   # srun's own options
pids=()
for rank in $(seq 0 $((ONE_HOST_NODES - 1))); do
    # shellcheck disable=SC2086
    env SLURM_NODEID=$rank SLURM_STEP_NUM_NODES=$ONE_HOST_NODES \\
        SLURM_STEP_NUM_TASKS=$ONE_HOST_NODES CUDA_VISIBLE_DEVICES=$rank $ONE_HOST_NODE_ENV \\
        "$@" > "$ONE_HOST_LOGS/node$rank.out" 2>&1 &
    pids+=($!)
done
rc=0
for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done
exit $rc
"""


def one_host_slurm(tmp_path: Path, addr: str, nnodes: int = 2, node_env: str = "",
                   **values) -> tuple[dict[str, str], Path]:
    """(environment, folder of each node's output) for train.sbatch on `nnodes` Slurm "nodes"
    of this host, rendezvous at `addr`."""
    folder = tmp_path / "slurm-bin"
    folder.mkdir(exist_ok=True)
    write_tool(folder, "scontrol", ONE_HOST_SCONTROL)
    write_tool(folder, "srun", ONE_HOST_SRUN)
    logs = tmp_path / "node-logs"
    logs.mkdir(exist_ok=True)
    env = subprocess_env(tmp_path, folder, SLURM_JOB_ID="4242", SLURM_JOB_NODELIST="host[0-1]",
                         SLURM_JOB_NUM_NODES=nnodes, SLURM_SUBMIT_DIR=REPO,
                         ONE_HOST_NODES=nnodes, ONE_HOST_ADDR=addr, ONE_HOST_LOGS=logs,
                         ONE_HOST_NODE_ENV=node_env, **values)
    return env, logs
