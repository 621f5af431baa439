"""The measuring loop shared by `bench toggles` and `bench peers`.

configs  the sides of one comparison: a default run and its variants, or ours and the peers
order    every repeat runs each runnable config once; repeat r starts at config r (rotated),
         so slow drift (clocks, heat, a neighbour) hits every side alike; with nothing
         runnable to compare with the default, nothing runs
runner   the function that measures one point (injected: tests pass a fake)
budget   before each point the loop checks that the point's estimate (scaled up when the
         points so far took longer than estimated) still fits; when it does not, it stops
         and says so in the JSON (the points done are kept)
writes   the JSON is rewritten after every point (atomically), so a crash or a timeout
         keeps what was measured; `complete` says whether the plan ran to its end
resume   `prior`, an earlier call's JSON of the same plan (`bench all --resume`): its whole
         repeats are kept and only the others run; a repeat is never split between two calls,
         so each repeat's paired ratios stay within one call (`resumed` says which came from
         where)
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from . import analysis, record
from .shape import BenchShape


@dataclass
class Config:
    id: str                          # "default", a lever key, or a peer side
    side: str                        # ours | hf | hf_liger | torchtitan
    env: dict[str, str] = field(default_factory=dict)   # launcher toggles on top of the shape
    lever: dict | None = None        # the catalogue entry (toggles), as a dict
    status: str = "planned"          # planned | refused | not applicable | not runnable | not run
    message: str = ""
    corrections: list = field(default_factory=list)

    @property
    def runnable(self) -> bool:
        return self.status == "planned"

    def to_dict(self) -> dict:
        return {"id": self.id, "side": self.side, "env": self.env, "lever": self.lever,
                "status": self.status, "message": self.message,
                "corrections": self.corrections}


@dataclass(frozen=True)
class PointSpec:
    index: int                       # position in the run order
    label: str                       # unique: run folder and log name
    config: str
    repeat: int
    side: str
    env: dict                        # the full launcher toggles (shape + config), ours only
    shape: BenchShape


Runner = Callable[[PointSpec], dict]
Estimate = Callable[[PointSpec], float]


def order(configs: list[Config], shape: BenchShape) -> list[PointSpec]:
    """The interleaved run order: repeat r runs the runnable configs rotated by r."""
    runnable = [c for c in configs if c.runnable]
    if len(runnable) < 2 and len(configs) > 1:
        return []  # nothing to compare with: every other side was decided without a run
    # (a single config is a headline run of the default alone: `toggles --keys default`)
    specs = []
    for repeat in range(shape.repeats):
        k = repeat % len(runnable) if runnable else 0
        for config in runnable[k:] + runnable[:k]:
            specs.append(PointSpec(len(specs), f"{_safe(config.id)}-r{repeat}", config.id,
                                   repeat, config.side, {**shape.env(), **config.env}, shape))
    return specs


def _safe(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "=-_." else "_" for ch in text)


def whole_repeats(prior: dict, specs: list[PointSpec]) -> list[int]:
    """The repeats of the plan `specs` that `prior` (an earlier JSON) measured every point of."""
    labels = {p.get("label") for p in prior.get("points", []) if isinstance(p, dict)}
    repeats = sorted({s.repeat for s in specs})
    return [r for r in repeats if all(s.label in labels for s in specs if s.repeat == r)]


def resume_problem(prior: dict, configs: list[Config], shape: BenchShape,
                   gpu_name: str | None) -> str | None:
    """Why `prior` cannot be extended by this plan, or None: the same sides with the same
    settings, the same shape but for the repeats, the same GPU."""
    if (prior.get("gpu") or {}).get("name") != gpu_name:
        return f"measured on {(prior.get('gpu') or {}).get('name')}, this is {gpu_name}"
    planned = (prior.get("shape") or {}).get("repeats", 1)
    if planned > shape.repeats:
        return (f"it planned {planned} repeats, this call asks {shape.repeats}: give "
                f"--repeats {planned} to finish it")
    mine = json.loads(json.dumps({k: v for k, v in shape.to_dict().items() if k != "repeats"}))
    theirs = {k: v for k, v in (prior.get("shape") or {}).items() if k in mine}
    if theirs != mine:
        return "its shape differs: " + ", ".join(
            f"{k} {theirs.get(k)} vs {v}" for k, v in mine.items() if theirs.get(k) != v)
    # the sides that run (a refused or inapplicable one has no points either way)
    old = {(c.get("id"), tuple(sorted((c.get("env") or {}).items())))
           for c in prior.get("configs", []) if isinstance(c, dict)
           and c.get("status") == "planned"}
    new = {(c.id, tuple(sorted(c.env.items()))) for c in configs if c.runnable}
    if old != new:
        return "its sides or their settings differ: " + ", ".join(
            sorted({c[0] for c in old ^ new}))
    return None


def run(result: dict, configs: list[Config], shape: BenchShape, runner: Runner,
        estimate: Estimate, out: Path, budget_s: float,
        clock: Callable[[], float] = time.monotonic, log: Callable[[str], None] = print,
        prior: dict | None = None) -> dict:
    """Measure every point of the plan (within the budget), writing `out` after each; with
    `prior` (resume_problem None) keep its whole repeats and measure the rest."""
    specs = order(configs, shape)
    kept = whole_repeats(prior, specs) if prior else []
    points = ([p for p in prior["points"] if isinstance(p, dict) and p.get("repeat") in kept]
              if kept else [])
    planned = specs
    specs = [s for s in specs if s.repeat not in kept]
    result.update(configs=[c.to_dict() for c in configs], points=points, complete=False,
                  stopped=None, plan={"order": [s.label for s in planned],
                                      "estimated_s": sum(estimate(s) for s in specs),
                                      "budget_s": budget_s})
    if kept:
        result["resumed"] = {"repeats_kept": kept, "from_git_sha": prior.get("git_sha"),
                             "from_created": prior.get("created"),
                             "from_host": prior.get("host"),
                             "note": f"repeat(s) {', '.join(map(str, kept))} measured in an "
                                     f"earlier call (git {str(prior.get('git_sha'))[:12]}, "
                                     f"{prior.get('created')}); each repeat's sides ran in "
                                     "one call"}
        log(f"[bench] resumed: {result['resumed']['note']}")
    _write(result, out)
    start = clock()
    estimated_done = 0.0
    out_of_memory: dict[str, str] = {  # config -> why its later repeats are not run
        p["config"]: f"not run: {p['label']} ran out of GPU memory in an earlier call, and the "
                     f"same run would again ({analysis.failure_line(p)})"
        for p in points if analysis.out_of_memory(p)}
    for i, spec in enumerate(specs):
        skipped = out_of_memory.get(spec.config)
        if skipped:
            point = {"side": spec.side, "skipped": True, "error": skipped}
        else:
            elapsed = clock() - start
            # runs slower than planned here (a slower start-up, say) make later estimates longer
            scale = max(1.0, elapsed / estimated_done) if estimated_done else 1.0
            need = estimate(spec) * scale
            if elapsed + need > budget_s:
                result["stopped"] = (f"budget: {elapsed:.0f} s spent, {spec.label} needs about "
                                     f"{need:.0f} s of the {budget_s:.0f} s budget; not run: "
                                     + ", ".join(s.label for s in specs[i:]))
                log(f"[bench] stopping: {result['stopped']}")
                break
            log(f"[bench] {spec.label} ({i + 1}/{len(specs)}, about {need:.0f} s) ...")
            point = runner(spec)
            estimated_done += estimate(spec)
            if analysis.out_of_memory(point):
                out_of_memory[spec.config] = (
                    f"not run: {spec.label} ran out of GPU memory, and the same run would again "
                    f"({analysis.failure_line(point)})")
        point.update(label=spec.label, config=spec.config, name=spec.config,
                     repeat=spec.repeat, order_index=spec.index, side=point.get("side", spec.side))
        result["points"].append(point)
        log(f"[bench] {spec.label}: " + (f"{point['tokens_per_s_per_gpu']:,.0f} tokens/s/GPU"
                                         if analysis.ok(point) else
                                         point["error"] if skipped else
                                         analysis.failure_line(point)))
        _write(result, out)
    else:
        result["complete"] = True
    result["elapsed_s"] = clock() - start
    _write(result, out)
    return result


def _write(result: dict, out: Path) -> None:
    result["results"] = analysis.results(result)
    record.write(result, out)
