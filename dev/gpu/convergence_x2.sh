#!/usr/bin/env bash
# 2xH200, ~7 min: the ADAM_EPS x GRAD_REDUCE_IN_BF16 grid (rerun the same command if it
# exits 3: finished cells are read back).   Carry: .whl data
source "$(dirname "$0")/env.sh"
python3 -m training.convergence docs/convergence/grid_adam_eps_x_bf16_reduce.yaml \
    --out "$OUT" --experiment-dir /tmp/conv; echo "convergence rc=$?"
tar czf "$OUT/runs.tgz" -C /tmp/conv --exclude=tensorboard .
