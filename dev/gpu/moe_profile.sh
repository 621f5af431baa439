#!/usr/bin/env bash
# 1xH200, ~3 min, timed-ish (run on an idle GPU): why ours is 0.68x HF Qwen3-MoE at the MoE
# bench shape (issue 25, session 7). Qwen3-30B-A3B cut to 8 layers, seq 4096, global batch 8 on
# one GPU (training/bench/catalog.py MOE_SHAPE), iterations 5-6 under the torch profiler, then
# the trace report (where the step goes: GEMMs, the permute, the router, idle/launch gaps).
# Then Hugging Face's Qwen3-MoE at the same shape (training.bench.hf_peer --profile-dir), its
# last two steps under the same profiler, and the same report: the two breakdowns side by side.
# Into $OUT: train.log, ours/ and hf/ (trace_report.md/.json), the traces archived.
# Usage: GIT_SHA=<sha> bash dev/gpu/moe_profile.sh    Carry: .whl
source "$(dirname "$0")/env.sh"
bash "$(dirname "$0")/burst.sh" idle || exit 1
export EXPERIMENT_DIR=/tmp/moe_profile
timeout 300 bash examples/moe/train_qwen3_moe.sh MODEL_SIZE=30B-A3B NUM_LAYERS=8 SEQ_LENGTH=4096 \
    MBS=1 BS=8 TOTAL_ITERS=8 EVAL_ITERS=0 GPUS_PER_NODE=1 PROFILE=torch PROFILE_STEP_START=5 \
    PROFILE_STEP_END=7 2>&1 | tail -40 | tee "$OUT/train_tail.log"
run=$(dirname "$(find /tmp/moe_profile -name manifest.json | head -1)")
cp "$run/train.log" "$OUT/" 2>/dev/null
timeout 200 python3 -m training.profiling.trace_report "$run" --out "$OUT/ours" --top 40 2>&1 | tail -60
tar czf "$OUT/profile_ours.tgz" -C "$run" profile 2>/dev/null
timeout 200 python3 -m training.bench.hf_peer --model qwen3-30B-A3B --num-layers 8 --seq-length 4096 \
    --mbs 1 --global-batch 8 --steps 3 --warmup 2 --json-out "$OUT/hf_peer.json" \
    --profile-dir /tmp/moe_profile_hf 2>&1 | tail -20 | tee "$OUT/hf_tail.log"
timeout 200 python3 -m training.profiling.trace_report /tmp/moe_profile_hf --out "$OUT/hf" --top 40 2>&1 | tail -60
tar czf "$OUT/profile_hf.tgz" -C /tmp moe_profile_hf 2>/dev/null
ls -la "$OUT"
