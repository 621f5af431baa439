"""The rehearsal: a run killed three times, restarted by the launcher, extended once, against
the same run uninterrupted; losses and final weights must be equal bit for bit.

    python -m training.resilience.rehearsal --out DIR [--iters 40] [--extend 60]
        [--save-interval 5] [--seed N] [KEY=VALUE ...]

Two runs of examples/llama/train_llama3.sh (MODEL_SIZE=tiny on the shipped corpus unless the
words say otherwise; data/shakespeare from `make data-sample`), side by side on this node:
  reference   --iters straight, saved, then extended to --extend (LOAD=SAVE, TOTAL_ITERS
              larger: the learning-rate schedule is pinned by WARMUP_ITERS and
              LR_DECAY_ITERS=--extend, so the checkpoint's schedule is the extension's)
  rehearsal   the same, with RESTARTS=5 and three SIGKILLs of the worker at random points
              (drawn from --seed): one at an iteration in each third of the run, the middle one
              during a save (after the save's folder appears and before its metadata.json,
              the file a complete distributed checkpoint writes last); the launcher's
              supervisor restarts it each time from the last complete checkpoint
Then: every iteration's loss (metrics.jsonl; a repeated iteration's last record) and every
tensor of the final checkpoints (model and optimizer) equal; three restarts recorded in
restarts.jsonl; no Traceback in any log; every iteration present. The verdict is
DIR/rehearsal.json; exit 0 when it passes, 1 when not.
"""
from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from training import REPO_ROOT, cli, safe_files
from training.resilience import heartbeat
from training.checkpoint_scan import incomplete_reason

SCRIPT = REPO_ROOT / "examples" / "llama" / "train_llama3.sh"
SAMPLE = REPO_ROOT / "data" / "shakespeare" / "train"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(out: Path, name: str, iters: int, extend: int, save_interval: int,
           words: list[str], **toggles) -> subprocess.Popen:
    """One launch of the example script into out/<name>/ (its run folder, its checkpoints)."""
    side = out / name.split("-")[0]
    env = dict(os.environ, MODEL_SIZE="tiny", GPUS_PER_NODE="1", DATA_PATH=str(SAMPLE),
               EVAL_ITERS="0", LR="1e-3", MIN_LR="1e-4", WARMUP_ITERS="3",
               LR_DECAY_ITERS=str(extend), TOTAL_ITERS=str(iters),
               SAVE=str(side / "ckpt"), LOAD=str(side / "ckpt"), RESUME="auto",
               SAVE_INTERVAL=str(save_interval), LOG_DIR=str(out / name),
               DATA_CACHE_PATH=str(side / "data_cache"), MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(_free_port()), TEE_OUTPUT="0", PREFLIGHT_MEMORY="off")
    env.update({k: str(v) for k, v in toggles.items()})
    return subprocess.Popen(["bash", str(SCRIPT), *words], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, what: str, timeout_s: float) -> None:
    try:
        _, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        raise RuntimeError(f"{what}: no end after {timeout_s:.0f} s\n{err[-3000:]}") from None
    if proc.returncode != 0:
        raise RuntimeError(f"{what}: exit {proc.returncode}\n{err[-3000:]}")


class Killer(threading.Thread):
    """SIGKILLs the run's worker (rank 0, from its heartbeat) at each planned point."""

    def __init__(self, run_dir: Path, ckpt: Path, points: list[tuple[int, str]],
                 save_interval: int):
        super().__init__(daemon=True)
        self.run_dir, self.ckpt, self.points = run_dir, ckpt, points
        self.save_interval = save_interval
        self.done: list[dict] = []
        self.stop = False

    def beat(self) -> heartbeat.Beat | None:
        return heartbeat.read_beats(self.run_dir).get(0)

    def run(self) -> None:
        since = 0.0
        for at, how in self.points:
            while not self.stop:
                beat = self.beat()
                if beat is not None and beat.time > since and beat.iteration is not None:
                    if how == "iteration" and beat.iteration >= at and beat.phase == "step":
                        self.kill(beat, how, None)
                        break
                    if how == "save" and beat.iteration >= at and beat.phase == "save":
                        folder = self.ckpt / f"iter_{beat.iteration:07d}"
                        if self.kill_in_save(beat, folder):
                            break
                        since = beat.time          # missed this save: the next one
                time.sleep(0.002)
            since = time.time()

    def kill_in_save(self, beat: heartbeat.Beat, folder: Path) -> bool:
        """Kill once the save's folder holds files and before its metadata.json; after two
        saves missed that way (a tiny model's save is quick), at the save's start."""
        self.missed = getattr(self, "missed", 0)
        if self.missed >= 2:
            self.kill(beat, "save", folder)
            return True
        deadline = time.time() + 30
        while time.time() < deadline and not self.stop:
            if incomplete_reason(folder) is None:
                self.missed += 1
                return False
            if folder.is_dir() and any(folder.iterdir()):
                self.kill(beat, "save", folder)
                return True
            time.sleep(0.0005)
        return False

    def kill(self, beat: heartbeat.Beat, how: str, folder: Path | None) -> None:
        pid = _worker_pid(self.run_dir)
        os.kill(pid, signal.SIGKILL)
        self.done.append({"how": how, "iteration": beat.iteration, "pid": pid,
                          "save_folder": str(folder) if folder else None,
                          "save_files_at_kill": sorted(p.name for p in folder.iterdir())
                          if folder and folder.is_dir() else [] if folder else None,
                          "save_complete_at_kill": incomplete_reason(folder) is None
                          if folder else None, "time": time.time()})


def _worker_pid(run_dir: Path) -> int:
    data = json.loads((run_dir / heartbeat.BEATS_DIR / "rank0.json").read_text())
    return int(data["pid"])


def plan(seed: int, iters: int, save_interval: int) -> list[tuple[int, str]]:
    """Three kill points, one in each third of the run; the middle one during a save."""
    rng = random.Random(seed)
    third = iters // 3
    first = rng.randint(2, third - 1)
    middle = rng.randint(third + 1, 2 * third - save_interval)
    last = rng.randint(2 * third + 2, iters - 2)
    return [(first, "iteration"), (middle, "save"), (last, "iteration")]


def losses(*run_dirs: Path) -> dict[int, float]:
    """iteration -> loss; a repeated iteration (redone after a restart) keeps its last record."""
    found: dict[int, float] = {}
    for run_dir in run_dirs:
        for line in (run_dir / "metrics.jsonl").read_text().splitlines():
            record = json.loads(line)
            if record.get("loss") is not None:
                found[record["iteration"]] = record["loss"]
    return found


def tensors_differ(a: Path, b: Path) -> list[str]:
    """Every tensor of two distributed checkpoints (model and optimizer) compared bit for bit:
    the keys that differ (or exist in one only)."""
    import torch

    from training.checkpoint.convert import single_process_group
    from training.checkpoint.megatron import DistCheckpointReader

    with single_process_group():
        readers = [DistCheckpointReader(a), DistCheckpointReader(b)]
        keys = sorted(set(readers[0].metadata) | set(readers[1].metadata))
        bad = [k for k in keys if k not in readers[0].metadata or k not in readers[1].metadata]
        for key in keys:
            if key in bad:
                continue
            x, y = (r.read([(key, None)])[0] for r in readers)
            if x.dtype != y.dtype or x.shape != y.shape or not torch.equal(_bits(x), _bits(y)):
                bad.append(key)
        for reader in readers:
            reader.close()
    return bad


def _bits(tensor):
    """A tensor's bytes (a float's bit pattern: -0.0 and NaN payloads compare as bits)."""
    import torch

    flat = tensor.contiguous().reshape(-1)
    return flat.view(torch.uint8) if flat.dtype.is_floating_point else flat


def tracebacks(*run_dirs: Path) -> dict[str, int]:
    found = {}
    for run_dir in run_dirs:
        for log in run_dir.glob("*.log"):
            count = log.read_text(errors="replace").count("Traceback")
            if count:
                found[str(log)] = count
    return found


def rehearse(out: Path, iters: int, extend: int, save_interval: int, seed: int,
             words: list[str], timeout_s: float = 420) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    points = plan(seed, iters, save_interval)
    started = time.time()
    ref = launch(out, "reference-run", iters, extend, save_interval, words)
    reh = launch(out, "rehearsal-run", iters, extend, save_interval, words, RESTARTS=5,
                 RESTART_BACKOFF=1)
    killer = Killer(out / "rehearsal-run", out / "rehearsal" / "ckpt", points, save_interval)
    killer.start()
    try:
        finish(ref, "the reference run", timeout_s)
        ref_ext = launch(out, "reference-extended", extend, extend, save_interval, words)
        finish(reh, "the rehearsal run", timeout_s)
    finally:
        killer.stop = True
    reh_ext = launch(out, "rehearsal-extended", extend, extend, save_interval, words)
    finish(ref_ext, "the reference's extension", timeout_s)
    finish(reh_ext, "the rehearsal's extension", timeout_s)

    a = losses(out / "reference-run", out / "reference-extended")
    b = losses(out / "rehearsal-run", out / "rehearsal-extended")
    restarts = [json.loads(x) for x in
                (out / "rehearsal-run" / "restarts.jsonl").read_text().splitlines()] \
        if (out / "rehearsal-run" / "restarts.jsonl").exists() else []
    final = f"iter_{extend:07d}"
    differ = tensors_differ(out / "reference" / "ckpt" / final,
                            out / "rehearsal" / "ckpt" / final)
    logs = tracebacks(*(out / n for n in ("reference-run", "reference-extended",
                                          "rehearsal-run", "rehearsal-extended")))
    checks = {
        "every_iteration_has_a_loss": sorted(b) == list(range(1, extend + 1)) == sorted(a),
        "losses_bitwise_equal": a == b,
        "final_tensors_bitwise_equal": not differ,
        "three_kills": len(killer.done) == 3,
        "one_kill_during_a_save": any(k["how"] == "save" and not k["save_complete_at_kill"]
                                      for k in killer.done),
        "three_restarts_recorded": [r["restart"] for r in restarts] == [True] * 3,
        "no_traceback": not logs,
    }
    first_diff = next((i for i in sorted(a) if a.get(i) != b.get(i)), None)
    verdict = {"passed": all(checks.values()), "checks": checks, "seed": seed,
               "plan": points, "kills": killer.done, "restarts": restarts,
               "tensors_differ": differ[:20], "tracebacks": logs,
               "first_loss_difference": None if first_diff is None else
               {"iteration": first_diff, "reference": a.get(first_diff),
                "rehearsal": b.get(first_diff)},
               "iters": iters, "extend": extend, "save_interval": save_interval,
               "words": words, "wall_s": time.time() - started}
    safe_files.write_text(out / "rehearsal.json", json.dumps(verdict, indent=1), "rehearsal verdict")
    return verdict


def main(argv: list[str] | None = None) -> int:
    parser = cli.ArgumentParser(prog="python -m training.resilience.rehearsal",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--iters", type=int, default=40)
    parser.add_argument("--extend", type=int, default=60)
    parser.add_argument("--save-interval", type=int, default=5)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("words", nargs="*", help="KEY=VALUE words for both runs")
    args = parser.parse_args(argv)
    if args.iters < 15 or args.extend <= args.iters:
        parser.error("--iters must be at least 15 and --extend above it")
    if not (SAMPLE.parent / "train.bin").exists() and not any(
            w.startswith("DATA_PATH=") for w in args.words):
        print("the shipped corpus is not built: run `make data-sample` first", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    verdict = rehearse(args.out, args.iters, args.extend, args.save_interval, seed, args.words)
    print(json.dumps({k: verdict[k] for k in ("passed", "checks", "seed", "plan", "kills",
                                              "first_loss_difference", "wall_s")}, indent=1))
    return 0 if verdict["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
