#!/usr/bin/env bash
# 1xH200, ~5 min (issue 52): the rehearsal. The tiny model on the shipped corpus is killed with
# SIGKILL at three random points (one during a save), restarted by the launcher's supervisor
# (RESTARTS) each time, then extended once (TOTAL_ITERS 40 -> 60), beside the same run
# uninterrupted; the losses and the final checkpoints' tensors must be equal bit for bit, with
# three restarts recorded and no Traceback in any log (tests/gpu/test_rehearsal_gpu.py); then
# Slurm's warning signal (SIGUSR2) sent to every process of a tiny run: saved, exit 75.
# $OUT/rehearsal.json: the verdict (seed, kill points, checks). REHEARSAL_SEED=N repeats a draw.
# Carry: .whl data
set -euo pipefail
source "$(dirname "$0")/env.sh"
status=0
timeout 450 python3 -m pytest -p no:cacheprovider -q -s -m gpu --durations=0 \
    tests/gpu/test_rehearsal_gpu.py 2>&1 | tee "$OUT/rehearsal.log" || status=1
exit "$status"
