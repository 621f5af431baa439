#!/usr/bin/env bash
# Llama 3 / 3.1 pretraining on Megatron-core, on the GPUs of this node (or one node of many).
#
#   bash examples/llama/train_llama3.sh                        # Llama3-8B, bf16, every toggle on
#   GRAD_REDUCE_IN_BF16=0 bash examples/llama/train_llama3.sh  # switch one toggle off
#   bash examples/llama/train_llama3.sh MODEL_SIZE=70B TP=8 PRECISION=fp8
#   DRY_RUN=1 bash examples/llama/train_llama3.sh              # print the launch, touch no GPU
#
# Every knob is an environment variable or a KEY=VALUE word after the script name; Megatron
# --flags may follow them. docs/toggles.md lists the knobs; training/launch/ resolves them, prints
# what differs from the defaults (value, source, reason) and refuses unsafe combinations
# before any GPU is used.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../lib/launch.sh"

resolve_launch llama3 "$@"
print_buckets   # exits here when DRY_RUN=1
exec_torchrun   # torchrun ... pretrain_gpt.py GPT_ARGS TRAIN_ARGS DATA_ARGS OUTPUT_ARGS EXTRA_ARGS
