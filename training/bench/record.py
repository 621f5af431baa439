"""The header every benchmark JSON carries, and writing it."""
from __future__ import annotations

import datetime as _dt
import importlib.metadata
import json
import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path

from training import REPO_ROOT
from training.launch.runfolder import git_sha, package_versions

BENCH_DIR = REPO_ROOT / "docs" / "benchmarks"


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


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def header(name: str, argv: list[str] | None = None, module: str = "training.bench") -> dict:
    import torch

    gpu = gpu_info()
    gpu["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    return {
        "name": name,
        "created": _dt.datetime.now().isoformat(timespec="seconds"),
        "command": shlex.join(["python", "-m", module, *(argv or sys.argv[1:])]),
        "git_sha": git_sha(REPO_ROOT),
        "host": socket.gethostname(),
        "gpu": gpu,
        "versions": {**package_versions(), "torchtitan": _version("torchtitan"),
                     "torch_runtime": torch.__version__, "cuda": torch.version.cuda,
                     "cudnn": _cudnn_version(torch),
                     "nccl": _nccl_version(torch)},
    }


def _cudnn_version(torch) -> int | str | None:
    """torch's cuDNN, or why it cannot say: with Transformer Engine's site first on the path a
    second cuDNN can shadow torch's own (torch then refuses to load it; the runs are unaffected
    where nothing calls cuDNN through torch)."""
    if not torch.cuda.is_available():
        return None
    try:
        return torch.backends.cudnn.version()
    except RuntimeError as e:
        return f"unavailable: {str(e).split('.')[0]}"


def _nccl_version(torch) -> str | None:
    if not torch.cuda.is_available():
        return None
    try:
        version = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError):
        return None
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def write(result: dict, out: Path) -> Path:
    """Write atomically (a temporary file, then a rename): a reader never sees half a file."""
    from training.safe_files import write_atomic

    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, json.dumps(result, indent=1, default=str) + "\n", "benchmark JSON")
    return out
