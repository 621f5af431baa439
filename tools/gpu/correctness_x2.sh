#!/usr/bin/env bash
# 2xH200, < 10 min: the full Llama3-8B (32 layers, seq 8192, DP=2) through the benchmark
# harness (issue 10's scale point: no recompute vs full recompute at micro-batch 1), then the
# correctness harnesses side by side on both GPUs (timing plays no part in them): numerics
# layouts, numerics toggles, the ADAM_EPS x GRAD_REDUCE_IN_BF16 convergence grid.
# Carry: .whl data
source "$(dirname "$0")/env.sh"
SCALE_S=${SCALE_S:-240}
timeout "$SCALE_S" python3 -m training.bench toggles --num-layers 32 --gpus 2 --global-batch 16 \
    --keys RECOMPUTE=full --repeats 1 --steps 4 --warmup 2 --out "$OUT/scale.json" \
    --name scale_h200x2_llama3-8B_seq8192 --work-dir /tmp/scale > "$OUT/scale.log" 2>&1
echo "scale rc=$?"; tail -12 "$OUT/scale.log"
left=$((540 - SECONDS))
MASTER_PORT=29610 timeout "$left" python3 -m training.numerics run layouts --out "$OUT" \
    --work-dir /tmp/num_layouts --budget-s $((left - 90)) > "$OUT/numerics_layouts.log" 2>&1 &
MASTER_PORT=29620 timeout "$left" python3 -m training.numerics run toggles --out "$OUT" \
    --work-dir /tmp/num_toggles --budget-s $((left - 90)) > "$OUT/numerics_toggles.log" 2>&1 &
MASTER_PORT=29630 timeout "$left" python3 -m training.convergence \
    docs/convergence/grid_adam_eps_x_bf16_reduce.yaml --out "$OUT/convergence" \
    --experiment-dir /tmp/conv --budget-s $((left - 150)) > "$OUT/convergence.log" 2>&1 &
wait
for f in numerics_layouts numerics_toggles convergence; do echo "== $f"; tail -20 "$OUT/$f.log"; done
tar czf "$OUT/correctness_runs.tgz" --exclude=tensorboard --exclude='*.distcp' \
    -C /tmp scale num_layouts num_toggles conv 2>/dev/null
