"""The efficiencies the throughput projection scales by, read from our measured benchmarks.

Nothing here is typed in: each figure is read from a recorded benchmark JSON under
docs/benchmarks/ (the real runs of `python -m training.bench`) and carries its source. The
projection (training/optimize/project.py) multiplies a platform's datasheet peak by these:

  dense_mfu          model FLOPs / peak of the full Llama3-8B at seq 8192 on one H200, bf16,
                     the native backend, MBS 1 (steady state of peers_h200_llama3-8B_seq8192)
  moe_mfu[family]    the same for our MoE runs (Mixtral-8x7B cut to 4 layers; Qwen3-30B-A3B cut
                     to 8 layers), the core step's default points
  precision_ratio    tokens/s of each fp8 recipe over bf16 on Transformer Engine, one H200
                     (te-recipes); MXFP8 does not run on Hopper, so it takes the tensor-scaled
                     fp8 ratio (stated where used)
  recompute_ratio    tokens/s with RECOMPUTE=selective|full over none (levers-recompute)
  mbs2_ratio         tokens/s at MBS 2 over MBS 1 (levers-kernels-mbs)
  backend_ratio      Transformer Engine over the native backend at bf16 (peers-te)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from statistics import mean

from training import REPO_ROOT
from training.reading import RecordError, read_json
from training.records import BenchResult, validate

from .inputs import BadInput

BENCH = Path("docs/benchmarks")
DENSE = BENCH / "peers_h200_llama3-8B_seq8192.json"
MOE = {"mixtral": BENCH / "moe-levers-lean-mixtral_h200_mixtral-8x7B-4L_seq4096.json",
       "qwen3": BENCH / "moe-levers_h200_qwen3-30B-A3B-8L_seq4096.json"}
RECIPES = BENCH / "te-recipes_h200_llama3-8B-8L_seq8192.json"
RECOMPUTE = BENCH / "levers-recompute_h200_llama3-8B-8L_seq8192.json"
MBS = BENCH / "levers-kernels-mbs_h200_llama3-8B-8L_seq8192.json"
BACKEND = BENCH / "peers-te_h200_llama3-8B-8L_seq8192.json"


@dataclass(frozen=True)
class Figure:
    value: float
    source: str          # the benchmark JSON (repo-relative) and what was read from it

    def __str__(self) -> str:
        return f"{self.value:.3f} ({self.source})"


@dataclass(frozen=True)
class Efficiencies:
    dense_mfu: Figure
    measured_on: str                     # the platform the MFUs were measured on
    moe_mfu: dict[str, Figure] = field(default_factory=dict)
    precision_ratio: dict[str, Figure] = field(default_factory=dict)
    recompute_ratio: dict[str, Figure] = field(default_factory=dict)
    mbs2_ratio: Figure | None = None
    backend_ratio: Figure | None = None


def _load(root: Path, rel: Path) -> dict:
    path = root / rel
    data = read_json(path, "benchmark the projection is calibrated from")
    if not isinstance(data, dict):
        raise RecordError(f"{path}: not a benchmark JSON (a JSON object)")
    validate(data, BenchResult, path)
    return data


def _mfu(doc: dict, rel: Path, label_start: str, backend: str | None = None) -> Figure:
    values = [p["summary"]["mfu"] for p in doc.get("points", [])
              if p.get("side") == "ours" and str(p.get("label", "")).startswith(label_start)
              and (backend is None or p.get("backend") == backend)
              and (p.get("summary") or {}).get("mfu")]
    if not values:
        raise BadInput(f"{rel}: no measured '{label_start}*' point with an MFU")
    return Figure(mean(values), f"{rel}: mean MFU of {len(values)} '{label_start}' points")


def _ratio(doc: dict, rel: Path, set_: str) -> Figure | None:
    for result in doc.get("results", []):
        if result.get("set") == set_ and isinstance(result.get("tokens_per_s_ratio"), float):
            return Figure(result["tokens_per_s_ratio"],
                          f"{rel}: tokens/s ratio {set_} vs {result.get('baseline')}")
    return None


@lru_cache(maxsize=4)
def measured(root: Path = REPO_ROOT) -> Efficiencies:
    dense_doc = _load(root, DENSE)
    platform = (dense_doc.get("gpu") or {}).get("name", "?")
    moe = {family: _mfu(_load(root, rel), rel, "default") for family, rel in MOE.items()}
    recipes = _load(root, RECIPES)
    precision = {"bf16": Figure(1.0, "bf16 is the reference")}
    for name in ("fp8", "fp8_tensorwise", "fp8_blockwise"):
        found = _ratio(recipes, RECIPES, f"PRECISION={name}")
        if found:
            precision[name] = found
    if "fp8_tensorwise" in precision:   # MX formats need sm100/gfx950: not measurable on H200
        tw = precision["fp8_tensorwise"]
        precision["mxfp8"] = Figure(tw.value, tw.source + " (MXFP8 takes the tensor-scaled fp8 "
                                    "ratio: MX formats do not run on the H200 we measure on)")
    recompute_doc = _load(root, RECOMPUTE)
    recompute = {"none": Figure(1.0, "no recompute is the reference")}
    for mode in ("selective", "full"):
        found = _ratio(recompute_doc, RECOMPUTE, f"RECOMPUTE={mode}")
        if found:
            recompute[mode] = found
    backend = _load(root, BACKEND)
    te = _mfu(backend, BACKEND, "transformer_engine", "transformer_engine").value
    native = _mfu(backend, BACKEND, "native", "native").value
    return Efficiencies(
        dense_mfu=_mfu(dense_doc, DENSE, "native", "native"), measured_on=platform,
        moe_mfu=moe, precision_ratio=precision, recompute_ratio=recompute,
        mbs2_ratio=_ratio(_load(root, MBS), MBS, "MBS=2"),
        backend_ratio=Figure(te / native, f"{BACKEND}: MFU of transformer_engine over native"))
