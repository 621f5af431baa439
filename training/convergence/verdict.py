"""Verdict per cell of a convergence grid: converged, plateau or diverged, by stated rules.

Every threshold is in Rules (the grid YAML's `verdict:` section overrides the defaults) and
Rules.describe() states them in words, in the table and on stdout. The rules, in order:

  diverged   a non-finite loss, grad norm or eval loss; or the train loss (mean over windows of
             `smooth` iterations) ending above its first window; or it giving back more than
             `give_back` of its progress (last window - best window > give_back x (first - best))
  converged  the best eval loss so far reached `target` (when one is set)
  plateau    the best eval loss so far improved by less than `plateau_rel` (relative) over the
             last `window` evaluations, and stays above the threshold: `plateau_above` when set,
             else the grid's best (among cells not diverged) + `plateau_gap`
  converged  otherwise: still falling at >= plateau_rel per `window` evaluations, or flat at the
             grid's best level

The *best eval loss so far* (running minimum) is judged rather than the last one, so that
over-fitting a small corpus late in a run is not read as a plateau. Without evaluations the
windowed train loss stands in for it (the verdict says so).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any


@dataclass(frozen=True)
class Rules:
    smooth: int = 10
    window: int = 4
    plateau_rel: float = 0.01
    plateau_gap: float = 0.15
    plateau_above: float | None = None
    target: float | None = None
    give_back: float = 0.5

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> "Rules":
        data = dict(data or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown verdict setting(s) {', '.join(unknown)}: use "
                             f"{', '.join(sorted(known))}")
        return cls(**data)

    def describe(self) -> list[str]:
        plateau_level = (f"above {self.plateau_above:g}" if self.plateau_above is not None else
                         f"more than {self.plateau_gap:g} above the grid's best")
        lines = [
            f"diverged: a non-finite loss, grad norm or eval loss; or the train loss (mean of "
            f"{self.smooth}-iteration windows) ends above its first window; or it gives back more "
            f"than {self.give_back:.0%} of its progress (last window vs best window)",
            f"plateau: the best eval loss so far improved less than {self.plateau_rel:.1%} over "
            f"the last {self.window} evaluations and stays {plateau_level}",
            f"converged: " + (f"the best eval loss reached {self.target:g}, or " if self.target
                              is not None else "") +
            f"still falling (>= {self.plateau_rel:.1%} over the last {self.window} evaluations), "
            f"or flat within {self.plateau_gap:g} of the grid's best"
            + ("" if self.plateau_above is None else f" / at or below {self.plateau_above:g}"),
        ]
        return lines


@dataclass
class Curves:
    """What a cell's run folder says: (iteration, value) series."""
    label: str
    train: list[tuple[int, float]] = field(default_factory=list)
    grad_norm: list[tuple[int, float]] = field(default_factory=list)
    evals: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class Verdict:
    label: str
    verdict: str                  # converged | plateau | diverged | failed
    reason: str
    numbers: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def windows(values: list[float], size: int) -> list[float]:
    """Means of consecutive windows of `size` values (a shorter last window is dropped, unless
    it is the only one)."""
    size = max(size, 1)
    chunks = [values[i:i + size] for i in range(0, len(values), size)]
    if len(chunks) > 1 and len(chunks[-1]) < size:
        chunks = chunks[:-1]
    return [sum(c) / len(c) for c in chunks if c]


def running_min(values: list[float]) -> list[float]:
    out, best = [], math.inf
    for v in values:
        best = min(best, v)
        out.append(best)
    return out


def _first_nonfinite(series: list[tuple[int, float]]) -> int | None:
    return next((it for it, v in series if v is None or not math.isfinite(v)), None)


def _prejudge(c: Curves, rules: Rules) -> tuple[Verdict | None, dict[str, Any], list[float], str]:
    """Divergence checks; else (None, numbers, the series to judge, its name)."""
    numbers: dict[str, Any] = {}
    for name, series in (("loss", c.train), ("grad norm", c.grad_norm), ("eval loss", c.evals)):
        bad = _first_nonfinite(series)
        if bad is not None:
            return Verdict(c.label, "diverged", f"non-finite {name} at iteration {bad}",
                           numbers), numbers, [], ""
    chunks = windows([v for _, v in c.train], rules.smooth)
    if chunks:
        start, end, best = chunks[0], chunks[-1], min(chunks)
        numbers.update(train_start=start, train_end=end, train_best=best)
        if len(chunks) >= 2 and end > start:
            return Verdict(c.label, "diverged", f"train loss ended above its start "
                           f"({start:.3f} -> {end:.3f})", numbers), numbers, [], ""
        progress = start - best
        if progress > 0 and end - best > rules.give_back * progress:
            return Verdict(c.label, "diverged",
                           f"train loss gave back {(end - best) / progress:.0%} of its progress "
                           f"(best {best:.3f}, end {end:.3f})", numbers), numbers, [], ""
    if c.grad_norm:
        norms = [v for _, v in c.grad_norm]
        numbers.update(grad_norm_max=max(norms),
                       grad_norm_end=windows(norms, rules.smooth)[-1])
    if c.evals:
        numbers.update(eval_last=c.evals[-1][1], eval_best=min(v for _, v in c.evals),
                       evaluations=len(c.evals))
        return None, numbers, running_min([v for _, v in c.evals]), "eval loss"
    return None, numbers, running_min(chunks), f"train loss ({rules.smooth}-iteration windows)"


def judge(cells: list[Curves], rules: Rules, failed: dict[str, str] | None = None
          ) -> dict[str, Verdict]:
    """The verdict of every cell. `failed`: label -> why the cell has no curves."""
    failed = failed or {}
    out: dict[str, Verdict] = {label: Verdict(label, "failed", why) for label, why in failed.items()}
    pending = []
    for c in cells:
        if c.label in out:
            continue
        verdict, numbers, series, what = _prejudge(c, rules)
        if verdict is not None:
            out[c.label] = verdict
        elif not series:
            out[c.label] = Verdict(c.label, "failed", "no loss recorded", numbers)
        else:
            numbers["level"] = series[-1]
            pending.append((c, numbers, series, what))
    grid_best = min((n["level"] for _, n, _, _ in pending), default=None)
    for c, numbers, series, what in pending:
        level = series[-1]
        threshold = rules.plateau_above if rules.plateau_above is not None else \
            grid_best + rules.plateau_gap
        numbers.update(threshold=threshold, grid_best=grid_best, judged=what)
        if rules.target is not None and level <= rules.target:
            out[c.label] = Verdict(c.label, "converged",
                                   f"best {what} {level:.3f} reached the target {rules.target:g}",
                                   numbers)
            continue
        if len(series) > rules.window:
            before = series[-1 - rules.window]
            improvement = (before - level) / abs(before) if before else 0.0
            numbers["improvement"] = improvement
            flat = improvement < rules.plateau_rel
            rate = (f"best {what} improved {improvement:.1%} over the last {rules.window} "
                    f"points ({before:.3f} -> {level:.3f})")
        else:
            flat = None
            rate = (f"only {len(series)} points of {what} (the flatness test needs more than "
                    f"{rules.window}): judged by level alone")
        if level > threshold and flat is not False:
            out[c.label] = Verdict(c.label, "plateau", f"{rate}; stays at {level:.3f}, above "
                                   f"{threshold:.3f}", numbers)
        elif flat:
            out[c.label] = Verdict(c.label, "converged", f"{rate}; flat at {level:.3f}, within "
                                   f"the threshold {threshold:.3f}", numbers)
        else:
            out[c.label] = Verdict(c.label, "converged",
                                   f"{rate}" + ("" if flat is None else ": still falling"),
                                   numbers)
    return out
