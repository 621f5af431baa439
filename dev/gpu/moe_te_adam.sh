#!/usr/bin/env bash
# 1 H200 with Transformer Engine carried (the TE carry first: /tmp/tesite), < 8 min: ADAM_IMPL=native,
# the native MixedPrecisionAdamW in place of TE's FusedAdam under the MoE lean step's
# precision-aware optimizer (issue 53; the recorded traces put TE's step at over twice ours).
#  1. timed, alone on the GPU: bench part moe-te-adam (Qwen3-30B-A3B 8L, the native backend with
#     TE on the path, i.e. the TE image's MoE default: ADAM_IMPL=auto = TE's FusedAdam against
#     ADAM_IMPL=native; 4 runs, ~3 min), both sides in the same call; PARTS
#     moe-te-adam,moe-te-adam-te adds the same on the TE backend (~3.5 min more: then ~8 min in
#     all). JSON into $OUT (copy to docs/benchmarks/, then `python -m training.bench levers`)
#  2. after it (~2 min): tests/gpu/test_adam_impl_gpu.py on the native backend (the tiny MoE
#     trains with it, the patch table names it, a save at 10 resumed to 20 continues the
#     uninterrupted run; auto keeps TE's FusedAdam)
# Usage: GIT_SHA=<sha> bash dev/gpu/moe_te_adam.sh [PARTS]     Carry: .whl data
export TE=1
source "$(dirname "$0")/env.sh"
bash "$(dirname "$0")/burst.sh" idle || exit 1   # timed work on an idle GPU only
timeout 400 python3 -m training.bench all --te --gpus 1 --parts "${1:-moe-te-adam}" \
    --force --budget-s 370 --out-dir "$OUT" --work-dir /tmp/bench > "$OUT/bench_all.log" 2>&1
echo "bench rc=$?"
tail -40 "$OUT/bench_all.log"
timeout 150 python3 -m pytest -p no:cacheprovider -q -s -m gpu -rA \
    tests/gpu/test_adam_impl_gpu.py -k "native] or auto" > "$OUT/adam_impl_tests.log" 2>&1
echo "tests rc=$?"
grep -E "PASSED|FAILED|SKIPPED|ERROR|passed|failed|resume" "$OUT/adam_impl_tests.log" | tail -20
tar czf "$OUT/bench_runs.tgz" --exclude=tensorboard -C /tmp/bench .
