"""Helpers for launcher tests: resolve in-process, and Megatron's parser on a launch."""
from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from training.launch.layers import RecipeLayer
from training.launch.resolve import Launch, resolve


def launch(env: dict, family: str = "llama3", words: list[str] | None = None,
           layers: Sequence[RecipeLayer] = (), **toggles) -> Launch:
    merged = dict(env)
    merged.update({k: str(v) for k, v in toggles.items()})
    merged.setdefault("DRY_RUN", "1")
    return resolve(family, merged, words, layers)


def megatron_parser() -> argparse.ArgumentParser:
    from training.arguments import megatron_parser as parser

    return parser()


def flag_groups() -> dict[str, str]:
    """Every option string of Megatron's parser (plus ours) -> its argument-group title."""
    groups = {}
    for group in megatron_parser()._action_groups:
        for action in group._group_actions:
            for option in action.option_strings:
                groups[option] = group.title
    return groups


def megatron_args(result: Launch, validate: bool = True):
    """Parse (and validate) the launch's Megatron words with megatron-core's own code.

    Two things a GPU node would provide are supplied: the environment the launcher exports
    (e.g. CUDA_DEVICE_MAX_CONNECTIONS), and the device architecture that validate_args asks
    torch.cuda for at TP/CP > 1 and with MoE grouped GEMM (the target platform's, Hopper when
    unknown)."""
    from unittest import mock

    import torch
    from megatron.training import arguments

    words = []
    for bucket in ("GPT_ARGS", "TRAIN_ARGS", "DATA_ARGS", "OUTPUT_ARGS", "EXTRA_ARGS"):
        words += result.buckets[bucket]
    words += result.user_args
    os.environ.setdefault("WORLD_SIZE", str(result.run.layout.world_size))
    os.environ.setdefault("RANK", "0")
    args = megatron_parser().parse_args(words)
    args.rank, args.world_size = 0, result.run.layout.world_size
    args._is_global_batch_size_explicitly_specified = True
    if validate:
        platform = result.ctx.caps.info
        arch = (platform.sm // 10) if platform is not None and platform.sm else 9
        env = {name: value for name, (value, _src, _why) in result.env.items()}
        with mock.patch.dict(os.environ, env), \
                mock.patch.object(arguments, "get_device_arch_version", return_value=arch), \
                mock.patch.object(torch.cuda, "get_device_capability", return_value=(arch, 0)):
            arguments.validate_args(args)
    return args
