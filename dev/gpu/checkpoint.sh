#!/usr/bin/env bash
# 1xH200, ~2 min plus the TE run (issue 26): a random HF Llama at the 8-layer Llama3-8B width (made here) goes
# through `python -m training.checkpoint import`, trains 20 iterations through the launcher
# (PRETRAINED_CHECKPOINT), comes out through `export`, and transformers' forward on the export
# matches ours; then the tiny bf16 parity tests, whose weights go through the same import, on
# the native and local backends, and on Transformer Engine's spec in a TE session (TE=1: the
# TE carry of dev/gpu_runbook.md first; without it that test skips), and there a tiny TE run
# through the launcher from an import (PRETRAINED_CHECKPOINT; skips without the corpus).
# Carry: .whl (and data for the TE run)
set -euo pipefail
source "$(dirname "$0")/env.sh"
status=0
timeout 420 python3 -m pytest -p no:cacheprovider -q -s -m gpu --durations=0 \
    tests/gpu/test_checkpoint_gpu.py 2>&1 | tee "$OUT/checkpoint_gpu.log" || status=1
timeout 150 python3 -m pytest -p no:cacheprovider -q -s -m gpu -k tiny \
    tests/gpu/test_parity_gpu.py "tests/gpu/test_te_gpu.py::test_te_bf16_parity_with_hf" \
    2>&1 | tee "$OUT/parity_gpu.log" || status=1
# TE=1 and the corpus (carry data): the launcher starts a tiny TE run from an import
timeout 240 python3 -m pytest -p no:cacheprovider -q -s -m gpu \
    "tests/gpu/test_te_gpu.py::test_te_tiny_run_starts_from_an_import" \
    2>&1 | tee "$OUT/te_from_import_gpu.log" || status=1
exit "$status"
