#!/usr/bin/env bash
# 2xH200, ~2 min: the peak memory split by phase (forward/backward, optimizer step, between
# steps; training/loop_hooks.PhasePeaks) at the 8-layer Llama3-8B shape, seq 8192, MBS 1,
# global batch 8: the launcher default on GPU 0 and RECOMPUTE=full on GPU 1, side by side.
# Prints each run's summary and keeps the run folders (no TensorBoard) in $OUT/runs.tgz.
# Carry: .whl
source "$(dirname "$0")/env.sh"
run() {  # NAME GPU PORT [KEY=VALUE ...]
    local name=$1 gpu=$2 port=$3
    shift 3
    env CUDA_VISIBLE_DEVICES="$gpu" MASTER_PORT="$port" MODEL_SIZE=8B NUM_LAYERS=8 \
        SEQ_LENGTH=8192 MBS=1 BS=8 TOTAL_ITERS=6 METRICS_WARMUP_ITERS=2 EVAL_ITERS=0 \
        EXPERIMENT_DIR=/tmp/phases EXP_NAME="$name" "$@" \
        timeout 150 bash examples/llama/train_llama3.sh > "$OUT/$name.log" 2>&1
    echo "$name rc=$?"
}
run default 0 29610 &
run recompute-full 1 29611 RECOMPUTE=full &
wait
for manifest in /tmp/phases/*/*/*/manifest.json; do
    echo "== $manifest"
    python3 -c "import json,sys; s=json.load(open(sys.argv[1]))['run']['summary']; \
print(json.dumps({k: s.get(k) for k in ('tokens_per_s_per_gpu', \
'peak_allocated_gib_max_over_ranks', 'peak_allocated_gib_by_phase')}, indent=1))" "$manifest"
done
tar czf "$OUT/runs.tgz" --exclude=tensorboard -C /tmp phases
