#!/usr/bin/env bash
# 1xH200, ~3-5 min, timed-ish (run on an idle GPU): where an MoE step goes, ours beside Hugging
# Face's model of the family at the bench shape (training/bench/catalog.py MOE_SHAPE and
# GPT_OSS_SHAPE, global batch 8 on one GPU). Ours: iterations 5-6 under the torch profiler, then
# the trace report (GEMMs, the permute, the router, attention, idle/launch gaps). HF: its last two
# steps under the same profiler (training.bench.hf_peer --profile-dir; --compile where the bench
# peer is compiled) and the same report: the two breakdowns side by side.
# --torchtitan: torchtitan's MoE peer alone (qwen3; compiled, as the bench runs it) under the same
# profiler, its last two steps (training.bench.titan_peer --profile-dir), into titan/.
# Into $OUT: train.log, ours/ and hf/ (trace_report.md/.json), the traces archived.
# Usage: GIT_SHA=<sha> bash dev/gpu/moe_profile.sh [qwen3|gpt_oss|mixtral]
#        [--compile|--ours-only|--torchtitan]
#        [TOGGLE=VALUE ...]   (the toggles go to ours: CUDA_GRAPH=full_iteration)   Carry: .whl
source "$(dirname "$0")/env.sh"
bash "$(dirname "$0")/burst.sh" idle || exit 1
family=${1:-qwen3}; hf_args=(); hf=1
case ${2:-} in --compile) hf_args=(--compile) ;; --ours-only) hf=0 ;; esac
toggles=("${@:3}")
if [ "${2:-}" = --torchtitan ]; then
    [ "$family" = qwen3 ] || { echo "--torchtitan: qwen3 only (torchtitan's MoE peer)"; exit 2; }
    mkdir -p "$OUT"
    timeout 420 python3 -m training.bench.titan_peer --model qwen3-30B-A3B --num-layers 8 \
        --seq-length 4096 --mbs 1 --global-batch 8 --steps 3 --warmup 3 \
        --json-out "$OUT/titan_peer.json" --profile-dir /tmp/moe_profile_titan 2>&1 \
        | tail -30 | tee "$OUT/titan_tail.log"
    timeout 200 python3 -m training.profiling.trace_report /tmp/moe_profile_titan --out "$OUT/titan" \
        --top 40 2>&1 | tail -60
    tar czf "$OUT/profile_titan.tgz" -C /tmp moe_profile_titan 2>/dev/null
    exit 0
fi
case $family in
    qwen3) script=train_qwen3_moe.sh size=30B-A3B hf_model=qwen3-30B-A3B seq=4096 layers=8 ;;
    gpt_oss) script=train_gpt_oss.sh size=20b hf_model=gpt-oss-20b seq=8192 layers=8 ;;
    mixtral) script=train_mixtral.sh size=8x7B hf_model=mixtral-8x7B seq=4096 layers=4 ;;
    *) echo "family: qwen3, gpt_oss or mixtral"; exit 2 ;;
esac
EXPERIMENT_DIR=$(mktemp -d /tmp/moe_profile.XXXX); export EXPERIMENT_DIR; mkdir -p "$OUT"
timeout 300 bash "examples/moe/$script" MODEL_SIZE=$size NUM_LAYERS=$layers SEQ_LENGTH=$seq \
    MBS=1 BS=8 TOTAL_ITERS=8 EVAL_ITERS=0 GPUS_PER_NODE=1 PROFILE=torch PROFILE_STEP_START=5 \
    PROFILE_STEP_END=7 "${toggles[@]}" 2>&1 | tail -40 | tee "$OUT/train_tail.log"
run=$(dirname "$(find "$EXPERIMENT_DIR" -name manifest.json | head -1)")
cp "$run/train.log" "$OUT/" 2>/dev/null
timeout 200 python3 -m training.profiling.trace_report "$run" --out "$OUT/ours" --top 40 2>&1 | tail -60
tar czf "$OUT/profile_ours.tgz" -C "$run" profile 2>/dev/null
[ $hf = 1 ] || exit 0
timeout 240 python3 -m training.bench.hf_peer --model $hf_model --num-layers $layers --seq-length $seq \
    --mbs 1 --global-batch 8 --steps 4 --warmup 2 --json-out "$OUT/hf_peer.json" "${hf_args[@]}" \
    --profile-dir /tmp/moe_profile_hf 2>&1 | tail -20 | tee "$OUT/hf_tail.log"
timeout 200 python3 -m training.profiling.trace_report /tmp/moe_profile_hf --out "$OUT/hf" --top 40 2>&1 | tail -60
tar czf "$OUT/profile_hf.tgz" -C /tmp moe_profile_hf 2>/dev/null
ls -la "$OUT"
