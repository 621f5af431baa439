# shellcheck shell=bash
# Sourced first by every dev/gpu/*.sh on the lent GPU machine: install the carried wheels
# (.whl, made here by the offline-wheels.sh line of dev/gpu_runbook.md) and export what the
# runs need. GIT_SHA comes from the caller.
set -uo pipefail
# Installed once per set of wheels: a script that sources this from another (resume_x2.sh runs
# correctness_x2.sh beside its tests) must not reinstall under a running process.
wheels=$(ls -l .whl | md5sum | cut -c1-32)
if [ "$(cat .site/.wheels 2>/dev/null)" != "$wheels" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target .site .whl/*.whl || exit 1
    echo "$wheels" > .site/.wheels
fi
export PYTHONPATH="$PWD/.site:$PWD" PYTHONUNBUFFERED=1 PYTHON=python3
# TE=1: Transformer Engine from the TE carry of this session (dev/gpu_runbook.md), first on the path
if [ "${TE:-0}" = 1 ]; then
    [ -d /tmp/tesite ] || { echo "TE=1 but no /tmp/tesite: send the TE carry first (dev/gpu_runbook.md)"; exit 1; }
    export PYTHONPATH="/tmp/tesite:$PYTHONPATH"
    python3 -c "import transformer_engine as te, transformer_engine.pytorch; print('Transformer Engine', te.__version__)" || exit 1
fi
: "${GIT_SHA:?GIT_SHA must be set: pass GIT_SHA=\$(git rev-parse HEAD) (the copied .git is stale)}"
export GIT_SHA
: "${OUT:?OUT must be set (the device tool sets it)}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
