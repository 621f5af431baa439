# shellcheck shell=bash
# Sourced first by every tools/gpu/*.sh on the lent GPU machine: install the carried wheels
# (.whl, made here by the offline-wheels.sh line of docs/gpu_runbook.md) and export what the
# runs need. GIT_SHA comes from the caller.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target .site .whl/*.whl || exit 1
export PYTHONPATH="$PWD/.site:$PWD" PYTHONUNBUFFERED=1 PYTHON=python3
: "${GIT_SHA:?GIT_SHA must be set: pass GIT_SHA=\$(git rev-parse HEAD) (the copied .git is stale)}"
export GIT_SHA
: "${OUT:?OUT must be set (the device tool sets it)}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
