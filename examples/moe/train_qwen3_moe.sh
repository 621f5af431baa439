#!/usr/bin/env bash
# Qwen3-MoE pretraining on Megatron-core (mixture of experts), on the GPUs of this node.
#
#   bash examples/moe/train_qwen3_moe.sh                          # Qwen3-30B-A3B, bf16, every toggle on
#   bash examples/moe/train_qwen3_moe.sh EP=8 GPUS_PER_NODE=8     # experts split over 8 GPUs
#   bash examples/moe/train_qwen3_moe.sh MODEL_SIZE=tiny          # 2 layers, 8 experts: smoke run
#   MOE_GROUPED_GEMM=0 bash examples/moe/train_qwen3_moe.sh       # Megatron's loop over the experts
#   DRY_RUN=1 bash examples/moe/train_qwen3_moe.sh NUM_LAYERS=8   # print the launch, touch no GPU
#
# The MoE knobs (EP, ETP, MOE_*) are in docs/toggles.md's table; docs/moe.md explains them.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../lib/launch.sh"

resolve_launch_with training.moe.launch qwen3_moe "$@"
print_buckets   # exits here when DRY_RUN=1
exec_torchrun   # torchrun ... pretrain_gpt.py GPT_ARGS TRAIN_ARGS DATA_ARGS OUTPUT_ARGS EXTRA_ARGS
