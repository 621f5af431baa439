"""`python -m training.convergence GRID.yaml [--out DIR] [--experiment-dir DIR] [--dry-run]`

Runs every cell of the grid (training/convergence/grid.py) through the real launcher, one after
the other, each in its own run folder with the same SEED (same data order); reads train loss,
grad norm and eval loss back from each metrics.jsonl; judges each cell (verdict.py, rules
printed with the table) and writes <out>/<name>.md, .json and .png.

  --dry-run       DRY_RUN=1 for every cell: each launch resolved and checked, nothing trained
  --report-only   no run: judge and report the run folders already there
  --no-resume     run every cell again (default: a finished cell is read back, not rerun)
  --budget-s S    stop starting cells when the next would not fit in S seconds (exit 3: run the
                  same command again to finish the grid)
Exit: 0 every cell judged, 1 a cell failed to run, 3 cells left for the next invocation.
"""
from __future__ import annotations

import datetime as _dt
import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path

from training.cli import ArgumentParser, fail, positive_float

from . import report, runner
from training import REPO_ROOT

from .grid import GridError, load
from .verdict import judge


def _git_sha() -> str | None:
    from training.launch.runfolder import git_sha

    return git_sha(REPO_ROOT)


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m training.convergence",
                            description=__doc__.split("\n\n")[1])
    parser.add_argument("grid", type=Path)
    parser.add_argument("--out", type=Path, default=None, help="default: the grid's `out`")
    parser.add_argument("--experiment-dir", type=Path, default=REPO_ROOT / "experiment" / "convergence")
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--no-resume", action="store_true")
    parser.add_argument("--budget-s", type=positive_float, default=None)
    args = parser.parse_args(argv)
    try:
        grid = load(args.grid)
    except (GridError, OSError) as err:
        fail(str(err))
        return 2
    budget = args.budget_s if args.budget_s is not None else grid.budget_s
    experiment_dir = args.experiment_dir.resolve()
    cells = grid.cells()
    print(f"[convergence] {grid.name}: {len(cells)} cells, {grid.script}; run folders under "
          f"{experiment_dir}", flush=True)
    for line in grid.rules.describe():
        print(f"[convergence] rule: {line}")

    started, runs, walls = time.time(), [], []
    for cell in cells:
        if args.report_only:
            run_dir = runner.find_run(experiment_dir, runner.exp_name(grid, cell))
            ok = runner.finished(run_dir)
            runs.append(runner.CellRun(cell, run_dir, 0 if ok else None, resumed=True,
                                       error=None if ok else "no finished run folder"))
            continue
        remaining = None if budget is None else budget - (time.time() - started)
        if remaining is not None and (remaining <= 0 or (walls and remaining < 1.1 * max(walls))):
            runs.append(runner.CellRun(cell, error="not run: the time budget is spent "
                                                   "(run the same command again)"))
            runs[-1].extra["left"] = True
            print(f"[convergence] {cell.label}: left for the next invocation", flush=True)
            continue
        timeout = grid.timeout_s if remaining is None else min(grid.timeout_s, remaining)
        print(f"[convergence] {cell.label} ...", flush=True)
        result = runner.run_cell(grid, cell, experiment_dir, dry_run=args.dry_run,
                                 resume=not args.no_resume, timeout_s=timeout)
        if result.wall_s is not None and not result.resumed:
            walls.append(result.wall_s)
        state = ("finished earlier: read back" if result.resumed else
                 f"rc={result.returncode} in {result.wall_s:.0f} s")
        print(f"[convergence] {cell.label}: {state}"
              + (f"\n{result.error}" if result.error else ""), flush=True)
        runs.append(result)

    if args.dry_run:
        bad = [r for r in runs if r.returncode != 0]
        print(f"[convergence] dry run: {len(runs) - len(bad)}/{len(runs)} cells resolved")
        return 1 if bad else 0

    curves, infos, failed = [], {}, {}
    for r in runs:
        if r.error is not None or r.run_dir is None:
            failed[r.cell.label] = r.error or "no run folder"
            continue
        c, info = runner.collect(r.run_dir, r.cell.label)
        curves.append(c)
        infos[r.cell.label] = info
    verdicts = judge(curves, grid.rules, failed)
    by_label = {c.label: c for c in curves}
    cells_out = []
    for r in runs:
        label = r.cell.label
        v, info = verdicts[label], infos.get(label, {})
        c = by_label.get(label)
        cells_out.append({
            "label": label, "values": r.cell.values, "verdict": v.verdict, "reason": v.reason,
            "numbers": v.numbers, "wall_s": r.wall_s, "resumed": r.resumed,
            "error": r.error, **{k: info.get(k) for k in ("run_dir", "parameters",
                                                          "tokens_per_s_per_gpu", "command_line")},
            "curves": {"train": c.train if c else [], "grad_norm": c.grad_norm if c else [],
                       "evals": c.evals if c else []}})
    first = next(iter(infos.values()), {})
    result = {
        "name": grid.name, "description": grid.source.get("description"),
        "created": _dt.datetime.now().isoformat(timespec="seconds"),
        "command": shlex.join(["python", "-m", "training.convergence",
                               *(sys.argv[1:] if argv is None else argv)]),
        "git_sha": first.get("git_sha") or _git_sha(), "device": first.get("device"),
        "layout": first.get("layout"), "versions": first.get("versions"),
        "grid_file": str(args.grid), "fixed": grid.fixed, "args": grid.args, "axes": grid.axes,
        "rules": asdict(grid.rules), "cells": cells_out,
        "main_effects": {key: report.main_effects(cells_out, grid.axes, key)
                         for key in ("eval_best", "train_end")},
    }
    out = args.out or grid.path(grid.out)
    paths = report.write(result, out)
    print(report.markdown(result))
    print(f"[convergence] wrote {paths['md']}, {paths['json'].name}, {paths['png'].name}")
    if any(r.extra.get("left") for r in runs):
        return 3
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
