#!/usr/bin/env bash
# Run an example training script inside this project's docker image, on this host's GPUs.
#
#   bash launchers/docker_run.sh                                         # Llama 3 8B, defaults
#   bash launchers/docker_run.sh examples/llama/train_llama3.sh MODEL_SIZE=70B TP=8
#   DRY_RUN=1 bash launchers/docker_run.sh ...    # print the docker command, run nothing
#   DRY_RUN=1 PLATFORM=mi355x bash launchers/docker_run.sh ...   # the command for an MI355X host
#
# Toggles you set (TP=2, DATA_PATH=..., NNODES=...) reach the script inside; the repository and
# the data, tokenizer and checkpoint folders are mounted at the same paths. DOCKER_IMAGE picks the
# image (default training:cuda / training:rocm, built from docker/), DOCKER_ENV names extra
# variables to pass (e.g. DOCKER_ENV=HF_TOKEN). training/deploy/docker.py builds the command and
# runs it (secrets by environment, never on the command line); docs/launch.md explains every flag.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../examples/lib/launch.sh"   # PYTHON, PYTHONPATH

exec "$PYTHON" -m training.deploy.docker "$@"   # DRY_RUN=1: prints the command, runs nothing
