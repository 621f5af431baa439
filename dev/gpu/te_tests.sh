#!/usr/bin/env bash
# 1 H200 with Transformer Engine carried (the TE carry of dev/gpu_runbook.md first), < 9 min:
# the TE GPU tests (the tiny TE run with every default-on toggle, each Hopper fp8 recipe, HF
# parity, save/resume), each step on its own so one failure keeps the others' results, and
# beside them on the same GPU the recipe convergence grid (docs/convergence/grid_te_recipes.yaml:
# loss curves, nothing timed; tens of GiB beside the tests' few, of 139). Both stop starting
# work LIMIT seconds after the call began. GRID_GPU=1 on a two-GPU machine puts the grid on GPU 1;
# GRID=0 leaves the grid out (its curves recorded already: docs/convergence/te_recipes.*);
# GRID_YAML names another grid (grid_te_recipes_seed2.yaml: fp8 and bf16 at a second seed).
# Carry: .whl data
export TE=1
source "$(dirname "$0")/env.sh"
LIMIT=${LIMIT:-480}
PYTEST=(python3 -m pytest -p no:cacheprovider -q -s -m gpu --durations=0 -rA)
[ "${GRID:-1}" = 1 ] && (export CUDA_VISIBLE_DEVICES=${GRID_GPU:-0} MASTER_PORT=29700
 timeout $((LIMIT + 30 - SECONDS)) python3 -m training.convergence \
     "${GRID_YAML:-docs/convergence/grid_te_recipes.yaml}" --budget-s $((LIMIT - SECONDS)) \
     --out "$OUT" --experiment-dir /tmp/conv_te > "$OUT/convergence.log" 2>&1
 echo "convergence rc=$?" >> "$OUT/convergence.log") &
step() {  # step NAME SECONDS PYTEST-ARGS...: within SECONDS and what is left of LIMIT
    local name=$1 limit=$2 left=$((LIMIT - SECONDS)); shift 2
    if [ "$left" -lt 30 ]; then echo "$name: not run (the call's time is spent)"; return; fi
    timeout $((limit < left ? limit : left)) "${PYTEST[@]}" "$@"; echo "$name rc=$?"
}
export CUDA_VISIBLE_DEVICES=0
{ step "resume" 150 tests/gpu/test_te_gpu.py -k resume
  step "parity" 100 tests/gpu/test_te_gpu.py -k parity
  step "tiny TE run" 150 tests/gpu/test_train_gpu.py -k transformer_engine
  step "fp8 recipes" 210 tests/gpu/test_te_gpu.py -k recipe
} > "$OUT/te_tests.log" 2>&1
wait
echo "== TE tests"; grep -E "PASSED|FAILED|SKIPPED|ERROR|rc=|not run|passed|failed|loss|resume|transformer_engine:" "$OUT/te_tests.log" | tail -40
echo "== convergence"; tail -25 "$OUT/convergence.log"
tar czf "$OUT/conv_runs.tgz" --exclude=tensorboard -C /tmp conv_te 2>/dev/null || true
