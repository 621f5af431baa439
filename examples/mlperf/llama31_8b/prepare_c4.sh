#!/usr/bin/env bash
# C4 (allenai/c4, en, json.gz shards) -> the two indexed datasets llama31_8b trains and
# evaluates on, tokenized with YOUR Llama 3.1 tokenizer (not shipped). docs/mlperf.md, "Data".
#
#   C4_DIR=/data/c4/en TOKENIZER=/models/Llama-3.1-8B OUT=/data/c4_llama31 \
#       bash examples/mlperf/llama31_8b/prepare_c4.sh
#
#   0. every setting checked first (shards present, range, tokenizer, OUT): one line if not
#   1. training set: the 128 shards c4-train.00768..00895-of-01024 (the reference's "en_6",
#      which it trains on), in one dataset: $OUT/c4-train.en_6
#   2. validation set: the first 91205 documents of c4-validation.00000..00007-of-00008, in
#      order (the reference's c4-validation-91205-samples): $OUT/c4-validation-91205
#   3. both checked by the launcher's data check against the tokenizer
# Tokenized as the reference does (NeMo without --append-eod): no BOS, no EOD
# (--no-add-special-tokens --no-append-eod); docs/mlperf.md, Data.
# Needs about 30 GB free under $OUT for step 1 (C4_DIR holds the .json.gz shards as downloaded).
# Resumable: run it again after a failure; a dataset already complete, verified and made from
# the same shards and tokenizer is kept (prepare --skip-complete), not rebuilt.
set -euo pipefail
: "${C4_DIR:=}"       # the folder of c4-train.*.json.gz and c4-validation.*.json.gz (en)
: "${TOKENIZER:=}"    # your Llama 3.1 tokenizer (a Hugging Face directory)
: "${OUT:=}"          # the folder the datasets go to
: "${FIRST_SHARD:=768}" "${LAST_SHARD:=895}" "${VALID_DOCS:=91205}"
export C4_DIR TOKENIZER OUT FIRST_SHARD LAST_SHARD VALID_DOCS
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
if [ -z "${PYTHON:-}" ]; then
    if [ -x "$REPO_ROOT/.venv/bin/python" ]; then PYTHON="$REPO_ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi
export PYTHONPATH="$REPO_ROOT${PYTHONPATH:+:$PYTHONPATH}"

# 0. every setting, before the long work (one line and exit 2 for the first bad one)
"$PYTHON" -m training.data.c4 check

# 1. training shards, in shard order
train=()
for i in $(seq "$FIRST_SHARD" "$LAST_SHARD"); do
    train+=("$(printf '%s/c4-train.%05d-of-01024.json.gz' "$C4_DIR" "$i")")
done
"$PYTHON" -m training.data.prepare "${train[@]}" --tokenizer "$TOKENIZER" \
    --no-add-special-tokens --no-append-eod --output-prefix "$OUT/c4-train.en_6" --skip-complete

# 2. the first VALID_DOCS validation documents, in file order (written whole or not at all)
valid_json="$OUT/c4-validation-$VALID_DOCS.jsonl"
"$PYTHON" -m training.data.c4 valid-json "$valid_json"
"$PYTHON" -m training.data.prepare "$valid_json" --tokenizer "$TOKENIZER" \
    --no-add-special-tokens --no-append-eod --output-prefix "$OUT/c4-validation-$VALID_DOCS" --skip-complete

# 3. what the launcher checks before a run (files, sizes, the .idx, one tokenizer for both)
"$PYTHON" -m training.data.check verify "$OUT/c4-train.en_6" --tokenizer-model "$TOKENIZER"
"$PYTHON" -m training.data.check verify "$OUT/c4-validation-$VALID_DOCS" --tokenizer-model "$TOKENIZER"
echo "DATA_PATH=$OUT/c4-train.en_6 VALID_DATA_PATH=$OUT/c4-validation-$VALID_DOCS TOKENIZER_MODEL=$TOKENIZER"
