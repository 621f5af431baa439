#!/usr/bin/env bash
# MLPerf Training gpt_oss_20b: gpt-oss-20b (mixture of experts) pretraining on C4 until eval loss
# <= 3.34, with an MLPerf log (<run>/mlperf.log) for mlperf-logging's checkers. docs/gpt_oss.md.
#
#   DATA_PATH=/data/c4_llama31/c4-train.en_6 VALID_DATA_PATH=/data/c4_llama31/c4-validation-91205 \
#       TOKENIZER_MODEL=meta-llama/Llama-3.1-8B EP=8 bash examples/mlperf/gpt_oss_20b/run_gpt_oss_20b.sh
#   ... BS=32 ...                          # free choice, still closed: LR and warm-up from BS 32's RCP
#   DRY_RUN=1 PLATFORM=mi355x GPUS_PER_NODE=8 bash examples/mlperf/gpt_oss_20b/run_gpt_oss_20b.sh EP=8
#
# The data are llama31_8b's (examples/mlperf/llama31_8b/prepare_c4.sh, or the reference's files);
# config.yaml beside this script holds the closed rules and the reference's choices. The flow is
# llama31_8b's (its script: the recipe's values and guards, MLPERF_RUN, the untimed index step,
# torchrun) with this benchmark's recipe.
set -euo pipefail
exec bash "$(dirname "${BASH_SOURCE[0]}")/../llama31_8b/run_llama31_8b.sh" --benchmark gpt_oss_20b "$@"
