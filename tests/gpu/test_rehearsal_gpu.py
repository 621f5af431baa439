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
