"""The experts' wgrad tile timing (training/native/wgrad_timing.py): its shapes are the MoE
families' expert projections, its inputs split the rows unevenly over the experts, and on the
CPU (the torch loop only) it writes the benchmark JSON with every sample and the error against
the fp32 reference. The kernels themselves are timed on the GPU machine."""
from __future__ import annotations

import json

import pytest
import torch

from training.native import wgrad_timing as wt


def test_the_shapes_are_the_families_expert_projections():
    from training.moe.gpt_oss import GPT_OSS_20B
    from training.moe.presets import MIXTRAL_8X7B, QWEN3_30B_A3B

    for preset, seq in ((QWEN3_30B_A3B, 4096), (MIXTRAL_8X7B, 4096), (GPT_OSS_20B, 8192)):
        fc1, fc2 = (s for s in wt.SHAPES if s.name.startswith(preset.name))
        ffn = preset.moe_ffn_hidden_size
        assert (fc1.experts, fc1.out, fc1.inp) == (preset.num_experts, 2 * ffn,
                                                    preset.hidden_size), preset.name
        assert (fc2.experts, fc2.out, fc2.inp) == (preset.num_experts, preset.hidden_size, ffn)
        assert fc1.rows == fc2.rows == seq * preset.router_topk


def test_inputs_split_the_rows_unevenly_and_end_at_the_row_count():
    shape = wt.WgradShape("t", 4, 6, 5, 40)
    x, dy, ends, grad = wt.inputs(shape, torch.device("cpu"))
    counts = torch.diff(ends, prepend=torch.zeros(1, dtype=ends.dtype))
    assert ends.dtype == torch.int32 and int(ends[-1]) == 40 and len(set(counts.tolist())) > 1
    assert x.shape == (40, 5) and dy.shape == (40, 6) and grad.shape == (4, 6, 5)
    assert not grad.any()


def test_cpu_run_writes_every_sample_and_the_error(tmp_path, monkeypatch):
    monkeypatch.setattr(wt, "SHAPES", (wt.WgradShape("tiny fc1", 3, 8, 6, 24),
                                       wt.WgradShape("tiny fc2", 3, 6, 4, 24)))
    out = wt.run(["--out-dir", str(tmp_path), "--repeats", "2", "--iters", "1",
                  "--device", "cpu", "--shapes", "fc2"])
    data = json.loads(out.read_text())
    assert out.name == "kernels-moe-wgrad_cpu.json" and data["git_sha"] and data["command"]
    assert list(data["shapes"]) == ["tiny fc2"]
    shape = data["shapes"]["tiny fc2"]
    assert len(shape["ms"]["torch loop"]) == 2 and shape["failed"] == {}
    assert 0 < shape["max_rel_error"]["torch loop"] < 1e-2    # a bf16 main_grad's rounding


def test_a_shape_filter_that_matches_nothing_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_:
        wt.run(["--shapes", "llama", "--device", "cpu"])
    assert exit_.value.code == 2
    assert "matches none of" in capsys.readouterr().err


def test_the_table_marks_each_shapes_fastest_and_names_failures(tmp_path, monkeypatch):
    monkeypatch.setattr(wt, "SHAPES", (wt.WgradShape("tiny fc1", 3, 8, 6, 24),))
    data = json.loads(wt.run(["--out-dir", str(tmp_path), "--repeats", "2", "--iters", "1",
                              "--device", "cpu"]).read_text())
    shape = data["shapes"]["tiny fc1"]
    shape["ms"]["slow"] = [x * 2 for x in shape["ms"]["torch loop"]]
    shape["summary_ms"]["slow"] = {"mean": shape["summary_ms"]["torch loop"]["mean"] * 2}
    shape["tflops"]["slow"] = 1.0
    data["shapes"]["other fc2"] = {**shape, "summary_ms": {"slow": shape["summary_ms"]["slow"]},
                                   "failed": {"torch loop": "CompilationError: out of smem"}}
    text = wt.table(data)
    rows = {line.split(" | ")[0].strip("| "): line for line in text.splitlines()}
    assert "| configuration | tiny fc1 | other fc2 |" in text
    assert rows["torch loop"].count("**") == 2 and "CompilationError" in rows["torch loop"]
    assert rows["slow"].count("**") == 2      # the only one timed at "other fc2"
    assert data["git_sha"][:7] in text


def test_docs_moe_table_is_the_recorded_json():
    from pathlib import Path

    source = Path("docs/benchmarks/kernels-moe-wgrad_h200.json")
    assert wt.render_page(source, Path("docs/moe.md"), check=True) == 0, (
        f"docs/moe.md is stale: run python -m training.native.wgrad_timing --table {source}")
