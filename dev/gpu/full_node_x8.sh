#!/usr/bin/env bash
# 8xH200 (nvidia-h200-x8, issue 11), < 10 min per call. Ask `status` first: not lent so far.
#   bash dev/gpu/full_node_x8.sh headline   the full Llama3-8B at seq 8192, DP=8 with the
#       distributed optimizer: the launcher default at global batch 128 (2 repeats) and at the
#       MLPerf global batch 32, then TP=2 x DP=4 at 128 (~8 min)
#   bash dev/gpu/full_node_x8.sh toggles    the next default-on toggle off vs on, 3 repeats,
#       at global batch 32 (`training.bench all --gpus 8`: one toggle per call, ~6 min; five calls)
# Carry: .whl
source "$(dirname "$0")/env.sh"
BENCH=(python3 -m training.bench)
SHAPE=(--num-layers 32 --gpus 8 --steps 3 --warmup 2)
case "${1:-}" in
headline)
    "${BENCH[@]}" toggles "${SHAPE[@]}" --global-batch 128 --keys default --repeats 2 \
        --name full-node-gb128_h200x8_llama3-8B_seq8192 --out "$OUT/gb128.json" \
        --work-dir /tmp/x8 > "$OUT/gb128.log" 2>&1; echo "gb128 rc=$?"
    "${BENCH[@]}" toggles "${SHAPE[@]}" --global-batch 32 --keys default --repeats 1 \
        --name full-node-gb32_h200x8_llama3-8B_seq8192 --out "$OUT/gb32.json" \
        --work-dir /tmp/x8 > "$OUT/gb32.log" 2>&1; echo "gb32 rc=$?"
    "${BENCH[@]}" toggles "${SHAPE[@]}" --tp 2 --global-batch 128 --keys default --repeats 1 \
        --name full-node-tp2dp4-gb128_h200x8_llama3-8B_seq8192 --out "$OUT/tp2dp4.json" \
        --work-dir /tmp/x8 > "$OUT/tp2dp4.log" 2>&1; echo "tp2dp4 rc=$?"
    tail -8 "$OUT"/*.log ;;
toggles)
    "${BENCH[@]}" all "${SHAPE[@]}" --global-batch 32 --out-dir "$OUT" --work-dir /tmp/x8 \
        > "$OUT/toggles.log" 2>&1; echo "toggles rc=$?"; tail -30 "$OUT/toggles.log" ;;
*)
    echo "usage: bash dev/gpu/full_node_x8.sh headline|toggles" >&2; exit 2 ;;
esac
