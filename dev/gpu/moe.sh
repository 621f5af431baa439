#!/usr/bin/env bash
# 1xH200, ~6 min with the default part, ~9 with both: mixture of experts (issue 25).
# First the MoE GPU tests (torch's grouped_mm and the permute's gather-sum kernel against their
# references, bf16 parity with HF Qwen3-MoE on each backend, the tiny MoE training on
# Shakespeare with balanced-enough routing), then the bench parts named in MOE_PARTS at the MoE
# bench shape (training/bench/catalog.py MOE_SHAPE), within what is left of 9 minutes:
#   moe-peers   ours vs HF Qwen3-MoE, with and without Liger (default)
#   moe-levers  grouped experts vs Megatron's SequentialMLP (MOE_PARTS=moe-peers,moe-levers)
# Later parts: moe-peers-torchtitan, moe-levers-permute, moe-levers-host, moe-levers-lean-mixtral, ...
# (bash dev/gpu/bench.sh 1 PART; the list: training/bench/catalog.py MOE_PARTS).
# Usage: GIT_SHA=... [MOE_PARTS=moe-peers[,moe-levers]|none] bash dev/gpu/moe.sh
# Carry: .whl data
source "$(dirname "$0")/env.sh"
timeout 300 python3 -m pytest -p no:cacheprovider -q -s -m gpu --durations=0 \
    tests/gpu/test_grouped_experts_gpu.py tests/gpu/test_moe_gpu.py > "$OUT/moe_gpu_tests.log" 2>&1
echo "moe gpu tests rc=$?" | tee -a "$OUT/moe_gpu_tests.log"
grep -E "PASSED|FAILED|SKIPPED|ERROR|passed|failed|tiny-moe|parity|max abs" \
    "$OUT/moe_gpu_tests.log" | tail -40
[ "${MOE_PARTS:-moe-peers}" = none ] && exit 0   # the tests only (untimed, beside other work)
left=$((540 - SECONDS))
timeout "$left" python3 -m training.bench all --gpus 1 --parts "${MOE_PARTS:-moe-peers}" \
    --budget-s $((left - 20)) --out-dir "$OUT" --work-dir /tmp/bench > "$OUT/bench_moe.log" 2>&1
echo "bench rc=$?"
tail -40 "$OUT/bench_moe.log"
tar czf "$OUT/bench_runs.tgz" --exclude=tensorboard -C /tmp bench
