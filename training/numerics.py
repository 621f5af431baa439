"""Two-GPU correctness: the same training compared across layouts, toggles and a reshard.

`python -m training.numerics run PART --out DIR` runs one part through the real launcher
(training.bench.ours.run_point, one subprocess per run) and writes DIR/numerics_<PART>.json
with every run's per-iteration losses and every comparison; `python -m training.numerics table
JSON...` writes docs/numerics.md from such JSONs. Parts (each fits one 10-minute GPU command):

  layouts   DP=1 vs DP=2 and TP=1 vs TP=2 (+ sequence parallel) at the same global batch and
            data order; GRAD_REDUCE_IN_BF16=1 vs 0 at DP=2; save at TP=2, resume at DP=2
            (Megatron distributed checkpoint, fully reshardable optimizer state)
  toggles   each default-on toggle off at DP=2 (distributed optimizer, overlapped reduce and
            gather) and at TP=2 (sequence parallel): every run must complete its iterations

Rules (stated in the JSON and the table): a layout pair agrees when the largest per-iteration
relative loss difference is within LAYOUT_TOL; a resumed run continues when its losses stay
within RESUME_TOL of the uninterrupted run; a toggle run completes when every iteration logged
a finite loss. The bf16-vs-fp32 reduce difference is reported, not judged.
"""
from __future__ import annotations

import math
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from training.cli import ArgumentParser, BadFile, fail, positive_float
from training.reading import read_json

LAYOUT_TOL = 0.01
RESUME_TOL = 0.02
ITERS = 50
PERF_TOGGLES = ("GRADIENT_ACCUMULATION_FUSION", "GRAD_REDUCE_IN_BF16",
                "DDP_AVERAGE_IN_COLLECTIVE", "CROSS_ENTROPY_LOSS_FUSION", "FUSED_SINGLE_QKV_ROPE")


@dataclass(frozen=True)
class RunSpec:
    label: str
    toggles: dict[str, str]


@dataclass
class Comparison:
    name: str
    kind: str            # agree | continue | complete | report
    runs: tuple[str, ...]
    iterations: tuple[int, int] = (1, ITERS)


@dataclass
class Part:
    name: str
    runs: list[RunSpec] = field(default_factory=list)
    comparisons: list[Comparison] = field(default_factory=list)


def base_toggles(data: Path | None) -> dict[str, str]:
    """A small Llama on the shipped corpus (mock data when it is not built)."""
    toggles = {"MODEL_SIZE": "tiny", "BS": "16", "MBS": "2", "TOTAL_ITERS": str(ITERS),
               "LR": "3e-4", "MIN_LR": "3e-5", "EVAL_ITERS": "0", "SEED": "1234",
               "LOG_INTERVAL": "1"}
    if data is not None:
        toggles["DATA_PATH"] = str(data)
    return toggles


def parts(data: Path | None, ckpt: Path) -> dict[str, Part]:
    base = base_toggles(data)
    dp1 = {**base, "GPUS_PER_NODE": "1"}
    dp2 = {**base, "GPUS_PER_NODE": "2"}
    tp2 = {**base, "GPUS_PER_NODE": "2", "TP": "2"}
    layouts = Part("layouts", [
        RunSpec("dp1", dp1),
        RunSpec("dp2", dp2),
        RunSpec("tp2", {**tp2, "SAVE": str(ckpt), "SAVE_INTERVAL": str(ITERS // 2),
                        "EXTRA_MEGATRON_ARGS": "--dist-ckpt-optim-fully-reshardable"}),
        RunSpec("dp2_fp32_reduce", {**dp2, "GRAD_REDUCE_IN_BF16": "0"}),
        RunSpec("dp2_resumed_from_tp2", {**dp2, "LOAD": str(ckpt),
                                         "EXTRA_MEGATRON_ARGS": f"--ckpt-step {ITERS // 2}"}),
    ], [
        Comparison("DP=2 vs DP=1", "agree", ("dp1", "dp2")),
        Comparison("TP=2 (+SP) vs TP=1", "agree", ("dp1", "tp2")),
        Comparison("bf16 vs fp32 gradient reduce at DP=2", "report", ("dp2_fp32_reduce", "dp2")),
        Comparison("resume at DP=2 from a TP=2 checkpoint", "continue",
                   ("tp2", "dp2_resumed_from_tp2"), (ITERS // 2 + 1, ITERS)),
    ])
    toggles = Part("toggles")
    for layout, toggles_env in (("dp2", dp2), ("tp2", tp2)):
        toggles.runs.append(RunSpec(f"{layout}_all_on", toggles_env))
        toggles.comparisons.append(Comparison(f"{layout}: all toggles on", "complete",
                                              (f"{layout}_all_on",)))
        for name in PERF_TOGGLES:
            label = f"{layout}_{name.lower()}_off"
            toggles.runs.append(RunSpec(label, {**toggles_env, name: "0"}))
            toggles.comparisons.append(Comparison(f"{layout}: {name}=0", "complete", (label,)))
    return {"layouts": layouts, "toggles": toggles}


def losses_of(point: dict) -> dict[int, float]:
    samples = point.get("samples") or {}
    return {i: l for i, l in zip(samples.get("iteration", []), samples.get("loss", []))
            if l is not None}


def judge(comparison: Comparison, points: dict[str, dict]) -> dict:
    first, last = comparison.iterations
    curves = [losses_of(points.get(label, {})) for label in comparison.runs]
    wanted = list(range(first, last + 1))
    result = {"name": comparison.name, "kind": comparison.kind, "runs": list(comparison.runs),
              "iterations": [first, last]}
    missing = [label for label, curve in zip(comparison.runs, curves)
               if not all(i in curve for i in wanted)]
    if missing:
        errors = {label: (points.get(label) or {}).get("error", "no run")[-400:]
                  for label in missing}
        return {**result, "ok": False, "verdict": f"incomplete: {', '.join(missing)}",
                "errors": errors}
    if comparison.kind == "complete":
        finite = all(math.isfinite(curves[0][i]) for i in wanted)
        return {**result, "ok": finite, "final_loss": curves[0][last],
                "verdict": "completed" if finite else "non-finite loss"}
    a, b = curves
    rel = [abs(a[i] - b[i]) / abs(a[i]) for i in wanted]
    worst = max(rel)
    out = {**result, "max_rel_diff": worst, "mean_rel_diff": sum(rel) / len(rel),
           "worst_iteration": wanted[rel.index(worst)],
           "final_losses": [a[last], b[last]], "bitwise": all(a[i] == b[i] for i in wanted)}
    if comparison.kind == "report":
        return {**out, "ok": True, "verdict": "reported"}
    tol = LAYOUT_TOL if comparison.kind == "agree" else RESUME_TOL
    return {**out, "ok": worst <= tol, "tolerance": tol,
            "verdict": "agree" if worst <= tol else "differ"}


Runner = Callable[[str, dict[str, str], Path, Path], dict]


def reusable_runs(part: Part, previous: dict) -> dict[str, dict]:
    """Runs of an earlier JSON of this part that need not run again: same label and toggles,
    exit code 0, a finite loss at every iteration. A run that saves a checkpoint is never
    reused (its checkpoint stayed on the machine that ran it; the run that loads it needs it
    here), and neither is one that loads a checkpoint."""
    reused = {}
    for spec in part.runs:
        old = (previous.get("runs") or {}).get(spec.label)
        if (old is None or old.get("returncode") != 0 or old.get("toggles") != spec.toggles
                or "SAVE" in spec.toggles or "LOAD" in spec.toggles):
            continue
        losses = {int(i): l for i, l in (old.get("losses") or {}).items()}
        iterations = sorted(losses)
        if iterations != list(range(1, ITERS + 1)) or not all(
                math.isfinite(l) for l in losses.values()):
            continue
        reused[spec.label] = {
            "returncode": 0, "run_dir": old.get("run_dir"),
            "tokens_per_s_per_gpu": old.get("tokens_per_s_per_gpu"),
            "peak_memory_gib": old.get("peak_memory_gib"),
            "samples": {"iteration": iterations, "loss": [losses[i] for i in iterations]},
            "reused_from": {"git_sha": previous.get("git_sha"),
                            "created": previous.get("created")}}
    return reused


def run_part(part: Part, work: Path, runner: Runner | None = None,
             budget_s: float | None = None, clock: Callable[[], float] = time.monotonic,
             reuse: dict[str, dict] | None = None) -> dict:
    """Run the part's runs in order and judge its comparisons. With budget_s, no run starts
    after that many seconds: the runs left are listed as not run and the comparisons that need
    them say incomplete (rerun the part in a later call for them, with --reuse). Runs in
    `reuse` (from reusable_runs) are taken as they are, and say so."""
    if runner is None:
        from training.bench.ours import run_point as runner
    points, start, not_run = dict(reuse or {}), clock(), []
    for spec in part.runs:
        if spec.label in points:
            print(f"[numerics] {part.name}: {spec.label} reused from the earlier JSON", flush=True)
            continue
        if budget_s is not None and clock() - start > budget_s:
            not_run.append(spec.label)
            continue
        print(f"[numerics] {part.name}: {spec.label} ...", flush=True)
        points[spec.label] = runner(spec.label, spec.toggles, work / "experiment", work / "logs")
        print(f"[numerics] {spec.label}: rc={points[spec.label].get('returncode')}", flush=True)
    return {"part": part.name,
            "rules": {"layout_tolerance": LAYOUT_TOL, "resume_tolerance": RESUME_TOL,
                      "complete": "every iteration logged a finite loss"},
            "runs": {label: {"toggles": next(s.toggles for s in part.runs if s.label == label),
                             "returncode": p.get("returncode"), "error": p.get("error"),
                             "losses": losses_of(p), "run_dir": p.get("run_dir"),
                             "tokens_per_s_per_gpu": p.get("tokens_per_s_per_gpu"),
                             "peak_memory_gib": p.get("peak_memory_gib"),
                             **({"reused_from": p["reused_from"]} if "reused_from" in p else {})}
                     for label, p in points.items()},
            "not_run": not_run,
            "comparisons": [judge(c, points) for c in part.comparisons]}


def _verdict(comparison: dict, data: dict) -> str:
    """The comparison's verdict, telling an incomplete one's runs left by the time budget from
    runs that failed (with their exit codes)."""
    verdict = comparison["verdict"]
    if not verdict.startswith("incomplete"):
        return verdict
    runs = data.get("runs", {})
    unrun = set(comparison["runs"]) - set(runs)
    if unrun and unrun <= set(data.get("not_run", [])):
        return "not run yet (time budget of the call)"
    codes = [str(runs[r]["returncode"]) for r in comparison["runs"]
             if runs.get(r, {}).get("returncode")]
    return verdict + (f" (exit code {', '.join(codes)})" if codes else "")


def load_results(paths: list[Path]) -> list[dict]:
    """Part JSONs, each with its file name as `source` (what the table cites)."""
    results = []
    for path in paths:
        data = read_json(path, "numerics part JSON")
        if not isinstance(data, dict) or not isinstance(data.get("comparisons"), list):
            raise BadFile(f"{path}: not a numerics part JSON (no comparisons list); give one of "
                          "docs/benchmarks/numerics_*.json")
        data["source"] = path.name
        results.append(data)
    return results


def table(results: list[dict]) -> str:
    lines = ["| part | comparison | verdict | max rel. loss diff | tolerance | final losses | source |",
             "|---|---|---|---|---|---|---|"]
    for data in results:
        for c in data["comparisons"]:
            diff = f"{c['max_rel_diff']:.2e}" if "max_rel_diff" in c else ""
            tol = f"{c['tolerance']:.0%}" if "tolerance" in c else ""
            finals = ", ".join(f"{x:.4f}" for x in c.get("final_losses", [])) or \
                (f"{c['final_loss']:.4f}" if "final_loss" in c else "")
            lines.append(f"| {data['part']} | {c['name']} | {_verdict(c, data)} | {diff} | {tol} | "
                         f"{finals} | `{data.get('source', '')}` |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m training.numerics")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run")
    run.add_argument("part", choices=("layouts", "toggles"))
    run.add_argument("--out", type=Path, required=True)
    run.add_argument("--data", type=Path, default=Path("data/shakespeare/train"))
    run.add_argument("--work-dir", type=Path, default=None)
    run.add_argument("--budget-s", type=positive_float, default=None,
                     help="start no run after this many seconds (the rest are listed as not run)")
    run.add_argument("--reuse", type=Path, default=None,
                     help="an earlier JSON of this part: its completed runs with the same toggles "
                          "are kept (marked reused_from), the others run")
    tab = sub.add_parser("table")
    tab.add_argument("json", nargs="+", type=Path)
    args = parser.parse_args(argv)

    if args.command == "table":
        try:
            print(table(load_results(args.json)))
        except BadFile as err:
            return fail(str(err))
        return 0
    from training.bench import record

    work = args.work_dir or Path(tempfile.mkdtemp(prefix="numerics-"))
    data = args.data if args.data.with_suffix(".bin").exists() else None
    part = parts(data, work / "ckpt")[args.part]
    reuse = None
    if args.reuse is not None and args.reuse.exists():
        try:
            reuse = reusable_runs(part, read_json(args.reuse, "numerics part JSON"))
        except BadFile as err:
            return fail(str(err))
    result = {**record.header(f"numerics_{args.part}", module="training.numerics"),
              **run_part(part, work, budget_s=args.budget_s, reuse=reuse),
              "data": str(data) if data else "mock"}
    out = record.write(result, args.out / f"numerics_{args.part}.json")
    result["source"] = out.name
    print(table([result]))
    return 0 if all(c["ok"] for c in result["comparisons"]) else 1


if __name__ == "__main__":
    sys.exit(main())
