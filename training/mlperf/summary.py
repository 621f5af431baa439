"""The result of an MLPerf run, from its mlperf.log: time to train, samples to converge, curve.

    python -m training.mlperf.summary <run folder or mlperf.log> [--out DIR]

writes mlperf_summary.json, mlperf_summary.md and eval_loss.png (eval loss against training
samples, the target as a line; the training loss from metrics.jsonl in the background when the
run folder has one) next to the log, or into --out.

  time to train        run_stop - run_start, the MLPerf timed region (init excluded)
  samples to converge  samples_count of the evaluation that reached the target (status success);
                       none when the run stopped without reaching it (status aborted)
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from training.cli import ArgumentParser, fail, positive_float
from training.reading import parse_json, read_text
from training.records import (EvalAccuracy, ManifestHead, MlperfEvent, RecordError, read_record,
                              validate)


def read_events(log: Path) -> list[dict[str, Any]]:
    """The :::MLLOG events of `log`; RecordError naming the line that is not one. A last line
    cut off (the run killed or still writing) is left out."""
    events = []
    text = read_text(log, "mlperf.log")
    lines = text.splitlines()
    for number, line in enumerate(lines, 1):
        if ":::MLLOG " not in line:
            continue
        try:
            event = parse_json(line.split(":::MLLOG ", 1)[1], f"{log}:{number}", "MLLOG event")
        except RecordError:
            if number == len(lines) and not text.endswith("\n"):
                break
            raise
        if not isinstance(event, dict) or not {"key", "value", "time_ms"} <= set(event):
            raise RecordError(f"{log}:{number}: not an MLLOG event (no key, value and time_ms)")
        model = EvalAccuracy if event.get("key") == "eval_accuracy" else MlperfEvent
        events.append(validate(event, model, f"{log}:{number}").model_dump())
    if not events:
        raise RecordError(f"{log}: no :::MLLOG events; not an mlperf.log (the run writes one with "
                         "MLPERF=1, examples/mlperf)")
    return events


def _first(events, key):
    return next((e for e in events if e["key"] == key), None)


def summarize(log: Path, target: float | None = None) -> dict[str, Any]:
    events = read_events(log)
    run_start, run_stop = _first(events, "run_start"), _first(events, "run_stop")
    evals = [(e["metadata"]["samples_count"], e["value"]) for e in events
             if e["key"] == "eval_accuracy"
             and (run_stop is None or e["time_ms"] <= run_stop["time_ms"])]
    status = run_stop["metadata"].get("status") if run_stop else "unfinished"
    values = {e["key"]: e["value"] for e in events if e["event_type"] == "POINT_IN_TIME"}
    minutes = ((run_stop["time_ms"] - run_start["time_ms"]) / 60000.0
               if run_start and run_stop else None)
    if status == "success":
        _check_success(log, run_start, run_stop, evals, minutes, target)
    converged = status == "success" and evals
    return {
        "log": str(log),
        "benchmark": values.get("submission_benchmark"),
        "division": values.get("submission_division"),
        "platform": values.get("submission_platform"),
        "status": status,
        "target_eval_loss": target,
        "time_to_train_min": minutes,
        "samples_to_converge": evals[-1][0] if converged else None,
        "final_eval_loss": evals[-1][1] if evals else None,
        "best_eval_loss": min((v for _, v in evals), default=None),
        "train_samples": values.get("train_samples"),
        "evaluations": len(evals),
        "global_batch_size": values.get("global_batch_size"),
        "eval_samples": values.get("eval_samples"),
        "curve": [{"samples": s, "eval_loss": v} for s, v in evals],
    }


def _check_success(log: Path, run_start, run_stop, evals, minutes, target) -> None:
    """A log that says success means something: a timed region of positive length, at least
    one evaluation, and (when the target is known) the last one at or below it. RecordError
    otherwise: a meaningless log is never reported as a success."""
    why = None
    if run_start is None:
        why = "no run_start"
    elif minutes is None or minutes <= 0:
        why = f"its time to train is {minutes:g} min (run_stop not after run_start)"
    elif not evals:
        why = "no eval_accuracy before run_stop"
    elif not math.isfinite(evals[-1][1]):
        why = f"its last eval loss is {evals[-1][1]}"
    elif target is not None and evals[-1][1] > target:
        why = f"its last eval loss {evals[-1][1]:g} is above the target {target:g}"
    if why:
        raise RecordError(f"{log}: run_stop says success but {why}: not a valid result")


def _target_from_manifest(run: Path) -> float | None:
    manifest = run / "manifest.json"
    if manifest.is_file():
        head = read_record(manifest, ManifestHead, "launcher manifest")
        return head.mlperf.target_eval_loss if head.mlperf else None
    return None


def markdown(s: dict[str, Any]) -> str:
    def fmt(value, spec=""):
        return "-" if value is None else format(value, spec)

    rows = [("benchmark / division", f"{s['benchmark']} / {s['division']}"),
            ("platform", s["platform"]), ("status", s["status"]),
            ("time to train (run_start to run_stop)", f"{fmt(s['time_to_train_min'], '.2f')} min"),
            ("samples to converge", fmt(s["samples_to_converge"])),
            ("target eval loss", fmt(s["target_eval_loss"])),
            ("final / best eval loss", f"{fmt(s['final_eval_loss'], '.4f')} / "
                                       f"{fmt(s['best_eval_loss'], '.4f')}"),
            ("evaluations", s["evaluations"]), ("training samples", fmt(s["train_samples"])),
            ("global batch / eval samples", f"{s['global_batch_size']} / {s['eval_samples']}")]
    return "\n".join(["| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows]) + "\n"


def plot(s: dict[str, Any], out: Path, train: list[tuple[int, float]] | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    if train:
        ax.plot([x for x, _ in train], [y for _, y in train], color="0.75", lw=0.8,
                label="train loss")
    xs = [p["samples"] for p in s["curve"]]
    ax.plot(xs, [p["eval_loss"] for p in s["curve"]], "o-", color="C0", label="eval loss")
    if s["target_eval_loss"] is not None:
        ax.axhline(s["target_eval_loss"], color="C3", ls="--", lw=1,
                   label=f"target {s['target_eval_loss']:g}")
    ax.set_xlabel("training samples (sequences)")
    ax.set_ylabel("loss")
    when = "-" if s["time_to_train_min"] is None else f"{s['time_to_train_min']:.2f} min"
    ax.set_title(f"{s['benchmark']} ({s['division']}): {s['status']}, time to train {when}",
                 fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def _train_curve(run: Path, global_batch: int | None) -> list[tuple[int, float]]:
    metrics = run / "metrics.jsonl"
    if not metrics.is_file() or not global_batch:
        return []
    from training.metrics import read_metrics

    return [(m["iteration"] * global_batch, m["loss"]) for m in read_metrics(metrics)
            if m.get("loss") is not None and "step_time_s" in m]


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m training.mlperf.summary",
                            description=__doc__.split("\n\n")[0])
    parser.add_argument("path", type=Path, help="run folder or its mlperf.log")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--target", type=positive_float, default=None,
                        help="target eval loss (default: the run's manifest, else none)")
    args = parser.parse_args(argv)
    log = args.path / "mlperf.log" if args.path.is_dir() else args.path
    if not log.is_file():
        print(f"error: no mlperf.log at {args.path}", file=sys.stderr)
        return 2
    run = log.parent
    try:
        target = args.target if args.target is not None else _target_from_manifest(run)
        s = summarize(log, target)
    except ValueError as err:
        return fail(str(err))
    out = args.out or run
    try:
        out.mkdir(parents=True, exist_ok=True)
        from training.safe_files import write_text

        write_text(out / "mlperf_summary.json", json.dumps(s, indent=2) + "\n", "MLPerf summary")
        write_text(out / "mlperf_summary.md", markdown(s), "MLPerf summary")
        plot(s, out / "eval_loss.png", _train_curve(run, s["global_batch_size"]))
    except OSError as err:
        return fail(f"cannot write the summary into {out}: {err.strerror or err}: give --out a "
                    "folder you can write")
    print(markdown(s), end="")
    print(f"wrote {out / 'mlperf_summary.json'}, mlperf_summary.md, eval_loss.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
