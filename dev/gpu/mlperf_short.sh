#!/usr/bin/env bash
# 1xH200, ~3 min: the MLPerf short run (examples/mlperf/llama31_8b/short_run.sh, open division,
# shipped corpus) through issue 22's run-side code: the seed drawn by the launch and taken by
# every rank, the untimed index step on node 0, the page cache dropped (as root where
# /proc/sys/vm/drop_caches is writable; otherwise cache_clear false with the reason: open
# division), run_start before Megatron reads any data; then the open checker and the summary.
# Into $OUT: mlperf.log, compliance.json, eval_loss.png, short_run.tgz, mlperf_checks.txt.
# Carry: .whl data
set -euo pipefail
source "$(dirname "$0")/env.sh"
set +e
GPUS=1 timeout 300 bash examples/mlperf/llama31_8b/short_run.sh "$OUT" 2>&1 | tee "$OUT/short_run_stdout.log"
echo "short_run rc=${PIPESTATUS[0]}"
python3 - "$OUT/mlperf.log" <<'PY' 2>&1 | tee "$OUT/mlperf_checks.txt"
import json, sys
events = [json.loads(l.split(":::MLLOG ", 1)[1]) for l in open(sys.argv[1]) if ":::MLLOG " in l]
keys = [e["key"] for e in events]
first = {e["key"]: e for e in reversed(events)}
print("cache_clear:", first["cache_clear"]["value"], first["cache_clear"]["metadata"].get("method"),
      "-", first["cache_clear"]["metadata"].get("detail"))
print("seed:", first["seed"]["value"])
print("order init_start < init_stop < run_start < eval_dataset_tokens < block_start:",
      keys.index("init_start") < keys.index("init_stop") < keys.index("run_start")
      < keys.index("eval_dataset_tokens") < keys.index("block_start"))
print("datasets:", {k: first[k]["value"] for k in keys if k.endswith("_dataset_tokens")
                    or k.endswith("_dataset_documents")})
PY
grep -h "MLPerf data index\|MLPerf seed\|MLPerf cache_clear" "$OUT/short_run_stdout.log" /tmp/mlperf_short/short_run.log 2>/dev/null | sort -u | head -8
