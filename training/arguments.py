"""The project's own argument groups, added on top of Megatron's parser.

Group titles are routed to buckets by training.launch.toggles.GROUP_TO_BUCKET.
"""
from __future__ import annotations

import argparse

from training.launch.toggles import BY_NAME

BACKENDS = ("transformer_engine", "native", "local")


def add_training_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    model = parser.add_argument_group(title="launcher: model")
    # megatron-core 0.19.2 has TransformerConfig.fused_single_qkv_rope but no flag for it;
    # core_transformer_config_from_args copies any args attribute named like a config field.
    model.add_argument("--fused-single-qkv-rope", action="store_true",
                       help="Apply RoPE to the packed QKV tensor in one kernel (no split/concat).")
    model.add_argument("--transformer-backend", choices=BACKENDS, default="transformer_engine",
                       help="Layer spec: transformer_engine (Megatron's TE spec), native (SDPA + "
                            "Liger/torch kernels, this project's), local (Megatron's local spec).")
    model.add_argument("--native-kernels", choices=("liger", "torch"), default="liger",
                       help="Kernels of the native backend: Liger-Kernel (Triton) or plain torch.")
    model.add_argument("--ce-chunk-mem", type=int, default=BY_NAME["CE_CHUNK_MEM"].default,
                       help="Liger fused linear cross-entropy's chunk_mem_const: each chunk's "
                            "logits stay under N x tokens x hidden (native backend, TP=1). The "
                            "launcher always passes its CE_CHUNK_MEM toggle; its default here.")

    train = parser.add_argument_group(title="launcher: training")
    train.add_argument("--nan-check", choices=("step", "bucket"), default="bucket",
                       help="step: stop at the first iteration whose loss or global gradient "
                            "norm is NaN/Inf (with --no-check-for-nan-in-loss-and-grad); bucket: "
                            "Megatron's per-bucket check only.")

    run = parser.add_argument_group(title="launcher: run")
    run.add_argument("--run-dir", type=str, default=None,
                     help="Run folder: metrics.jsonl and the manifest's run section go here.")
    run.add_argument("--metrics-warmup-iters", type=int, default=3,
                     help="Iterations left out of the steady-state figures.")
    return parser
