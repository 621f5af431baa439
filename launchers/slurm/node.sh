#!/usr/bin/env bash
# One node of a Slurm job, started by train.sbatch through srun (one task per node):
# this node's NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT and RUN_ID from the allocation, then
# the example script (inside docker when DOCKER_IMAGE is set).
#
#   bash launchers/slurm/node.sh examples/llama/train_llama3.sh [KEY=VALUE ...]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../examples/lib/launch.sh"   # PYTHON, REPO_ROOT
if [ $# -eq 0 ]; then
    echo "usage: launchers/slurm/node.sh examples/<family>/train_<model>.sh [KEY=VALUE ...]" >&2
    exit 2
fi
# This node's values, then the script (training/deploy/cluster.py: nothing is evaluated by bash).
exec "$PYTHON" -m training.deploy.cluster node "$@"
