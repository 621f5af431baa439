"""Range and form checks of the registry: a value out of range is one line, exit 2, before
anything is derived (issue 20, "inputs checked end to end")."""
from __future__ import annotations

import math

import pytest

from training.launch.settings import BadInput
from training.launch.toggles import BY_NAME, REGISTRY, Form, Range, parse_value

from .helpers import launch

RANGED = [t for t in REGISTRY if isinstance(t.check, Range)]


def _outside(check: Range) -> list[float]:
    values = []
    if check.low is not None:
        values.append(check.low if check.low_open else check.low - 1)
    if check.high is not None:
        values.append(check.high if check.high_open else check.high + 1)
    return values


def _inside(check: Range, kind: str) -> list[float]:
    step = 1 if kind == "int" else 1e-3
    values = []
    if check.low is not None:
        values.append(check.low + step if check.low_open else check.low)
    if check.high is not None:
        values.append(check.high - step if check.high_open else check.high)
    return values


def _raw(value: float, kind: str) -> str:
    return str(int(value)) if kind == "int" else repr(float(value))


@pytest.mark.parametrize("toggle", RANGED, ids=lambda t: t.name)
def test_each_range_refuses_outside_and_takes_its_bounds(toggle):
    assert _outside(toggle.check), f"{toggle.name}: a range with no bound"
    for value in _outside(toggle.check):
        with pytest.raises(BadInput, match=rf"^{toggle.name}=.*out of range: use "):
            parse_value(toggle, _raw(value, toggle.kind))
    for value in _inside(toggle.check, toggle.kind):
        parse_value(toggle, _raw(value, toggle.kind))


def _floats():
    from training.mlperf.layer import TOGGLES as MLPERF
    from training.moe.layer import TOGGLES as MOE

    return [t for t in (*REGISTRY, *MOE, *MLPERF) if t.kind == "float"]


@pytest.mark.parametrize("toggle", _floats(), ids=lambda t: t.name)
@pytest.mark.parametrize("raw", ["nan", "inf", "-inf"])
def test_every_float_is_finite(toggle, raw):
    """The core's floats and the recipe layers' (MOE_AUX_LOSS_COEFF, MLPERF_TARGET_LOSS): a
    float with no range of its own is checked as FINITE, one mechanism with the ranges."""
    with pytest.raises(BadInput, match=f"{toggle.name}='{raw}' is not a finite number: use a number"):
        parse_value(toggle, raw)


@pytest.mark.parametrize("word", [
    # the issue's list: LR/MIN_LR, betas, eps/decay/clip, sizes, iterations, ports, MASTER_ADDR
    "LR=0", "LR=-1e-4", "LR=nan", "MIN_LR=-1e-5", "MIN_LR=inf", "ADAM_BETA1=1", "ADAM_BETA2=-0.1",
    "ADAM_EPS=-1e-8", "WEIGHT_DECAY=-0.1", "CLIP_GRAD=-1", "SEQ_LENGTH=0", "NUM_LAYERS=0",
    "EVAL_INTERVAL=0", "LOG_INTERVAL=0", "TOTAL_ITERS=-5", "WARMUP_ITERS=-1",
    "LR_DECAY_ITERS=0", "EVAL_ITERS=-1", "MASTER_PORT=0", "MASTER_PORT=65536",
    "MASTER_ADDR=", "MASTER_ADDR=node 0", "TP=100000", "BS=1000000000", "MBS=0",
    "GPUS_PER_NODE=0", "NNODES=0", "SEQ_LENGTH=100000000", "SPLIT=abc", "SPLIT=0,1,0",
    "SPLIT=1,2,3,4", "SPLIT=-1,1",
])
def test_bad_values_are_refused_before_anything_is_derived(base_env, word):
    name, raw = word.split("=", 1)
    with pytest.raises(BadInput) as err:
        launch(base_env, words=[word])
    assert str(err.value).startswith(f"{name}={raw!r}")
    assert "\n" not in str(err.value)


def test_the_boundaries_the_issue_names_are_accepted(base_env):
    result = launch(base_env, words=["MIN_LR=0", "ADAM_BETA1=0", "ADAM_EPS=0", "WEIGHT_DECAY=0",
                                     "CLIP_GRAD=0", "EVAL_ITERS=0", "MASTER_PORT=65535",
                                     "MASTER_ADDR=node-0.example", "SPLIT=949,50,1"])
    assert result.settings["MASTER_PORT"] == 65535 and result.settings["MIN_LR"] == 0.0


def test_the_readme_values_column_shows_each_check():
    from training.launch.docs import toggles_table

    table = toggles_table()
    for toggle in REGISTRY:
        if toggle.check is None:
            continue
        row = next(line for line in table.splitlines() if line.startswith(f"| `{toggle.name}` |"))
        text = toggle.check.text
        assert text in row, (toggle.name, text)
    assert isinstance(BY_NAME["SPLIT"].check, Form) and math.isfinite(BY_NAME["LR"].default)
