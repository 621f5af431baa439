"""README blocks of the llama31_8b recipe layer: its knobs and its guard, generated like the
core's (training/launch/docs.py). `python -m training.mlperf.docs [--check]`."""
from __future__ import annotations

import sys

from training.launch import docs

from .layer import TOGGLES, llama31_8b

BLOCKS = {"mlperf-toggles": lambda: docs.toggles_table(TOGGLES),
          "mlperf-guards": lambda: docs.guards_table(llama31_8b().guards)}


def main(argv: list[str] | None = None) -> int:
    return docs.main(argv, BLOCKS, prog="python -m training.mlperf.docs")


if __name__ == "__main__":
    sys.exit(main())
