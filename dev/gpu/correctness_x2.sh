#!/usr/bin/env bash
# 2xH200, < 10 min: the full Llama3-8B (32 layers, seq 8192, DP=2) through the benchmark
# harness (issue 10's scale point: no recompute vs full recompute at micro-batch 1), then the
# correctness harnesses side by side on both GPUs (timing plays no part in them): numerics
# layouts, numerics toggles, the ADAM_EPS x GRAD_REDUCE_IN_BF16 convergence grid.
#   SCALE_S=0   skips the scale point.
#   CONV_DIR    the grid's run folders; finished cells are read back, not rerun. To finish a
#               grid started in an earlier call: unpack its convergence_runs.tgz into .carry/conv
#               here, carry .carry, and set CONV_DIR=.carry/conv.
#   CONV=0      skips the convergence grid.
# The numerics parts reuse the completed runs of docs/benchmarks/numerics_<part>.json (same
# toggles, exit 0; never a run that saves or loads a checkpoint) and run the rest.
# $OUT keeps few files (the device returns at most 8): the JSONs, and two archives.
# Carry: .whl data [.carry]
source "$(dirname "$0")/env.sh"
SCALE_S=${SCALE_S:-240}
CONV_DIR=${CONV_DIR:-/tmp/conv}
CONV=${CONV:-1}
mkdir -p /tmp/logs
if [ "$SCALE_S" -gt 0 ]; then
    timeout "$SCALE_S" python3 -m training.bench toggles --num-layers 32 --gpus 2 \
        --global-batch 16 --keys RECOMPUTE=full --repeats 1 --steps 4 --warmup 2 \
        --out "$OUT/scale.json" --name scale_h200x2_llama3-8B_seq8192 --work-dir /tmp/scale \
        > /tmp/logs/scale.log 2>&1
    echo "scale rc=$?"; tail -12 /tmp/logs/scale.log
fi
left=$((540 - SECONDS))
for part in layouts toggles; do
    port=$([ "$part" = layouts ] && echo 29610 || echo 29620)
    MASTER_PORT=$port timeout "$left" python3 -m training.numerics run "$part" --out "$OUT" \
        --work-dir "/tmp/num_$part" --budget-s $((left - 90)) \
        --reuse "docs/benchmarks/numerics_$part.json" > "/tmp/logs/numerics_$part.log" 2>&1 &
done
if [ "$CONV" != 0 ]; then
    MASTER_PORT=29630 timeout "$left" python3 -m training.convergence \
        docs/convergence/grid_adam_eps_x_bf16_reduce.yaml --out /tmp/conv_report \
        --experiment-dir "$CONV_DIR" --budget-s $((left - 150)) > /tmp/logs/convergence.log 2>&1 &
fi
wait
for f in numerics_layouts numerics_toggles convergence; do
    echo "== $f"; tail -20 "/tmp/logs/$f.log"
done
tar czf "$OUT/logs_and_reports.tgz" -C /tmp logs conv_report 2>/dev/null
tar czf "$OUT/runs.tgz" --exclude=tensorboard --exclude='*.distcp' -C /tmp \
    scale num_layouts num_toggles 2>/dev/null
tar czf "$OUT/convergence_runs.tgz" --exclude=tensorboard --exclude='*.distcp' -C "$CONV_DIR" .
