"""Helpers shared by the trace report tests (a uniquely named module: `import conftest` is ambiguous)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
H200_SAMPLE = REPO / "tests" / "data" / "profiling" / "h200_ddp2"


def make_traces(out: Path, device: str, world: int, steps: int = 3) -> None:
    """Run trace_maker.py in a fresh interpreter (it spawns one process per rank)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, str(HERE / "trace_maker.py"), str(out), "--device", device, "--world", str(world),
         "--steps", str(steps)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
