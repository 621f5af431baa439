"""A low-precision recipe as a throughput lever: of the recipes this run's GPU runs (the
launcher's hardware rules, training/launch/recipes.py), the one docs/levers.json measured
fastest against bf16, quoted with its convergence A/B against bf16 (docs/convergence/
te_recipes*.json, one report per seed, written by `python -m training.convergence
docs/convergence/grid_te_recipes*.yaml`). Without a measurement, nothing is recommended; without
the A/B, the quote says its convergence is not measured.

"Not worse than bf16 beyond noise" is the benchmarks' verdict rule applied to the best eval loss:
the recipe's gap to bf16, paired seed by seed and averaged, is worse only when it exceeds the
noise and every seed agrees in sign. With two or more seeds the noise is measured: the largest of
bf16's range across seeds, the recipe's range and the paired gaps' range. With one seed it is a
rerun's spread of one cell (RERUN_NOISE), which leaves the seed's own effect unsampled."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from training import REPO_ROOT
from training.launch.recipes import RECIPES
from training.platforms import PLATFORMS
from training.reading import RecordError, read_json
from training.run_description import RunDescription

from .config import available

# One report per seed of the same grid (only SEED differs between the two files' grids).
CONVERGENCE = (REPO_ROOT / "docs" / "convergence" / "te_recipes.json",
               REPO_ROOT / "docs" / "convergence" / "te_recipes_seed2.json")
GRID = "docs/convergence/grid_te_recipes.yaml"
# The largest rerun spread of one cell measured on the H200 (0.039, the first grid's reruns,
# docs/convergence.md "noise"), rounded up: the noise of a one-seed A/B.
RERUN_NOISE = 0.04


@dataclass(frozen=True)
class Seed:
    """One report's cells for the recipe and bf16."""
    report: str
    seed: str
    device: str
    verdict: str
    reason: str
    best: float | None
    bf16_best: float | None

    @property
    def gap(self) -> float | None:
        if self.verdict == "diverged":
            return float("inf")
        if self.best is None or self.bf16_best is None:
            return None
        return self.best - self.bf16_best


@dataclass(frozen=True)
class RecipeAB:
    """A recipe against bf16 over the seeds measured: the mean paired gap in best eval loss,
    its noise and where the noise comes from."""
    recipe: str
    seeds: tuple[Seed, ...]

    @property
    def paired(self) -> list[Seed]:
        return [s for s in self.seeds if s.gap is not None]

    @property
    def gap(self) -> float | None:
        gaps = [s.gap for s in self.paired]
        return sum(gaps) / len(gaps) if gaps else None

    @property
    def noise(self) -> float:
        pairs = [s for s in self.paired if s.gap != float("inf")]
        if len(pairs) < 2:
            return RERUN_NOISE

        def spread(values):
            return max(values) - min(values)
        return max(spread([s.bf16_best for s in pairs]), spread([s.best for s in pairs]),
                   spread([s.gap for s in pairs]))

    @property
    def noise_source(self) -> str:
        n = len([s for s in self.paired if s.gap != float("inf")])
        if n < 2:
            return "one seed: one cell's rerun spread on the H200, the seed's effect unsampled"
        return (f"measured over {n} seeds: the largest of bf16's range, {self.recipe}'s range "
                "and the paired gaps' range")

    @property
    def worse(self) -> bool:
        gaps = [s.gap for s in self.paired]
        return bool(gaps) and (float("inf") in gaps
                               or (self.gap > self.noise and all(g > 0 for g in gaps)))


def platform_recipes(c: RunDescription) -> list[str]:
    """The fp8/fp4 recipes this run could switch to: bf16 now, Transformer Engine available,
    and the GPU has the recipe's number formats."""
    platform = PLATFORMS.get(c.platform) if c.platform else None
    if c.precision != "bf16" or not available(c, "transformer_engine") or platform is None:
        return []
    return [name for name, r in RECIPES.items()
            if r.kind != "bf16" and r.supports(platform.sm, platform.gfx)]


def _paths(convergence: Path | Sequence[Path]) -> list[Path]:
    return [Path(convergence)] if isinstance(convergence, (str, Path)) else \
        [Path(p) for p in convergence]


def _read(path: Path) -> dict | None:
    """A report, or None where it cannot be read."""
    try:
        data = read_json(path, "report")
    except RecordError:
        return None
    return data if isinstance(data, dict) else None


def _dict(value) -> dict:
    """A report's object, or {} where a damaged or hand-edited report has something else."""
    return value if isinstance(value, dict) else {}


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None


def recipe_ab(recipe: str, convergence: Path | Sequence[Path] = CONVERGENCE) -> RecipeAB | None:
    """The recipe's A/B against bf16 over every readable report with a usable cell for it (not
    failed, not missing); None where there is none."""
    seeds = []
    for path in _paths(convergence):
        data = _read(path)
        if data is None:
            continue
        cell_list = data.get("cells") if isinstance(data.get("cells"), list) else []
        cells = {_dict(c.get("values")).get("PRECISION"): c
                 for c in cell_list if isinstance(c, dict)}
        cell = _dict(cells.get(recipe))
        if not isinstance(cell.get("verdict"), str) or cell["verdict"] == "failed":
            continue
        seeds.append(Seed(
            report=path.name, seed=str(_dict(data.get("fixed")).get("SEED", "?")),
            device=str(data.get("device") or "GPU"), verdict=cell["verdict"],
            reason=str(cell.get("reason") or ""),
            best=_number(_dict(cell.get("numbers")).get("eval_best")),
            bf16_best=_number(_dict(_dict(cells.get("bf16")).get("numbers")).get("eval_best"))))
    return RecipeAB(recipe, tuple(seeds)) if seeds else None


def convergence_text(recipe: str, convergence: Path | Sequence[Path] = CONVERGENCE) -> str:
    """The A/B's verdicts for `recipe`, its best eval loss against bf16's seed by seed, the mean
    gap against its noise; or why there is none."""
    paths = _paths(convergence)
    ab = recipe_ab(recipe, paths)
    how = f"run `python -m training.convergence {GRID}`"
    if ab is None:
        names = ", ".join(p.name for p in paths)
        if not any(p.exists() for p in paths):
            return f"convergence not measured ({names}: none exists yet: {how})"
        return f"convergence not measured for PRECISION={recipe} ({names}: {how})"
    first = ab.seeds[0]
    reports = ", ".join(s.report for s in ab.seeds)
    verdicts = sorted({s.verdict for s in ab.seeds})
    text = (f"convergence A/B ({reports}, {first.device}): {'/'.join(verdicts)}"
            + (f" at {len(ab.seeds)} seeds" if len(ab.seeds) > 1 else ""))
    losses = [f"{s.best:.3f} vs bf16's {s.bf16_best:.3f} ({s.gap:+.3f}, seed {s.seed})"
              for s in ab.paired if s.gap != float("inf")]
    if losses:
        text += ", best eval loss " + "; ".join(losses) + " (same data and steps)"
    if ab.gap is not None and ab.gap != float("inf"):
        text += (f"; {'mean gap' if len(losses) > 1 else 'gap'} {ab.gap:+.3f}, "
                 f"{'beyond' if ab.worse else 'within'} the noise {ab.noise:.3f} "
                 f"({ab.noise_source})")
    if len(ab.seeds) == 1 and first.reason:
        text += f"; {first.reason}"
    return text
