"""The import benchmark runs end to end on the tiny shape and records what the bar needs."""
from __future__ import annotations

import json

import pytest

from training.checkpoint import bench


@pytest.mark.slow
def test_bench_records_ratios_and_memory_per_repeat(tmp_path):
    out = tmp_path / "bench.json"
    assert bench.main(["--preset", "tiny", "--repeats", "2", "--dir", str(tmp_path / "work"),
                       "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    kinds = [(s["repeat"], s["kind"]) for s in result["samples"]]
    assert kinds == [(0, "read"), (0, "copy"), (0, "import"),
                     (1, "import"), (1, "copy"), (1, "read")]
    assert all(s["seconds"] > 0 for s in result["samples"])
    assert all(s["bytes"] == result["shape"]["bytes"] for s in result["samples"]
               if s["kind"] != "copy")   # the copy counts the files' bytes, headers included
    assert len(result["ratios"]["import_over_read"]["values"]) == 2
    assert result["shape"]["largest_chunk_bytes"] == 8192 * 256 * 2   # the embedding
    assert len(result["memory"]["added_bytes"]) == 2
    assert set(result["verdict"]) == {"time", "memory"}
    assert result["command"].startswith("python -m training.checkpoint.bench")
    assert "2-core shared CPU host" in result["machine"]["note"]
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == []   # input removed
