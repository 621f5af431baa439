"""The rehearsal on one GPU (training/resilience/rehearsal.py): the tiny model on the shipped
corpus, killed with SIGKILL at three random points (one during a save), restarted by the
launcher's supervisor each time (RESTARTS), then extended once, against the same run
uninterrupted beside it: every iteration's loss and every tensor of the final checkpoints
(weights and optimizer state) equal bit for bit, three restarts in restarts.jsonl, no
Traceback in any log, no iteration missing. dev/gpu/rehearsal.sh runs it."""
from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

from training.resilience.rehearsal import SAMPLE, rehearse

pytestmark = pytest.mark.gpu


def test_killed_three_times_restarted_and_extended_equals_the_run_uninterrupted(tmp_path):
    if not (SAMPLE.parent / "train.bin").exists():
        pytest.skip("the shipped corpus is not built: run `make data-sample` first")
    seed = int(os.environ.get("REHEARSAL_SEED") or random.SystemRandom().randrange(2**31))
    out = tmp_path / "rehearsal"
    verdict = rehearse(out, iters=40, extend=60, save_interval=5, seed=seed, words=[])
    print("\nrehearsal:", json.dumps({k: verdict[k] for k in (
        "passed", "checks", "seed", "plan", "kills", "first_loss_difference", "wall_s")},
        indent=1))
    if os.environ.get("OUT"):
        (Path(os.environ["OUT"]) / "rehearsal.json").write_text(
            json.dumps(verdict, indent=1))
    assert verdict["passed"], verdict["checks"]


def test_slurms_warning_signal_to_every_process_saves_and_exits_for_a_requeue(tmp_path):
    """SIGUSR2 (train.sbatch's --signal) sent to every process of a tiny run, as Slurm may send
    it: torchrun and the worker ignore it, the supervisor forwards SIGTERM to the worker, which
    saves at the next step and stops; the launch exits 75 with that checkpoint complete."""
    import signal
    import time

    from training.resilience import exits, heartbeat
    from training.resilience.rehearsal import finish, launch
    from training.resilience.supervise import _descendants

    if not (SAMPLE.parent / "train.bin").exists():
        pytest.skip("the shipped corpus is not built: run `make data-sample` first")
    proc = launch(tmp_path, "preempted-run", 2000, 2000, 1000, [])
    run = tmp_path / "preempted-run"
    deadline = time.time() + 240
    while time.time() < deadline:
        beat = heartbeat.read_beats(run).get(0)
        if beat is not None and (beat.iteration or 0) >= 5:
            break
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        time.sleep(0.05)
    for pid in [proc.pid, *_descendants(proc.pid)]:
        os.kill(pid, signal.SIGUSR2)
    with pytest.raises(RuntimeError, match=f"exit {exits.PREEMPTED}"):
        finish(proc, "the preempted run", 120)
    marker = json.loads((run / "preemption.json").read_text())
    saved = tmp_path / "preempted" / "ckpt" / f"iter_{marker['iteration']:07d}"
    assert (saved / "metadata.json").is_file() and marker["saved"]
    log = (run / "train.log").read_text()
    assert "[preemption] a stop signal arrived" in log and "exit 75" in log
    assert "Traceback" not in log
