#!/usr/bin/env bash
# 1xH200, ~2 min (issue 26): a random HF Llama at the 8-layer Llama3-8B width (made here) goes
# through `python -m training.checkpoint import`, trains 20 iterations through the launcher
# (PRETRAINED_CHECKPOINT), comes out through `export`, and transformers' forward on the export
# matches ours; then the tiny bf16 parity tests, whose weights go through the same import, on
# every backend present (Transformer Engine's spec too when /tmp/tesite is carried).
# Carry: .whl
set -euo pipefail
source "$(dirname "$0")/env.sh"
if [ -d /tmp/tesite ]; then export PYTHONPATH="/tmp/tesite:$PYTHONPATH"; fi
status=0
timeout 420 python3 -m pytest -p no:cacheprovider -q -s -m gpu --durations=0 \
    tests/gpu/test_checkpoint_gpu.py 2>&1 | tee "$OUT/checkpoint_gpu.log" || status=1
timeout 120 python3 -m pytest -p no:cacheprovider -q -s -m gpu -k tiny \
    tests/gpu/test_parity_gpu.py 2>&1 | tee "$OUT/parity_gpu.log" || status=1
exit "$status"
