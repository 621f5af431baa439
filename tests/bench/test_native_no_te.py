"""The `native_no_te` side: the native backend with Transformer Engine taken off PYTHONPATH, so
one call measures what TE's presence on an image costs the native backend (parts
moe-te-native-te-cost and -mixtral)."""
from __future__ import annotations

import importlib
import os

import pytest

from training.bench.catalog import PART_SHAPES
from training.bench.ours import NotRunnable, python_path_without_te
from training.bench.ours import precheck
from training.bench.suites import peer_configs


@pytest.fixture
def fake_te(tmp_path, monkeypatch):
    """A transformer_engine package importable from tmp/tesite (as the TE carry's /tmp/tesite)."""
    site = tmp_path / "tesite"
    (site / "transformer_engine").mkdir(parents=True)
    (site / "transformer_engine" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    yield site
    importlib.invalidate_caches()


def test_the_te_entry_is_taken_off_and_the_rest_kept(fake_te, tmp_path):
    other = str(tmp_path / "site")
    path = os.pathsep.join([str(fake_te), other])
    assert python_path_without_te({"PYTHONPATH": path}) == other


def test_te_that_no_pythonpath_entry_brings_cannot_be_taken_off(fake_te, tmp_path):
    with pytest.raises(NotRunnable, match="not on PYTHONPATH"):
        python_path_without_te({"PYTHONPATH": str(tmp_path / "site")})


def test_a_second_copy_of_te_makes_the_side_not_runnable(fake_te, tmp_path):
    """Taken off one entry, TE still imports from another: the run would measure TE again."""
    second = tmp_path / "other"
    (second / "transformer_engine").mkdir(parents=True)
    (second / "transformer_engine" / "__init__.py").write_text("")
    with pytest.raises(NotRunnable, match="still imports"):
        python_path_without_te({"PYTHONPATH": os.pathsep.join([str(fake_te), str(second)])})


def test_without_te_there_is_nothing_to_take_off():
    if importlib.util.find_spec("transformer_engine") is not None:
        pytest.skip("Transformer Engine imports here")
    with pytest.raises(NotRunnable, match="does not import here"):
        python_path_without_te({"PYTHONPATH": ""})


def test_the_part_runs_the_side_where_te_comes_from_pythonpath(fake_te, tmp_path, base_env,
                                                                 monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(fake_te), str(tmp_path)]))
    shape = PART_SHAPES["moe-te-native-te-cost"]
    configs = peer_configs(shape, ["native", "native_no_te"],
                           lambda t: precheck(t, family=shape.family, environ=base_env),
                           lambda side: None)
    assert [(c.id, c.side, c.status) for c in configs] == [
        ("native", "ours", "planned"), ("native_no_te", "ours", "planned")]
    assert configs[1].env == {"TRANSFORMER_IMPL": "native", "PYTHONPATH": str(tmp_path)}
    configs = peer_configs(shape, ["native", "native_no_te"],        # ours_env: both sides
                           lambda t: precheck(t, family=shape.family, environ=base_env),
                           lambda side: None, ours_env={"MBS": "2"})
    assert configs[0].env["MBS"] == configs[1].env["MBS"] == "2"
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))       # TE from elsewhere: not runnable
    configs = peer_configs(shape, ["native", "native_no_te"],
                           lambda t: precheck(t, family=shape.family, environ=base_env),
                           lambda side: None)
    assert configs[1].status == "not runnable" and "not on PYTHONPATH" in configs[1].message
    assert configs[0].status == "not run"                 # nothing left to compare with
