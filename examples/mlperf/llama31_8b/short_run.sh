#!/usr/bin/env bash
# A short real MLPerf-logged run on the shipped corpus (open division), then mlperf-logging's
# compliance checker and the result summary. docs/mlperf.md, "A short run".
#
#   bash examples/mlperf/llama31_8b/short_run.sh OUTDIR        # 2 GPUs (GPUS=1 for one)
#
# The model is Llama 3.1 8B's shape with 2 layers (~0.5B parameters with the corpus' 8192-token
# vocabulary) at sequence 1024, GBS 32, lr 8e-4, the closed optimizer rules; evaluation every
# 800 sequences on the first 64 validation sequences (the corpus' validation set holds 82 at
# 1024 tokens, not 1024); stop at eval loss <= 5.5 (a guess for this model and corpus: the run
# ends "aborted" at TOTAL_ITERS=400 if it never gets there). SAVE shows the final checkpoint at
# the stop. Into OUTDIR: mlperf.log, eval_loss.png, compliance.json, short_run.tgz (the run's
# train.log, manifest, metrics, the checker's own log, the summary).
set -uo pipefail
OUTDIR=${1:?usage: short_run.sh OUTDIR}
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
PYTHON=${PYTHON:-python3}
WORK=${WORK:-/tmp/mlperf_short}
RUN="$WORK/experiment/mlperf-llama31_8b/bf16/short"
mkdir -p "$OUTDIR" "$WORK"
rm -rf "$WORK/experiment" "$WORK/ckpt"

EXPERIMENT_DIR="$WORK/experiment" RUN_ID=short MLPERF_DIVISION=open \
MODEL_SIZE=3.1-8B NUM_LAYERS=2 SEQ_LENGTH=1024 BS=32 MBS=4 GPUS_PER_NODE="${GPUS:-2}" \
MLPERF_EVAL_EVERY=800 MLPERF_EVAL_SAMPLES=64 WARMUP_ITERS=30 MLPERF_TARGET_LOSS=5.5 \
TOTAL_ITERS=400 SAVE="$WORK/ckpt" SAVE_INTERVAL=100000 \
DATA_PATH="$REPO_ROOT/data/shakespeare/train" VALID_DATA_PATH="$REPO_ROOT/data/shakespeare/valid" \
    timeout 480 bash "$REPO_ROOT/examples/mlperf/llama31_8b/run_llama31_8b.sh" \
    > "$WORK/short_run.log" 2>&1
echo "run rc=$?"
grep -E "^\[summary\]|Traceback|Error" "$WORK/short_run.log" | head -5
echo "final checkpoint at iteration: $(cat "$WORK/ckpt/latest_checkpointed_iteration.txt" 2>/dev/null || echo none)"

"$PYTHON" -m mlperf_logging.compliance_checker --usage training --ruleset 6.1.0 \
    --log_output "$WORK/compliance_checker.log" "$RUN/mlperf.log"
echo "compliance_checker rc=$?"
"$PYTHON" -m training.mlperf.compliance "$RUN/mlperf.log" --as-closed --json "$OUTDIR/compliance.json"
"$PYTHON" -m training.mlperf.summary "$RUN" --out "$WORK"

cp "$RUN/mlperf.log" "$WORK/eval_loss.png" "$OUTDIR/"
tar czf "$OUTDIR/short_run.tgz" -C "$WORK" short_run.log compliance_checker.log \
    mlperf_summary.json mlperf_summary.md -C "$RUN" manifest.json metrics.jsonl
ls -la "$OUTDIR"
