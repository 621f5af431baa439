#!/usr/bin/env bash
# One H200, untimed work kept running across device calls (the machine stays warm between calls
# sent back to back). Each job runs a dev/gpu script in its own process session with
# OUT=/tmp/burst/NAME, so it outlives the call that started it; timed benchmarks run only after
# `collect` has seen every job end.
#   start NAME SCRIPT [ARGS...]   start a job (log /tmp/burst/NAME.log, exit status NAME.rc)
#   status                        each job: running, or its exit status, and its log's last line
#   collect SECONDS               wait up to SECONDS for the jobs, then copy every job's results
#                                 into $OUT/NAME.tgz and print the tail of each log
#   idle                          before timed work (bench.sh runs it): refuse while a job runs;
#                                 end what ended jobs left on the GPU (a job's timeout ends pytest,
#                                 not always the launcher processes it started)
# Usage: GIT_SHA=<sha> bash dev/gpu/burst.sh start gpu-tests dev/gpu/gpu_tests.sh
set -uo pipefail
B=/tmp/burst
mkdir -p "$B"
cmd=${1:?usage: burst.sh start NAME SCRIPT [ARGS...] | status | collect SECONDS}
shift
case "$cmd" in
start)
    name=${1:?job name}; script=${2:?script}; shift 2
    mkdir -p "$B/$name"
    OUT="$B/$name" setsid nohup bash -c 'bash "$@"; echo $? > "'"$B/$name.rc"'"' _ "$script" "$@" \
        > "$B/$name.log" 2>&1 < /dev/null &
    echo "started $name: $script $*"
    ;;
status|collect)
    if [ "$cmd" = collect ]; then
        deadline=$((SECONDS + ${1:?seconds to wait}))
        while [ "$SECONDS" -lt "$deadline" ]; do
            running=0
            for log in "$B"/*.log; do [ -e "${log%.log}.rc" ] || running=1; done
            [ "$running" = 0 ] && break
            sleep 5
        done
    fi
    for log in "$B"/*.log; do
        [ -e "$log" ] || continue
        name=$(basename "$log" .log)
        rc=$(cat "$B/$name.rc" 2>/dev/null || echo running)
        echo "== $name: $rc"
        if [ "$cmd" = collect ]; then tail -25 "$log"; else tail -1 "$log"; fi
    done
    if [ "$cmd" = collect ]; then
        : "${OUT:?OUT must be set (the device tool sets it)}"
        for log in "$B"/*.log; do   # one archive per job (a call returns 8 files of 16 MiB)
            name=$(basename "$log" .log)
            touch "$B/$name.rc"   # empty: still running at collect
            tar czf "$OUT/$name.tgz" --exclude='*.safetensors' --exclude='*.pt' --exclude='*.pth' \
                --exclude='*.distcp' --exclude='*.bin' --exclude='*.idx' --exclude=tensorboard \
                -C "$B" "$name" "$name.log" "$name.rc" 2>/dev/null
        done
        ls -la "$OUT"
    fi
    ;;
idle)
    for log in "$B"/*.log; do
        [ -e "$log" ] || continue
        [ -s "${log%.log}.rc" ] || { echo "burst.sh idle: job $(basename "$log" .log) still runs: collect first"; exit 1; }
    done
    for _ in 1 2 3 4 5 6; do
        pids=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader | tr -d ' ')
        [ -z "$pids" ] && { echo "GPU idle"; exit 0; }
        echo "left on the GPU by ended jobs, ended now: $(echo "$pids" | tr '\n' ' ')"
        # shellcheck disable=SC2086
        kill $pids 2>/dev/null; sleep 5
    done
    echo "burst.sh idle: the GPU is still busy"; exit 1
    ;;
*) echo "burst.sh: unknown command $cmd (start, status, collect, idle)"; exit 2 ;;
esac
