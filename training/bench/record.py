"""The header every benchmark JSON carries, and writing it."""
from __future__ import annotations

import datetime as _dt
import json
import shlex
import subprocess
import sys
from pathlib import Path

from training.launch.runfolder import git_sha, package_versions

REPO = Path(__file__).resolve().parents[2]
BENCH_DIR = REPO / "docs" / "benchmarks"


def gpu_info() -> dict:
    info = {"name": None, "count": 0, "driver": None}
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=20, check=True).stdout.strip().splitlines()
        if out:
            name, driver, memory = (x.strip() for x in out[0].split(","))
            info.update(name=name, driver=driver, memory=memory, count=len(out))
    except (OSError, subprocess.SubprocessError):
        pass
    return info


def header(name: str, argv: list[str] | None = None) -> dict:
    import torch

    return {
        "name": name,
        "created": _dt.datetime.now().isoformat(timespec="seconds"),
        "command": shlex.join(["python", "-m", "training.bench", *(argv or sys.argv[1:])]),
        "git_sha": git_sha(REPO),
        "gpu": gpu_info(),
        "versions": {**package_versions(), "torch_runtime": torch.__version__,
                     "cuda": torch.version.cuda,
                     "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None},
    }


def write(result: dict, out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    return out
