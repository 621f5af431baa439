"""A lever measured `over` another of its part (catalogue Lever.over): fp8 against bf16 both at
micro-batch 2, from moe-te-more's `PRECISION=fp8+MBS=2` and `MBS` runs; its row and its
levers.json entry are at micro-batch 2."""
from __future__ import annotations

import pytest

from training.bench import sweep
from training.bench.analysis import toggles_results
from training.bench.catalog import MOE_TE_PARTS, PART_SHAPES, select
from training.bench.levers import lever_entry
from training.bench.ours import precheck
from training.bench.suites import toggle_configs

from .fakes import FakeRunner

PART = "moe-te-more"


@pytest.fixture
def data(base_env):
    shape = PART_SHAPES[PART]
    (keys,) = [k for _kind, name, k in MOE_TE_PARTS if name == PART]
    def h200(toggles):
        return precheck(toggles, family=shape.family, environ=dict(base_env, PLATFORM="h200"))

    configs, values = toggle_configs(shape, select(shape, None, None, list(keys)), h200)
    runner = FakeRunner(speed={"default": 47000.0, "MBS": 68000.0,
                               "PRECISION=fp8+MBS=2": 70000.0}, noise=0.0)
    return {"configs": [c.to_dict() for c in configs], "default_resolved": values,
            "shape": shape.to_dict(), "points": [dict(runner(s), config=s.config, repeat=s.repeat)
                                                 for s in sweep.order(configs, shape)]}


def _row(data):
    return next(r for r in toggles_results(data) if r["key"] == "PRECISION=fp8+MBS=2")


def test_the_row_compares_with_the_mbs_run_and_is_at_mbs_2(data):
    row = _row(data)
    assert row["baseline"] == "PRECISION=bf16 MBS=2" and row["at"] == {"MBS": "2"}
    assert row["tokens_per_s_ratio"] == pytest.approx(70 / 68, rel=1e-3)
    mbs = next(r for r in toggles_results(data) if r["key"] == "MBS")
    assert mbs["tokens_per_s_ratio"] == pytest.approx(68 / 47, rel=1e-3)   # the default run
    entry = lever_entry(row, data, "x.json")
    assert entry["shape"]["mbs"] == 2 and entry["baseline"] == "PRECISION=bf16 MBS=2"


def test_a_lever_after_it_still_compares_with_the_default_run(data):
    """The levers after an `over` one in the part (mxfp8, measured where the GPU has it) keep
    the default run as their baseline; and an `over` row does not need the default run."""
    mxfp8 = next(c for c in data["configs"] if c["id"] == "PRECISION=mxfp8")
    assert mxfp8["status"] == "refused"        # an H200: made to run here, as on a B300
    mxfp8["status"] = "planned"
    data["points"] += [dict(p, config="PRECISION=mxfp8", label=f"mxfp8-r{p['repeat']}")
                       for p in data["points"] if p["config"] == "MBS"]
    rows = {r["key"]: r for r in toggles_results(data)}
    assert rows["PRECISION=mxfp8"]["tokens_per_s_ratio"] == pytest.approx(68 / 47, rel=1e-3)
    assert "at" not in rows["PRECISION=mxfp8"]
    for p in data["points"]:
        if p["config"] == "default":
            p.update(returncode=1, error="boom")
            p.pop("tokens_per_s_per_gpu")
    rows = {r["key"]: r for r in toggles_results(data)}
    assert rows["PRECISION=fp8+MBS=2"]["tokens_per_s_ratio"] == pytest.approx(70 / 68, rel=1e-3)
    assert rows["MBS"]["verdict"] == "not measured"


def test_a_json_from_before_over_takes_it_from_the_catalogue(data):
    """Session 18's moe-te-more JSON was written before levers had `over`."""
    for config in data["configs"]:
        if config["lever"]:
            config["lever"].pop("over")
            if config["id"] == "PRECISION=fp8+MBS=2":
                config["lever"]["baseline"] = "PRECISION=bf16 MBS=1"
    row = _row(data)
    assert row["baseline"] == "PRECISION=bf16 MBS=2"
    assert row["tokens_per_s_ratio"] == pytest.approx(70 / 68, rel=1e-3)


def test_without_the_mbs_run_the_row_is_not_measured(data):
    data["points"] = [p for p in data["points"] if p["config"] != "MBS"]
    row = _row(data)
    assert row["verdict"] == "not measured" and "the MBS run" in row["notes"][-1]
