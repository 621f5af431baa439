from __future__ import annotations

import contextlib

import pytest
import torch

from training.profiling import ranges as rg


@pytest.fixture(autouse=True)
def _ranges_off():
    rg.enable_ranges(False)
    yield
    rg.enable_ranges(False)


def _recorded_names(enabled: bool) -> set[str]:
    rg.enable_ranges(enabled)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with rg.train_range(rg.RANGE_FORWARD):
            torch.ones(4).sum()
    return {e.key for e in prof.key_averages()}


def test_canonical_names():
    assert rg.RANGE_DATA == "train/data"
    assert rg.RANGE_FORWARD == "train/forward"
    assert rg.RANGE_OPTIMIZER == "train/optimizer_step"
    assert len(set(rg.ALL_RANGES)) == len(rg.ALL_RANGES) == 6
    assert all(name.startswith("train/") for name in rg.ALL_RANGES)
    assert {rg.RANGE_BACKWARD, rg.RANGE_GRAD_REDUCE, rg.RANGE_PARAM_GATHER} <= set(rg.ALL_RANGES)


def test_off_by_default_is_a_shared_nullcontext():
    assert rg.ranges_enabled() is False
    a, b = rg.train_range(rg.RANGE_DATA), rg.train_range(rg.RANGE_BACKWARD)
    assert a is b  # one shared object: nothing is built per call
    assert isinstance(a, contextlib.nullcontext)


@pytest.mark.filterwarnings("ignore:Warning. Profiler clears events")
@pytest.mark.slow
def test_off_records_nothing():
    names = _recorded_names(enabled=False)
    assert "aten::sum" in names  # the profiler did run
    assert rg.RANGE_FORWARD not in names


def test_on_records_the_range():
    assert rg.RANGE_FORWARD in _recorded_names(enabled=True)


def test_on_refuses_unknown_names():
    rg.enable_ranges(True)
    with pytest.raises(ValueError, match="unknown training range 'train/fwd'"):
        rg.train_range("train/fwd")
