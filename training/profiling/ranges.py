"""Canonical names of the training-loop ranges that the profiler records.

The training side wraps each phase of an iteration in ``train_range(RANGE_...)``; the trace
report (training/profiling/trace_report.py) looks these exact names up in the trace and
reports the time spent in each. One source of truth: both sides import the names from here.

Cost when profiling is off: ``train_range`` returns one shared ``contextlib.nullcontext``
instance after a single module-level flag check, so no profiler object is created and
nothing is recorded. ``enable_ranges(True)`` is called by the run side when PROFILE=torch
is active (the launcher resolves that; this module does not read the environment).
"""

from __future__ import annotations

import contextlib
from typing import ContextManager

import torch.profiler

RANGE_DATA = "train/data"
RANGE_FORWARD = "train/forward"
RANGE_BACKWARD = "train/backward"
RANGE_OPTIMIZER = "train/optimizer_step"
RANGE_GRAD_REDUCE = "train/grad_reduce"
RANGE_PARAM_GATHER = "train/param_gather"

# Report order: the order of the phases inside one iteration.
ALL_RANGES: tuple[str, ...] = (
    RANGE_DATA,
    RANGE_FORWARD,
    RANGE_BACKWARD,
    RANGE_GRAD_REDUCE,
    RANGE_OPTIMIZER,
    RANGE_PARAM_GATHER,
)

_enabled = False
_NULL = contextlib.nullcontext()


def enable_ranges(on: bool) -> None:
    """Turn range recording on (PROFILE=torch) or off (the default)."""
    global _enabled
    _enabled = bool(on)


def ranges_enabled() -> bool:
    return _enabled


def train_range(name: str) -> ContextManager[object]:
    """A context manager that records ``name`` as a profiler range when ranges are enabled.

    Only the canonical names above are accepted when enabled, so a typo on the training side
    fails loudly instead of silently producing a range the report never finds.
    """
    if not _enabled:
        return _NULL
    if name not in ALL_RANGES:
        raise ValueError(
            f"unknown training range {name!r}; use one of training.profiling.ranges.ALL_RANGES: "
            + ", ".join(ALL_RANGES)
        )
    return torch.profiler.record_function(name)
