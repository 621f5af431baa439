#!/usr/bin/env bash
# 2xH200, ~8 min: every GPU test (training, parity, kernels, checkpoint resume, profiling,
# the two-'node' launch, MLPerf) and the MLPerf short run with its compliance check.
# Carry: .whl data
source "$(dirname "$0")/env.sh"
timeout 420 python3 -m pytest -p no:cacheprovider -q -s -m gpu tests/gpu tests/profiling \
    tests/launchers tests/mlperf 2>&1 | tee "$OUT/gpu_tests.log" | tail -40
timeout 150 bash examples/mlperf/llama31_8b/short_run.sh "$OUT" > "$OUT/mlperf_short.log" 2>&1
echo "mlperf short run rc=$?"; tail -15 "$OUT/mlperf_short.log"
