"""The memory estimator against measured peaks of real runs.

    python -m training.optimize.calibration [RUN ...] [--json]

For each run folder with a measured peak (manifest.json run.summary, or metrics.jsonl):
the estimated peak, the measured peak (torch.cuda.max_memory_allocated, max over ranks) and
the error. A second check isolates the weights-and-optimizer terms: the memory still
allocated after an optimizer step (metrics.jsonl mem_allocated_gib, activations freed) against
the estimate's static terms + the step-only fp32 gradient copy + persistent buffers, without
the overhead constant. Where the run recorded its peak by phase (training/loop_hooks.PhasePeaks),
the forward/backward and optimizer-step estimates are checked each against its own measured
peak. Default runs: the recorded H200 runs in tests/data/runs/.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from training import REPO_ROOT
from training.cli import ArgumentParser, fail

from .config import from_manifest
from .inputs import BadInput, load_run
from .memory import OVERHEAD_GIB, error_pct, estimate, phase_errors

DEFAULT_RUNS = ("tests/data/runs/h200_l8_native", "tests/data/runs/h200_l8_local",
                "tests/data/runs/h200x2_l32_native",
                "tests/data/runs/h200x2_l32_native_full_recompute",
                # recorded with the peak split by phase (session 6)
                "tests/data/runs/h200_l8_native_phases",
                "tests/data/runs/h200_l8_native_full_recompute_phases",
                # the optimizer-state toggles (session 8), one H200: bf16 moments with
                # remainder or stochastic-rounding masters at 8 layers, the full model with
                # the pre-flight's recommendation, and Megatron's CPU offload
                "tests/data/runs/h200_l8_native_opt_state_bf16",
                "tests/data/runs/h200_l8_native_opt_state_bf16_sr",
                "tests/data/runs/h200_l32_native_opt_state_bf16",
                "tests/data/runs/h200_l8_native_cpu_offload",
                # Transformer Engine (session 9, te-recipes' runs): bf16 with Liger's fused
                # linear cross-entropy, and fp8 delayed scaling (its weight copies)
                "tests/data/runs/h200_l8_te", "tests/data/runs/h200_l8_te_fp8",
                # MoE (session 11, moe-levers-lean's runs): Qwen3-30B-A3B cut to 8 layers with
                # the MoE launch's lean step (16-bit optimizer state) and with the core defaults
                "tests/data/runs/h200_l8_moe_lean", "tests/data/runs/h200_l8_moe_core",
                # and Mixtral-8x7B cut to 4 layers (session 12, moe-levers-lean-mixtral's runs)
                "tests/data/runs/h200_l4_mixtral_lean", "tests/data/runs/h200_l4_mixtral_core")
# The goal for the estimator's error on measured runs.
GOAL_PCT = 15.0


def calibrate(run: str | Path) -> dict:
    inputs = load_run(run)
    config = from_manifest(inputs.manifest)
    est = estimate(config)
    measured, where = inputs.measured_peak_gib()
    if measured is None:
        raise BadInput(f"{run}: no measured peak (a DRY_RUN manifest, or a run without "
                       "metrics): nothing to calibrate against")
    row = {"run": str(run), "model": config.model.name, "layers": config.model.num_layers,
           "seq": config.model.seq_length, "mbs": config.layout.mbs, "backend": config.backend,
           "gpus": config.layout.world_size, "dist_opt": config["DISTRIBUTED_OPTIMIZER"],
           "recompute": config["RECOMPUTE"], "precision": config.precision,
           "estimated_peak_gib": est.peak_gib,
           "peak_phase": est.peak_phase, "measured_peak_gib": measured, "measured_from": where,
           "error_pct": error_pct(est.peak_gib, measured),
           "within_goal": abs(error_pct(est.peak_gib, measured)) <= GOAL_PCT}
    phases = phase_errors(est, inputs.measured_phase_peaks_gib())
    if phases:
        row["phases"] = phases
    after = [m.get("mem_allocated_gib") for m in inputs.metrics
             if isinstance(m.get("mem_allocated_gib"), (int, float))]
    if after:
        static = sum(t.gib for t in est.terms
                     if t.phase in ("static", "persistent") and t.key != "overhead")
        static += sum(t.gib for t in est.terms if t.key == "step_fp32_grads")
        row["after_step"] = {"estimated_gib": static, "measured_gib": after[-1],
                             "error_pct": error_pct(static, after[-1]),
                             "terms": "weights + gradient buffer + main params + Adam + "
                                      "fp32 gradient copy + persistent buffers (no overhead)"}
    return row


def markdown(rows: list[dict]) -> str:
    """The estimator-vs-measured table of docs/optimize.md (generated, never typed)."""
    lines = ["| run | shape | estimated peak | measured peak | error | by phase: estimated / "
             "measured | after a step: estimated / measured |", "|---|---|---|---|---|---|---|"]
    for row in rows:
        a = row.get("after_step")
        after = (f"{a['estimated_gib']:.2f} / {a['measured_gib']:.2f} GiB "
                 f"({a['error_pct']:+.1f}%)" if a else "-")
        phases = "; ".join(f"{label} {e['estimated_gib']:.2f} / {e['measured_gib']:.2f} GiB "
                           f"({e['error_pct']:+.1f}%)"
                           for label, e in row.get("phases", {}).items()) or "not recorded"
        lines.append(f"| {Path(row['run']).name} | {row['model']}, {row['layers']} layers, seq "
                     f"{row['seq']}, mbs {row['mbs']}, {row['gpus']} GPU"
                     f"{'s' if row['gpus'] > 1 else ''}"
                     f"{', distributed optimizer' if row['dist_opt'] else ''}, {row['backend']}"
                     f"{'' if row['precision'] == 'bf16' else ' ' + row['precision']}, RECOMPUTE="
                     f"{row['recompute']} | {row['estimated_peak_gib']:.2f} GiB "
                     f"({row['peak_phase']}) | {row['measured_peak_gib']:.2f} GiB | "
                     f"{row['error_pct']:+.1f}% | {phases} | {after} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m training.optimize.calibration",
                            description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="*", help="run folders (default: the recorded H200 runs)")
    parser.add_argument("--json", action="store_true", help="print JSON rows")
    parser.add_argument("--markdown", action="store_true",
                        help="print the table docs/optimize.md carries")
    args = parser.parse_args(argv)
    runs = args.runs or [str(REPO_ROOT / r) for r in DEFAULT_RUNS]
    try:
        rows = [calibrate(r) for r in runs]
    except BadInput as err:
        fail(str(err))
        return err.exit_code
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if args.markdown:
        print(markdown(rows))
        return 0
    print(f"estimator vs measured peak allocated memory (overhead constant {OVERHEAD_GIB} GiB; "
          f"goal: within {GOAL_PCT:.0f}%)")
    for row in rows:
        name = Path(row["run"]).name
        print(f"  {name}: {row['model']} {row['layers']}L seq {row['seq']} mbs {row['mbs']} "
              f"{row['backend']}, RECOMPUTE={row['recompute']}: estimated "
              f"{row['estimated_peak_gib']:.2f} GiB ({row['peak_phase']}), measured "
              f"{row['measured_peak_gib']:.2f} GiB: error {row['error_pct']:+.1f}%"
              + ("" if row["within_goal"] else "  MISSES THE GOAL"))
        for label, e in row.get("phases", {}).items():
            print(f"    {label}: estimated {e['estimated_gib']:.2f} GiB, measured "
                  f"{e['measured_gib']:.2f} GiB: error {e['error_pct']:+.1f}%")
        if "after_step" in row:
            a = row["after_step"]
            print(f"    after an optimizer step: estimated {a['estimated_gib']:.2f} GiB, "
                  f"measured {a['measured_gib']:.2f} GiB: error {a['error_pct']:+.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
