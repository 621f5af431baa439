#!/usr/bin/env bash
# 1xH200, ~5 min, not timed: the GPU tests that need neither Transformer Engine nor their own
# script (kernels, odd kernel shapes past 2^31 elements, HF parity, the tiny training runs,
# profiling, the MLPerf GPU test). Their own scripts run the rest: checkpoint.sh, moe.sh
# (MOE_PARTS=none: tests only), optimizer_memory_checks.sh, te_tests.sh.
# Carry: .whl data
source "$(dirname "$0")/env.sh"
timeout 560 python3 -m pytest -p no:cacheprovider -q -s -m gpu --durations=0 -rA \
    tests/gpu/test_native_kernels_gpu.py tests/gpu/test_kernel_shapes_gpu.py \
    tests/gpu/test_parity_gpu.py tests/gpu/test_train_gpu.py tests/profiling/test_profiling_gpu.py \
    tests/mlperf/test_mlperf_gpu.py \
    > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?"
grep -E "PASSED|FAILED|SKIPPED|ERROR|passed|failed|late loss|resume" "$OUT/gpu_tests.log" | tail -60
