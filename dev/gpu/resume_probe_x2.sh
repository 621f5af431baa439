#!/usr/bin/env bash
# 2xH200, ~2 min: the tiny save/resume pair twice side by side, Megatron's default optimizer
# checkpoint format (dp_reshardable) on GPU0 and fully_reshardable on GPU1, printing both loss
# curves (tests/gpu/test_train_gpu.py's resume test missed 1e-3 by 28x with the default).
# Carry: .whl data
source "$(dirname "$0")/env.sh"
pair() {  # $1 GPU, $2 port base, $3 extra Megatron args
    local dir=/tmp/probe$1
    common=(MODEL_SIZE=tiny GPUS_PER_NODE=1 DATA_PATH=data/shakespeare/train EVAL_ITERS=0
            LR=1e-3 MIN_LR=1e-4 TOTAL_ITERS=20 "EXPERIMENT_DIR=$dir" RUN_ID=run
            MASTER_ADDR=127.0.0.1 "EXTRA_MEGATRON_ARGS=$3")
    env CUDA_VISIBLE_DEVICES="$1" "${common[@]}" EXP_NAME=full MASTER_PORT=$2 SAVE=$dir/ckpt \
        SAVE_INTERVAL=10 bash examples/llama/train_llama3.sh > "$dir.full.log" 2>&1
    env CUDA_VISIBLE_DEVICES="$1" "${common[@]}" EXP_NAME=resumed MASTER_PORT=$(($2 + 1)) \
        LOAD=$dir/ckpt bash examples/llama/train_llama3.sh --ckpt-step 10 > "$dir.resumed.log" 2>&1
    echo "GPU$1 rc=$? extra='$3'"
    python3 - "$dir" <<'PY'
import json, sys
from pathlib import Path
d = Path(sys.argv[1])
def losses(name):
    f = d / name / "bf16" / "run" / "metrics.jsonl"
    return {m["iteration"]: m["loss"] for m in map(json.loads, f.read_text().splitlines())
            if m.get("loss") is not None} if f.exists() else {}
a, b = losses("full"), losses("resumed")
for i in range(9, 21):
    print(i, a.get(i), b.get(i))
PY
    grep -h "sharded state of type\|Error" "$dir.resumed.log" | head -5
}
pair 0 29700 "" > "$OUT/probe0.txt" 2>&1 &
pair 1 29710 "--dist-ckpt-optim-fully-reshardable" > "$OUT/probe1.txt" 2>&1 &
wait
cat "$OUT/probe0.txt" "$OUT/probe1.txt"
