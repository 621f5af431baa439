"""`python -m training.moe.launch --family qwen3_moe|mixtral [KEY=VALUE ...] [--flags ...]`

Called by examples/moe/train_*.sh in place of `python -m training.launch`: the same launcher
(registry, guards, run folder, manifest, startup table, shell assignments on stdout) and the
same memory pre-flight as examples/llama's (training.optimize.preflight), with the MoE presets
registered and the MoE recipe layer on top (training/moe/layer.py: the EP, ETP and MOE_*
knobs and their guards); the core launcher imports no model family.
"""
from __future__ import annotations

import sys

from . import presets  # noqa: F401 - registers the qwen3_moe and mixtral families
from .layer import MOE


def main(argv: list[str] | None = None) -> int:
    from training.launch.__main__ import main as launch
    from training.optimize.preflight import check as memory_preflight

    return launch(argv, layers=[MOE], checks=(memory_preflight,))


if __name__ == "__main__":
    sys.exit(main())
