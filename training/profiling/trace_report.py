"""Trace report of a profiled run: where the time goes, and a one-line verdict.

    python -m training.profiling.trace_report RUN_OR_TRACE_DIR [--out DIR] [--top N] [--device gpu|cpu]

RUN_OR_TRACE_DIR is a run folder (the traces are in its profile/), a folder of torch profiler
traces (rank-<N>.json[.gz] as Megatron's --use-pytorch-profiler writes them) or one trace
file. The traces are read with Holistic Trace Analysis (HTA). Writes trace_report.md,
trace_report.json (for the advisor) and trace_breakdown.png into the traces' folder, or --out.

--device cpu analyses the CPU timeline of CPU-only (gloo) runs; without it a trace that has
no GPU events is refused with a message that names the option. See docs/profiling.md.

Exit status: 0 on success, 2 on bad input (one line on stderr, no traceback).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import sys
from pathlib import Path
from typing import Any

from training.cli import ArgumentParser
from training.profiling import kernel_groups as kg
from training.profiling import ranges as rg
from training.profiling.loading import DEVICES, TraceReportError, find_trace_files, load, require_hta, trace_dir_of
from training.profiling.render import chart, markdown
from training.profiling.verdict import EXPOSED_COMM_BOUND_PCT, IDLE_BOUND_PCT, RULES

SCHEMA_VERSION = 1

TIMELINES = {
    "gpu": "device events of each rank (GPU kernels, memcpy, memset); idle/compute/non-compute from HTA "
    "get_temporal_breakdown, overlap from HTA get_comm_comp_overlap",
    "cpu": "CPU timeline (--device cpu): torch operators are compute, collectives (gloo:*, c10d::*) are "
    "communication, idle is time with neither (Python/dispatcher overhead); HTA loads the trace, its GPU "
    "analyses do not apply, so the same definitions are applied to HTA's dataframe",
}

_COMMON_DEFINITIONS = {
    "exposed communication": "time communication runs with no computation at the same time (not overlapped); "
    "a collective's time includes waiting for the slowest rank",
    "communication total": "time any communication runs, overlapped or not",
    "kernel groups": "kernel names sorted by the pattern table in training/profiling/kernel_groups.py "
    "(first match wins); shares are of summed kernel time, so concurrent streams both count",
    "training ranges": "record_function ranges named in training/profiling/ranges.py; host time is the range's "
    "wall time on its CPU thread, kernel time the summed duration of the GPU kernels launched (from any thread) "
    "while it was open",
    "dropped steps": "HTA drops the last profiled step (its GPU work may be cut off when the profiler stops)",
    "overall": "times summed over ranks, so overall percentages weigh each rank by its span",
}
DEFINITIONS = {
    "gpu": {
        "span": "first to last device event of the analysed steps (HTA's kernel_time)",
        "compute": "time any computation kernel runs (HTA: kernels that are neither NCCL nor Memcpy/Memset/Sync)",
        "other non-compute": "time only memcpy/memset/sync run",
        "idle": "time no device event runs (the GPU waits for the host to enqueue work)",
        **_COMMON_DEFINITIONS,
    },
    "cpu": {
        "span": "first to last torch operator or collective of the analysed steps",
        "compute": "time any torch operator (cat cpu_op, other than c10d::*) runs on any thread",
        "other non-compute": "always 0 on the CPU timeline (no memcpy/memset events)",
        "idle": "time no operator or collective runs (Python, dispatcher and data-loading overhead)",
        **_COMMON_DEFINITIONS,
    },
}


def build_report(path: Path, device: str = "gpu", top_n: int = 10) -> dict[str, Any]:
    """Load the traces under ``path`` and return the report dict (the JSON written to disk)."""
    if top_n < 1:
        raise TraceReportError(f"--top must be at least 1, not {top_n}")
    files = find_trace_files(path)
    require_hta()
    from training.profiling.analysis import analyse  # imports HTA

    ta = load(files)
    body = analyse(ta, device, top_n)
    notes = []
    if not body["profiled_steps"]:
        notes.append("no ProfilerStep ranges in the traces (not captured with a torch.profiler schedule): "
                     "the whole trace is analysed")
    elif len(body["profiled_steps"]) - len(body["dropped_steps"]) < 2:
        notes.append("fewer than two steps analysed; profile more steps (PROFILE_STEP_END - PROFILE_STEP_START >= 3)")
    if not any(r["ranges"] for r in body["ranks"]):
        notes.append("no training ranges in the traces (ranges are recorded when PROFILE=torch)")
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": "training.profiling.trace_report",
        "hta_version": importlib.metadata.version("HolisticTraceAnalysis"),
        "source": {
            "path": str(path),
            "trace_dir": str(files[0].parent),
            "trace_files": {str(r): f for r, f in sorted(ta.t.trace_files.items())},
        },
        "timeline": TIMELINES[device],
        "definitions": DEFINITIONS[device],
        "thresholds": {"exposed_comm_pct": EXPOSED_COMM_BOUND_PCT, "idle_pct": IDLE_BOUND_PCT},
        "verdict_rules": RULES,
        "kernel_group_patterns": [{"group": g, "pattern": p, "catches": w} for g, p, w in kg.GROUP_PATTERNS],
        "range_names": list(rg.ALL_RANGES),
        "notes": notes,
        **body,
    }


def write_report(report: dict[str, Any], out: Path) -> dict[str, Path]:
    from training.safe_files import write_text

    paths = {"markdown": out / "trace_report.md", "json": out / "trace_report.json", "png": out / "trace_breakdown.png"}
    try:
        out.mkdir(parents=True, exist_ok=True)
        write_text(paths["json"], json.dumps(report, indent=2) + "\n", "trace report JSON")
        write_text(paths["markdown"], markdown(report), "trace report")
        chart(report, paths["png"])
    except OSError as e:
        raise TraceReportError(f"cannot write the report into {out}: {e.strerror or e}") from None
    return paths


def _parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="python -m training.profiling.trace_report",
        description="Where the time of a profiled run goes (read with Holistic Trace Analysis), with a verdict.",
    )
    p.add_argument("path", type=Path, help="run folder (traces in PATH/profile/), folder of traces, or one trace")
    p.add_argument("--out", type=Path, default=None, help="output folder (default: the traces' folder)")
    p.add_argument("--top", type=int, default=10, help="kernels listed per rank and overall (default 10)")
    p.add_argument(
        "--device",
        choices=DEVICES,
        default="gpu",
        help="timeline to analyse: gpu (default) or cpu for CPU-only runs (gloo), see docs/profiling.md",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        report = build_report(args.path, device=args.device, top_n=args.top)
        out = args.out if args.out is not None else trace_dir_of(args.path)
        paths = write_report(report, out)
    except TraceReportError as e:
        print(f"trace_report: error: {e}", file=sys.stderr)
        return 2
    for r in report["ranks"]:
        print(f"rank {r['rank']}: {r['verdict']['line']}")
    print(f"overall: {report['overall']['verdict']['line']}")
    for p in paths.values():
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
