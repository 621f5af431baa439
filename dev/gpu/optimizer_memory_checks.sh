#!/usr/bin/env bash
# 1 or 2 H200s, ~5 min, not timed (issue 23): may run beside other work. The convergence A/B of
# the optimizer state on Shakespeare (docs/convergence/grid_optimizer_state.yaml: four cells of a
# 2-layer Llama3-8B-width model, 250 iterations; rerun the same command if it exits 3: finished
# cells are read back) and, beside it (on GPU 1 where there is one), tests/gpu/test_optimizer_state_gpu.py
# (the Triton AdamW against float64 on CUDA, its memory, and the toggles through the launcher).
# Usage: GIT_SHA=<sha> bash dev/gpu/optimizer_memory_checks.sh    Carry: .whl data
source "$(dirname "$0")/env.sh"
second=$(( $(nvidia-smi -L | wc -l) > 1 ? 1 : 0 ))
CUDA_VISIBLE_DEVICES=0 MASTER_PORT=29710 python3 -m training.convergence \
    docs/convergence/grid_optimizer_state.yaml --out "$OUT" --experiment-dir /tmp/conv_opt \
    > "$OUT/convergence.log" 2>&1 &
conv=$!
CUDA_VISIBLE_DEVICES=$second timeout 500 python3 -m pytest -p no:cacheprovider -q -m gpu -rA \
    tests/gpu/test_optimizer_state_gpu.py > "$OUT/tests_gpu.log" 2>&1
echo "GPU tests rc=$?"
wait "$conv"
echo "convergence rc=$?"
tail -40 "$OUT/tests_gpu.log"
tail -30 "$OUT/convergence.log"
tar czf "$OUT/conv_runs.tgz" -C /tmp/conv_opt --exclude=tensorboard .
