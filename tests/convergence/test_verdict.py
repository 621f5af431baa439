"""The verdict rules on recorded and synthetic curves."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from training.convergence.runner import collect
from training.convergence.verdict import Curves, Rules, judge, running_min, windows

RUNS = Path(__file__).resolve().parents[1] / "data" / "runs"


def curve(label, start, floor, rate, n=200, eval_every=20, grad=1.0, grad_growth=0.0,
          eval_offset=0.1):
    """Loss decaying from start towards floor; eval a little above train."""
    train = [(i, floor + (start - floor) * math.exp(-rate * i)) for i in range(1, n + 1)]
    grads = [(i, grad * (1 + grad_growth * i / n)) for i in range(1, n + 1)]
    evals = [(i, v + eval_offset) for i, v in train if i % eval_every == 0]
    return Curves(label, train, grads, evals)


def test_the_reference_2x2_pattern_plateau_against_converged():
    """eps 1e-8: flat near 5.9 with grad norm climbing; eps 1e-5: down to ~3.8 (the study)."""
    cells = [curve("eps=1e-8 bf16=1", 10.0, 5.8, 0.05, grad_growth=8.0),
             curve("eps=1e-8 bf16=0", 10.0, 5.85, 0.05, grad_growth=8.0),
             curve("eps=1e-5 bf16=1", 10.0, 3.7, 0.02),
             curve("eps=1e-5 bf16=0", 10.0, 3.72, 0.02)]
    v = judge(cells, Rules())
    assert [v[c.label].verdict for c in cells] == ["plateau", "plateau", "converged", "converged"]
    assert "above" in v["eps=1e-8 bf16=1"].reason
    assert v["eps=1e-8 bf16=1"].numbers["grad_norm_max"] > 8
    assert v["eps=1e-5 bf16=1"].numbers["level"] < 4.0


def test_non_finite_values_diverge():
    c = curve("nan", 10, 4, 0.05)
    c.train[150] = (151, float("nan"))
    c2 = curve("inf grad", 10, 4, 0.05)
    c2.grad_norm[10] = (11, float("inf"))
    v = judge([c, c2, curve("ok", 10, 4, 0.05)], Rules())
    assert v["nan"].verdict == "diverged" and "iteration 151" in v["nan"].reason
    assert v["inf grad"].verdict == "diverged" and "grad norm" in v["inf grad"].reason
    assert v["ok"].verdict == "converged"


def test_loss_ending_above_its_start_diverges():
    rising = Curves("rising", [(i, 9.0 + 0.01 * i) for i in range(1, 101)], [], [])
    v = judge([rising], Rules())["rising"]
    assert v.verdict == "diverged" and "above its start" in v.reason


def test_giving_back_progress_diverges_and_the_threshold_is_the_rule():
    down = [10 - 0.06 * i for i in range(1, 101)]            # 10 -> 4
    up = [4 + 0.055 * i for i in range(1, 76)]               # back up to ~8: gives back ~60%
    c = Curves("spike", list(enumerate(down + up, 1)), [], [])
    assert judge([c], Rules())["spike"].verdict == "diverged"
    assert "gave back" in judge([c], Rules())["spike"].reason
    assert judge([c], Rules(give_back=0.9))["spike"].verdict != "diverged"


def test_target_reached_is_converged_even_when_far_from_the_others():
    slow = curve("slow", 10, 5.0, 0.05)
    fast = curve("fast", 10, 3.0, 0.05)
    assert judge([slow, fast], Rules())["slow"].verdict == "plateau"
    assert judge([slow, fast], Rules(target=5.5))["slow"].verdict == "converged"


def test_still_falling_is_converged_with_its_rate_and_absolute_threshold():
    falling = curve("falling", 10, 2.0, 0.005)               # far from its floor at n=200
    best = curve("best", 10, 3.0, 0.05)
    v = judge([falling, best], Rules())["falling"]
    assert v.verdict == "converged" and "still falling" in v.reason
    flat_high = curve("flat high", 10, 5.0, 0.1)
    assert judge([flat_high], Rules())["flat high"].verdict == "converged"     # grid of one
    assert judge([flat_high], Rules(plateau_above=4.0))["flat high"].verdict == "plateau"


def test_overfitting_is_judged_on_the_best_eval_loss_so_far():
    c = curve("overfit", 10, 3.0, 0.05)
    c.evals = [(i, v + (0.004 * max(0, i - 100))) for i, v in c.evals]   # eval rises late
    other = curve("other", 10, 3.05, 0.05)
    v = judge([c, other], Rules())["overfit"]
    assert v.verdict == "converged" and v.numbers["eval_last"] > v.numbers["eval_best"]


def test_too_few_evaluations_are_judged_by_level_and_say_so():
    a = curve("a", 10, 3.0, 0.05, n=60)          # 3 evaluations < window 4
    b = curve("b", 10, 6.0, 0.05, n=60)
    v = judge([a, b], Rules())
    assert v["a"].verdict == "converged" and v["b"].verdict == "plateau"
    assert "judged by level alone" in v["b"].reason


def test_failed_cells_are_reported_not_judged():
    v = judge([curve("a", 10, 3, 0.05)], Rules(), failed={"b": "exit 1: OOM"})
    assert v["b"].verdict == "failed" and v["b"].reason == "exit 1: OOM"


def test_recorded_h200_runs_native_and_local_both_converge():
    """Two real 8-layer Llama3-8B runs on an H200 (20 iterations, no evaluation): judged on
    their windowed train loss, both converge, to the same level."""
    cells = [collect(RUNS / name, name)[0] for name in ("h200_l8_native", "h200_l8_local")]
    assert all(len(c.train) == 20 and not c.evals for c in cells)
    v = judge(cells, Rules(smooth=5, window=2))
    for c in cells:
        assert v[c.label].verdict == "converged", v[c.label].reason
        assert "train loss (5-iteration windows)" in v[c.label].numbers["judged"]
        assert v[c.label].numbers["train_end"] < 0.2 < 5 < v[c.label].numbers["train_start"]


def test_window_and_running_min_helpers():
    assert windows([1, 2, 3, 4, 5], 2) == [1.5, 3.5]
    assert windows([1, 2], 5) == [1.5]
    assert running_min([3, 1, 2, 0.5]) == [3, 1, 1, 0.5]


def test_rules_are_stated_with_their_numbers_and_unknown_settings_refused():
    text = " ".join(Rules(plateau_rel=0.02, window=6, plateau_gap=0.3).describe())
    assert "2.0%" in text and "last 6 evaluations" in text and "0.3" in text
    with pytest.raises(ValueError, match="unknown verdict setting"):
        Rules.from_dict({"windw": 3})
