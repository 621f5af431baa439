#!/usr/bin/env bash
# 1xH200, ~1-2 min: our Liger-path RMSNorm and SwiGLU against Liger-Kernel's own Megatron
# integration (and torch/Megatron's own, for scale), forward + backward at Llama3-8B's shapes,
# 5 rotated repeats -> $OUT/kernels-liger-megatron_h200.json (copy to docs/benchmarks/).
# The decision it informs is one line: training/native/__init__.py IMPLEMENTATION.
# The kernels' correctness (odd shapes, past 2^31 elements) is tests/gpu/test_kernel_shapes_gpu.py,
# run by the GPU test call. Carry: .whl
set -euo pipefail
source "$(dirname "$0")/env.sh"
bash "$(dirname "$0")/burst.sh" idle || exit 1   # timed work on an idle GPU only
export PYTHONUNBUFFERED=1
timeout 300 python3 -m training.native.op_timing --out-dir "$OUT" 2>&1 | tee "$OUT/op_timing.log"
