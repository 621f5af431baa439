#!/usr/bin/env bash
# 2xH200, ~9 min: the one-GPU training tests on GPU0 while GPU1 measures the next benchmark
# part (`training.bench all --slot 0/1`). The tiny local-backend run goes last: it hung in
# sessions 2 and 3 (a crash that did not exit, fixed in f6dbec0); a hang now prints stacks.
# Carry: .whl data
source "$(dirname "$0")/env.sh"
PYTEST=(python3 -m pytest -p no:cacheprovider -q -s -m gpu --durations=0)
(export CUDA_VISIBLE_DEVICES=0
 timeout 200 "${PYTEST[@]}" tests/gpu/test_train_gpu.py -k "not local" > "$OUT/gpu_tests_a.log" 2>&1
 echo "test_train_gpu (not local) rc=$?" >> "$OUT/gpu_tests_a.log"
 timeout 150 "${PYTEST[@]}" tests/gpu/test_native_kernels_gpu.py tests/gpu/test_parity_gpu.py \
     >> "$OUT/gpu_tests_a.log" 2>&1
 echo "kernels + parity rc=$?" >> "$OUT/gpu_tests_a.log"
 timeout 180 "${PYTEST[@]}" tests/gpu/test_train_gpu.py -k "local" >> "$OUT/gpu_tests_a.log" 2>&1
 echo "test_train_gpu (local) rc=$?" >> "$OUT/gpu_tests_a.log") &
CUDA_VISIBLE_DEVICES=1 timeout 560 python3 -m training.bench all --gpus 1 --slot 0/1 \
    --budget-s 500 --master-port 29600 --out-dir "$OUT" --work-dir /tmp/bench1 \
    > "$OUT/bench_slot1.log" 2>&1 &
wait
echo "== gpu tests"; grep -E "PASSED|FAILED|SKIPPED|ERROR|rc=|passed|failed|loss|resume" "$OUT/gpu_tests_a.log" | tail -30
echo "== bench"; tail -30 "$OUT/bench_slot1.log"
tar czf "$OUT/bench_runs.tgz" --exclude=tensorboard -C /tmp bench1
