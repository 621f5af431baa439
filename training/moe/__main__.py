"""`python -m training.moe flops --model qwen3-30B-A3B [--num-layers N] [--seq-length S]`:
training.metrics' FLOPs command with the MoE presets (gpt-oss's too) registered (the run floor imports no
family, so its own CLI knows the core presets only)."""
from __future__ import annotations

import sys

from training import metrics

from . import gpt_oss, presets  # noqa: F401 - register the MoE presets and gpt-oss's


def main(argv: list[str] | None = None) -> int:
    return metrics.main(argv, prog="python -m training.moe")


if __name__ == "__main__":
    sys.exit(main())
