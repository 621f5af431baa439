#!/usr/bin/env bash
# 2xH200, one part per call (~4 min layouts, ~8 min toggles): training.numerics.
# Usage: bash dev/gpu/numerics_x2.sh layouts|toggles      Carry: .whl data
source "$(dirname "$0")/env.sh"
timeout 560 python3 -m training.numerics run "$1" --out "$OUT" --work-dir /tmp/numerics \
    > "$OUT/numerics_$1.log" 2>&1
echo "numerics rc=$?"; tail -25 "$OUT/numerics_$1.log"
