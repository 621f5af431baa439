#!/usr/bin/env bash
# 1 or 2 H200s, < 9 min: the next part of the benchmark sweep that fits (training.bench all
# skips parts already recorded in docs/benchmarks/), or the named parts.
# Usage: bash dev/gpu/bench.sh 1|2 [PART[,PART...] [--force]]
# Carry: .whl
source "$(dirname "$0")/env.sh"
bash "$(dirname "$0")/burst.sh" idle || exit 1   # timed work on an idle GPU only
python3 -m training.bench all --gpus "${1:-1}" ${2:+--parts "$2"} "${@:3}" --out-dir "$OUT" \
    --work-dir /tmp/bench > "$OUT/bench_all.log" 2>&1; echo "bench rc=$?"
tail -60 "$OUT/bench_all.log"
tar czf "$OUT/bench_runs.tgz" --exclude=tensorboard -C /tmp/bench .
