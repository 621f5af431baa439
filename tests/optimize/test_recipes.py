"""The advisor recommends a low-precision recipe where the GPU has it: the one the levers file
measured fastest against bf16, quoting that ratio and its convergence A/B verdict, or saying
the A/B is not measured. Recorded H200 run folders, a levers file with made-up recipe rows
(in a tmp file, never committed) and a convergence report in the harness's format."""
from __future__ import annotations

import json

import pytest

from training.optimize.config import from_manifest
from training.optimize.recipes import RERUN_NOISE, convergence_text, platform_recipes, recipe_ab

from .helpers import NATIVE, advise, copy_run, edit_manifest, fixture_levers, write_levers

TE_SHAPE = {"model": "llama3-8B", "num_layers": 8, "seq_length": 8192, "mbs": 1,
            "global_batch": 8, "gpus": 1, "tp": 1, "pp": 1, "dp": 1, "precision": "bf16",
            "backend": "transformer_engine"}


def _recipe_row(name: str, ratio: float | None, verdict: str) -> dict:
    return {"id": "PRECISION", "kind": "precision", "set": f"PRECISION={name}",
            "baseline": "PRECISION=bf16",
            "effect": {"tokens_per_s_ratio": ratio, "ratio_spread": 0.01 if ratio else None,
                       "verdict": verdict, "peak_memory_gib": {"baseline": 62.0, "with": 65.0}},
            "shape": TE_SHAPE, "hardware": "NVIDIA H200",
            "source": "docs/benchmarks/te-recipes_h200_llama3-8B-8L_seq8192.json",
            "repeats": 2 if ratio else 0, "notes": ""}


def _levers(tmp_path, rows) -> object:
    data = fixture_levers()
    data["levers"] += rows
    return write_levers(tmp_path / "levers.json", data)


def _te_run(tmp_path, backend="transformer_engine", te=True):
    run = copy_run(NATIVE, tmp_path / "run")

    def edit(m):
        m["backend"] = backend
        m["values"]["TRANSFORMER_IMPL"] = backend
        m["capabilities"]["transformer_engine"] = te
    edit_manifest(run, edit)
    return run


def _convergence(tmp_path, cells) -> object:
    path = tmp_path / "te_recipes.json"
    path.write_text(json.dumps({"device": "NVIDIA H200", "cells": [
        {"values": {"PRECISION": name}, "verdict": verdict, "reason": "still falling",
         "numbers": {"eval_best": best}} for name, verdict, best in cells]}))
    return path


ROWS = [_recipe_row("fp8", 1.28, "faster"), _recipe_row("fp8_tensorwise", 1.25, "faster"),
        _recipe_row("fp8_blockwise", 1.12, "faster"), _recipe_row("mxfp8", None, "refused")]


def _recommend(tmp_path, rows=ROWS, cells=None, **run):
    from training.optimize import levers as levers_mod
    from training.optimize.advisor import advise as _advise
    from training.optimize.inputs import load_run

    conv = _convergence(tmp_path, cells) if cells else tmp_path / "none.json"
    book = levers_mod.load(_levers(tmp_path, rows))
    return _advise(load_run(_te_run(tmp_path, **run)), book, convergence=conv)


def test_the_fastest_measured_recipe_is_recommended_with_its_convergence_verdict(tmp_path):
    report = _recommend(tmp_path, cells=[("bf16", "converged", 4.70),
                                         ("fp8", "converged", 4.72)])
    [rec] = [r for r in report["recommendations"] if r["id"] == "precision_recipe"]
    assert rec["set"] == "PRECISION=fp8" and rec["status"] == "measured"
    assert "x1.280 tokens/s" in rec["measured_text"] and "fp8_blockwise" in rec["why"]
    assert "converged, best eval loss 4.720 vs bf16's 4.700 (+0.020" in rec["convergence"]
    assert rec["convergence"] in rec["measured_text"]
    assert "low_precision_compute" not in {d["id"] for d in report["dead_ends"]}
    assert "PRECISION=fp8" in report["command"]


def test_without_the_ab_the_quote_says_convergence_is_not_measured(tmp_path):
    [rec] = [r for r in _recommend(tmp_path)["recommendations"] if r["id"] == "precision_recipe"]
    assert "convergence not measured" in rec["convergence"]
    assert "grid_te_recipes.yaml" in rec["convergence"]


def test_a_recipe_measured_slower_is_a_dead_end_with_its_quote(tmp_path):
    report = _recommend(tmp_path, rows=[_recipe_row("fp8", 0.97, "slower")])
    assert "precision_recipe" not in {r["id"] for r in report["recommendations"]}
    dead = {d["id"]: d for d in report["dead_ends"]}
    assert "x0.970 tokens/s" in dead["precision_recipe"]["text"]
    assert "low_precision_compute" not in dead


def test_on_the_native_backend_the_recipe_comes_with_the_te_backend(tmp_path):
    report = _recommend(tmp_path, backend="native")
    [rec] = [r for r in report["recommendations"] if r["id"] == "precision_recipe"]
    assert rec["sets"] == {"TRANSFORMER_IMPL": "transformer_engine", "PRECISION": "fp8"}


def test_no_recipe_without_transformer_engine_or_without_a_measurement(tmp_path):
    report = _recommend(tmp_path, te=False)
    assert "precision_recipe" not in {r["id"] for r in report["recommendations"]}
    assert "low_precision_compute" in {d["id"] for d in report["dead_ends"]}
    report = advise(_te_run(tmp_path / "b"))           # the fixture has no recipe measured
    assert "precision_recipe" not in {r["id"] for r in report["recommendations"]}
    assert any(c.startswith("PRECISION: h200 runs fp8, fp8_tensorwise, fp8_blockwise")
               for c in report["considered"])


@pytest.mark.parametrize("platform,expect", [
    ("h200", ["fp8", "fp8_tensorwise", "fp8_blockwise"]),
    ("b300", ["fp8", "fp8_tensorwise", "fp8_blockwise", "mxfp8", "nvfp4"]),
    ("mi355x", ["fp8", "fp8_tensorwise", "mxfp8", "mxfp4"]),
    ("mi300x", ["fp8", "fp8_tensorwise"])])
def test_the_recipes_a_gpu_has_come_from_the_launchers_rules(tmp_path, platform, expect):
    manifest = json.loads((NATIVE / "manifest.json").read_text())
    manifest["capabilities"].update(platform=platform, transformer_engine=True)
    assert platform_recipes(from_manifest(manifest)) == expect


def test_convergence_text_of_a_failed_or_missing_cell(tmp_path):
    path = _convergence(tmp_path, [("bf16", "converged", 4.7), ("fp8", "failed", None)])
    assert "not measured for PRECISION=fp8" in convergence_text("fp8", path)
    assert "not measured for PRECISION=fp8_blockwise" in convergence_text("fp8_blockwise", path)


def test_a_faster_recipe_that_learns_worse_than_bf16_beyond_noise_gives_way(tmp_path):
    """The H200 A/B of session 7: fp8 (delayed) fastest but +0.098 above bf16's best eval loss,
    fp8_tensorwise a little slower and below bf16: the advisor recommends fp8_tensorwise and
    says why fp8 was passed over."""
    report = _recommend(tmp_path, cells=[("bf16", "converged", 5.350),
                                         ("fp8", "converged", 5.448),
                                         ("fp8_tensorwise", "converged", 5.303)])
    [rec] = [r for r in report["recommendations"] if r["id"] == "precision_recipe"]
    assert rec["set"] == "PRECISION=fp8_tensorwise"
    assert "not worse than bf16 beyond noise (fp8 learned slower)" in rec["why"]
    [passed_over] = [c for c in report["considered"] if c.startswith("PRECISION=fp8:")]
    assert "x1.280 tokens/s" in passed_over and "+0.098" in passed_over


def test_no_recipe_when_every_measured_one_learns_worse(tmp_path):
    report = _recommend(tmp_path, rows=[_recipe_row("fp8", 1.28, "faster")],
                        cells=[("bf16", "converged", 5.350), ("fp8", "diverged", 9.0)])
    assert "precision_recipe" not in {r["id"] for r in report["recommendations"]}
    assert any(c.startswith("PRECISION=fp8:") and "no recipe is recommended" in c
               for c in report["considered"])


def _seed_reports(tmp_path, seeds) -> list:
    """One report per seed: seeds = {SEED: [(recipe, verdict, best eval loss), ...]}."""
    paths = []
    tmp_path.mkdir(parents=True, exist_ok=True)
    for seed, cells in seeds.items():
        path = tmp_path / f"te_recipes_{seed}.json"
        path.write_text(json.dumps({"device": "NVIDIA H200", "fixed": {"SEED": seed}, "cells": [
            {"values": {"PRECISION": name}, "verdict": verdict, "reason": "still falling",
             "numbers": {"eval_best": best}} for name, verdict, best in cells]}))
        paths.append(path)
    return paths


def _recommend_seeds(tmp_path, seeds, rows=ROWS):
    from training.optimize import levers as levers_mod
    from training.optimize.advisor import advise as _advise
    from training.optimize.inputs import load_run

    book = levers_mod.load(_levers(tmp_path, rows))
    return _advise(load_run(_te_run(tmp_path)), book, convergence=_seed_reports(tmp_path, seeds))


def test_two_seeds_measure_the_noise_a_recipe_gap_is_judged_against(tmp_path):
    """The H200 A/B after session 10: fp8 (delayed) above bf16 at both seeds (+0.098, +0.033),
    its mean gap inside the seed-to-seed spread of its own best eval loss (0.111): within noise,
    so the fastest recipe is recommended, with every seed's numbers quoted."""
    seeds = {"1234": [("bf16", "converged", 5.350), ("fp8", "converged", 5.448)],
             "4321": [("bf16", "converged", 5.304), ("fp8", "converged", 5.337)]}
    ab = recipe_ab("fp8", _seed_reports(tmp_path / "r", seeds))
    assert [s.seed for s in ab.seeds] == ["1234", "4321"]
    assert ab.gap == pytest.approx((0.098 + 0.033) / 2)
    assert ab.noise == pytest.approx(5.448 - 5.337) and not ab.worse
    report = _recommend_seeds(tmp_path, seeds, rows=[_recipe_row("fp8", 1.31, "faster")])
    [rec] = [r for r in report["recommendations"] if r["id"] == "precision_recipe"]
    assert rec["set"] == "PRECISION=fp8"
    assert "converged at 2 seeds" in rec["convergence"]
    assert "5.448 vs bf16's 5.350 (+0.098, seed 1234); 5.337 vs bf16's 5.304 (+0.033, seed 4321)" \
        in rec["convergence"]
    assert "mean gap +0.066, within the noise 0.111 (measured over 2 seeds" in rec["convergence"]


def test_a_gap_every_seed_repeats_beyond_their_spread_is_worse(tmp_path):
    seeds = {"1": [("bf16", "converged", 5.30), ("fp8", "converged", 5.45),
                   ("fp8_tensorwise", "converged", 5.29)],
             "2": [("bf16", "converged", 5.31), ("fp8", "converged", 5.47),
                   ("fp8_tensorwise", "converged", 5.32)]}
    ab = recipe_ab("fp8", _seed_reports(tmp_path / "r", seeds))
    assert ab.noise == pytest.approx(0.02) and ab.worse
    report = _recommend_seeds(tmp_path, seeds)
    [rec] = [r for r in report["recommendations"] if r["id"] == "precision_recipe"]
    assert rec["set"] == "PRECISION=fp8_tensorwise"
    [passed_over] = [c for c in report["considered"] if c.startswith("PRECISION=fp8:")]
    assert "+0.155 in best eval loss above bf16's, beyond the noise of 0.020" in passed_over


def test_a_seed_that_diverged_makes_the_recipe_worse_whatever_the_others_say(tmp_path):
    seeds = {"1": [("bf16", "converged", 5.30), ("fp8", "converged", 5.29)],
             "2": [("bf16", "converged", 5.31), ("fp8", "diverged", 9.0)]}
    ab = recipe_ab("fp8", _seed_reports(tmp_path / "r", seeds))
    assert ab.worse and ab.gap == float("inf")
    report = _recommend_seeds(tmp_path, seeds, rows=[_recipe_row("fp8", 1.31, "faster")])
    assert "precision_recipe" not in {r["id"] for r in report["recommendations"]}
    [passed_over] = [c for c in report["considered"] if c.startswith("PRECISION=fp8:")]
    assert "A/B diverged" in passed_over and "no recipe is recommended" in passed_over


def test_a_missing_or_unreadable_seed_report_is_left_out(tmp_path):
    [one] = _seed_reports(tmp_path, {"1": [("bf16", "converged", 5.30),
                                           ("fp8", "converged", 5.32)]})
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    ab = recipe_ab("fp8", [one, bad, tmp_path / "absent.json"])
    assert len(ab.seeds) == 1 and ab.noise == RERUN_NOISE and not ab.worse
    assert "one seed" in convergence_text("fp8", [one, bad])
    assert "none exists yet" in convergence_text("fp8", [tmp_path / "absent.json"])


def test_a_damaged_report_is_left_out_not_a_traceback(tmp_path):
    """Valid JSON of the wrong shape (a hand edit, a cut-off rewrite): no usable cell."""
    bad = tmp_path / "te_recipes.json"
    bad.write_text('{"cells": [null, 3, {"values": "x"}, {"values": {"PRECISION": "fp8"}, '
                   '"verdict": 7}], "fixed": "SEED"}')
    assert recipe_ab("fp8", [bad]) is None
    assert "not measured for PRECISION=fp8" in convergence_text("fp8", [bad])


def test_a_recipe_measured_on_another_kind_of_model_is_not_recommended(tmp_path):
    """Dense fp8 figures say nothing of an MoE model's GEMMs (and back): an MoE row of the same
    recipe is needed. The same dense rows recommend fp8 for the dense run (tests above)."""
    moe_row = dict(_recipe_row("fp8", 0.91, "within noise"),
                   shape=dict(TE_SHAPE, model="qwen3-30B-A3B", seq_length=4096))
    report = _recommend(tmp_path, rows=ROWS + [moe_row])   # the dense run: the dense rows count
    [rec] = [r for r in report["recommendations"] if r["id"] == "precision_recipe"]
    assert "x1.280 tokens/s" in rec["measured_text"]
    assert not any("measured on MoE models only" in c for c in report["considered"])

    from training.optimize import levers as levers_mod
    from training.optimize.advisor import advise as _advise
    from training.optimize.inputs import load_run

    from .helpers import RUNS

    run = copy_run(RUNS / "h200_l8_moe_lean", tmp_path / "moe")   # the MoE bench shape's run
    edit_manifest(run, lambda m: m["capabilities"].update(transformer_engine=True))
    for rows, quoted in ((ROWS, None), (ROWS + [moe_row], "x0.910 tokens/s")):
        book = levers_mod.load(_levers(tmp_path, rows))
        report = _advise(load_run(run), book, convergence=tmp_path / "none.json")
        assert "precision_recipe" not in {r["id"] for r in report["recommendations"]}
        assert any("measured on dense models only" in c for c in report["considered"])
        dead = {d["id"]: d for d in report["dead_ends"]}
        if quoted:   # the MoE row, within noise: a dead end quoting it
            assert quoted in dead["precision_recipe"]["text"]
