"""`python -m training.moe flops --model qwen3-30B-A3B [--num-layers N] [--seq-length S]`:
training.metrics' FLOPs command with the MoE presets registered (the run floor imports no
family, so its own CLI knows the core presets only)."""
from __future__ import annotations

import sys

from training import metrics

from . import presets  # noqa: F401 - registers the MoE presets


def main(argv: list[str] | None = None) -> int:
    return metrics.main(argv, prog="python -m training.moe")


if __name__ == "__main__":
    sys.exit(main())
