"""The llama31_8b RCPs of the installed mlperf-logging, and the recipe's choice per batch size."""
from __future__ import annotations

import json
import math

import pytest

from training.mlperf import rcp


@pytest.mark.parametrize("ruleset", ["5.1.0", "6.0.0", "6.1.0"])
def test_every_rcp_of_the_package_is_read_with_its_hyperparameters(ruleset):
    raw = json.loads(rcp.rcp_file(ruleset).read_text())
    rcps = rcp.load(ruleset)
    assert len(rcps) == len(raw) and [r.batch_size for r in rcps] == sorted(r["BS"] for r in raw.values())
    for r in rcps:
        hp = raw[r.name]["Hyperparams"]
        choice = rcp.choose(r.batch_size, rcps)
        assert choice.exact and not choice.note and choice.rcp is r
        assert choice.lr == hp["opt_base_learning_rate"]
        assert choice.warmup_iters == math.ceil(hp["opt_learning_rate_warmup_samples"] / r.batch_size)


def test_a_batch_size_without_rcp_takes_a_neighbour_and_says_what_the_checker_will_do():
    rcps = rcp.load("6.1.0")
    sizes = [r.batch_size for r in rcps]
    between = (sizes[0] + sizes[1]) // 2 if sizes[1] - sizes[0] > 1 else sizes[0] + 1
    c = rcp.choose(between, rcps)
    assert not c.exact and c.rcp.batch_size == sizes[0] and "interpolates" in c.note
    above = rcp.choose(sizes[-1] * 2, rcps)
    assert above.rcp.batch_size == sizes[-1]
    assert f"Missing RCP, please submit RCP with BS = {sizes[-1] * 2}" in above.note
    below = rcp.choose(max(sizes[0] // 2, 1), rcps)
    assert below.rcp.batch_size == sizes[0] and "slower" in below.note
