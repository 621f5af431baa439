"""The effect/verdict rule on synthetic per-repeat throughputs."""
from __future__ import annotations

import pytest

from training.bench.stats import VERDICT_RULE, effect, harmonic_tokens_per_s, summarize


def _repeats(mean: float, offsets: list[float]) -> dict[int, float]:
    return {r: mean * (1 + o) for r, o in enumerate(offsets)}


def test_three_percent_with_half_percent_noise_is_faster():
    base = _repeats(1000.0, [0.005, -0.005, 0.0])
    with_ = _repeats(1030.0, [-0.005, 0.004, 0.005])
    row = effect(with_, base)
    assert row["verdict"] == "faster"
    assert row["tokens_per_s_ratio"] == pytest.approx(1.03, abs=0.003)
    assert row["repeats"] == 3
    assert row["ratio_spread"] == pytest.approx(max(row["paired_ratios"]) - min(row["paired_ratios"]))


def test_three_percent_with_five_percent_noise_is_within_noise():
    base = _repeats(1000.0, [0.05, -0.05, 0.0])
    with_ = _repeats(1030.0, [-0.05, 0.05, 0.01])
    assert effect(with_, base)["verdict"] == "within noise"


def test_slower_and_orientation():
    base = _repeats(1000.0, [0.002, -0.002, 0.0])
    slow = _repeats(900.0, [0.002, 0.0, -0.002])
    row = effect(slow, base)
    assert row["verdict"] == "slower" and row["tokens_per_s_ratio"] < 1
    assert effect(base, slow)["verdict"] == "faster"


def test_paired_ratio_range_counts_as_noise():
    # each side's own spread (2%) is below the 3% effect, but the paired ratios move 4%
    base = {0: 1000.0, 1: 1020.0, 2: 1010.0}
    with_ = {0: 1050.0, 1: 1030.0, 2: 1040.0}
    row = effect(with_, base)
    assert summarize(list(base.values()))["spread"] < row["tokens_per_s_ratio"] - 1
    assert summarize(list(with_.values()))["spread"] < row["tokens_per_s_ratio"] - 1
    assert row["ratio_spread"] > row["tokens_per_s_ratio"] - 1
    assert row["verdict"] == "within noise"


def test_single_repeat_uses_step_spread_and_says_so():
    row = effect({0: 1030.0}, {0: 1000.0}, set_step_spread=0.01, base_step_spread=0.005)
    assert row["verdict"] == "faster" and row["noise"] == 0.01
    assert "1 repeat" in row["note"]
    assert effect({0: 1005.0}, {0: 1000.0}, 0.01, 0.01)["verdict"] == "within noise"


def test_nothing_measured():
    assert effect({}, {0: 1.0})["verdict"] == "not measured"


def test_harmonic_mean_is_tokens_over_time():
    assert harmonic_tokens_per_s([1.0, 3.0], 100, 1) == pytest.approx(50.0)
    assert harmonic_tokens_per_s([1.0, 1.0], 100, 2) == pytest.approx(50.0)


def test_summarize_and_rule_text():
    s = summarize([1.0, 2.0, 3.0])
    assert s["mean"] == 2.0 and s["spread"] == pytest.approx(1.0)
    assert "within noise" in VERDICT_RULE and "rotated" in VERDICT_RULE


def test_a_timed_out_run_is_named_by_its_timeout_not_by_a_warning_it_printed():
    from training.bench.analysis import failure_line

    timed_out = {"error": "timed out after 110 s\nBackend impl 'x' could not be imported: "
                          "ImportError: cannot import name 'tanh'\nstill compiling"}
    assert failure_line(timed_out) == "timed out after 110 s"
    crashed = {"error": "step 1\nRuntimeError: CUDA error: out of memory\nexiting"}
    assert failure_line(crashed) == "RuntimeError: CUDA error: out of memory"
