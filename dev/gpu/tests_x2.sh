#!/usr/bin/env bash
# 2xH200, ~7 min: every GPU test and the MLPerf short run with its compliance check.
# The one-GPU halves run side by side (one per GPU), then the two-'node' launch test.
# Carry: .whl data
source "$(dirname "$0")/env.sh"
PYTEST=(python3 -m pytest -p no:cacheprovider -q -s -m gpu --durations=0)
(CUDA_VISIBLE_DEVICES=0 timeout 330 "${PYTEST[@]}" tests/gpu > "$OUT/gpu_tests_a.log" 2>&1
 echo "tests/gpu rc=$?" >> "$OUT/gpu_tests_a.log") &
(CUDA_VISIBLE_DEVICES=1 timeout 150 "${PYTEST[@]}" tests/profiling tests/mlperf \
     > "$OUT/gpu_tests_b.log" 2>&1
 echo "tests/profiling tests/mlperf rc=$?" >> "$OUT/gpu_tests_b.log"
 CUDA_VISIBLE_DEVICES=1 GPUS=1 timeout 200 bash examples/mlperf/llama31_8b/short_run.sh "$OUT" \
     > "$OUT/mlperf_short.log" 2>&1
 echo "mlperf short run rc=$?" >> "$OUT/mlperf_short.log") &
wait
timeout 150 "${PYTEST[@]}" tests/launchers > "$OUT/gpu_tests_multinode.log" 2>&1
echo "tests/launchers rc=$?" >> "$OUT/gpu_tests_multinode.log"
for f in gpu_tests_a gpu_tests_b mlperf_short gpu_tests_multinode; do
    echo "== $f"; tail -25 "$OUT/$f.log"
done
