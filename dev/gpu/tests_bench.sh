#!/usr/bin/env bash
# 1xH200, < 9 min: the one-GPU training tests but the local backend's (tiny native run,
# checkpoint resume, empty LOAD refused, the kernel checks; ~2 min), then the named benchmark
# parts that fit the rest. Usage: bash dev/gpu/tests_bench.sh PART[,PART...] [--force]
# Carry: .whl data
source "$(dirname "$0")/env.sh"
timeout 180 python3 -m pytest -p no:cacheprovider -q -s -m gpu --durations=0 -k "not local" \
    tests/gpu/test_train_gpu.py tests/gpu/test_native_kernels_gpu.py > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?"; grep -E "PASSED|FAILED|ERROR|passed|failed|resume" "$OUT/gpu_tests.log" | tail -20
python3 -m training.bench all --gpus 1 --parts "$1" "${@:2}" --budget-s $((540 - SECONDS)) \
    --out-dir "$OUT" --work-dir /tmp/bench > "$OUT/bench_all.log" 2>&1; echo "bench rc=$?"
tail -40 "$OUT/bench_all.log"
tar czf "$OUT/bench_runs.tgz" --exclude=tensorboard -C /tmp/bench .
