"""A low-precision recipe as a throughput lever: of the recipes this run's GPU runs (the
launcher's hardware rules, training/launch/recipes.py), the one docs/levers.json measured
fastest against bf16, quoted with the verdict of its convergence A/B against bf16
(docs/convergence/te_recipes.json, written by `python -m training.convergence
docs/convergence/grid_te_recipes.yaml`). Without a measurement, nothing is recommended; without
the A/B, the quote says its convergence is not measured."""
from __future__ import annotations

import json
from pathlib import Path

from training import REPO_ROOT
from training.launch.recipes import RECIPES
from training.platforms import PLATFORMS
from training.run_description import RunDescription

from .config import available

CONVERGENCE = REPO_ROOT / "docs" / "convergence" / "te_recipes.json"
GRID = "docs/convergence/grid_te_recipes.yaml"
# How far a recipe's best eval loss may sit above bf16's in the A/B and still count as "not worse
# beyond noise": the largest rerun spread of one cell measured on the H200 (0.039, the first
# grid's reruns, docs/convergence.md "noise"), rounded up.
CONVERGENCE_NOISE = 0.04


def platform_recipes(c: RunDescription) -> list[str]:
    """The fp8/fp4 recipes this run could switch to: bf16 now, Transformer Engine available,
    and the GPU has the recipe's number formats."""
    platform = PLATFORMS.get(c.platform) if c.platform else None
    if c.precision != "bf16" or not available(c, "transformer_engine") or platform is None:
        return []
    return [name for name, r in RECIPES.items()
            if r.kind != "bf16" and r.supports(platform.sm, platform.gfx)]


def _read_ab(path: Path) -> dict | None:
    """The A/B report, or None where it cannot be read."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def _best_losses(data: dict, recipe: str) -> tuple[dict, float | None, float | None]:
    """The recipe's cell, its best eval loss and bf16's (None where absent)."""
    cells = {(c.get("values") or {}).get("PRECISION"): c for c in data.get("cells") or []}
    cell = cells.get(recipe) or {}
    mine = (cell.get("numbers") or {}).get("eval_best")
    theirs = ((cells.get("bf16") or {}).get("numbers") or {}).get("eval_best")
    number = (int, float)
    return (cell, mine if isinstance(mine, number) else None,
            theirs if isinstance(theirs, number) else None)


def convergence_gap(recipe: str, path: Path = CONVERGENCE) -> float | None:
    """The recipe's best eval loss minus bf16's in the A/B; infinity where the recipe diverged;
    None where the A/B has no usable cell for it (not run, or the run failed)."""
    data = _read_ab(path)
    if data is None:
        return None
    cell, mine, theirs = _best_losses(data, recipe)
    if cell.get("verdict") in (None, "failed"):
        return None
    if cell["verdict"] == "diverged":
        return float("inf")
    return mine - theirs if mine is not None and theirs is not None else None


def convergence_text(recipe: str, path: Path = CONVERGENCE) -> str:
    """The A/B's verdict for `recipe` and its best eval loss against bf16's, or why there is
    none."""
    how = f"run `python -m training.convergence {GRID}`"
    data = _read_ab(path)
    if data is None:
        return f"convergence not measured ({path.name} does not exist yet: {how})"
    cell, mine, theirs = _best_losses(data, recipe)
    if cell.get("verdict") in (None, "failed"):
        return f"convergence not measured for PRECISION={recipe} ({path.name}: {how})"
    text = f"convergence A/B ({path.name}, {data.get('device') or 'GPU'}): {cell['verdict']}"
    if mine is not None and theirs is not None:
        text += (f", best eval loss {mine:.3f} vs bf16's {theirs:.3f} ({mine - theirs:+.3f}, "
                 f"same data, seed and steps)")
    if cell.get("reason"):
        text += f"; {cell['reason']}"
    return text
