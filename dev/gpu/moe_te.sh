#!/usr/bin/env bash
# 1 H200 with Transformer Engine carried (dev/gpu_runbook.md's TE carry first), < 9 min, untimed:
# MoE on the TE backend (issue 37). The MoE GPU tests with TE (HF Qwen3-MoE parity of TE's
# grouped linear and of the native experts beside TE's layers; the tiny MoE through the TE
# image's defaults in bf16 and fp8), beside them on the same GPU the fp8 convergence grid
# (docs/convergence/grid_moe_te_fp8.yaml); then, alone on the GPU, the bench shape under the
# profiler with TE's experts and with the native ones (trace reports: where the step goes).
# Usage: GIT_SHA=<sha> bash dev/gpu/moe_te.sh     Carry: .whl data (warm machine: /tmp/tesite)
export TE=1
source "$(dirname "$0")/env.sh"
LIMIT=${LIMIT:-330}
(export MASTER_PORT=29700
 timeout $((LIMIT + 30)) python3 -m training.convergence docs/convergence/grid_moe_te_fp8.yaml \
     --budget-s "$LIMIT" --out "$OUT" --experiment-dir /tmp/conv_moe_te > "$OUT/convergence.log" 2>&1
 echo "convergence rc=$?" >> "$OUT/convergence.log") &
timeout "$LIMIT" python3 -m pytest -p no:cacheprovider -q -s -m gpu -rA --durations=0 \
    tests/gpu/test_moe_gpu.py -k "transformer_engine or te_backend" > "$OUT/moe_te_tests.log" 2>&1
echo "tests rc=$?" >> "$OUT/moe_te_tests.log"
wait
profile() {  # profile NAME TOGGLES...: iterations 5-6 of the bench shape under the profiler
    local name=$1; shift
    EXPERIMENT_DIR=/tmp/moe_te_profile/$name timeout 150 bash examples/moe/train_qwen3_moe.sh \
        TRANSFORMER_IMPL=transformer_engine \
        MODEL_SIZE=30B-A3B NUM_LAYERS=8 SEQ_LENGTH=4096 MBS=1 BS=8 TOTAL_ITERS=7 EVAL_ITERS=0 \
        GPUS_PER_NODE=1 PROFILE=torch PROFILE_STEP_START=5 PROFILE_STEP_END=7 "$@" \
        > "$OUT/profile_$name.log" 2>&1
    local run; run=$(dirname "$(find "/tmp/moe_te_profile/$name" -name manifest.json | head -1)")
    timeout 120 python3 -m training.profiling.trace_report "$run" --out "/tmp/moe_te_reports/$name" \
        --top 30 > "/tmp/moe_te_reports/$name.txt" 2>&1
}
mkdir -p /tmp/moe_te_reports
profile te_experts MOE_EXPERT_IMPL=te
profile native_experts
echo "== MoE TE tests"; grep -E "PASSED|FAILED|SKIPPED|ERROR|rc=|loss|max abs err" "$OUT/moe_te_tests.log" | tail -30
echo "== convergence"; tail -15 "$OUT/convergence.log"
for n in te_experts native_experts; do echo "== profile $n"; tail -30 "/tmp/moe_te_reports/$n.txt"; done
tar czf "$OUT/moe_te_reports.tgz" -C /tmp moe_te_reports 2>/dev/null
tar czf "$OUT/conv_runs.tgz" --exclude=tensorboard -C /tmp conv_moe_te 2>/dev/null || true
ls "$OUT"
