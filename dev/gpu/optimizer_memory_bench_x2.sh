#!/usr/bin/env bash
# 2xH200, ~8 min, timed (issue 23). GPU 0: full Llama3-8B (32 layers, seq 8192, global batch 8)
# on one H200, ours with the optimizer state the launcher's pre-flight recommends for that
# launch, side by side with HF+Liger (REPEATS, default 2; 1 warm-up + 3 measured steps each),
# then the CPU-offload lever rows at 8 layers with what is left of the budget. GPU 1: the
# optimizer-state lever rows at 8 layers (default, bf16 moments + remainder masters, bf16 +
# stochastic rounding; 3 repeats). JSONs in $OUT (for docs/benchmarks/), run folders in
# runs.tgz (manifests and metrics: for the estimator's calibration).
# Usage: GIT_SHA=<sha> [REPEATS=1] bash dev/gpu/optimizer_memory_bench_x2.sh    Carry: .whl
source "$(dirname "$0")/env.sh"
REPEATS=${REPEATS:-2}
ours_env=$(CUDA_VISIBLE_DEVICES=0 BS=8 GPUS_PER_NODE=1 python3 -m training.optimize.preflight --recommend \
    2>"$OUT/preflight.log") || { cat "$OUT/preflight.log"; exit 1; }
echo "the pre-flight recommends for the full model at global batch 8: ${ours_env:-nothing}"

gpu0() {
    local start=$SECONDS
    CUDA_VISIBLE_DEVICES=0 timeout 420 python3 -m training.bench peers --num-layers 32 \
        --global-batch 8 --sides native,hf_liger --ours-env "$ours_env" \
        --repeats "$REPEATS" --warmup 1 --steps 3 --budget-s 400 --timeout-s 240 \
        --master-port 29500 --work-dir /tmp/bench0 \
        --out "$OUT/peers_h200_llama3-8B_seq8192.json"
    echo "full-model peers rc=$? after $((SECONDS - start)) s"
    CUDA_VISIBLE_DEVICES=0 timeout $((530 - SECONDS + start)) python3 -m training.bench all \
        --gpus 1 --parts levers-optimizer-offload --repeats 1 \
        --budget-s $((500 - SECONDS + start)) --master-port 29550 --out-dir "$OUT" \
        --work-dir /tmp/bench0b
    echo "offload part rc=$?"
}
gpu0 > "$OUT/bench_gpu0.log" 2>&1 &
CUDA_VISIBLE_DEVICES=1 timeout 540 python3 -m training.bench all --gpus 1 \
    --parts levers-optimizer-state --budget-s 510 --master-port 29600 --out-dir "$OUT" \
    --work-dir /tmp/bench1 > "$OUT/bench_gpu1.log" 2>&1 &
wait
for gpu in 0 1; do echo "== GPU $gpu"; tail -40 "$OUT/bench_gpu$gpu.log"; done
tar czf "$OUT/runs.tgz" --exclude=tensorboard -C /tmp bench0 bench0b bench1 2>/dev/null
ls "$OUT"
