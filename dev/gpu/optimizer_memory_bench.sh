#!/usr/bin/env bash
# 1 or 2 H200s, timed (issue 23); nothing else may run on the GPU meanwhile. First: full
# Llama3-8B (32 layers, seq 8192, global batch 8) on one H200, ours with the optimizer state the
# launcher's pre-flight recommends for that launch, side by side with HF+Liger (REPEATS, default
# 1; 1 warm-up + 3 measured steps each). Then the optimizer-state lever rows at 8 layers
# (default, bf16 moments + remainder masters, bf16 + stochastic rounding), then the CPU-offload
# rows with what is left. On two GPUs the 8-layer state rows run on GPU 1 beside the first part.
# One GPU: ~9 min with REPEATS=1. JSONs in $OUT (for docs/benchmarks/), run folders in runs.tgz.
# Usage: GIT_SHA=<sha> [REPEATS=2] bash dev/gpu/optimizer_memory_bench.sh    Carry: .whl
source "$(dirname "$0")/env.sh"
bash "$(dirname "$0")/burst.sh" idle || exit 1   # timed work on an idle GPU only
REPEATS=${REPEATS:-1}
LIMIT=${LIMIT:-540}
ours_env=$(CUDA_VISIBLE_DEVICES=0 BS=8 GPUS_PER_NODE=1 python3 -m training.optimize.preflight --recommend \
    2>"$OUT/preflight.log") || { cat "$OUT/preflight.log"; exit 1; }
echo "the pre-flight recommends for the full model at global batch 8: ${ours_env:-nothing}"

full_model() {
    CUDA_VISIBLE_DEVICES=0 timeout 300 python3 -m training.bench peers --num-layers 32 \
        --global-batch 8 --sides native,hf_liger --ours-env "$ours_env" \
        --repeats "$REPEATS" --warmup 1 --steps 3 --budget-s 280 --timeout-s 200 \
        --master-port 29500 --work-dir /tmp/bench0 \
        --out "$OUT/peers_h200_llama3-8B_seq8192.json"
    echo "full-model peers rc=$? at $SECONDS s"
}
part() {  # part GPU NAME PORT: one lever part within what is left of LIMIT
    local left=$((LIMIT - SECONDS))
    [ "$left" -lt 60 ] && { echo "$2: not run (the call's time is spent)"; return; }
    CUDA_VISIBLE_DEVICES=$1 timeout "$left" python3 -m training.bench all --gpus 1 --parts "$2" \
        --repeats 1 --budget-s $((left - 20)) --master-port "$3" --out-dir "$OUT" \
        --work-dir "/tmp/bench_$2"
    echo "$2 rc=$? at $SECONDS s"
}
if [ "$(nvidia-smi -L | wc -l)" -gt 1 ]; then
    { full_model; part 0 levers-optimizer-offload 29550; } > "$OUT/bench_gpu0.log" 2>&1 &
    part 1 levers-optimizer-state 29600 > "$OUT/bench_gpu1.log" 2>&1
    wait
else
    { full_model; part 0 levers-optimizer-state 29600; part 0 levers-optimizer-offload 29550; } \
        > "$OUT/bench_gpu0.log" 2>&1
fi
for log in "$OUT"/bench_gpu*.log; do echo "== $log"; tail -40 "$log"; done
tar czf "$OUT/runs.tgz" --exclude=tensorboard -C /tmp bench0 bench_levers-optimizer-state \
    bench_levers-optimizer-offload 2>/dev/null
ls "$OUT"
