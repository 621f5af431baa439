#!/usr/bin/env bash
# 1xH200, ~6 min (issue 52): bit-for-bit resume on the native backend, dense (tiny Llama) and
# MoE (tiny Qwen3-MoE), on the shipped corpus through the launcher. Each: 20 iterations saved
# at 10 and 20 against a resume from 10 (losses 11-20 and every tensor of the final checkpoint
# equal, bit for bit), then an extension (TOTAL_ITERS=10 on the 20-iteration schedule,
# continued to TOTAL_ITERS=20 from its own folder with the checkpoint's schedule: no Megatron
# assert) against the same straight run. Eight tiny runs. The TE variants are in
# tests/gpu/test_te_gpu.py (TE carry: TE=1 bash dev/gpu/gpu_tests.sh or pytest_gpu.sh).
# Usage: GIT_SHA=$(git rev-parse HEAD) bash dev/gpu/resume.sh     Carry: .whl data
source "$(dirname "$0")/env.sh"
set -o pipefail
timeout 450 python3 -m pytest -p no:cacheprovider -q -s -m gpu --durations=0 \
    tests/gpu/test_train_gpu.py -k "checkpoint_resume" 2>&1 | tee "$OUT/resume_gpu.log"
status=$?
grep -E "PASSED|FAILED|passed|failed|tensors compared|worst relative" "$OUT/resume_gpu.log" | tail -20
exit "$status"
