"""The workers' side of a preemption: which iteration a signal's save holds.

Megatron's --exit-signal-handler (always on, toggles.CLOSING_WORDS) catches SIGTERM on every
rank; at the next step boundary, checkpoint_and_decide_exit sees it on any rank (an all-gather),
saves when --save is set, and train() ends with sys.exit(0): a preempted run and a finished one
look alike to torchrun. The patch here (training.megatron_patches, `preemption_record`) tells
them apart: when the exit was the signal's, rank 0 writes <run>/preemption.json (the iteration,
whether it was saved and where) and prints one line; the supervisor turns it into the exit
status a scheduler requeues on (training.resilience.exits.PREEMPTED).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from training import safe_files

MARKER = "preemption.json"


def write_marker(run_dir: str | Path, iteration: int, save: str | None) -> Path:
    path = Path(run_dir) / MARKER
    safe_files.write_atomic(path, json.dumps({"iteration": iteration, "saved": bool(save),
                                              "save": save, "time": time.time()}),
                            "preemption record")
    return path


def read_marker(run_dir: str | Path) -> dict | None:
    try:
        data = json.loads((Path(run_dir) / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("iteration"), int) else None


def message(iteration: int, save: str | None) -> str:
    if save:
        return (f"[preemption] a stop signal arrived: iteration {iteration} is saved in {save}; "
                "the run stops here and resumes from it when started again with LOAD="
                f"{save}")
    return (f"[preemption] a stop signal arrived: the run stops after iteration {iteration} "
            "with nothing saved (no SAVE)")


def recorded_exit(original, run):
    """checkpoint_and_decide_exit: Megatron's decision, and when it is the exit signal's, the
    marker (rank 0) and the message."""

    def checkpoint_and_decide_exit(model, optimizer, opt_param_scheduler, iteration, *a, **kw):
        should_exit = original(model, optimizer, opt_param_scheduler, iteration, *a, **kw)
        if should_exit and run.args.exit_signal_handler and _signalled():
            if run.rank == 0:
                print(message(iteration, run.args.save), flush=True)
                if run.args.run_dir:
                    write_marker(run.args.run_dir, iteration, run.args.save)
            if run.heartbeat is not None:
                run.heartbeat.beat("end", iteration)
        return should_exit

    return checkpoint_and_decide_exit


def _signalled() -> bool:
    """Whether any rank received the exit signal (collective: every rank exits together, so
    every rank asks)."""
    from megatron.training.global_vars import get_signal_handler

    return any(get_signal_handler().signals_received())
