"""Run the cells of a grid through the real launcher, one after the other, and read them back.

Each cell is `bash <script> [args]` with the environment: this process's, minus every registry
toggle (except the machine-specific ones in KEEP), plus the grid's fixed toggles, the cell's
values, and EXPERIMENT_DIR, EXP_NAME=<grid>__<cell>, RUN_ID=grid. Its run folder is
<experiment dir>/<EXP_NAME>/<precision>/grid/ (manifest.json, metrics.jsonl, train.log).

A cell whose run folder holds a finished run (the manifest's `run` section and metrics.jsonl)
is not run again; any other leftover of that cell is removed first (metrics.jsonl appends).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training.launch.runfolder import read_manifest
from training.reading import RecordError

from .grid import Cell, Grid
from .verdict import Curves

RUN_ID = "grid"
KEEP = ("MASTER_ADDR", "MASTER_PORT", "NNODES", "NODE_RANK", "PLATFORM")
_PARAMS = re.compile(r"number of parameters on .*?:\s*(\d+)")


@dataclass
class CellRun:
    cell: Cell
    run_dir: Path | None = None
    returncode: int | None = None
    wall_s: float | None = None
    resumed: bool = False
    error: str | None = None
    log: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def exp_name(grid: Grid, cell: Cell) -> str:
    return f"{grid.name}__{cell.slug}"


def cell_env(grid: Grid, cell: Cell, experiment_dir: Path, dry_run: bool,
             base: dict[str, str] | None = None) -> dict[str, str]:
    from .grid import toggle_names

    toggles = toggle_names(grid.script)
    env = {k: v for k, v in (os.environ if base is None else base).items()
           if k not in toggles or k in KEEP}
    env.update(grid.fixed)
    env.update(cell.values)
    env.update(EXPERIMENT_DIR=str(experiment_dir), EXP_NAME=exp_name(grid, cell), RUN_ID=RUN_ID,
               DRY_RUN="1" if dry_run else "0")
    return env


def find_run(experiment_dir: Path, name: str) -> Path | None:
    found = sorted((experiment_dir / name).glob(f"*/{RUN_ID}/manifest.json"))
    return found[-1].parent if found else None


def finished(run: Path | None) -> bool:
    if run is None or not (run / "metrics.jsonl").is_file():
        return False
    try:
        return "run" in read_manifest(run)
    except RecordError:
        return False


def run_cell(grid: Grid, cell: Cell, experiment_dir: Path, *, dry_run: bool = False,
             resume: bool = True, timeout_s: float | None = None) -> CellRun:
    name = exp_name(grid, cell)
    result = CellRun(cell)
    existing = find_run(experiment_dir, name)
    if resume and not dry_run and finished(existing):
        result.run_dir, result.resumed, result.returncode = existing, True, 0
        return result
    shutil.rmtree(experiment_dir / name, ignore_errors=True)
    (experiment_dir / name).mkdir(parents=True, exist_ok=True)
    result.log = experiment_dir / name / "cell.log"
    cmd = ["bash", str(grid.path(grid.script)), *grid.args]
    started = time.time()
    from training.safe_files import open_write

    with open_write(result.log, "cell log") as out:
        try:
            proc = subprocess.run(cmd, env=cell_env(grid, cell, experiment_dir, dry_run),
                                  stdout=out, stderr=subprocess.STDOUT, cwd=grid.path("."),
                                  timeout=timeout_s or grid.timeout_s)
            result.returncode = proc.returncode
        except subprocess.TimeoutExpired:
            result.returncode = None
            result.error = f"timed out after {timeout_s or grid.timeout_s:.0f} s"
    result.wall_s = time.time() - started
    result.run_dir = find_run(experiment_dir, name)
    if result.returncode != 0 and result.error is None:
        result.error = f"exit {result.returncode}: " + _tail(result.log)
    elif not dry_run and result.error is None and not finished(result.run_dir):
        result.error = "the run ended without a finished run folder: " + _tail(result.log)
    return result


def _tail(path: Path, lines: int = 12) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def collect(run: Path, label: str) -> tuple[Curves, dict[str, Any]]:
    """Curves of a run folder (metrics.jsonl) and what else the table shows about it."""
    from training.metrics import read_metrics

    records = read_metrics(run / "metrics.jsonl")
    steps = [m for m in records if "step_time_s" in m]
    evals: dict[int, float] = {}
    for m in records:
        if "eval_loss" in m and m["iteration"] not in evals:  # Megatron's post-loop validation
            evals[m["iteration"]] = _number(m["eval_loss"])    # repeats the last iteration
    curves = Curves(label,
                    train=[(m["iteration"], _number(m["loss"])) for m in steps
                           if m.get("loss") is not None],
                    grad_norm=[(m["iteration"], _number(m["grad_norm"])) for m in steps
                               if m.get("grad_norm") is not None],
                    evals=sorted(evals.items()))
    info: dict[str, Any] = {"run_dir": str(run)}
    manifest_path = run / "manifest.json"
    if manifest_path.is_file():
        manifest = read_manifest(run)
        summary = (manifest.get("run") or {}).get("summary") or {}
        info.update(tokens_per_s_per_gpu=summary.get("tokens_per_s_per_gpu"),
                    device=summary.get("device"), git_sha=manifest.get("git_sha"),
                    command_line=manifest.get("command_line"),
                    versions=(manifest.get("run") or {}).get("versions"),
                    layout=manifest.get("layout"))
    for log in sorted(run.glob("train*.log")):
        found = _PARAMS.search(log.read_text(errors="replace"))
        if found:
            info["parameters"] = int(found.group(1))
            break
    return curves, info


def _number(value: Any) -> float:
    """metrics.jsonl writes non-finite floats as strings ('nan', 'inf')."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")
