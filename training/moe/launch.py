"""`python -m training.moe.launch --family qwen3_moe|mixtral|gpt_oss [KEY=VALUE ...] [--flags ...]`

Called by examples/moe/train_*.sh in place of `python -m training.launch`: the same launcher
(registry, guards, run folder, manifest, startup table, shell assignments on stdout) and the
same memory pre-flight as examples/llama's (training.optimize.preflight), with the MoE presets
registered and the MoE recipe layer on top (training/moe/layer.py: the EP, ETP and MOE_*
knobs and their guards; for gpt-oss also training/moe/gpt_oss.py's guards, which act on its
presets only); the core launcher imports no model family.
"""
from __future__ import annotations

import sys

from . import presets  # noqa: F401 - registers the qwen3_moe and mixtral families
from .gpt_oss import GPT_OSS  # registers the gpt_oss family
from .layer import MOE


def main(argv: list[str] | None = None) -> int:
    from training.launch.__main__ import main as launch
    from training.optimize.preflight import CHOOSERS
    from training.optimize.preflight import check as memory_preflight

    return launch(argv, layers=[MOE, GPT_OSS], checks=(memory_preflight,), choosers=CHOOSERS,
                  prog="python -m training.moe.launch")


if __name__ == "__main__":
    sys.exit(main())
