#!/usr/bin/env bash
# gpt-oss pretraining on Megatron-core (mixture of experts with attention sinks and an
# alternating sliding window), on the GPUs of this node.
#
#   bash examples/moe/train_gpt_oss.sh EP=8 GPUS_PER_NODE=8        # gpt-oss-20b, 4 experts a GPU
#   bash examples/moe/train_gpt_oss.sh MODEL_SIZE=120b EP=8 ...    # gpt-oss-120b
#   bash examples/moe/train_gpt_oss.sh MODEL_SIZE=tiny             # 2 layers, 8 experts: smoke run
#   DRY_RUN=1 bash examples/moe/train_gpt_oss.sh NUM_LAYERS=4      # print the launch, touch no GPU
#
# The MoE knobs (EP, ETP, MOE_*) are in README.md's toggle table; docs/gpt_oss.md explains the
# family (sinks and window on the native backend through flex attention, biased experts).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../lib/launch.sh"

resolve_launch_with training.moe.launch gpt_oss "$@"
print_buckets   # exits here when DRY_RUN=1
exec_torchrun   # torchrun ... pretrain_gpt.py GPT_ARGS TRAIN_ARGS DATA_ARGS OUTPUT_ARGS EXTRA_ARGS
