"""Reading what the advisor works from: a run folder or a DRY_RUN manifest.

A run folder holds manifest.json (always), and when the run went on GPUs metrics.jsonl,
train.log, and, when profiled and reported, trace_report.json (in the folder or in its
profile/). Anything that cannot be read is a BadInput: one line, exit status 2.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Input the advisor cannot work from: the launcher's BadInput (one line, exit status 2).
from training.launch.settings import BadInput
from training.metrics import read_metrics
from training.reading import RecordError, read_json
from training.records import RunManifest, validate


# What an out-of-memory looks like in a train.log (torch's CUDA and HIP allocators, NCCL's
# and the generic RuntimeError wording).
OOM_PATTERN = re.compile(r"(CUDA|HIP) out of memory|OutOfMemoryError|out of memory",
                         re.IGNORECASE)


@dataclass
class RunInputs:
    run_dir: Path
    manifest_path: Path
    manifest: dict[str, Any]
    metrics: list[dict[str, Any]] = field(default_factory=list)
    metrics_path: Path | None = None
    trace_report: dict[str, Any] | None = None
    trace_report_path: Path | None = None
    log_path: Path | None = None
    oom_lines: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what was read around (a cut last line)

    @property
    def dry_run(self) -> bool:
        return bool(self.manifest.get("dry_run")) and "run" not in self.manifest

    @property
    def summary(self) -> dict[str, Any]:
        run = self.manifest.get("run") or {}
        return run.get("summary") or {}

    def measured_peak_gib(self) -> tuple[float | None, str | None]:
        """Peak allocated memory of the run (max over ranks) and where it was read."""
        value = self.summary.get("peak_allocated_gib_max_over_ranks")
        if isinstance(value, (int, float)):
            return float(value), "manifest.json run.summary.peak_allocated_gib_max_over_ranks"
        peaks = [m.get("mem_peak_allocated_gib") for m in self.metrics]
        peaks = [p for p in peaks if isinstance(p, (int, float))]
        if peaks:
            return max(peaks), "metrics.jsonl max(mem_peak_allocated_gib) (rank 0)"
        return None, None

    def measured_phase_peaks_gib(self) -> dict[str, float]:
        """Peak allocated memory per phase (forward_backward, optimizer_step, between_steps;
        max over ranks), where the run recorded it (training/loop_hooks.PhasePeaks); else {}."""
        phases = self.summary.get("peak_allocated_gib_by_phase")
        if not isinstance(phases, dict):
            return {}
        return {k: float(v) for k, v in phases.items() if isinstance(v, (int, float))}


def _find_manifest(path: Path) -> Path:
    if not path.exists():
        raise BadInput(f"{path}: no such file or folder (give a run folder or its manifest.json)")
    if path.is_file():
        if path.name != "manifest.json" and path.suffix != ".json":
            raise BadInput(f"{path}: not a manifest (give a run folder or its manifest.json)")
        return path
    direct = path / "manifest.json"
    if direct.is_file():
        return direct
    below = sorted(path.rglob("manifest.json"))
    if len(below) == 1:
        return below[0]
    if not below:
        raise BadInput(f"{path}: no manifest.json here or below: not a run folder (a launch, "
                       "or DRY_RUN=1 bash examples/llama/train_llama3.sh, writes one)")
    names = ", ".join(str(p.parent.relative_to(path)) for p in below[:3])
    raise BadInput(f"{path}: {len(below)} run folders below ({names}"
                   f"{', ...' if len(below) > 3 else ''}): name one")


REQUIRED_SECTIONS = ("model", "layout", "values", "toggles")


def load_run(path: str | Path) -> RunInputs:
    manifest_path = _find_manifest(Path(path))
    manifest = read_json(manifest_path, "launcher manifest")
    if not isinstance(manifest, dict):
        raise RecordError(f"{manifest_path}: the manifest is not a JSON object")
    missing = [k for k in REQUIRED_SECTIONS if not isinstance(manifest.get(k), (dict, list))]
    if missing:
        raise RecordError(f"{manifest_path}: not a launcher manifest (missing "
                       f"{', '.join(missing)}); write one with the launcher")
    validate(manifest, RunManifest, manifest_path)
    run_dir = manifest_path.parent
    inputs = RunInputs(run_dir=run_dir, manifest_path=manifest_path, manifest=manifest)

    metrics_path = run_dir / "metrics.jsonl"
    if metrics_path.is_file():
        inputs.metrics, inputs.metrics_path = read_metrics(metrics_path, inputs.notes), metrics_path

    for candidate in (run_dir / "trace_report.json", run_dir / "profile" / "trace_report.json"):
        if candidate.is_file():
            report = read_json(candidate, "trace report")
            if not isinstance(report, dict) or not isinstance(report.get("overall"), dict):
                raise RecordError(f"{candidate}: not a trace report (no 'overall' section; see "
                               "docs/profiling.md)")
            inputs.trace_report, inputs.trace_report_path = report, candidate
            break

    log_path = run_dir / "train.log"
    if log_path.is_file():
        inputs.log_path = log_path
        with log_path.open(errors="replace") as f:
            for line in f:
                if OOM_PATTERN.search(line):
                    inputs.oom_lines.append(line.strip()[:300])
    return inputs
