"""README blocks of the MoE recipe layer: its knobs and its guards, generated like the core's
(training/launch/docs.py). `python -m training.moe.docs [--check]`."""
from __future__ import annotations

import sys

from training.launch import docs

from .layer import GUARDS, TOGGLES

BLOCKS = {"moe-toggles": lambda: docs.toggles_table(TOGGLES),
          "moe-guards": lambda: docs.guards_table(GUARDS)}


def main(argv: list[str] | None = None) -> int:
    return docs.main(argv, BLOCKS, prog="python -m training.moe.docs")


if __name__ == "__main__":
    sys.exit(main())
