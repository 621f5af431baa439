#!/usr/bin/env bash
# 2xH200, < 9 min: two one-GPU parts of the benchmark sweep side by side, one per GPU; each
# JSON records that it ran beside the other.
# Usage: bash dev/gpu/bench_x2.sh [--force]              the next parts: `training.bench all
#            --slot 0/2` and `1/2` (--force re-measures slot 0's complete parts)
#        bash dev/gpu/bench_x2.sh PARTS0 PARTS1 [--force] the named parts, GPU 0 and GPU 1
#            (--force to both: re-measures a named part that is already complete)
#        TE=1 bash dev/gpu/bench_x2.sh peers-te te-recipes --te --repeats 2   the Transformer
#            Engine parts (after the TE carry; every word after the two parts goes to both)
# Carry: .whl
source "$(dirname "$0")/env.sh"
for slot in 0 1; do
    if [ $# -ge 2 ] && [ "${1:0:2}" != "--" ]; then
        parts=("$1" "$2"); select=(--parts "${parts[$slot]}" "${@:3}")
    else
        select=(--slot "$slot/2"); if [ "$slot" = 0 ]; then select+=("$@"); fi
    fi
    CUDA_VISIBLE_DEVICES=$slot timeout 560 python3 -m training.bench all --gpus 1 \
        "${select[@]}" --budget-s 500 --master-port $((29500 + 100 * slot)) \
        --out-dir "$OUT" --work-dir "/tmp/bench$slot" \
        > "$OUT/bench_slot$slot.log" 2>&1 &
done
wait
for slot in 0 1; do echo "== slot $slot"; tail -30 "$OUT/bench_slot$slot.log"; done
tar czf "$OUT/bench_runs.tgz" --exclude=tensorboard -C /tmp bench0 bench1
