"""The save-async part's figure: a save's cost to the step from a run's per-iteration records
(training/bench/ours.py save_cost), and the part itself (a shape that saves inside the
measured steps, its own SAVE folder per run)."""
from __future__ import annotations

from training.bench import catalog
from training.bench.ours import save_cost


def test_the_interval_after_a_save_less_the_median_of_the_others():
    # 8 iterations, 2 warm-up, saved at 4: iteration 5's record comes 3 s late
    times, t = [], 100.0
    for it in range(1, 9):
        t += 1.0 + (3.0 if it == 5 else 0.0) + (5.0 if it == 1 else 0.0)
        times.append(t)
    samples = {"iteration": list(range(1, 9)), "time": times,
               "warmup": [i <= 2 for i in range(1, 9)]}
    cost = save_cost(samples, 4)
    assert cost["after_a_save"] == [5]
    assert cost["plain_gap_median_s"] == 1.0
    assert cost["extra_s"] == [3.0]
    assert cost["iterations"] == list(range(2, 9)) and len(cost["wall_gap_s"]) == 7


def test_the_part_saves_inside_its_measured_steps():
    shape = catalog.PART_SHAPES["save-async"]
    values = shape.values()
    interval = int(values["SAVE_INTERVAL"])
    assert shape.warmup < interval < values["TOTAL_ITERS"]     # a save between measured steps
    assert shape.num_layers == 32 and shape.gpus == 1           # the full Llama3-8B, one GPU
    levers = catalog.select(shape, None, None, ["ASYNC_SAVE=1"])
    assert [lv.env for lv in levers] == [{"ASYNC_SAVE": "1"}]
    assert ("toggles", "save-async", ("ASYNC_SAVE=1",)) in [
        (kind, name, keys) for name, kind, keys in catalog.PARTS_X1]
