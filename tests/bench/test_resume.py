"""`bench all --resume`: a part's earlier JSON extended by whole repeats (a 1-repeat part to its
2 repeats in a later call), never a repeat split between calls; a different plan is measured
anew, with the reason."""
from __future__ import annotations

import json

import pytest

from training.bench import __main__ as cli
from training.bench import sweep

from .test_cli import TAG, fake_tools  # noqa: F401 - the fixture

PART = f"toggles-a_h200_{TAG}"


def _run(out_dir, *words):
    return cli.main(["all", "--parts", "toggles-a", "--out-dir", str(out_dir), *words])


def test_a_one_repeat_json_is_extended_to_two(fake_tools, tmp_path, capsys):  # noqa: F811
    out_dir = tmp_path / "out"
    assert _run(out_dir, "--repeats", "1") == 0
    first = json.loads((out_dir / f"{PART}.json").read_text())
    assert first["complete"] and {p["repeat"] for p in first["points"]} == {0}
    calls = len(fake_tools.calls)
    assert _run(out_dir, "--repeats", "2") == 0      # complete: without --resume, done
    assert f"{PART}: done" in capsys.readouterr().out
    assert _run(out_dir, "--resume", "--repeats", "2") == 0
    text = capsys.readouterr().out
    assert f"resumes {out_dir / PART}.json: repeat(s) [0] kept" in text
    second = json.loads((out_dir / f"{PART}.json").read_text())
    ran = fake_tools.calls[calls:]
    assert {s.repeat for s in ran} == {1} and len(ran) == len(first["points"])
    assert second["complete"] and second["shape"]["repeats"] == 2
    assert second["points"][:len(first["points"])] == first["points"]   # kept as they were
    assert second["resumed"]["repeats_kept"] == [0]
    assert second["resumed"]["from_created"] == first["created"]
    assert "Resumed: repeat(s) 0 measured in an earlier call" in text
    assert all(r["repeats"] == 2 for r in second["results"] if r.get("verdict") not in
               ("refused", "not measured", "not applicable"))
    assert _run(out_dir, "--resume", "--repeats", "2") == 0   # nothing left: not rewritten
    assert f"{PART}: done" in capsys.readouterr().out
    assert _run(out_dir, "--resume", "--repeats", "2", "--force") == 0   # --force: anew
    again = json.loads((out_dir / f"{PART}.json").read_text())
    assert "resumed" not in again and again["created"] != second["created"] or \
        again["points"] != second["points"]
    assert len(fake_tools.calls) == calls + 3 * len(first["points"])


def test_a_prior_that_is_no_benchmark_json_is_not_resumed(fake_tools, tmp_path,  # noqa: F811
                                                          capsys):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / f"{PART}.json").write_text("[1, 2]")
    assert _run(out_dir, "--resume", "--repeats", "1") == 0
    assert "not a benchmark JSON (a JSON object); measured anew" in capsys.readouterr().out
    assert json.loads((out_dir / f"{PART}.json").read_text())["complete"]


@pytest.mark.parametrize("field,value", [("shape.repeats", "2"), ("shape.repeats", 1.5),
                                         ("gpu.name", 7), ("points.0.label", ["x"]),
                                         ("complete", "yes")])
def test_a_prior_with_a_wrong_type_is_said_and_measured_anew(fake_tools, tmp_path,  # noqa: F811
                                                             capsys, field, value):
    """A hand-edited earlier JSON with a string where a number goes (or any field of the wrong
    type) is named and measured anew, never a TypeError in the comparison."""
    out_dir = tmp_path / "out"
    assert _run(out_dir, "--repeats", "1") == 0
    path = out_dir / f"{PART}.json"
    data = json.loads(path.read_text())
    *parents, last = field.split(".")
    node = data
    for key in parents:
        node = node[int(key)] if key.isdigit() else node[key]
    node[last] = value
    path.write_text(json.dumps(data))
    capsys.readouterr()
    assert _run(out_dir, "--resume", "--repeats", "1") == 0
    out = capsys.readouterr().out
    assert f"{path}: {field}: " in out and "; measured anew" in out, out


def test_a_split_repeat_is_measured_again_whole():
    """The first call stopped inside repeat 1: only repeat 0 is kept."""
    specs = [sweep.PointSpec(i, f"c{c}-r{r}", f"c{c}", r, "ours", {}, None)
             for i, (r, c) in enumerate([(0, 0), (0, 1), (1, 1), (1, 0)])]
    prior = {"points": [{"label": s.label, "repeat": s.repeat} for s in specs[:3]]}
    assert sweep.whole_repeats(prior, specs) == [0]
    assert sweep.whole_repeats({"points": []}, specs) == []


@pytest.mark.parametrize("change,why", [
    (lambda d: d["gpu"].update(name="AMD Instinct MI355X"), "measured on AMD Instinct MI355X"),
    (lambda d: d["shape"].update(repeats=3) or d.update(complete=False),   # stopped early
     "it planned 3 repeats, this call asks 2"),
    (lambda d: d["shape"].update(seq_length=4096), "seq_length 4096 vs 8192"),
    (lambda d: d["configs"][1]["env"].update(MBS="4"), "sides or their settings differ"),
    (lambda d: d["configs"][1].pop("env"), "sides or their settings differ"),   # hand-edited
])
def test_another_plan_is_measured_anew(fake_tools, tmp_path, capsys, change, why):  # noqa: F811
    out_dir = tmp_path / "out"
    assert _run(out_dir, "--repeats", "1") == 0
    path = out_dir / f"{PART}.json"
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))
    capsys.readouterr()
    assert _run(out_dir, "--resume", "--repeats", "2") == 0
    text = capsys.readouterr().out
    assert "not resumed from" in text and why in text, text
    again = json.loads(path.read_text())
    assert "resumed" not in again and {p["repeat"] for p in again["points"]} == {0, 1}
