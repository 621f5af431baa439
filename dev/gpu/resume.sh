#!/usr/bin/env bash
# 1xH200, ~8 min (issue 52). First the bit-for-bit resume test on the native backend (tiny
# Llama on the shipped corpus, through the launcher): 20 iterations saved at 10 and 20 against
# a resume from 10 (losses 11-20 and every tensor of the final checkpoint equal, bit for bit),
# then an extension (TOTAL_ITERS=10 on the 20-iteration schedule, continued to TOTAL_ITERS=20
# from its own folder with the checkpoint's schedule, no Megatron assert) against the same
# straight run: four tiny runs, ~3 min. Then the bench part save-async: a save's cost to the
# step on the full Llama3-8B, sync against ASYNC_SAVE=1 (training/bench/catalog.py
# SAVE_SHAPE), in what is left of the call; its JSON in $OUT (docs/benchmarks/ after review).
# The MoE and TE resume tests: tests/gpu/test_train_gpu.py -k moe_checkpoint_resume and
# tests/gpu/test_te_gpu.py -k checkpoint_resume (TE carry), e.g. through dev/gpu/pytest_gpu.sh.
# Usage: GIT_SHA=$(git rev-parse HEAD) [RESUME_PARTS=save-async|none] bash dev/gpu/resume.sh
# Carry: .whl data
source "$(dirname "$0")/env.sh"
set -o pipefail
timeout 240 python3 -m pytest -p no:cacheprovider -q -s -m gpu --durations=0 \
    tests/gpu/test_train_gpu.py -k "test_checkpoint_resume" 2>&1 | tee "$OUT/resume_gpu.log"
status=$?
grep -E "PASSED|FAILED|passed|failed|tensors compared|worst relative" "$OUT/resume_gpu.log" | tail -20
[ "${RESUME_PARTS:-save-async}" = none ] && exit "$status"
left=$((460 - SECONDS))
timeout "$left" python3 -m training.bench all --gpus 1 --parts "${RESUME_PARTS:-save-async}" \
    --budget-s $((left - 20)) --out-dir "$OUT" --work-dir /tmp/bench > "$OUT/bench_save.log" 2>&1
echo "bench rc=$?"
tail -30 "$OUT/bench_save.log"
exit "$status"
