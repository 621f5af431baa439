"""Reading, matching and quoting docs/levers.json entries."""
from __future__ import annotations

import copy
import json

import pytest

from training.optimize import levers
from training.optimize.config import from_manifest, shape_key
from training.optimize.inputs import BadInput, load_run

from .helpers import DRY_ALL_ON, FIXTURE, LOCAL, NATIVE, advise, fixture_levers, write_levers


def _book(tmp_path, data):
    return levers.load(write_levers(tmp_path / "levers.json", data))


def test_fixture_loads_and_says_it_is_a_fixture():
    book = levers.load(FIXTURE)
    assert len(book.entries) == len(fixture_levers()["levers"])
    assert all(e.source == "tests/data/levers_fixture.json" for e in book.entries)
    assert all("fixture" in e.notes for e in book.entries)


def test_closest_shape_wins(tmp_path):
    data = fixture_levers()
    mbs = next(e for e in data["levers"] if e["set"] == "MBS=2")
    far = copy.deepcopy(mbs)
    far["shape"]["seq_length"] = 2048
    far["effect"]["tokens_per_s_ratio"] = 1.5
    data["levers"].insert(0, far)
    book = _book(tmp_path, data)
    config = from_manifest(load_run(NATIVE).manifest)
    match = book.find({"MBS": "2"}, shape_key(config), "h200", {"MBS": "1"})
    assert match.entry.shape["seq_length"] == 8192 and match.exact
    assert match.others == 1 and match.differs == {}
    long_run = config.with_values(SEQ_LENGTH=2048)
    match = book.find({"MBS": "2"}, shape_key(long_run), "h200", {"MBS": "1"})
    assert match.entry.effect["tokens_per_s_ratio"] == 1.5


def test_other_hardware_ranks_below_the_same_hardware(tmp_path):
    data = fixture_levers()
    mbs = next(e for e in data["levers"] if e["set"] == "MBS=2")
    other = copy.deepcopy(mbs)
    other["hardware"] = "AMD Instinct MI355X"
    other["effect"]["tokens_per_s_ratio"] = 1.9
    data["levers"].insert(0, other)
    config = from_manifest(load_run(NATIVE).manifest)
    match = _book(tmp_path, data).find({"MBS": "2"}, shape_key(config), "h200", {"MBS": "1"})
    assert match.entry.hardware == "NVIDIA H200"
    match = _book(tmp_path, data).find({"MBS": "2"}, shape_key(config), "mi355x", {"MBS": "1"})
    assert match.entry.hardware == "AMD Instinct MI355X"


def test_the_same_hardware_outranks_a_closer_shape_measured_elsewhere(tmp_path):
    """Hardware first, then shape: this GPU's entry two shape fields away is quoted before
    another GPU's entry at exactly this run's shape."""
    data = fixture_levers()
    mbs = next(e for e in data["levers"] if e["set"] == "MBS=2")
    run = from_manifest(load_run(NATIVE).manifest).with_values(SEQ_LENGTH=2048, NUM_LAYERS=4)
    other = copy.deepcopy(mbs)
    other["hardware"] = "AMD Instinct MI355X"
    other["shape"] = dict(shape_key(run))
    data["levers"].insert(0, other)
    match = _book(tmp_path, data).find({"MBS": "2"}, shape_key(run), "h200", {"MBS": "1"})
    assert match.entry.hardware == "NVIDIA H200"
    assert set(match.differs) == {"seq_length", "num_layers"}


def test_an_entry_speaks_only_for_the_toggles_it_changes(tmp_path):
    """fp8 against bf16, both at micro-batch 2 (bench levers `over`): an fp8 measurement at
    MBS 2, no MBS measurement; the MBS lever quotes the MBS row."""
    data = fixture_levers()
    mbs = next(e for e in data["levers"] if e["set"] == "MBS=2")
    at_two = copy.deepcopy(mbs)
    at_two.update(id="PRECISION", kind="precision", set="PRECISION=fp8 MBS=2",
                  baseline="PRECISION=bf16 MBS=2", key="PRECISION=fp8+MBS=2")
    at_two["shape"]["mbs"] = 2
    at_two["effect"]["tokens_per_s_ratio"] = 1.03
    data["levers"].insert(0, at_two)
    book = _book(tmp_path, data)
    config = from_manifest(load_run(NATIVE).manifest)
    # a run at MBS 2 asking for MBS 4: the fp8 row's baseline (MBS=2) matches, but it does
    # not change MBS; the MBS row (2 vs 1) is the nearest MBS measurement
    match = book.find({"MBS": "4"}, shape_key(config.with_values(MBS=2)), "h200", {"MBS": "2"})
    assert match.entry.set == "MBS=2" and not match.exact
    match = book.find({"PRECISION": "fp8"}, shape_key(config.with_values(MBS=2)), "h200")
    assert match.entry.set == "PRECISION=fp8 MBS=2" and match.exact and not match.differs


def test_quote_names_shape_source_and_differences():
    book = levers.load(FIXTURE)
    config = from_manifest(load_run(NATIVE).manifest).with_values(SEQ_LENGTH=32768)
    match = book.find({"RECOMPUTE": "full"}, shape_key(config), "h200", {"RECOMPUTE": "none"})
    text = match.quote()
    assert text.startswith("RECOMPUTE=full vs RECOMPUTE=none: x0.748 tokens/s")
    assert "slower" in text and "peak 54.1 -> 43.6 GiB" in text
    assert "llama3-8B 8L seq 8192 mbs 1 gb 8 1 GPU tp1pp1dp1 native bf16" in text
    assert "source tests/data/levers_fixture.json" in text
    assert "seq_length 8192 vs 32768" in text


def test_no_entry_for_a_lever_is_none():
    book = levers.load(FIXTURE)
    assert book.find({"CP": "2"}, {}, "h200") is None


def test_a_dry_run_without_platform_and_without_the_option_says_memory_is_unknown():
    report = advise(DRY_ALL_ON)
    assert report["shape"]["platform"] is None
    assert report["memory"]["estimate"]["device_gib"] is None
    assert any("GPU memory unknown" in e for e in report["bottleneck"]["evidence"])
    assert report["bottleneck"]["kind"] == "throughput-bound"


def test_peers_are_not_levers_and_default_matches_the_registry_default(tmp_path):
    data = fixture_levers()
    peer = copy.deepcopy(next(e for e in data["levers"] if e["set"] == "MBS=2"))
    peer.update(id="peer:hf", kind="peer", set="ours (launcher default)",
                baseline="HF transformers")
    kernels = next(e for e in data["levers"] if e["set"] == "NATIVE_KERNELS=liger")
    kernels["set"] = "NATIVE_KERNELS=<default>"
    data["levers"].append(peer)
    book = _book(tmp_path, data)
    config = from_manifest(load_run(NATIVE).manifest)
    assert book.find({"ours": "x"}, shape_key(config), "h200") is None
    # NATIVE_KERNELS defaults to auto (resolved per platform): <default> matches liger
    match = book.find({"NATIVE_KERNELS": "liger"}, shape_key(config), "h200",
                      {"NATIVE_KERNELS": "torch"})
    assert match is not None and match.exact
    # MBS defaults to 1: <default> is not 2
    assert not levers.value_matches("MBS", "<default>", "2")
    assert levers.value_matches("MBS", "<default>", "1")


def test_an_unmeasured_entry_needs_no_source_but_a_measured_one_does(tmp_path):
    """Mutation caught: training/optimize/levers.py load() taking only a ratio for a
    measurement (`measured = ratio is not None`): the same entry with the verdict 'slower' and
    no ratio then loads without a source. The old test checked only the unmeasured half."""
    data = fixture_levers()
    unmeasured = next(e for e in data["levers"] if e["effect"]["verdict"] == "not measured")
    unmeasured.update(source=None, shape=None, hardware=None)
    book = _book(tmp_path, data)
    entry = next(e for e in book.entries if e.verdict == "not measured")
    assert levers.quote(entry).endswith("not measured: fixture; needs DP>1")
    # a verdict is a measurement, with a ratio or without one: it must say where it comes from
    assert unmeasured["effect"]["tokens_per_s_ratio"] is None
    unmeasured["effect"]["verdict"] = "slower"
    with pytest.raises(BadInput, match=r"has a measurement but no 'source'"):
        _book(tmp_path, data)


REAL = FIXTURE.parents[2] / "docs" / "levers.json"


@pytest.mark.skipif(not REAL.exists(), reason="docs/levers.json not produced yet")
def test_the_benchmarks_levers_file_reads_and_is_quoted_as_written():
    """Mutation caught: training/optimize/levers.py LeverBook.find skipping every entry
    (`continue` for the peer test): no recommendation is measured any more, and the old loop
    over the measured ones then checked nothing."""
    book = levers.load(REAL)
    report = advise(LOCAL, levers=REAL)
    measured = [rec for rec in report["recommendations"] if rec["status"] == "measured"]
    assert measured    # the local-backend run: TRANSFORMER_IMPL=native, measured by the peers
    for rec in measured:
        entry = rec["measured"]["entry"]
        assert entry["source"] and entry["source"] in rec["measured_text"]
        ratio = entry["effect"]["tokens_per_s_ratio"]
        if ratio is not None:
            assert f"x{ratio:.3f}" in rec["measured_text"]
    assert len(book.entries) == len(json.loads(REAL.read_text())["levers"])
