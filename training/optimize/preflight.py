"""Pre-flight: the memory estimate of a resolved launch against its GPU, before torchrun.

    python -m training.optimize.preflight --family llama3 [KEY=VALUE ...] [--megatron-flags]

is the launcher's command line (`python -m training.launch`, what examples/lib/launch.sh
runs) with this check added after the launch is resolved and before anything is printed or
written: the launcher sits on the floor below the readers (docs/architecture.md), so the
check plugs in from here. Before it, the micro-batch where nobody set it: the largest measured
faster that fits (training/optimize/microbatch.py, source `preflight` in the table). It takes
the launch's run description, estimates the per-GPU peak
(training/optimize/memory.py) and compares it with the GPU's memory (training/platforms.py: the
node's GPU, or PLATFORM=<name>):

  above the GPU's memory   PREFLIGHT_MEMORY=refuse (default): refused (exit 2) with the
                           estimate by term and the levers that make it fit, as the advisor
                           (python -m training.optimize) orders and quotes them; =warn: the
                           same as a warning
  above 90% of it          a warning (the advisor's memory-bound line) with the same levers
  otherwise                an info line with the estimate
  no known GPU             skipped, with a line that says so (set PLATFORM=<name>)

`--recommend` resolves the launch (DRY_RUN, without the check) and prints the toggles the
pre-flight recommends for it as `KEY=VALUE,...` (what `python -m training.bench peers
--ours-env` takes).
"""
from __future__ import annotations

import os
import sys
from typing import Any

from training import REPO_ROOT
from training.cli import ArgumentParser, fail

from .config import device_gib
from .memory import MEMORY_BOUND_FRACTION, Estimate

GUARD = "preflight_memory"


def _choose_micro_batch(launch) -> dict:
    from .microbatch import choose

    return choose(launch)


# what the pre-flight chooses where nobody did (training.launch.resolve's choosers)
CHOOSERS = (_choose_micro_batch,)
# The estimator's peak phases and the term phases that make each up (memory.py).
_PHASE_TERMS = {"forward/backward": ("static", "persistent", "activations", "loss", "backward"),
                "optimizer step": ("static", "persistent", "step")}


def _estimate(launch) -> tuple[dict, Any, Estimate]:
    """(the launch's manifest, its run description, the estimate)."""
    from training.launch.manifest import launch_manifest

    from .memory import estimate

    return launch_manifest(launch), launch.run, estimate(launch.run)


def levers_to_fit(manifest: dict, run, est: Estimate) -> dict[str, Any]:
    """The advisor's memory flow for this launch: its recommendations (each with its
    cumulative estimate and measured quote), verdict and the command to try."""
    from . import levers
    from .advisor import Context, command, memory_flow
    from .inputs import BadInput

    try:
        book = levers.load_default(None, REPO_ROOT)
    except BadInput as err:  # a broken levers file must not block a launch: mechanism only
        book = levers.empty(f"levers file unreadable ({err}): recommendations on mechanism only")
    ctx = Context(config=run, estimate=est, bottleneck="memory-bound")
    flow = memory_flow(run, ctx, book)
    return {"recommendations": flow["recommendations"], "verdict": flow["verdict"],
            "fits": bool(flow["final_estimate"].fits),
            "command": command(manifest, run, flow["recommendations"])}


def report_text(run, est: Estimate, flow: dict[str, Any], headline: str) -> str:
    """The refusal or warning: the estimate split by term, then the levers."""
    lines = [headline, f"  estimate at the {est.peak_phase} (training/optimize/memory.py, "
                       "per GPU):"]
    phases = _PHASE_TERMS[est.peak_phase]
    for term in est.terms:
        if term.phase in phases and term.in_peak and term.gib >= 0.005:
            lines.append(f"    {term.gib:7.2f} GiB  {term.label}  [{term.formula}]")
    lines.append(f"    {est.peak_gib:7.2f} GiB  peak ({device_gib(run):.0f} GiB on "
                 f"{run.platform})")
    recs = flow["recommendations"]
    if recs:
        lines.append(f"  levers (python -m training.optimize, in its order; {flow['verdict']}):")
        for i, rec in enumerate(recs, 1):
            after = rec.get("estimate") or {}
            fraction = after.get("fraction_of_device")
            lines.append(f"    {i}. {rec['set']}: {rec['title']}; estimate "
                         f"{after.get('peak_gib', float('nan')):.1f} GiB"
                         + (f" ({fraction:.0%})" if fraction is not None else "")
                         + f"; {rec['measured_text']}")
        lines += [f"  note: {text}" for text in taken_back(recs)]
    else:
        lines.append(f"  no lever of the advisor applies: {flow['verdict']}")
    if flow["command"]:
        lines.append(f"  try: {flow['command']}")
    return "\n".join(lines)


def taken_back(recs: list[dict[str, Any]]) -> list[str]:
    """Where a later lever sets a toggle an earlier one set to another value (the CPU offload
    keeps fp32 state after the bf16 state levers): which, and why, since the try line carries
    the later value."""
    notes, set_by = [], {}
    for i, rec in enumerate(recs, 1):
        back = {k: v for k, v in rec["sets"].items() if k in set_by and set_by[k][1] != v}
        if back:
            earlier = sorted({set_by[k][0] for k in back})
            reason = rec.get("mechanism") or rec.get("why") or rec["title"]
            notes.append(f"lever {i} ({rec['title']}) sets "
                         + " ".join(f"{k}={v}" for k, v in back.items())
                         + f" again, over lever{'s' if len(earlier) > 1 else ''} "
                         + ", ".join(map(str, earlier)) + f": {reason}")
        for k, v in rec["sets"].items():
            set_by[k] = (i, v)
    return notes


def check(launch) -> None:
    """The pre-flight of one resolved launch: a refusal, a warning or an info line."""
    from training.launch.settings import Refusal

    s = launch.settings
    mode = s["PREFLIGHT_MEMORY"]
    if mode == "off":
        s.info(GUARD, "PREFLIGHT_MEMORY=off: the memory estimate is not checked.")
        return
    caps = launch.ctx.caps
    if caps.info is None:
        s.info(GUARD, "memory check skipped: no known GPU "
                      f"({caps.device_name or 'none visible'}, {caps.source}); set "
                      "PLATFORM=<name> to check a launch for that GPU's memory.")
        return
    manifest, run, est = _estimate(launch)
    device = device_gib(run)
    fraction = est.peak_gib / device
    where = (f"{est.peak_gib:.1f} GiB per GPU, {fraction:.0%} of the {device:.0f} GiB of "
             f"{caps.platform}")
    if fraction <= MEMORY_BOUND_FRACTION:
        s.info(GUARD, f"memory estimate {where} (training/optimize/memory.py): fits.")
        return
    flow = levers_to_fit(manifest, run, est)
    if fraction > 1.0:
        headline = (f"the estimated peak memory, {where}, is above the GPU's memory: this launch "
                    "would run out of memory."
                    + (" PREFLIGHT_MEMORY=warn launches it anyway, =off skips the check."
                       if mode == "refuse" else ""))
        text = report_text(run, est, flow, headline)
        if mode == "refuse":
            raise Refusal(GUARD, text)
        s.warn(GUARD, text)
        return
    s.warn(GUARD, report_text(run, est, flow,
                              f"the estimated peak memory, {where}, is above 90%: allocator "
                              "fragmentation or a spike the estimate does not model can run "
                              "it out of memory."))


def recommended(family: str, environ: dict[str, str], words: list[str] | None = None
                ) -> dict[str, str]:
    """The toggles the pre-flight recommends for a launch (none when it fits)."""
    from training.launch.resolve import resolve

    launch = resolve(family, dict(environ, DRY_RUN="1", PREFLIGHT_MEMORY="off"), words)
    manifest, run, est = _estimate(launch)
    device = device_gib(run)
    if device is None or est.peak_gib <= MEMORY_BOUND_FRACTION * device:
        return {}
    sets: dict[str, str] = {}
    for rec in levers_to_fit(manifest, run, est)["recommendations"]:
        sets.update(rec["sets"])
    return sets


def main(argv: list[str] | None = None) -> int:
    """The launcher's command line with the check, or --recommend."""
    from training.launch import __main__ as launcher
    from training.launch.settings import LaunchError

    argv = sys.argv[1:] if argv is None else list(argv)
    if "--recommend" not in argv:
        return launcher.main(argv, checks=(check,), choosers=CHOOSERS,
                             prog="python -m training.optimize.preflight")
    argv.remove("--recommend")
    own, words = launcher._split_argv(argv)
    parser = ArgumentParser(prog="python -m training.optimize.preflight --recommend")
    parser.add_argument("--family", default="llama3")
    family = parser.parse_known_args(own)[0].family
    try:
        sets = recommended(family, dict(os.environ), words)
    except LaunchError as err:
        fail(str(err))
        return err.exit_code
    print(",".join(f"{k}={v}" for k, v in sets.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
