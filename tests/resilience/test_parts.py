"""The pieces of training/resilience on their own: the last complete checkpoint, the heartbeats'
reading and the hang diagnosis from faulthandler's stacks, the restart command, torchrun's
one-line failure, and the rehearsal's plan and comparisons (its GPU run:
tests/gpu/test_rehearsal_gpu.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from training.resilience import heartbeat, rehearsal
from training.resilience.supervise import Options, Supervisor, _last_complete, _without

REPO = Path(__file__).resolve().parents[2]


def _iter(save: Path, iteration: int, complete: bool = True) -> None:
    folder = save / f"iter_{iteration:07d}"
    folder.mkdir(parents=True)
    (folder / "__0_0.distcp").write_text("x")
    if complete:                       # DCP's index, then megatron's config: the last files
        (folder / ".metadata").write_text("x")
        (folder / "metadata.json").write_text('{"sharded_backend": "torch_dist"}')


def test_the_last_complete_checkpoint_passes_over_one_cut_short(tmp_path):
    assert _last_complete(tmp_path / "none") is None
    assert _last_complete(None) is None
    _iter(tmp_path, 10)
    _iter(tmp_path, 20)
    _iter(tmp_path, 30, complete=False)            # SIGKILL during the write
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("20")
    assert _last_complete(tmp_path) == 20
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("")   # killed in its write
    assert _last_complete(tmp_path) == 20


def test_a_torch_format_checkpoint_is_complete_when_its_archives_are_whole(tmp_path):
    """The launcher's rule (training.checkpoint_scan), not the marker's word: a torch-format
    checkpoint whose rank archive was cut short is passed over."""
    rank = tmp_path / "iter_0000005" / "mp_rank_00"
    rank.mkdir(parents=True)
    torch.save({"iteration": 5}, rank / "model_optim_rng.pt")
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("5")
    assert _last_complete(tmp_path) == 5
    data = (rank / "model_optim_rng.pt").read_bytes()
    (rank / "model_optim_rng.pt").write_bytes(data[:len(data) // 2])    # killed in the write
    assert _last_complete(tmp_path) is None


def test_a_restart_loads_the_last_complete_checkpoint_in_place_of_the_first_load(tmp_path,
                                                                                monkeypatch):
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable))   # this Python's own torchrun
    save = tmp_path / "ckpt"
    command = ["torchrun", "x.py", "--load", "/first", "--ckpt-step=3", "--lr", "1"]
    sup = Supervisor(Options(tmp_path, command, save=str(save)))
    first = sup.command_for(0)
    assert first[:3] == [sys.executable, "-m", "training.resilience.torchrun"]
    assert first[3:] == command[1:]
    assert sup.command_for(1)[3:] == command[1:]          # nothing saved yet: as at first
    _iter(save, 8)
    assert sup.command_for(1)[3:] == ["x.py", "--lr", "1", "--load", str(save),
                                      "--ckpt-step", "8"]
    assert _without(["--a", "1", "--b=2", "--c"], ("--a", "--b")) == ["--c"]


def test_another_torchrun_first_on_path_runs_as_it_is(tmp_path, monkeypatch):
    """A torchrun first on PATH that is not this Python's own (a site's wrapper, a test's
    stand-in) is the one the launch named: the supervisor runs it, not torch's module."""
    stand_in = tmp_path / "bin" / "torchrun"
    stand_in.parent.mkdir()
    stand_in.write_text("#!/bin/sh\n")
    stand_in.chmod(0o755)
    monkeypatch.setenv("PATH", f"{stand_in.parent}{os.pathsep}{os.path.dirname(sys.executable)}")
    command = ["torchrun", "x.py"]
    assert Supervisor(Options(tmp_path, command)).command_for(0) == command


def _beat(run: Path, rank: int, iteration, phase: str, t: float, world: int = 2) -> None:
    (run / "heartbeat").mkdir(parents=True, exist_ok=True)
    (run / "heartbeat" / f"rank{rank}.json").write_text(json.dumps(
        {"rank": rank, "world": world, "iteration": iteration, "phase": phase, "time": t,
         "main_thread": f"0x{rank + 1:016x}"}))


STACK = """Timeout (0:00:01)!
Thread 0x00007f0000000009 (most recent call first):
  File "/usr/lib/python3.12/threading.py", line 355 in wait
  File "/site/torch/utils/data/_utils/pin_memory.py", line 5 in _pin_memory_loop

Thread 0x{main:016x} (most recent call first):
{frames}
"""


def _stack(run: Path, rank: int, frames: list[str]) -> None:
    (run / "stacks").mkdir(parents=True, exist_ok=True)
    (run / "stacks" / f"rank{rank}.txt").write_text(STACK.format(
        main=rank + 1, frames="\n".join(f'  File "{f}' for f in frames)))


def test_the_diagnosis_names_the_rank_behind_its_frame_and_the_collective(tmp_path):
    _beat(tmp_path, 0, 41, "step", 1000.0)
    _beat(tmp_path, 1, 40, "step", 990.0)
    _stack(tmp_path, 0, ['/site/torch/distributed/c10d_logger.py", line 81 in wrapper',
                         '/site/torch/distributed/distributed_c10d.py", line 2806 in all_reduce',
                         '/site/megatron/core/distributed/param_and_grad_buffer.py", line 9 in '
                         'start_grad_sync'])
    _stack(tmp_path, 1, ['/repo/training/data/loader.py", line 12 in read_chunk',
                         '/repo/training/pretrain_gpt.py", line 135 in forward_step'])
    beats = heartbeat.read_beats(tmp_path)
    assert heartbeat.stalled_for(beats, 1100.0) == 100.0
    text = heartbeat.diagnose(beats, tmp_path, 60, now=1100.0)
    assert text.startswith("hang: no progress for 100 s (HANG_TIMEOUT=60): rank 1 behind "
                           "(after iteration 40; the others after iteration 41), rank 1 at "
                           "read_chunk (training/data/loader.py:12); the others wait in "
                           "all_reduce (torch/distributed/distributed_c10d.py:2806)"), text


def test_the_diagnosis_with_every_rank_in_one_collective_and_a_silent_rank(tmp_path):
    _beat(tmp_path, 0, 7, "save", 50.0, world=3)
    _beat(tmp_path, 1, 7, "save", 50.0, world=3)
    _stack(tmp_path, 0, ['/site/torch/distributed/distributed_c10d.py", line 9 in barrier'])
    text = heartbeat.diagnose(heartbeat.read_beats(tmp_path), tmp_path, 30, now=90.0)
    assert "rank 2 never reported (no heartbeat)" in text
    _beat(tmp_path, 2, 7, "save", 50.0, world=3)
    text = heartbeat.diagnose(heartbeat.read_beats(tmp_path), tmp_path, 30, now=90.0)
    assert "every rank saving after iteration 7; rank 0 in barrier (" in text, text


def test_nothing_is_watched_before_the_first_beat_or_after_every_rank_ended(tmp_path):
    assert heartbeat.stalled_for({}, 5.0) is None
    _beat(tmp_path, 0, 3, "end", 1.0)
    _beat(tmp_path, 1, 3, "end", 1.0)
    assert heartbeat.stalled_for(heartbeat.read_beats(tmp_path), 500.0) is None
    _beat(tmp_path, 1, 3, "step", 1.0)
    assert heartbeat.stalled_for(heartbeat.read_beats(tmp_path), 500.0) == 499.0
    assert heartbeat.read_beats(tmp_path, since=2.0) == {}     # an earlier attempt's


def test_the_writer_arms_faulthandler_and_disarms_it_at_the_end(tmp_path):
    script = f"""
import sys, time
sys.path.insert(0, {str(REPO)!r})
from training.resilience.heartbeat import HeartbeatWriter
w = HeartbeatWriter({str(tmp_path)!r}, 0, 1, timeout_s=0.3)
w.beat("step", 1)
def stuck_in_step():
    time.sleep(0.6)
stuck_in_step()
w.beat("end", 1)
time.sleep(0.5)
w.close()
"""
    subprocess.run([sys.executable, "-c", script], check=True, timeout=30)
    text = (tmp_path / "stacks" / "rank0.txt").read_text()
    assert text.count("Timeout (") == 1                      # once, and not after the end
    frames = heartbeat.main_thread_frames(
        text, json.loads((tmp_path / "heartbeat" / "rank0.json").read_text())["main_thread"])
    assert frames[0].func == "stuck_in_step"


def test_torchrun_reports_a_killed_worker_in_one_line_without_a_traceback(tmp_path):
    script = tmp_path / "die.py"
    script.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    proc = subprocess.run([sys.executable, "-m", "training.resilience.torchrun",
                           "--nproc-per-node", "1", "--master-port", "0", str(script)],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr, proc.stderr
    assert f"torchrun: {script} failed: rank 0 (pid " in proc.stderr
    assert ") killed by SIGKILL" in proc.stderr


def test_the_rehearsal_plan_has_a_kill_in_each_third_and_one_in_a_save():
    for seed in range(50):
        points = rehearsal.plan(seed, 40, 5)
        assert [how for _, how in points] == ["iteration", "save", "iteration"]
        at = [a for a, _ in points]
        assert 2 <= at[0] < 13 < at[1] <= 21 < at[2] <= 38, points
    assert rehearsal.plan(7, 40, 5) == rehearsal.plan(7, 40, 5)


def test_the_rehearsal_keeps_a_repeated_iterations_last_loss(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in (
        {"iteration": 1, "loss": 9.0}, {"iteration": 2, "loss": 8.0},
        {"iteration": 1, "loss": 9.5}, {"iteration": 2, "eval_loss": 1.0})) + "\n")
    assert rehearsal.losses(tmp_path) == {1: 9.5, 2: 8.0}


def _dist_checkpoint(folder: Path, tensors: dict) -> None:
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing import ShardedTensor

    folder.mkdir(parents=True)
    dist_checkpointing.save({k: ShardedTensor.from_rank_offsets(k, v, replica_id=0)
                             for k, v in tensors.items()}, str(folder))


def test_the_rehearsal_compares_checkpoints_bit_for_bit(tmp_path, monkeypatch):
    """Megatron's own dist-checkpoint save on the CPU (its writer's CUDA synchronize and
    device, and its spawned result queue, stood in for, as tests/distributed/ranks.py does)."""
    import queue

    from megatron.core.dist_checkpointing.strategies import filesystem_async

    from training.checkpoint.convert import single_process_group

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    monkeypatch.setattr(filesystem_async, "_results_queue", queue.Queue())

    w = torch.arange(12, dtype=torch.float32).reshape(3, 4) / 7
    flipped = w.clone()
    flipped.view(torch.int32)[1, 2] ^= 1                      # one bit of one value
    zero = torch.zeros(2, dtype=torch.bfloat16)
    with single_process_group():
        _dist_checkpoint(tmp_path / "a", {"w": w, "z": zero})
        _dist_checkpoint(tmp_path / "b", {"w": w.clone(), "z": zero.clone()})
        _dist_checkpoint(tmp_path / "c", {"w": flipped, "z": -zero})      # -0.0 == 0.0
        _dist_checkpoint(tmp_path / "d", {"w": w})
    assert rehearsal.tensors_differ(tmp_path / "a", tmp_path / "b") == []
    assert rehearsal.tensors_differ(tmp_path / "a", tmp_path / "c") == ["w", "z"]
    assert rehearsal.tensors_differ(tmp_path / "a", tmp_path / "d") == ["z"]


def test_the_rehearsal_finds_tracebacks_in_the_logs(tmp_path):
    (tmp_path / "train.log").write_text("ok\nTraceback (most recent call last):\n")
    (tmp_path / "third_party.log").write_text("fine\n")
    assert rehearsal.tracebacks(tmp_path) == {str(tmp_path / "train.log"): 1}
