#!/usr/bin/env bash
# 2xH200 with Transformer Engine carried (the TE carry of dev/gpu_runbook.md first), ~6 min:
# the TE GPU tests on GPU 0 (the tiny TE run with every default-on toggle, each Hopper fp8
# recipe, HF parity, save/resume), each step on its own so one failure keeps the others' results,
# while GPU 1 runs the recipe convergence grid (docs/convergence/grid_te_recipes.yaml).
# Carry: .whl data
export TE=1
source "$(dirname "$0")/env.sh"
PYTEST=(python3 -m pytest -p no:cacheprovider -q -s -m gpu --durations=0 -rA)
(export CUDA_VISIBLE_DEVICES=1 MASTER_PORT=29700
 timeout 420 python3 -m training.convergence docs/convergence/grid_te_recipes.yaml \
     --out "$OUT" --experiment-dir /tmp/conv_te > "$OUT/convergence.log" 2>&1
 echo "convergence rc=$?" >> "$OUT/convergence.log") &
(export CUDA_VISIBLE_DEVICES=0
 log="$OUT/te_tests.log"
 timeout 150 "${PYTEST[@]}" tests/gpu/test_train_gpu.py -k transformer_engine > "$log" 2>&1
 echo "tiny TE run rc=$?" >> "$log"
 timeout 240 "${PYTEST[@]}" tests/gpu/test_te_gpu.py -k recipe >> "$log" 2>&1
 echo "fp8 recipes rc=$?" >> "$log"
 timeout 120 "${PYTEST[@]}" tests/gpu/test_te_gpu.py -k parity >> "$log" 2>&1
 echo "parity rc=$?" >> "$log"
 timeout 180 "${PYTEST[@]}" tests/gpu/test_te_gpu.py -k resume >> "$log" 2>&1
 echo "resume rc=$?" >> "$log") &
wait
echo "== TE tests"; grep -E "PASSED|FAILED|SKIPPED|ERROR|rc=|passed|failed|loss|resume|transformer_engine:" "$OUT/te_tests.log" | tail -40
echo "== convergence"; tail -25 "$OUT/convergence.log"
tar czf "$OUT/conv_runs.tgz" --exclude=tensorboard -C /tmp conv_te 2>/dev/null || true
