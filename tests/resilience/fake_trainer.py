"""A stand-in for `torchrun pretrain_gpt.py`, for the supervisor's tests: no torch, no GPU.

    python fake_trainer.py --run-dir RUN --ranks 2 --iters 8 [--save DIR --save-interval 2]
        [--load DIR --ckpt-step N] [--cues CUES.json] [--hang-timeout S]

With --under-torchrun a real torchrun starts the ranks (RANK, WORLD_SIZE). Otherwise the
parent plays torchrun: it starts one process per rank, each in a session of its own (as
torchrun does), and exits 0 when all succeed, 1 as soon as one fails (after killing the rest),
whatever the rank's own status. Each rank plays Megatron's loop: an iteration takes a few ms,
then a heartbeat (training.resilience.heartbeat, as the loop hooks write it); every
--save-interval iterations a "checkpoint" (iter_NNNNNNN/metadata.json, then the tracker);
SIGTERM saves at the next iteration's end and stops with status 0, rank 0 writing
preemption.json (as training.resilience.preemption does). Every iteration a rank runs is
appended to RUN/ran.rank<R>.txt.

Cues (a JSON list in --cues; a cue with "once" is used up when it fires, marked by a file
beside the list, so a restart passes it): {"at": 5, "rank": 0 (or "*": every rank), "do": "crash" | "user_error" | "hang" | "wait",
"once": true}.
hang sleeps in hang_here(); wait spins in all_reduce() (a collective that never completes).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from training.resilience import preemption  # noqa: E402
from training.resilience.heartbeat import HeartbeatWriter  # noqa: E402
from training.resilience.supervise import record_worker_exit  # noqa: E402

STEP_S = 0.01


def parse(argv):
    p = argparse.ArgumentParser()
    p.add_argument("--run-dir", required=True)
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--rank", type=int, default=None)
    p.add_argument("--iters", type=int, default=8)
    p.add_argument("--save", default=None)
    p.add_argument("--save-interval", type=int, default=0)
    p.add_argument("--load", default=None)
    p.add_argument("--ckpt-step", type=int, default=None)
    p.add_argument("--cues", default=None)
    p.add_argument("--hang-timeout", type=float, default=0)
    p.add_argument("--under-torchrun", action="store_true",
                   help="a rank started by a real torchrun (RANK, WORLD_SIZE)")
    args = p.parse_args(argv)
    if args.under_torchrun:
        args.rank, args.ranks = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return args


def parent(argv, args) -> int:
    procs = [subprocess.Popen([sys.executable, __file__, *argv, "--rank", str(r)],
                              start_new_session=True) for r in range(args.ranks)]
    while True:
        codes = [p.poll() for p in procs]
        if any(c not in (None, 0) for c in codes):
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
            return 1
        if all(c == 0 for c in codes):
            return 0
        time.sleep(0.01)


def cue_for(cues_path, rank: int, iteration: int):
    if not cues_path:
        return None
    cues = json.loads(Path(cues_path).read_text())
    for i, cue in enumerate(cues):
        if cue["at"] == iteration and cue.get("rank", 0) in (rank, "*"):
            fired = Path(f"{cues_path}.fired{i}")     # one file per cue: no rank races another
            if cue.get("once"):
                if fired.exists():
                    continue
                fired.touch()
            return cue["do"]
    return None


def save(folder: str, iteration: int) -> None:
    it = Path(folder) / f"iter_{iteration:07d}"
    it.mkdir(parents=True, exist_ok=True)
    (it / "__0_0.distcp").write_text("x")
    (it / ".metadata").write_text("x")                 # DCP's index, then megatron's config
    (it / "metadata.json").write_text('{"sharded_backend": "torch_dist"}')
    (Path(folder) / "latest_checkpointed_iteration.txt").write_text(str(iteration))


def hang_here() -> None:
    time.sleep(3600)


def all_reduce(run_dir: Path) -> None:
    while not (run_dir / "never").exists():
        time.sleep(0.01)


def rank_main(args) -> int:
    run_dir = Path(args.run_dir)
    stop = []
    signal.signal(signal.SIGTERM, lambda s, f: stop.append(s))
    beats = HeartbeatWriter(run_dir, args.rank, args.ranks, args.hang_timeout)
    start = args.ckpt_step if (args.load and args.ckpt_step) else 0
    beats.beat("start", start or None)
    ran = open(run_dir / f"ran.rank{args.rank}.txt", "a")
    for iteration in range(start + 1, args.iters + 1):
        cue = cue_for(args.cues, args.rank, iteration)
        if cue == "crash":
            raise SystemExit(1)
        if cue == "user_error":
            record_worker_exit(2)
            raise SystemExit(2)
        if cue == "hang":
            hang_here()
        time.sleep(STEP_S)
        ran.write(f"{iteration}\n")
        ran.flush()
        beats.beat("step", iteration)
        if cue == "wait":
            all_reduce(run_dir)
        if args.save and args.save_interval and iteration % args.save_interval == 0:
            beats.beat("save", iteration)
            if args.rank == 0:
                save(args.save, iteration)
        if stop:
            if args.rank == 0:
                if args.save:
                    save(args.save, iteration)
                preemption.write_marker(run_dir, iteration, args.save)
            beats.beat("end", iteration)
            return 0
    beats.beat("end", args.iters)
    beats.close()
    return 0


def main() -> int:
    argv = sys.argv[1:]
    args = parse(argv)
    if args.rank is None:
        return parent(argv, args)
    return rank_main(args)


if __name__ == "__main__":
    sys.exit(main())
