#!/usr/bin/env bash
# 2xH200, < 9 min: two one-GPU parts of the benchmark sweep side by side, one per GPU
# (`training.bench all --slot 0/2` and `1/2`; each JSON records that it ran beside the other).
# Usage: bash tools/gpu/bench_x2.sh [--force]   (--force re-measures slot 0's complete parts,
# e.g. the peers with 3 repeats).   Carry: .whl
source "$(dirname "$0")/env.sh"
for slot in 0 1; do
    extra=()
    if [ "$slot" = 0 ] && [ -n "${1:-}" ]; then extra=("$1"); fi
    CUDA_VISIBLE_DEVICES=$slot timeout 560 python3 -m training.bench all --gpus 1 \
        --slot "$slot/2" --budget-s 500 --master-port $((29500 + 100 * slot)) \
        --out-dir "$OUT" --work-dir "/tmp/bench$slot" "${extra[@]}" \
        > "$OUT/bench_slot$slot.log" 2>&1 &
done
wait
for slot in 0 1; do echo "== slot $slot"; tail -30 "$OUT/bench_slot$slot.log"; done
tar czf "$OUT/bench_runs.tgz" --exclude=tensorboard -C /tmp bench0 bench1
