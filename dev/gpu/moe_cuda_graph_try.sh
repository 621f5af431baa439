#!/usr/bin/env bash
# 1xH200, ~3 min, on an idle GPU: does Megatron's full-iteration CUDA graph capture our MoE step,
# and what does it do to the launch-bound step (issue 25; docs/moe.md "What that leaves")?
# The MoE bench shape (Qwen3-30B-A3B cut to 8 layers, seq 4096, global batch 8), three launches
# through the example script, each 10 iterations:
#   sync-free   MOE_DEVICE_COUNTS=1 CROSS_ENTROPY_LOSS_FUSION=0 (no host synchronisation in the
#               step: the counts stay on the GPU, Megatron's CE instead of Liger's, whose
#               .item() would break a capture), with bf16 moments and remainder masters
#               (ADAM_MOMENTS_DTYPE=bf16 MASTER_WEIGHTS=remainder: ~45 GiB less state, room
#               for the graph's own memory pool beside the eager warm-up's; estimate 59.9 GiB)
#   graph       the same + --cuda-graph-impl full_iteration (Megatron's flag; since session 11 the CUDA_GRAPH toggle, its guard applies:
#               fwd+bwd of every micro-batch replayed as one graph after its warm-up steps)
#   default     the launcher's default, for reference
# Prints each run's steady step times, tokens/s and per-iteration losses (graph vs sync-free:
# the same computation, so the losses should agree). An exploration, not a benchmark: if the
# graph captures and pays, the next step is a guarded toggle measured as a lever.
# Usage: GIT_SHA=<sha> bash dev/gpu/moe_cuda_graph_try.sh    Carry: .whl
source "$(dirname "$0")/env.sh"
bash "$(dirname "$0")/burst.sh" idle || exit 1
SHAPE=(TRANSFORMER_IMPL=native MODEL_SIZE=30B-A3B NUM_LAYERS=8 SEQ_LENGTH=4096 MBS=1 BS=8
       TOTAL_ITERS=10 METRICS_WARMUP_ITERS=5 EVAL_ITERS=0 GPUS_PER_NODE=1)
run() {  # run NAME ARGS...: one launch into /tmp/cg/NAME, its log into $OUT/NAME.log
    local name=$1; shift
    EXPERIMENT_DIR=/tmp/cg/$name timeout 240 bash examples/moe/train_qwen3_moe.sh "${SHAPE[@]}" "$@" \
        > "$OUT/$name.log" 2>&1
    echo "$name rc=$?"
}
SYNC_FREE=(MOE_DEVICE_COUNTS=1 CROSS_ENTROPY_LOSS_FUSION=0 ADAM_MOMENTS_DTYPE=bf16 MASTER_WEIGHTS=remainder)
run sync-free "${SYNC_FREE[@]}"
run graph "${SYNC_FREE[@]}" --cuda-graph-impl full_iteration
run default
python3 - <<'PY'
import json, pathlib, statistics
for name in ("sync-free", "graph", "default"):
    found = sorted(pathlib.Path("/tmp/cg", name).rglob("metrics.jsonl"))
    if not found:
        print(f"{name}: no metrics.jsonl"); continue
    rows = [json.loads(line) for line in found[-1].read_text().splitlines() if line.strip()]
    steady = [r for r in rows if not r.get("warmup")]
    times = [r["step_time_s"] for r in steady]
    tps = [r["tokens_per_s_per_gpu"] for r in steady]
    print(f"{name}: steady steps {[round(t, 3) for t in times]}, "
          f"{statistics.fmean(tps):,.0f} tokens/s/GPU" if tps else f"{name}: no steady step")
    print(f"  loss by iteration: {[round(r['loss'], 5) for r in rows]}")
PY
for name in sync-free graph default; do echo "== $name (tail)"; tail -8 "$OUT/$name.log"; done
