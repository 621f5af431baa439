#!/usr/bin/env bash
# 1 H200, < 8 min (issue 51): documents kept apart on the GPU, native backend (TE=1: also
# Transformer Engine's THD path, after the TE carry of dev/gpu_runbook.md). Each step has its
# own time limit (one failure keeps the others' results), none starts after LIMIT (default 450 s):
#   tests   tests/gpu/test_documents_gpu.py: packed batch vs its documents one at a time, bf16,
#           dense / MoE / gpt-oss (flex, loop, varlen; TE where it imports), dropped and shifted
#           masks caught; flex and varlen vs the loop at 8192 tokens, fwd+bwd; a tiny run with
#           and without DOCUMENT_MASK trains differently                  (~3 min, limit 240 s)
#   timing  dev/gpu/document_attention_timing.py: flex, varlen, loop vs causal SDPA, fwd+bwd at
#           8192 tokens of mock-like documents and of one document (untimed tests done first)
#                                                                         (~30 s, limit 90 s)
#   bench   training.bench all --parts levers-documents (TE=1: then te-documents), 1 repeat:
#           DOCUMENT_MASK=1 vs 0, llama3-8B 8 layers, seq 8192, mock data's ~2k-token documents
#           -> $OUT/*.json (docs/benchmarks/)                             (~3 min, the rest)
# Into $OUT: documents_tests.log, document_attention_timing.json/.log, bench_all.log, the part JSON.
# Usage: GIT_SHA=<sha> [TE=1] [REPEATS=1] [TESTS_K=<pytest -k>] [TIMING=0] [LIMIT=450]
#        bash dev/gpu/documents.sh                                        Carry: .whl data
# (TESTS_K runs only the tests it selects; TIMING=0 skips the attention timing.)
source "$(dirname "$0")/env.sh"
LIMIT=${LIMIT:-450}
left() { echo $((LIMIT - SECONDS)); }
if [ "$(left)" -gt 30 ]; then
    timeout $(( $(left) < 240 ? $(left) : 240 )) python3 -m pytest -p no:cacheprovider -q -s \
        -m gpu --durations=0 -rA ${TESTS_K:+-k "$TESTS_K"} tests/gpu/test_documents_gpu.py \
        > "$OUT/documents_tests.log" 2>&1
    echo "tests rc=$? after ${SECONDS} s" >> "$OUT/documents_tests.log"
fi
if [ "${TIMING:-1}" = 1 ] && [ "$(left)" -gt 30 ]; then
    timeout $(( $(left) < 90 ? $(left) : 90 )) python3 dev/gpu/document_attention_timing.py \
        "$OUT/document_attention_timing.json" > "$OUT/document_attention_timing.log" 2>&1
    echo "timing rc=$? after ${SECONDS} s" >> "$OUT/document_attention_timing.log"
fi
bench() {  # bench PART [--te]: one repeat of the part within what is left of LIMIT
    if [ "$(left)" -lt 120 ]; then echo "bench $1: not run (the call's time is spent)"; return; fi
    timeout "$(left)" python3 -m training.bench all --gpus 1 --parts "$@" --repeats "${REPEATS:-1}" \
        --budget-s "$(( $(left) - 20 ))" --out-dir "$OUT" --work-dir /tmp/bench
    echo "bench $1 rc=$? after ${SECONDS} s"
}
{ bench levers-documents
  [ "${TE:-0}" = 1 ] && bench te-documents --te   # TE=1: TE's THD path too, if time is left
} > "$OUT/bench_all.log" 2>&1
echo "== tests"
grep -E "PASSED|FAILED|SKIPPED|ERROR|rc=|passed|failed|max abs err|logit_err|Error:" \
    "$OUT/documents_tests.log" | tail -40
echo "== timing"; cat "$OUT/document_attention_timing.log" 2>/dev/null
echo "== bench"; tail -25 "$OUT/bench_all.log"
ls -la "$OUT"
