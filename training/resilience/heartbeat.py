"""Heartbeats: every rank says where it is, and the watchdog reads them.

Each rank writes <run>/heartbeat/rank<N>.json (replaced whole, never half-written) at the
points of Megatron's loop the hooks see (training.loop_hooks): training starts (`start`), an
iteration ends (`step`, with its number), a save or an evaluation begins (`save`, `eval`),
training ends (`end`). With HANG_TIMEOUT set, each beat also re-arms faulthandler's own timer
(faulthandler.dump_traceback_later): a rank that makes no beat for that long writes every
thread's Python stack to <run>/stacks/rank<N>.txt from a C thread, which works while Python
is stuck in a collective or a kernel launch.

The supervisor (training.resilience.supervise) reads the beats: when the newest beat of every
rank is older than HANG_TIMEOUT, the run has stopped making progress; `diagnose` names the rank
that is behind, the frame it is in and the collective the others wait in, from the beats and
the stacks. The standard library only: the fake trainers of the tests write beats too.
"""
from __future__ import annotations

import faulthandler
import json
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from training import safe_files

BEATS_DIR, STACKS_DIR = "heartbeat", "stacks"
# The order of a rank's phases within one iteration (the rank furthest back is the one with
# the lowest iteration, then the earliest phase).
PHASES = ("start", "step", "eval", "save", "end")
# torch.distributed's collectives and waits, as faulthandler names their frames
COLLECTIVES = frozenset((
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "reduce_scatter",
    "reduce_scatter_tensor", "broadcast", "broadcast_object_list", "barrier", "monitored_barrier",
    "all_to_all", "all_to_all_single", "send", "recv", "isend", "irecv", "batch_isend_irecv",
    "reduce", "gather", "scatter", "wait", "synchronize", "_wait_for_all"))


class HeartbeatWriter:
    """One rank's beats; `timeout_s` > 0 also arms the stack dump (HANG_TIMEOUT)."""

    def __init__(self, run_dir: str | Path, rank: int, world: int, timeout_s: float = 0):
        self.run_dir = Path(run_dir)
        self.rank, self.world, self.timeout_s = rank, world, float(timeout_s)
        (self.run_dir / BEATS_DIR).mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / BEATS_DIR / f"rank{rank}.json"
        self.main_thread = f"0x{threading.main_thread().ident:016x}"
        self.stacks = None
        if self.timeout_s > 0:
            (self.run_dir / STACKS_DIR).mkdir(parents=True, exist_ok=True)
            self.stacks = safe_files.open_write(self.run_dir / STACKS_DIR / f"rank{rank}.txt",
                                                "stack dump")

    def beat(self, phase: str, iteration: int | None) -> None:
        record = {"rank": self.rank, "world": self.world, "iteration": iteration,
                  "phase": phase, "time": time.time(), "pid": os.getpid(),
                  "main_thread": self.main_thread}
        safe_files.write_atomic(self.path, json.dumps(record), "heartbeat")
        if self.stacks is None:
            return
        if phase == "end":
            faulthandler.cancel_dump_traceback_later()
        else:
            faulthandler.dump_traceback_later(self.timeout_s, repeat=False, file=self.stacks)

    def close(self) -> None:
        if self.stacks is not None:
            faulthandler.cancel_dump_traceback_later()
            self.stacks.close()
            self.stacks = None


@dataclass(frozen=True)
class Beat:
    rank: int
    world: int
    iteration: int | None
    phase: str
    time: float
    main_thread: str = ""

    @property
    def position(self) -> tuple[int, int]:
        """Where the rank is in the run: (iteration, phase) compares furthest back first."""
        return (self.iteration if self.iteration is not None else -1,
                PHASES.index(self.phase) if self.phase in PHASES else 0)

    def where(self) -> str:
        if self.phase == "start" or self.iteration is None:
            return "before the first iteration"
        return {"step": f"after iteration {self.iteration}",
                "save": f"saving after iteration {self.iteration}",
                "eval": f"evaluating after iteration {self.iteration}",
                "end": "training ended"}.get(self.phase, f"iteration {self.iteration}")


def read_beats(run_dir: str | Path, since: float = 0.0) -> dict[int, Beat]:
    """Each rank's latest beat written at or after `since` (an earlier attempt's are left out);
    a file being replaced or unreadable is skipped (read again at the next look)."""
    beats: dict[int, Beat] = {}
    folder = Path(run_dir) / BEATS_DIR
    try:
        paths = list(folder.glob("rank*.json"))
    except OSError:
        return beats
    for path in paths:
        try:
            data = json.loads(path.read_text())
            beat = Beat(int(data["rank"]), int(data["world"]),
                        None if data.get("iteration") is None else int(data["iteration"]),
                        str(data["phase"]), float(data["time"]), str(data.get("main_thread", "")))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if beat.time >= since:
            beats[beat.rank] = beat
    return beats


def stalled_for(beats: dict[int, Beat], now: float) -> float | None:
    """Seconds since the newest beat of any rank, or None while nothing is watched (no beat
    yet: start-up, loading; or every rank has ended training: the final save)."""
    if not beats or all(b.phase == "end" for b in beats.values()):
        return None
    return now - max(b.time for b in beats.values())


def reached_iteration(beats: dict[int, Beat]) -> int | None:
    """The furthest iteration any rank completed (None: no iteration)."""
    done = [b.iteration for b in beats.values() if b.iteration is not None]
    return max(done) if done else None


# -- the stacks faulthandler wrote ------------------------------------------------------------

_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-f]+)", re.M)
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)', re.M)


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    func: str

    def __str__(self) -> str:
        parts = Path(self.file).parts
        short = "/".join(parts[-3:]) if len(parts) > 3 else self.file
        return f"{self.func} ({short}:{self.line})"


def main_thread_frames(text: str, main_thread: str = "") -> list[Frame]:
    """The frames of the main thread's last dump in a faulthandler file, innermost first
    (faulthandler prints the most recent call first). Without the thread's id, the last
    thread of the dump (faulthandler lists the main thread last)."""
    dumps = text.split("Timeout (")
    last = dumps[-1]
    blocks = {}
    order = []
    for match in _THREAD.finditer(last):
        order.append((match.group(1), match.start()))
    for i, (ident, start) in enumerate(order):
        end = order[i + 1][1] if i + 1 < len(order) else len(last)
        blocks[ident] = last[start:end]
    if not blocks:
        return []
    block = blocks.get(main_thread) or blocks[order[-1][0]]
    return [Frame(m.group("file"), int(m.group("line")), m.group("func"))
            for m in _FRAME.finditer(block)]


def collective_of(frames: list[Frame]) -> Frame | None:
    """The outermost torch.distributed collective in a stack (the call our code made), or None."""
    hits = [f for f in frames if f.func in COLLECTIVES]
    return hits[-1] if hits else None


def _stack_words(frames: list[Frame]) -> str:
    if not frames:
        return "no stack dumped"
    collective = collective_of(frames)
    if collective is not None:
        return f"in {collective}"
    return f"at {frames[0]}"


def diagnose(beats: dict[int, Beat], run_dir: str | Path, timeout_s: float,
             now: float | None = None) -> str:
    """One line: how long nothing moved, which rank is behind and where (its frame, or the
    collective it waits in), where the others wait, and where the stacks are."""
    now = time.time() if now is None else now
    run_dir = Path(run_dir)
    world = max(b.world for b in beats.values())
    missing = [r for r in range(world) if r not in beats]
    stacks = {}
    for rank, beat in beats.items():
        try:
            text = (run_dir / STACKS_DIR / f"rank{rank}.txt").read_text(errors="replace")
        except OSError:
            text = ""
        stacks[rank] = main_thread_frames(text, beat.main_thread)
    age = now - max(b.time for b in beats.values())
    head = f"no progress for {age:.0f} s (HANG_TIMEOUT={timeout_s:g})"
    if missing:
        behind_text = (f"rank{'s' if len(missing) > 1 else ''} "
                       f"{', '.join(map(str, missing[:8]))} never reported (no heartbeat)")
        others = beats
    else:
        furthest_back = min(b.position for b in beats.values())
        behind = sorted(r for r, b in beats.items() if b.position == furthest_back)
        others = {r: b for r, b in beats.items() if r not in behind}
        first = behind[0]
        names = ", ".join(map(str, behind[:8])) + (" ..." if len(behind) > 8 else "")
        if not others:
            behind_text = (f"every rank {beats[first].where()}; rank {first} "
                           f"{_stack_words(stacks[first])}")
        else:
            ahead = max(b.position for b in others.values())
            ahead_beat = next(b for b in others.values() if b.position == ahead)
            behind_text = (f"rank{'s' if len(behind) > 1 else ''} {names} behind "
                           f"({beats[first].where()}; the others {ahead_beat.where()}), rank "
                           f"{first} {_stack_words(stacks[first])}")
    waits = {str(collective_of(stacks[r])) for r in others if collective_of(stacks[r])}
    waiting = f"; the others wait in {sorted(waits)[0]}" if len(waits) == 1 else (
        f"; the others wait in {len(waits)} places" if waits else "")
    return (f"hang: {head}: {behind_text}{waiting}. Every rank's stack: "
            f"{run_dir / STACKS_DIR}/rank<N>.txt")
