"""Derivation happens once, before the guards (resolve.prepare): the order the guards run in
changes nothing: not a value, a source, a reason, a notice or a refusal."""
from __future__ import annotations

import itertools
import random

import pytest

from training.launch.guards import Refusals, run_guards
from training.launch.resolve import prepare

# Toggles whose rules touch the same values (the optimizer and fusion toggles under FSDP, sequence
# parallel under TP and the local backend, mxfp4's gradient buffer), every combination.
GRID = {
    "FSDP": ("0", "1"),
    "TRANSFORMER_IMPL": ("native", "local", "transformer_engine"),
    "TP": ("1", "2"),
    "SEQUENCE_PARALLEL": (None, "1"),
    "DISTRIBUTED_OPTIMIZER": (None, "0"),
    "GRADIENT_ACCUMULATION_FUSION": (None, "1"),
    "PRECISION": ("bf16", "mxfp4"),
    "GRAD_REDUCE_IN_BF16": (None, "0"),
    "OVERLAP_PARAM_GATHER": (None, "1"),
}


def _outcome(env: dict[str, str], order) -> tuple:
    ctx = prepare("llama3", env)
    try:
        run_guards(ctx, order(list(ctx.guards)))
    except Refusals as err:
        return "refused", sorted(str(r) for r in err.refusals)
    values = {name: (s.value, s.source, s.reason, s.requested)
              for name, s in ctx.settings.values.items()}
    return "ok", values, sorted((n.level, n.guard, n.message) for n in ctx.settings.notices)


def _launches(base_env):
    for combo in itertools.product(*GRID.values()):
        env = dict(base_env, PLATFORM="mi355x", GPUS_PER_NODE="8", MODEL_SIZE="tiny",
                   DRY_RUN="1", RUN_ID="r")
        env.update({k: v for k, v in zip(GRID, combo) if v is not None})
        yield env


@pytest.mark.slow
def test_guards_in_any_order_give_the_same_launch(base_env):
    rng = random.Random(0)
    orders = [lambda g: g[::-1], lambda g: rng.sample(g, len(g))]
    checked = refused = 0
    for env in _launches(base_env):
        forward = _outcome(env, lambda g: g)
        for order in orders:
            assert _outcome(env, order) == forward, {k: env[k] for k in GRID if k in env}
        checked += 1
        refused += forward[0] == "refused"
    assert checked == 2 * 3 * 2 * 2 * 2 * 2 * 2 * 2 * 2 and 0 < refused < checked


@pytest.mark.parametrize("name", ["SEQUENCE_PARALLEL", "WARMUP_ITERS", "METRICS_WARMUP_ITERS",
                                  "RUN_ID", "GPUS_PER_NODE", "TRANSFORMER_IMPL"])
def test_derived_values_are_there_before_any_guard_runs(base_env, name):
    ctx = prepare("llama3", dict(base_env, DRY_RUN="1"))
    assert ctx.settings[name] is not None
    assert ctx.settings.setting(name).source in ("derived", "platform")
