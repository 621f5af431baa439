"""Wall-time estimates for a plan, calibrated from the benchmark JSONs already recorded.

A launcher run costs a fixed overhead (bash + resolve + torchrun + Megatron init + teardown,
measured as the run's wall time minus its step times), a slower first step (kernel
compilation, allocator warm-up) and the steps. The overhead and first-step figures and each
side's model TFLOP/s come from the newest recorded points that carry them, for our launcher
per backend and model family where those were recorded (a Transformer Engine run builds for
longer, an MoE step reaches a third of a dense one's TFLOP/s), else per side; where none does,
the fallbacks below are used and the plan says so. Variant factors are planning guesses
(how much slower a variant's step is), never reported as results.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path

from training.launch.presets import PRESETS
from training.metrics import flops_per_token
from training.reading import RecordError
from training.run_description import Model

from .suites import saved_result
from .sweep import PointSpec

FALLBACK = {"overhead_s": {"ours": 35.0, "local": 35.0, "hf": 20.0, "hf_liger": 20.0,
                           "hf_compile": 20.0, "torchtitan": 45.0},
            "first_extra_s": {"ours": 6.0, "local": 15.0, "hf": 2.0, "hf_liger": 3.0,
                              "hf_compile": 60.0, "torchtitan": 10.0},
            "tflops": {"ours": 500.0, "local": 220.0, "hf": 480.0, "hf_liger": 520.0,
                       "hf_compile": 500.0, "torchtitan": 450.0}}

# Planning guess: the first step of a model with a sliding window or attention sinks (gpt-oss)
# compiles flex attention's kernels (forward and backward, a set per window) on our side and in
# the HF peer; added while no run of that family on that side is recorded.
FLEX_COMPILE_S = 45.0

# Planning guesses: a variant's step time relative to the default run's (1.0 = same).
SLOWDOWN = {"RECOMPUTE=full": 1.35, "RECOMPUTE=selective": 1.05, "NATIVE_KERNELS=torch": 1.15,
            "CROSS_ENTROPY_LOSS_FUSION": 1.05, "GRADIENT_ACCUMULATION_FUSION": 1.03}


@dataclass
class Calibration:
    overhead_s: dict = field(default_factory=lambda: dict(FALLBACK["overhead_s"]))
    first_extra_s: dict = field(default_factory=lambda: dict(FALLBACK["first_extra_s"]))
    tflops: dict = field(default_factory=lambda: dict(FALLBACK["tflops"]))
    sources: dict = field(default_factory=dict)   # "what.side" -> the JSON it came from

    def describe(self) -> str:
        lines = []
        for what in ("overhead_s", "first_extra_s", "tflops"):
            for side, value in getattr(self, what).items():
                src = self.sources.get(f"{what}.{side}", "fallback guess")
                lines.append(f"  {what:14s} {side:31s} {value:7.1f}  ({src})")
        return "\n".join(lines)


def _side_of(point: dict) -> str | None:
    config = point.get("config") or point.get("name")
    if config in ("default", "native"):
        return "ours"
    if config in ("local", "hf", "hf_liger", "hf_compile", "torchtitan"):
        return config
    return None


def calibrate(bench_dir: Path) -> Calibration:
    """Overheads, first-step extras and TFLOP/s per side from recorded points (newest first)."""
    cal = Calibration()
    seen: dict[str, dict[str, list[float]]] = {}
    files = sorted(Path(bench_dir).glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    for path in files:
        try:
            data = saved_result(path)
        except RecordError:
            continue
        if data.get("kind") not in ("peers", "toggles", "levers"):
            continue
        for point in data.get("points", []):
            side = _side_of(point)
            samples = point.get("samples") or {}
            times, warm = samples.get("step_time_s") or [], samples.get("warmup") or []
            steady = [t for t, w in zip(times, warm) if not w]
            if side is None or not steady or not point.get("model_tflops_per_gpu"):
                continue
            shape = data.get("shape") if isinstance(data.get("shape"), dict) else {}
            family = shape.get("family") or "llama3"
            keys = [side, _key(side, family, point.get("backend") or "native")]
            for key in keys:
                bucket = seen.setdefault(key, {"overhead_s": [], "first_extra_s": [],
                                               "tflops": [], "src": path.name})
                if point.get("wall_s"):
                    bucket["overhead_s"].append(point["wall_s"] - sum(times))
                bucket["first_extra_s"].append(times[0] - statistics.fmean(steady))
                bucket["tflops"].append(point["model_tflops_per_gpu"])
    for side, bucket in seen.items():
        for what in ("overhead_s", "first_extra_s", "tflops"):
            if bucket[what]:
                getattr(cal, what)[side] = statistics.median(bucket[what])
                cal.sources[f"{what}.{side}"] = bucket["src"]
    return cal


def _key(side: str, family: str, backend: str) -> str:
    """The calibration key of one side and model family: ours also by backend (a peer has
    one)."""
    return f"{side}:{backend}:{family}" if side == "ours" else f"{side}:{family}"


def _figure(cal: Calibration, what: str, spec: PointSpec) -> float:
    """A calibration figure for the spec: its side's at its model family (and our launcher's
    at its backend) where recorded, else the side's pooled one, else the fallback."""
    side = _plan_side(spec)
    figures = getattr(cal, what)
    backend = spec.env.get("TRANSFORMER_IMPL") or spec.shape.backend or "native"
    key = _key(side, spec.shape.family, backend)
    if key in figures:
        return figures[key]
    return figures.get(side, FALLBACK[what].get(side, FALLBACK[what]["ours"]))


def step_seconds(spec: PointSpec, cal: Calibration) -> float:
    shape, env = spec.shape, spec.env
    preset = PRESETS[shape.preset]
    seq = int(env.get("SEQ_LENGTH", shape.seq_length))
    model = Model.of(preset, shape.num_layers, seq)
    tflops = _figure(cal, "tflops", spec)
    seconds = shape.global_batch * seq * flops_per_token(model) / (shape.gpus * tflops * 1e12)
    return seconds * SLOWDOWN.get(spec.config, 1.0) * (1.05 if shape.dp > 1 else 1.0)


def _plan_side(spec: PointSpec) -> str:
    if spec.side != "ours":
        return spec.side
    return "local" if spec.env.get("TRANSFORMER_IMPL") == "local" else "ours"


def _flex_compile_s(spec: PointSpec, cal: Calibration) -> float:
    preset = PRESETS[spec.shape.preset]
    if not (getattr(preset, "sliding_window", None) or getattr(preset, "attention_sinks", False)):
        return 0.0
    backend = spec.env.get("TRANSFORMER_IMPL") or spec.shape.backend or "native"
    recorded = _key(_plan_side(spec), spec.shape.family, backend) in cal.first_extra_s
    return 0.0 if recorded else FLEX_COMPILE_S


def estimate(spec: PointSpec, cal: Calibration) -> float:
    iters = spec.shape.warmup + spec.shape.steps
    return (_figure(cal, "overhead_s", spec) + _figure(cal, "first_extra_s", spec)
            + _flex_compile_s(spec, cal) + iters * step_seconds(spec, cal))


def format_plan(title: str, specs: list[PointSpec], skipped: list[tuple[str, str, str]],
                cal: Calibration, budget_s: float) -> str:
    """The plan as text: each run with its estimate, then the levers that need no run."""
    total = sum(estimate(s, cal) for s in specs)
    lines = [title, f"{len(specs)} runs, estimated {total:.0f} s ({total / 60:.1f} min); "
                    f"budget {budget_s:.0f} s" + ("" if total <= budget_s else
                                                  "  ** over budget: the loop stops early **"),
             "", "  #  label                                  est s  changes"]
    for spec in specs:
        changes = {k: v for k, v in spec.env.items() if k not in spec.shape.env()
                   or spec.shape.env()[k] != v}
        lines.append(f"{spec.index + 1:3d}  {spec.label:38s} {estimate(spec, cal):6.0f}  "
                     f"{spec.side}{' ' + ' '.join(f'{k}={v}' for k, v in changes.items()) if changes else ''}")
    if skipped:
        lines += ["", "Not run (decided before any GPU work):"]
        lines += [f"  {cid}: {status}: {msg}" for cid, status, msg in skipped]
    lines += ["", "Estimate inputs (overhead = wall minus step times of a recorded run):",
              cal.describe()]
    return "\n".join(lines)
