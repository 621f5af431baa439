"""One measured point of ours: the real launcher (examples/llama/train_llama3.sh) in a
subprocess, read back from the run folder it writes (manifest.json and metrics.jsonl)."""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from training.metrics import read_metrics

from .record import REPO


def run_point(label: str, toggles: dict[str, str], experiment_dir: Path, log_dir: Path,
              family: str = "llama3", timeout_s: int = 900) -> dict:
    """Launch once with `toggles` (env overrides); return the point's record."""
    env = dict(os.environ)
    env.update({k: str(v) for k, v in toggles.items()})
    env.update(EXPERIMENT_DIR=str(experiment_dir), EXP_NAME=label, RUN_ID=f"{int(time.time())}")
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{label}.log"
    script = REPO / "examples" / "llama" / f"train_{family}.sh"
    started = time.time()
    with log.open("w") as out:
        proc = subprocess.run(["bash", str(script)], env=env, stdout=out, stderr=subprocess.STDOUT,
                              timeout=timeout_s)
    point = {"label": label, "side": "ours", "toggles": toggles, "returncode": proc.returncode,
             "wall_s": time.time() - started, "log": str(log)}
    runs = sorted((experiment_dir / label).glob("*/*/manifest.json"))
    if proc.returncode != 0 or not runs:
        point["error"] = _tail(log)
        return point
    manifest = json.loads(runs[-1].read_text())
    metrics = read_metrics(runs[-1].parent / "metrics.jsonl")
    steps = [m for m in metrics if "step_time_s" in m]
    summary = (manifest.get("run") or {}).get("summary") or {}
    point.update({
        "run_dir": str(runs[-1].parent),
        "backend": manifest["backend"],
        "precision": manifest["precision"],
        "layout": manifest["layout"],
        "toggles_resolved": {row["toggle"]: row["value"] for row in manifest["toggles"]},
        "native": (manifest.get("run") or {}).get("native"),
        "summary": summary,
        "samples": {"iteration": [m["iteration"] for m in steps],
                    "step_time_s": [m["step_time_s"] for m in steps],
                    "warmup": [m["warmup"] for m in steps],
                    "loss": [m["loss"] for m in steps]},
        "tokens_per_s_per_gpu": summary.get("tokens_per_s_per_gpu"),
        "model_tflops_per_gpu": summary.get("model_tflops_per_gpu"),
        "peak_memory_gib": summary.get("peak_allocated_gib_max_over_ranks"),
        "optimizer_state": _optimizer_state(manifest),
    })
    return point


def _optimizer_state(manifest: dict) -> str:
    values = manifest["values"]
    dist = "sharded over DP (distributed optimizer)" if values.get("DISTRIBUTED_OPTIMIZER") \
        else "replicated"
    grads = "bf16" if values.get("GRAD_REDUCE_IN_BF16") else "fp32"
    return f"fp32 main params + fp32 Adam moments, {dist}; bf16 model params; {grads} grads"


def _tail(path: Path, lines: int = 30) -> str:
    text = path.read_text(errors="replace").splitlines()
    return "\n".join(text[-lines:])
