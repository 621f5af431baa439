"""The README's performance block, regenerated between its markers (on a temp file)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from training.bench.__main__ import main
from training.bench.levers import build
from training.bench.readme import BEGIN, END, NoMarkers, replace_block, update_readme

# The first H200 peers run (1 repeat), kept under docs/benchmarks/earlier/: fixed figures.
REAL_PEERS = (Path(__file__).resolve().parents[2] / "docs" / "benchmarks" / "earlier"
              / "peers_h200_llama3-8B-8L_seq8192_1repeat.json")
PEERS_NAME = "peers_h200_llama3-8B-8L_seq8192.json"


@pytest.fixture
def bench(tmp_path) -> Path:
    bench = tmp_path / "benchmarks"
    bench.mkdir()
    shutil.copy(REAL_PEERS, bench / PEERS_NAME)
    return bench


def test_only_the_block_changes_and_a_rerun_is_a_no_op(tmp_path, bench):
    readme = tmp_path / "README.md"
    readme.write_text(f"# Title\n\nintro\n\n{BEGIN}\nold typed table\n{END}\n\n## After\nkeep\n")
    assert update_readme(readme, build(bench), bench) is True
    text = readme.read_text()
    assert text.startswith("# Title\n\nintro\n\n" + BEGIN + "\n")
    assert text.endswith(END + "\n\n## After\nkeep\n")
    assert "old typed table" not in text
    block = text[text.index(BEGIN):text.index(END)]
    assert ("| native | llama3-8B 8L seq8192 mbs1 gb8, 1 GPU (TP1 PP1 DP1), bf16 | 34,967 | "
            "532.6 | 54.1 | 1 | NVIDIA H200 |") in block
    assert "| TRANSFORMER_IMPL=local |" in block and "2.407x" in block
    assert "Not measured yet:" in block and "RECOMPUTE=full" in block
    assert update_readme(readme, build(bench), bench) is False


def test_missing_markers_change_nothing(tmp_path, bench, capsys):
    readme = tmp_path / "README.md"
    readme.write_text("# no markers\n")
    with pytest.raises(NoMarkers):
        update_readme(readme, build(bench), bench)
    assert readme.read_text() == "# no markers\n"
    assert main(["readme", "--readme", str(readme), "--bench-dir", str(bench)]) == 2
    assert "perf-table" in capsys.readouterr().err
    with pytest.raises(NoMarkers):
        replace_block(f"{END}\n{BEGIN}\n", "x")   # wrong order


def test_cli_updates_the_block(tmp_path, bench, capsys):
    readme = tmp_path / "README.md"
    readme.write_text(f"{BEGIN}\n{END}\n")
    assert main(["readme", "--readme", str(readme), "--bench-dir", str(bench)]) == 0
    assert "updated" in capsys.readouterr().out
    assert "peer:hf_liger" in readme.read_text()
