#!/usr/bin/env bash
# 1 H200, untimed GPU tests side by side (nothing here is a speed measurement): each group of
# pytest arguments runs as its own process at the same time, its log in $OUT/NAME.log, all
# stopped LIMIT seconds (default 450) after the call began. Tiny models: a few GiB each of 139.
# Usage: GIT_SHA=<sha> [TE=1] bash dev/gpu/side_by_side.sh NAME='PYTEST ARGS' [NAME='...' ...]
#   e.g. documents='tests/gpu/test_documents_gpu.py' rehearsal='tests/gpu/test_rehearsal_gpu.py'
# Carry: .whl data
source "$(dirname "$0")/env.sh"
LIMIT=${LIMIT:-450}
pids=()
for group in "$@"; do
    name=${group%%=*}; read -r -a args <<< "${group#*=}"
    ( timeout $((LIMIT - SECONDS)) python3 -m pytest -p no:cacheprovider -q -s -m gpu -rA \
          --durations=0 "${args[@]}" > "$OUT/$name.log" 2>&1
      echo "$name rc=$? after ${SECONDS} s" >> "$OUT/$name.log" ) &
    pids+=($!)
done
wait "${pids[@]}"
for group in "$@"; do
    name=${group%%=*}
    echo "== $name"
    grep -E "^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)|rc=|[0-9]+ (passed|failed)" "$OUT/$name.log" | tail -25
done
