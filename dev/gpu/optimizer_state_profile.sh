#!/usr/bin/env bash
# 1xH200, ~5 min, on an idle GPU: where the 8-layer step with bf16 optimizer states loses its
# ~1% to the fp32 default (issue 23; levers-optimizer-state_h200_*: 0.991x and 0.987x). The
# default and ADAM_MOMENTS_DTYPE=bf16 MASTER_WEIGHTS=remainder at the bench shape, iterations
# 4-5 under the torch profiler; the trace report's training ranges of each (host and kernel
# time of forward, backward, optimizer step) side by side.
# First the kernel alone: its GPU tests against float64 and its vector path against its
# element path (new in session 8, not yet run on a GPU), then dev/gpu/adamw_bandwidth.py
# (bandwidth per state mode, declared 16-byte aligned or not, torch's fused AdamW for scale).
# Into $OUT: adamw_bandwidth.jsonl, ranges_<name>.md (each report's ranges and top kernels), traces.tgz.
# Usage: GIT_SHA=<sha> bash dev/gpu/optimizer_state_profile.sh    Carry: .whl
source "$(dirname "$0")/env.sh"
bash "$(dirname "$0")/burst.sh" idle || exit 1
profile() {  # profile NAME TOGGLES...
    local name=$1; shift
    EXPERIMENT_DIR=/tmp/optprof/$name timeout 120 bash examples/llama/train_llama3.sh \
        NUM_LAYERS=8 BS=8 TOTAL_ITERS=6 EVAL_ITERS=0 GPUS_PER_NODE=1 PROFILE=torch \
        PROFILE_STEP_START=4 PROFILE_STEP_END=5 "$@" 2>&1 | grep -E "\[summary\]" | tee -a "$OUT/summary.log"
    local run
    run=$(dirname "$(find "/tmp/optprof/$name" -name manifest.json | head -1)")
    timeout 90 python3 -m training.profiling.trace_report "$run" --out "/tmp/optprof/report_$name" \
        --top 15 > /dev/null 2>&1
    sed -n '/## Training ranges/,/## How/p;/## Top kernels: rank 0/,/^$/p' \
        "/tmp/optprof/report_$name/trace_report.md" > "$OUT/ranges_$name.md"
    grep -E "train/(forward|backward|optimizer_step)" "$OUT/ranges_$name.md" | grep "rank 0"
}
timeout 240 python3 -m pytest -p no:cacheprovider -q -m gpu tests/gpu/test_optimizer_state_gpu.py \
    -k "vector_accesses or tracks_float64" 2>&1 | tail -5 | tee "$OUT/kernel_tests.log"
timeout 120 python3 dev/gpu/adamw_bandwidth.py 2>&1 | tee "$OUT/adamw_bandwidth.jsonl"
profile default
profile bf16 ADAM_MOMENTS_DTYPE=bf16 MASTER_WEIGHTS=remainder
tar czf "$OUT/traces.tgz" --exclude=tensorboard -C /tmp optprof 2>/dev/null
ls "$OUT"
