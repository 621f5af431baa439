"""One measured point of ours: the real launcher (the family's entry script, e.g.
examples/llama/train_llama3.sh) in a subprocess, read back from the run folder it writes (manifest.json and metrics.jsonl).

precheck() resolves the same launch in-process first (DRY_RUN: the launcher's own resolve,
guards included, no GPU): a refused lever costs no launch, and a guard's corrections are
known before anything runs.
"""
from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

from training import REPO_ROOT
from training.launch.toggles import BY_NAME
from training.metrics import read_metrics
from training.launch.runfolder import read_manifest
from training.records import RunManifest, validate
from training.run_description import RunDescription

# Registry toggles that may come from the caller's environment; every other toggle in the
# environment is dropped so a stray GRAD_REDUCE_IN_BF16=0 in a shell cannot skew a baseline.
INHERITED_TOGGLES = ("MASTER_ADDR", "MASTER_PORT", "PLATFORM", "NNODES", "NODE_RANK")


def clean_environ(environ: dict[str, str] | None = None) -> tuple[dict[str, str], list[str]]:
    """The caller's environment without registry toggles; returns (env, dropped names)."""
    environ = dict(os.environ if environ is None else environ)
    dropped = sorted(k for k in environ if k in BY_NAME and k not in INHERITED_TOGGLES)
    for name in dropped:
        del environ[name]
    return environ, dropped


class NotRunnable(Exception):
    """An ours-peer side that cannot run on this machine (the message says why)."""


def python_path_without_te(environ: dict[str, str] | None = None) -> str:
    """PYTHONPATH with the entries Transformer Engine imports from taken out (the TE carry's
    /tmp/tesite on the lent GPU machine); NotRunnable where TE does not import, or imports
    from the interpreter's own site-packages, where no PYTHONPATH hides it."""
    spec = importlib.util.find_spec("transformer_engine")
    if spec is None or not spec.submodule_search_locations:
        raise NotRunnable("Transformer Engine does not import here: nothing to take off")
    package = Path(list(spec.submodule_search_locations)[0]).resolve()
    entries = (environ if environ is not None else os.environ).get("PYTHONPATH", "")
    entries = [e for e in entries.split(os.pathsep) if e]
    kept = [e for e in entries if Path(e).resolve() != package.parent]
    if len(kept) == len(entries):
        raise NotRunnable(f"Transformer Engine imports from {package.parent}, which is not on "
                          "PYTHONPATH: it cannot be taken off the path for one run")
    path = os.pathsep.join(kept)
    # a second copy (site-packages, another entry) would make the run measure TE again
    probe = subprocess.run(
        [sys.executable, "-c", "import importlib.util as u; "
         "s = u.find_spec('transformer_engine'); print(s.origin if s else '')"],
        env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True, timeout=120)
    still = probe.stdout.strip()
    if probe.returncode != 0 or still:
        raise NotRunnable(f"Transformer Engine still imports without {package.parent} on the "
                          f"path ({still or probe.stderr.strip()[-200:]})")
    return path


def family_layers(family: str) -> list:
    """The recipe layers a family's entry point resolves with (the MoE family's toggles and
    guards: training/moe/layer.py); none for the core's families."""
    from training.moe.presets import MOE_FAMILIES

    if family == "gpt_oss":
        from training.moe.gpt_oss import GPT_OSS
        from training.moe.layer import MOE

        return [MOE, GPT_OSS]
    if family in MOE_FAMILIES:
        from training.moe.layer import MOE

        return [MOE]
    return []


def precheck(toggles: dict[str, str], family: str = "llama3",
             environ: dict[str, str] | None = None) -> dict:
    """Resolve the launch as the launcher would (DRY_RUN=1, with the memory pre-flight the
    example scripts run): refused, or the resolved values and every correction a guard made."""
    from training.launch.resolve import resolve
    from training.launch.settings import LaunchError, fmt_value
    from training.optimize.preflight import check

    env, _ = clean_environ(environ)
    env.update({k: str(v) for k, v in toggles.items()})
    env["DRY_RUN"] = "1"
    try:
        with warnings.catch_warnings():  # Megatron's import-time notices (no TE/apex here)
            warnings.simplefilter("ignore")
            launch = resolve(family, env, layers=family_layers(family))
            check(launch)
    except LaunchError as err:
        return {"status": "refused", "message": str(err)}
    values = launch.settings.values
    return {"status": "ok",
            "values": {name: fmt_value(s.value) for name, s in values.items()},
            "corrections": [{"toggle": name, "value": fmt_value(s.value), "reason": s.reason}
                            for name, s in values.items() if s.source == "guard"],
            "layout": {k: v for k, v in launch.run.layout.to_dict().items()
                       if k in ("tp", "pp", "dp", "world_size")}}


def _rows_from(manifest: dict, source: str) -> list[dict]:
    """The manifest's toggle rows set by `source` (guard: a guard's correction; recipe: a recipe
    layer's value, e.g. the MoE launch's lean step), as {toggle, value, reason}."""
    return [{"toggle": row["toggle"], "value": row["value"], "reason": row.get("reason", "")}
            for row in manifest["toggles"] if row.get("source") == source]


def run_logged(cmd: list[str], env: dict[str, str], log: Path, timeout_s: float,
               cwd: Path = REPO_ROOT) -> tuple[int, bool]:
    """Run cmd with its output in `log`; on timeout end its whole process group (torchrun
    and its workers). Returns (returncode, timed_out)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    from training.safe_files import open_write

    with open_write(log, "run log") as out:
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            return proc.wait(timeout=timeout_s), False
        except subprocess.TimeoutExpired:
            for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
            return proc.returncode if proc.returncode is not None else -9, True


def run_point(label: str, toggles: dict[str, str], experiment_dir: Path, log_dir: Path,
              family: str = "llama3", timeout_s: float = 900) -> dict:
    """Launch once with `toggles` (env overrides); return the point's record."""
    env, _ = clean_environ()
    env.update({k: str(v) for k, v in toggles.items()})
    run_id = f"{int(time.time() * 1000)}"
    env.update(EXPERIMENT_DIR=str(experiment_dir), EXP_NAME=label, RUN_ID=run_id)
    log = log_dir / f"{label}.log"
    from training.launch.presets import SCRIPTS

    script = REPO_ROOT / SCRIPTS[family]
    save = None
    if env.get("SAVE_INTERVAL") and not env.get("SAVE"):   # a part that measures saves: its
        save = experiment_dir / label / f"ckpt-{run_id}"  # own folder, removed after the run
        env["SAVE"] = str(save)
    started = time.time()
    returncode, timed_out = run_logged(["bash", str(script)], env, log, timeout_s)
    ended = time.time()
    point = {"label": label, "side": "ours", "toggles": toggles, "returncode": returncode,
             "wall_s": ended - started, "started": started, "ended": ended, "log": str(log)}
    if save is not None:
        import shutil

        point["save_dir"] = str(save)
        shutil.rmtree(save, ignore_errors=True)   # a full model's checkpoints fill the disk
    runs = sorted((experiment_dir / label).glob(f"*/{run_id}/manifest.json"))
    if returncode == 2 and not timed_out:
        # The launcher refused (a guard or a bad value) before any GPU work.
        lines = _tail(log, 60).splitlines()
        first = next((i for i, line in enumerate(lines) if line.startswith("error:")), 0)
        point["refusal"] = point["error"] = "\n".join(lines[first:])
        return point
    if returncode != 0 or not runs:
        point["error"] = (f"timed out after {timeout_s:.0f} s\n" if timed_out else "") + _tail(log)
        return point
    point.update(read_run(runs[-1].parent))
    point["startup"] = startup_breakdown(point, (point.pop("timeline", None) or {}))
    return point


def startup_breakdown(point: dict, timeline: dict) -> dict | None:
    """Where a launch's wall time went besides the steps, in seconds: launcher and torchrun
    until the worker's first line, Python imports (split into torch's and the rest's where the
    run recorded when torch was in), Megatron's initialise + model, dataset and optimizer build
    until the first step, the steps, and the end (summary, teardown)."""
    keys = ("worker_start", "imports_done", "first_step_start", "training_done")
    if not all(timeline.get(k) for k in keys) or not point.get("started"):
        return None
    names = ["launcher_and_torchrun_s", "imports_s", "init_to_first_step_s", "training_s",
             "finish_and_exit_s"]
    if timeline.get("torch_imported"):
        keys = ("worker_start", "torch_imported", *keys[1:])
        names[1:2] = ["torch_import_s", "megatron_and_project_imports_s"]
    t = [point["started"], *(timeline[k] for k in keys), point["ended"]]
    return {name: round(b - a, 3) for name, a, b in zip(names, t, t[1:])}


def read_run(run: Path) -> dict:
    """A finished run folder -> the fields a benchmark point records."""
    manifest = read_manifest(run)
    validate(manifest, RunManifest, run / "manifest.json")
    described = RunDescription.from_dict(manifest)
    metrics = read_metrics(run / "metrics.jsonl")
    steps = [m for m in metrics if "step_time_s" in m]
    summary = (manifest.get("run") or {}).get("summary") or {}
    out = {
        "run_dir": str(run),
        "backend": described.backend,
        "precision": described.precision,
        "layout": described.layout.to_dict(),
        "toggles_resolved": {row["toggle"]: row["value"] for row in manifest["toggles"]},
        "corrections": _rows_from(manifest, "guard"),
        "layer_values": _rows_from(manifest, "recipe"),   # a family layer's defaults (MoE)
        "native": (manifest.get("run") or {}).get("native"),
        "transformer_engine": (manifest.get("run") or {}).get("transformer_engine"),
        "timeline": (manifest.get("run") or {}).get("timeline"),
        "summary": summary,
        "samples": {"iteration": [m["iteration"] for m in steps],
                    "step_time_s": [m["step_time_s"] for m in steps],
                    "warmup": [m["warmup"] for m in steps],
                    "loss": [m["loss"] for m in steps],
                    "time": [m.get("time") for m in steps]},
        "tokens_per_s_per_gpu": summary.get("tokens_per_s_per_gpu"),
        "model_tflops_per_gpu": summary.get("model_tflops_per_gpu"),
        "peak_memory_gib": summary.get("peak_allocated_gib_max_over_ranks"),
        "optimizer_state": optimizer_state(described),
    }
    interval = described.get("SAVE_INTERVAL") if described.get("SAVE") else None
    if interval:
        out["save_cost"] = save_cost(out["samples"], int(interval))
    if not summary.get("measured", bool(summary)):
        out["error"] = f"no steady-state figure: {summary.get('reason', 'summary missing')}"
    return out


def save_cost(samples: dict, interval: int) -> dict:
    """What a checkpoint costs the step, from a run's per-iteration records: the wall time
    from iteration k's record to k+1's holds step k+1 and, where k was saved (k a multiple of
    SAVE_INTERVAL), the save. `extra_s`: each such interval after a save less the median of
    the measured intervals after no save (the last iteration's save is after the last record:
    not seen here)."""
    import statistics

    its, times, warm = samples["iteration"], samples["time"], samples["warmup"]
    gaps = {b: tb - ta for a, b, ta, tb in zip(its, its[1:], times, times[1:])
            if ta is not None and tb is not None and b == a + 1}
    after = {b: gap for b, gap in gaps.items() if (b - 1) % interval == 0}
    plain = [gap for b, gap in gaps.items() if b not in after
             and not warm[its.index(b)] and not warm[its.index(b - 1)]]
    base = statistics.median(plain) if plain else None
    return {"interval": interval, "iterations": list(gaps), "wall_gap_s": list(gaps.values()),
            "after_a_save": sorted(after), "plain_gap_median_s": base,
            "extra_s": [after[b] - base for b in sorted(after)] if base is not None else []}


MASTER_TEXT = {"fp32": "fp32 main params", "remainder": "fp32 master as 16-bit remainders",
               "stochastic": "no master (bf16 params, stochastic rounding)"}


def optimizer_state(run: RunDescription) -> str:
    dist = "sharded over DP (distributed optimizer)" if run.get("DISTRIBUTED_OPTIMIZER") \
        else "replicated"
    grads = "bf16" if run.get("GRAD_REDUCE_IN_BF16") else "fp32"
    if run.get("OPTIMIZER_CPU_OFFLOAD"):
        share = float(run.get("OPTIMIZER_OFFLOAD_FRACTION") or 1.0)
        return (f"fp32 main params + fp32 Adam moments, {share:.0%} of them on the CPU "
                f"(CPU offload), {dist}; bf16 model params; {grads} grads")
    master = MASTER_TEXT[run.get("MASTER_WEIGHTS") or "fp32"]
    moments = run.get("ADAM_MOMENTS_DTYPE") or "fp32"
    return f"{master} + {moments} Adam moments, {dist}; bf16 model params; {grads} grads"


def _tail(path: Path, lines: int = 30) -> str:
    text = path.read_text(errors="replace").splitlines()
    return "\n".join(text[-lines:])
