#!/usr/bin/env bash
# 2 or 8 H200s (nvidia-h200-x2 / nvidia-h200-x8, issue 27), < 9 min per call, timed work on an
# idle node. The parts are `training.bench all` parts with their own shapes (catalog.py
# PART_SHAPES: the full Llama3-8B at seq 8192 and 8 sequences per GPU, the DP toggles at the
# MLPerf global batch of 32, Qwen3-30B-A3B at EP=GPUS); their JSONs land in $OUT.
#   bash dev/gpu/full_node.sh 2 full-x2,moe-ep2          2 GPUs: full model bf16 + MoE EP=2
#   bash dev/gpu/full_node.sh 8 full-x8,moe-ep8          8 GPUs: the same at 8 (one call each
#   bash dev/gpu/full_node.sh 8 node-dp-comm             of node-dp-optimizer, node-dp-overlap,
#                                                        node-toggles)
#   TE=1 bash dev/gpu/full_node.sh 2|8 full-x2-te|full-x8-te --te   after the TE carry
#   bash dev/gpu/full_node.sh 2 scale-slurm   the scaling series' 1-GPU point (scale-x1, GPU 0
#       alone), then the two-"node" GPU tests (plain and through launchers/slurm/train.sbatch)
# Words after PARTS go to `training.bench all` (--force, --repeats 1, ...).
# Usage: GIT_SHA=<sha> bash dev/gpu/full_node.sh GPUS PARTS [ARGS...]   Carry: .whl (+ data)
source "$(dirname "$0")/env.sh"
gpus=${1:?usage: full_node.sh 2|8 PARTS [ARGS...]}
parts=${2:?usage: full_node.sh 2|8 PARTS [ARGS...]}
shift 2
[ "$(nvidia-smi -L | wc -l)" -ge "$gpus" ] || { echo "full_node.sh: fewer than $gpus GPUs here"; exit 2; }
bash "$(dirname "$0")/burst.sh" idle || exit 1
if [ "$parts" = scale-slurm ]; then
    CUDA_VISIBLE_DEVICES=0 timeout 300 python3 -m training.bench all --gpus 1 --parts scale-x1 \
        "$@" --out-dir "$OUT" --work-dir /tmp/bench > "$OUT/bench_all.log" 2>&1
    echo "scale-x1 rc=$? at $SECONDS s"
    timeout $((530 - SECONDS)) python3 -m pytest -q -m gpu -p no:cacheprovider -rs \
        tests/launchers/test_multinode_gpu.py > "$OUT/multinode_tests.log" 2>&1
    echo "two-node tests rc=$? at $SECONDS s"; tail -15 "$OUT/multinode_tests.log"
else
    timeout 540 python3 -m training.bench all --gpus "$gpus" --parts "$parts" "$@" \
        --out-dir "$OUT" --work-dir /tmp/bench > "$OUT/bench_all.log" 2>&1
    echo "bench rc=$? at $SECONDS s"
fi
tail -60 "$OUT/bench_all.log"
tar czf "$OUT/bench_runs.tgz" --exclude=tensorboard -C /tmp bench 2>/dev/null
ls "$OUT"
