"""A convergence grid: fixed toggles, axes of toggle values, verdict thresholds (GRID.yaml).

    name: adam_eps_x_bf16_reduce          # names the run folders and the output files
    script: examples/llama/train_llama3.sh  # the launcher entry every cell runs (default)
    fixed: {MODEL_SIZE: 8B, NUM_LAYERS: 2, ..., SEED: 1234}   # the same for every cell
    args: []                              # Megatron --flags after the words (optional)
    axes:                                 # every combination is one cell, in this order
      ADAM_EPS: [1.0e-8, 1.0e-5]
      GRAD_REDUCE_IN_BF16: [0, 1]
    cells:                                # instead of axes: the cells themselves, each
      - {ADAM_EPS: 1.0e-8, GRAD_REDUCE_IN_BF16: 0}   # setting the same toggles (the axes are
      - {ADAM_EPS: 1.0e-5, GRAD_REDUCE_IN_BF16: 1}   # their values, in order of appearance)
    verdict: {smooth: 10, window: 4, ...} # training/convergence/verdict.py Rules
    out: docs/convergence                 # where the table, JSON and PNG go
    timeout_s: 600                        # per cell
    budget_s: null                        # for the whole grid: cells that would not fit are
                                          # left for the next invocation (it resumes)

Every name in fixed and axes must be a toggle of the registry (with the MoE layer's for an
examples/moe/ script: toggle_names; a typo would otherwise be a
silently ignored environment variable). SEED cannot be an axis: every cell reads the same data
in the same order. Relative paths (script, out) are taken from the repository root.
"""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training import REPO_ROOT
from training.reading import RecordError, read_yaml

from .verdict import Rules

DEFAULT_SCRIPT = "examples/llama/train_llama3.sh"
MANAGED = ("EXPERIMENT_DIR", "EXP_NAME", "RUN_ID", "DRY_RUN")   # set by the harness per cell


class GridError(RecordError):
    """A grid file that cannot run; the message says what to change (the project's one user
    error for a file: training.reading.RecordError, exit 2)."""


def env_value(value: Any) -> str:
    """A YAML value as the launcher reads it from the environment."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


@dataclass(frozen=True)
class Cell:
    values: dict[str, str]

    @property
    def label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.values.items())

    @property
    def slug(self) -> str:
        text = "__".join(f"{k}-{v}" for k, v in self.values.items())
        return re.sub(r"[^A-Za-z0-9_.+-]", "_", text)


@dataclass
class Grid:
    name: str
    fixed: dict[str, str]
    axes: dict[str, list[str]]
    rules: Rules
    script: str = DEFAULT_SCRIPT
    args: list[str] = field(default_factory=list)
    out: str = "docs/convergence"
    timeout_s: int = 600
    budget_s: float | None = None
    source: dict[str, Any] = field(default_factory=dict)
    explicit: list[dict[str, str]] | None = None   # `cells:` instead of the axes' product

    def cells(self) -> list[Cell]:
        if self.explicit is not None:
            return [Cell(dict(values)) for values in self.explicit]
        names = list(self.axes)
        return [Cell(dict(zip(names, combo)))
                for combo in itertools.product(*(self.axes[n] for n in names))]

    def path(self, value: str) -> Path:
        p = Path(value)
        return p if p.is_absolute() else REPO_ROOT / p


def toggle_names(script: str) -> set[str]:
    """The toggles a grid may set for its script: the core registry's, and the MoE recipe
    layer's for an MoE entry point (examples/moe/, whose launch adds training/moe/layer.py)."""
    from training.launch.toggles import BY_NAME

    path = Path(script) if Path(script).is_absolute() else REPO_ROOT / script
    names = set(BY_NAME)
    if path.resolve().parent == (REPO_ROOT / "examples" / "moe").resolve():
        from training.moe.layer import MOE
        names.update(toggle.name for toggle in MOE.toggles)
    return names


def load(path: Path) -> Grid:
    try:
        data = read_yaml(path, "grid")
    except RecordError as err:
        raise GridError(str(err)) from None
    if not isinstance(data, dict):
        raise GridError(f"{path}: expected a mapping with name, fixed, axes")
    known = {"name", "description", "script", "fixed", "args", "axes", "cells", "verdict",
             "out", "timeout_s", "budget_s"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise GridError(f"{path}: unknown key(s) {', '.join(unknown)}; use {', '.join(sorted(known))}")
    name = str(data.get("name") or "")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise GridError(f"{path}: name {name!r} must be letters, digits, '_', '.', '-'")
    for key in ("fixed", "axes", "verdict"):
        if data.get(key) is not None and not isinstance(data[key], dict):
            raise GridError(f"{path}: {key} must be a mapping of NAME: value, not {data[key]!r}")
    if data.get("args") is not None and not isinstance(data["args"], list):
        raise GridError(f"{path}: args must be a list of Megatron flags, e.g. [--log-interval, 1]")
    timeout_s = _number(path, data, "timeout_s", 600, int)
    budget_s = _number(path, data, "budget_s", None, float)
    script = str(data.get("script") or DEFAULT_SCRIPT)
    if not (Path(script) if Path(script).is_absolute() else REPO_ROOT / script).is_file():
        raise GridError(f"{path}: script {script} not found (relative paths start at the repository root)")
    fixed = {k: env_value(v) for k, v in (data.get("fixed") or {}).items()}
    explicit = _explicit_cells(path, data)
    axes_raw = data.get("axes") or {}
    if explicit is not None:
        if axes_raw:
            raise GridError(f"{path}: give axes or cells, not both")
        axes_raw = {k: list(dict.fromkeys(c[k] for c in explicit)) for k in explicit[0]}
    if not axes_raw:
        raise GridError(f"{path}: no axes: a grid varies at least one toggle")
    axes = {}
    for key, values in axes_raw.items():
        if not isinstance(values, list) or not values:
            raise GridError(f"{path}: axis {key} needs a list of values")
        axes[key] = [env_value(v) for v in values]
    known_toggles = toggle_names(script)
    for key in [*fixed, *axes]:
        if key not in known_toggles:
            raise GridError(f"{path}: {key} is not a toggle of the launcher's registry"
                            f" for {script}")
    if "SEED" in axes:
        raise GridError(f"{path}: SEED cannot be an axis: every cell must read the same data in "
                        "the same order (set it under fixed)")
    both = sorted(set(fixed) & set(axes))
    if both:
        raise GridError(f"{path}: {', '.join(both)} is both fixed and an axis")
    managed = [k for k in MANAGED if k in fixed or k in axes]
    if managed:
        raise GridError(f"{path}: {', '.join(managed)} is set by the harness for each cell")
    try:
        rules = Rules.from_dict(data.get("verdict"))
    except (TypeError, ValueError) as err:
        raise GridError(f"{path}: verdict: {err}") from None
    return Grid(name=name, fixed=fixed, axes=axes, rules=rules, script=script,
                args=[str(a) for a in data.get("args") or []],
                out=str(data.get("out") or "docs/convergence"),
                timeout_s=timeout_s, budget_s=budget_s, source=data, explicit=explicit)


def _explicit_cells(path: Path, data: dict) -> list[dict[str, str]] | None:
    """The `cells:` list: mappings that all set the same toggles, no cell twice."""
    raw = data.get("cells")
    if raw is None:
        return None
    if not isinstance(raw, list) or not raw or not all(isinstance(c, dict) and c for c in raw):
        raise GridError(f"{path}: cells must be a list of mappings TOGGLE: value")
    cells = [{k: env_value(v) for k, v in c.items()} for c in raw]
    keys = list(cells[0])
    for cell in cells:
        if sorted(cell) != sorted(keys):
            raise GridError(f"{path}: every cell sets the same toggles ({', '.join(keys)}); "
                            f"{cell} does not")
    seen = [tuple(c[k] for k in keys) for c in cells]
    if len(set(seen)) != len(seen):
        raise GridError(f"{path}: a cell is listed twice")
    return [{k: c[k] for k in keys} for c in cells]


def _number(path: Path, data: dict, key: str, default, kind):
    """data[key] as a positive `kind` (int or float), `default` when absent or null."""
    value = data.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 \
            or value == float("inf") or (kind is int and value != int(value)):
        what = "a whole number of seconds" if kind is int else "a number of seconds"
        raise GridError(f"{path}: {key}: {value!r} must be {what} above 0"
                        + (" (or null: no budget)" if default is None else f" (default {default})"))
    return kind(value)
