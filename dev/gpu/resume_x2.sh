#!/usr/bin/env bash
# 2xH200, ~3 min: the checkpoint work left after session 3's first calls. The numerics parts
# (both GPUs; completed runs reused, so only the TP=2 save, the DP=2 resume from it and the
# runs not yet done) beside the one-GPU training tests on GPU0 (tiny local run, save/resume,
# empty LOAD). Carry: .whl data
source "$(dirname "$0")/env.sh"
(CUDA_VISIBLE_DEVICES=0 timeout 400 python3 -m pytest -p no:cacheprovider -q -s -m gpu \
     --durations=0 tests/gpu/test_train_gpu.py > "$OUT/gpu_train_tests.log" 2>&1
 echo "tests/gpu/test_train_gpu.py rc=$?" >> "$OUT/gpu_train_tests.log") &
SCALE_S=0 CONV=0 bash "$(dirname "$0")/correctness_x2.sh"
wait
echo "== train tests"
grep -E "PASSED|FAILED|rc=|passed|failed|loss|resume|Error" "$OUT/gpu_train_tests.log" | tail -30
