#!/usr/bin/env bash
# 2xH200, ~8 min: the next one-GPU part of the sweep on GPU0 (toggles-c in session 3) beside
# the torchtitan peer's first GPU run on GPU1 (native vs torchtitan, 3 repeats).
# Carry: .whl
source "$(dirname "$0")/env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 540 python3 -m training.bench all --gpus 1 --slot 0/1 \
    --budget-s 440 --master-port 29500 --out-dir "$OUT" --work-dir /tmp/bench0 \
    > "$OUT/bench_gpu0.log" 2>&1 &
CUDA_VISIBLE_DEVICES=1 timeout 540 python3 -m training.bench peers --sides native,torchtitan \
    --budget-s 440 --master-port 29600 --work-dir /tmp/bench1 \
    --name peers-torchtitan_h200_llama3-8B-8L_seq8192 \
    --out "$OUT/peers-torchtitan_h200_llama3-8B-8L_seq8192.json" > "$OUT/bench_gpu1.log" 2>&1 &
wait
for gpu in 0 1; do echo "== GPU$gpu"; tail -25 "$OUT/bench_gpu$gpu.log"; done
tar czf "$OUT/bench_runs.tgz" --exclude=tensorboard -C /tmp bench0 bench1
