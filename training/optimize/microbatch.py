"""The micro-batch the pre-flight chooses where the user leaves it to the launcher.

MBS is the user's to choose. When nobody chose it (its source is the registry's `default`: not
the user's, not a recipe's, e.g. the MLPerf references', not a preset's), the pre-flight picks
the largest micro-batch that both

  was measured faster    a docs/levers.json row of MBS=N against the run's own micro-batch, on
                         this GPU, this backend and precision, for this model (its preset, at
                         any depth: a row of Qwen3-30B-A3B 8L speaks for Qwen3-30B-A3B, not for
                         Mixtral nor the tiny test presets), verdict `faster` by at least
                         MIN_GAIN;
  fits                   the memory estimate (training/optimize/memory.py) at N is at most
                         MEMORY_BOUND_FRACTION of the GPU's memory;

and divides the global batch over the data-parallel ranks. The value is shown in the launch
table with source `preflight` and the row it stands on; where a measured-faster micro-batch
does not fit or divide, an info line says why the micro-batch stays. Nothing else changes: a
user's MBS (env or KEY=VALUE), a recipe's and a preset's are never touched.

`choose` is a chooser of training.launch.resolve (run after the guards on the resolved launch;
what it returns is seeded into a second resolve, so the run folder's name, the gradient
accumulation and every guard see the chosen value).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from training import REPO_ROOT

from .memory import MEMORY_BOUND_FRACTION

SOURCE = "preflight"
GUARD = "preflight_micro_batch"
# The smallest measured gain a default changes for. Between device calls the team saw the same
# launch move by 1-4% (docs/moe.md, sessions 15-18), and a larger micro-batch spends memory
# (Llama 3 8B 8L: 54 -> 61 GiB for 1.011x); a row below this keeps the micro-batch.
MIN_GAIN = 1.05


@dataclass(frozen=True)
class Candidate:
    mbs: int
    entry: Any          # levers.LeverEntry


def measured_faster(run, book) -> list[Candidate]:
    """The micro-batches docs/levers.json measured faster than this run's own, for a run like
    it (same GPU, backend, precision and model), largest first; the closest row (most shape
    fields equal) speaks for each."""
    from training.platforms import platform_for_device_name

    from .config import shape_key

    shape = shape_key(run)
    best: dict[int, tuple[int, Any]] = {}
    for entry in book.entries:
        sets, base = entry.assignments, entry.baseline_assignments
        if set(sets) != {"MBS"} or set(base) != {"MBS"}:   # a lever of MBS alone
            continue
        try:
            mbs, was = int(sets["MBS"]), int(base["MBS"])
        except ValueError:
            continue
        hw = platform_for_device_name(entry.hardware or "")
        if (was != run.layout.mbs or mbs <= was or hw is None or hw.name != run.platform
                or entry.shape.get("backend") != run.backend
                or entry.shape.get("precision") != run.precision
                or entry.shape.get("model") != run.model.name
                or entry.verdict != "faster" or (entry.ratio or 0) < MIN_GAIN):
            continue
        score = sum(1 for k, v in shape.items() if entry.shape.get(k) == v)
        if mbs not in best or score > best[mbs][0]:
            best[mbs] = (score, entry)
    return [Candidate(m, best[m][1]) for m in sorted(best, reverse=True)]


def _row(entry) -> str:
    from .levers import shape_text

    return (f"MBS={entry.assignments['MBS']} measured {entry.ratio:.2f}x MBS="
            f"{entry.baseline_assignments['MBS']} on {entry.hardware} at "
            f"{shape_text(entry.shape)} ({entry.source})")


def choose(launch, book=None) -> dict[str, tuple[Any, str, str]]:
    """{"MBS": (value, source, reason)} to resolve the launch again with, or {} (then an info
    line on `launch` says why, where a measured-faster micro-batch was not taken)."""
    import dataclasses

    from training.run_description import RunDescription

    from .config import device_gib
    from .memory import estimate

    s, run = launch.settings, launch.run
    if s.setting("MBS").source != "default" or s.get("MLPERF_DIVISION"):
        return {}     # the user's, a recipe's or a preset's; an MLPerf run keeps the reference's
    if book is None:
        from .inputs import BadInput
        from .levers import load_default

        try:
            book = load_default(None, REPO_ROOT)
        except BadInput:      # a broken levers file must not block a launch: MBS stays
            return {}
    candidates = measured_faster(run, book)
    device = device_gib(run)
    if not candidates or device is None:
        return {}
    if s["PREFLIGHT_MEMORY"] == "off":
        s.info(GUARD, f"MBS stays {run.layout.mbs}: {_row(candidates[0].entry)}, but "
                      "PREFLIGHT_MEMORY=off leaves the memory unestimated (set MBS yourself).")
        return {}
    passed = []
    for candidate in candidates:
        m, lay = candidate.mbs, run.layout
        if lay.global_batch % (m * lay.dp):
            passed.append(f"MBS={m} does not divide the global batch {lay.global_batch} over "
                          f"{lay.dp} data-parallel rank{'s' if lay.dp != 1 else ''}")
            continue
        trial = RunDescription(run.family, dataclasses.replace(run.model),
                               {**run.values, "MBS": m}, run.platform, run.capabilities)
        peak = estimate(trial).peak_gib
        if peak > MEMORY_BOUND_FRACTION * device:
            passed.append(f"MBS={m}'s estimated peak {peak:.1f} GiB is above "
                          f"{MEMORY_BOUND_FRACTION:.0%} of the {device:.0f} GiB")
            continue
        reason = (f"{_row(candidate.entry)}; estimated peak {peak:.1f} GiB of {device:.0f} "
                  f"(training/optimize/microbatch.py; MBS=1 keeps one)")
        return {"MBS": (m, SOURCE, reason)}
    s.info(GUARD, f"MBS stays {run.layout.mbs}: {_row(candidates[0].entry)}, but "
                  + "; ".join(passed) + ".")
    return {}
