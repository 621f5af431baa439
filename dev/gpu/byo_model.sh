#!/usr/bin/env bash
# 1xH200, ~6 min (issue 39): Llama-3.2-1B's config.json (16 layers at full width, tied
# embeddings, RoPE factor 32; its published weights where LLAMA32_1B names a local copy, else
# random ones) goes through `python -m training.checkpoint import`, trains 50 iterations on the
# shipped Shakespeare corpus through the launcher with PRETRAINED_CHECKPOINT alone (the launch
# takes the import's shape), the loss falling, comes out through `export`, and transformers'
# forward on the export matches ours (tests/gpu/test_byo_model_gpu.py).
# Carry: .whl and data (data/shakespeare: `make data-sample`)
set -euo pipefail
source "$(dirname "$0")/env.sh"
timeout 580 python3 -m pytest -p no:cacheprovider -q -s -m gpu --durations=0 \
    tests/gpu/test_byo_model_gpu.py 2>&1 | tee "$OUT/byo_model_gpu.log"
