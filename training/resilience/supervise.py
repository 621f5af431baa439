"""The supervisor: between the launcher's bash entry and torchrun, for the whole run.

    python -m training.resilience.supervise --run-dir RUN [--save DIR] [--restarts N]
        [--backoff S] [--hang-timeout S] [--preemption requeue|stop] -- torchrun ...

examples/lib/launch.sh's exec_torchrun runs torchrun under it (the options from the registry's
PREEMPTION, RESTARTS, RESTART_BACKOFF and HANG_TIMEOUT); its output is torchrun's, its exit
status the run's (training.resilience.exits). torchrun itself runs as
training.resilience.torchrun: the same, with a failed worker told in one line instead of
torchrun's traceback.

Preemption. SIGTERM, SIGINT, SIGHUP and SIGUSR2 (Slurm's warning signal, `#SBATCH
--signal=USR2@...` in launchers/slurm/train.sbatch) are caught here and forwarded as SIGTERM to
the workers alone (torchrun's children): Megatron's --exit-signal-handler saves at the next
step boundary and the workers exit; rank 0 writes preemption.json (training.resilience.
preemption). torchrun runs in its own session with SIGUSR2 ignored (it and the workers inherit
that), so a signal sent to the whole job neither kills torchrun nor cuts a save short through
torchrun's 30-second shutdown. A second SIGINT/SIGTERM stops everything at once. Exit 75
(PREEMPTED) when the saved checkpoint is complete: requeue and the run resumes.

Restarts. An attempt that fails (not 0, not a user error's 2, not a preemption) is started
again, at most RESTARTS times, after RESTART_BACKOFF seconds doubling each time (at most 10
minutes), from the last complete checkpoint in SAVE (`--load SAVE --ckpt-step N`, in place of
the first attempt's --load/--ckpt-step). Two failures in a row at the same iteration (the
furthest any rank's heartbeat reached) end the run: a failure that repeats is not transient.
Each restart is a line of RUN/restarts.jsonl.

Hangs. With HANG_TIMEOUT, the ranks' heartbeats (training.resilience.heartbeat) are read every
second or so: when none moved for HANG_TIMEOUT seconds, every rank has written its stack
(faulthandler, RUN/stacks/), the diagnosis is printed and written to RUN/hang.txt, every
process of the attempt is killed, and the attempt ends as HUNG (124), restarted like a failure
when RESTARTS allow.

The standard library only, as the launcher's bash entry runs it before torchrun.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from training import cli, safe_files
from training.resilience import exits, heartbeat, preemption
from training.checkpoint_scan import last_complete

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR2)
MAX_BACKOFF_S = 600.0
SAME_FAILURE_LIMIT = 2                  # failures in a row at one iteration end the run
RUN_DIR_ENV = "SUPERVISED_RUN_DIR"      # the workers record a user error's exit there
WORKER_EXITS = "worker_exits"
PR_SET_CHILD_SUBREAPER, PR_SET_PDEATHSIG = 36, 1


@dataclass
class Options:
    run_dir: Path
    command: list[str]
    save: str | None = None
    restarts: int = 0
    backoff_s: float = 10.0
    hang_timeout_s: float = 0.0
    preemption: str = "stop"            # requeue | stop
    poll_s: float = 1.0


@dataclass
class Outcome:
    status: int                         # the attempt's exit status (the command's, or ours)
    kind: str                           # done | user_error | preempted | stopped | hung | failed
    reached: int | None = None          # the furthest iteration the heartbeats reached
    detail: str = ""


@dataclass
class Supervisor:
    opts: Options
    log: object = sys.stderr
    signals: list[int] = field(default_factory=list)    # stop signals received, in order
    sleep: object = time.sleep

    # -- signals -------------------------------------------------------------------------
    def install(self) -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._on_signal)
        _become_subreaper()

    def _on_signal(self, signum, frame) -> None:
        self.signals.append(signum)

    def say(self, text: str) -> None:
        try:
            print(f"[supervise] {text}", file=self.log, flush=True)
        except OSError:      # the log's reader is gone: the run goes on, its record too
            pass

    # -- the run ---------------------------------------------------------------------------
    def run(self) -> int:
        failures: list[int | None] = []        # the iteration each failed attempt reached
        attempt = 0
        while True:
            command = self.command_for(attempt)
            started = time.time()
            outcome = self.attempt(command, started)
            if outcome.kind in ("done", "user_error", "preempted", "stopped"):
                if outcome.detail:
                    self.say(outcome.detail)
                return outcome.status
            failures.append(outcome.reached)
            verdict = self.restart_verdict(attempt, failures)
            resume = _last_complete(self.opts.save)
            wait = 0.0 if verdict else min(self.opts.backoff_s * 2 ** attempt, MAX_BACKOFF_S)
            self.record(attempt, outcome, resume, wait, verdict)
            if verdict:
                self.say(f"{outcome.detail or f'the run failed (exit {outcome.status})'}; "
                         f"{verdict}")
                return outcome.status
            where = f"iteration {resume} (the last complete checkpoint in {self.opts.save})" \
                if resume is not None else "the start (no complete checkpoint yet)"
            self.say(f"{outcome.detail or f'the run failed (exit {outcome.status})'}; restart "
                     f"{attempt + 1} of {self.opts.restarts} in {wait:g} s from {where}")
            self.back_off(wait)
            if self.signals:          # stopped while waiting: nothing runs, nothing to save
                self.say("a stop signal arrived during the back-off: not restarting")
                return exits.STOPPED
            attempt += 1

    def back_off(self, wait_s: float) -> None:
        """Wait, in short sleeps: a stop signal ends the wait (time.sleep resumes after one)."""
        end = time.monotonic() + wait_s
        while not self.signals and time.monotonic() < end:
            self.sleep(min(0.2, max(end - time.monotonic(), 0)))

    def restart_verdict(self, attempt: int, failures: list[int | None]) -> str:
        """Why the run is not restarted ('' when it is)."""
        if attempt >= self.opts.restarts:
            return (f"no restart left (RESTARTS={self.opts.restarts})" if self.opts.restarts
                    else "RESTARTS=0: not restarted")
        recent = failures[-SAME_FAILURE_LIMIT:]
        if len(recent) == SAME_FAILURE_LIMIT and len(set(recent)) == 1:
            where = f"iteration {recent[0]}" if recent[0] is not None else \
                "before the first iteration"
            return (f"it failed {SAME_FAILURE_LIMIT} times in a row at {where} without "
                    "progress: not restarted again (look at the log for the error; resume "
                    "with LOAD=SAVE once it is fixed)")
        return ""

    def command_for(self, attempt: int) -> list[str]:
        """The first attempt runs the command as given; a restart resumes from the last
        complete checkpoint in SAVE (the first attempt's own --load otherwise). The word
        `torchrun` runs as training.resilience.torchrun (torchrun with a failed worker told in
        one line, not its traceback) where it names this Python's own torchrun; another
        torchrun first on PATH (a site's wrapper, a test's stand-in) runs as it is."""
        command = list(self.opts.command)
        if "torchrun" in command and _own_torchrun():
            i = command.index("torchrun")
            command[i:i + 1] = [sys.executable, "-m", "training.resilience.torchrun"]
        if attempt == 0 or not self.opts.save:
            return command
        iteration = _last_complete(self.opts.save)
        if iteration is None:
            return command
        return _without(command, ("--load", "--ckpt-step")) + [
            "--load", self.opts.save, "--ckpt-step", str(iteration)]

    def record(self, attempt: int, outcome: Outcome, resume: int | None, wait: float,
               verdict: str) -> None:
        line = {"time": time.time(), "host": socket.gethostname(), "attempt": attempt,
                "exit_status": outcome.status,
                "kind": outcome.kind, "reached_iteration": outcome.reached,
                "restart": not verdict, "resume_from_iteration": resume if not verdict else None,
                "backoff_s": wait, "why_not": verdict or None}
        try:
            with safe_files.open_write(self.opts.run_dir / "restarts.jsonl", "restart record",
                                       append=True) as out:
                out.write(json.dumps(line) + "\n")
        except OSError as err:
            self.say(f"cannot write {self.opts.run_dir / 'restarts.jsonl'}: {err}")

    # -- one attempt -----------------------------------------------------------------------
    def attempt(self, command: list[str], started: float) -> Outcome:
        run_dir = self.opts.run_dir
        for stale in (run_dir / preemption.MARKER, *(run_dir / WORKER_EXITS).glob("*")):
            stale.unlink(missing_ok=True)
        env = dict(os.environ, **{RUN_DIR_ENV: str(run_dir)})
        try:
            proc = subprocess.Popen(command, env=env, start_new_session=True,
                                    preexec_fn=_ignore_warning_signal)
        except OSError as err:
            return Outcome(127, "failed", None, f"cannot start {command[0]}: "
                                                f"{err.strerror or err}")
        forwarded = 0
        hung = ""
        while True:
            try:
                status = proc.wait(timeout=self.opts.poll_s)
                break
            except subprocess.TimeoutExpired:
                pass
            if len(self.signals) > forwarded:
                forwarded = self.forward(proc, forwarded)
            if self.opts.hang_timeout_s > 0 and not hung and not self.signals:
                hung = self.watch(started)
                if hung:
                    _kill_tree(proc.pid)
        if len(self.signals) > forwarded:
            forwarded = len(self.signals)
        _reap_orphans()
        reached = heartbeat.reached_iteration(heartbeat.read_beats(run_dir, since=started))
        return self.classify(status, reached, hung, bool(self.signals))

    def forward(self, proc: subprocess.Popen, forwarded: int) -> int:
        """A new stop signal: the first goes to the workers as SIGTERM (save at the next step);
        a second SIGINT/SIGTERM stops everything now."""
        name = signal.Signals(self.signals[-1]).name
        if forwarded == 0:
            workers = _children(proc.pid) or [proc.pid]
            for pid in workers:
                _signal(pid, signal.SIGTERM)
            self.say(f"{name}: asked the {len(workers)} worker(s) to "
                     + ("save at the next step boundary and stop"
                        if self.opts.save else "stop at the next step boundary")
                     + " (a second Ctrl-C/SIGTERM stops at once)")
        elif self.signals[-1] in (signal.SIGINT, signal.SIGTERM):
            self.say(f"{name} again: stopping every process now")
            _kill_tree(proc.pid)
        return len(self.signals)

    def watch(self, started: float) -> str:
        """The diagnosis when no rank made progress for HANG_TIMEOUT seconds, else ''."""
        beats = heartbeat.read_beats(self.opts.run_dir, since=started)
        age = heartbeat.stalled_for(beats, time.time())
        if age is None or age <= self.opts.hang_timeout_s:
            return ""
        self._await_stacks(beats)
        text = heartbeat.diagnose(beats, self.opts.run_dir, self.opts.hang_timeout_s)
        try:
            safe_files.write_text(self.opts.run_dir / "hang.txt", text + "\n", "hang diagnosis")
        except OSError:
            pass
        self.say(text)
        return text

    def _await_stacks(self, beats: dict, limit_s: float = 5.0) -> None:
        """The ranks' own timers dump their stacks at HANG_TIMEOUT after their last beat,
        about when this look sees it: wait a little for every file to be written."""
        deadline = time.monotonic() + min(limit_s, max(self.opts.hang_timeout_s, 0.5))
        paths = [self.opts.run_dir / heartbeat.STACKS_DIR / f"rank{r}.txt" for r in beats]
        while time.monotonic() < deadline:
            if all(p.is_file() and p.stat().st_size > 0 for p in paths):
                time.sleep(0.2)      # the dump of the last thread may still be under way
                return
            time.sleep(0.1)

    def classify(self, status: int, reached: int | None, hung: str,
                 signalled: bool) -> Outcome:
        run_dir = self.opts.run_dir
        if hung:
            return Outcome(exits.HUNG, "hung", reached, "the run hung (see above)")
        marker = preemption.read_marker(run_dir)
        if marker is not None:
            iteration = marker["iteration"]
            if marker.get("saved"):
                if _last_complete(self.opts.save or marker.get("save")) == iteration:
                    return Outcome(exits.PREEMPTED if self.opts.preemption == "requeue"
                                   else exits.STOPPED, "preempted", reached,
                                   f"preempted: iteration {iteration} saved in "
                                   f"{marker.get('save')}; exit {exits.PREEMPTED} (requeue: "
                                   "the run resumes from it)" if self.opts.preemption == "requeue"
                                   else f"stopped: iteration {iteration} saved")
                return Outcome(status or 1, "failed", reached,
                               f"preempted at iteration {iteration}, but its checkpoint in "
                               f"{marker.get('save')} is not complete")
            return Outcome(exits.STOPPED, "stopped", reached,
                           f"stopped by a signal after iteration {iteration}, nothing saved")
        if status == 0:
            return Outcome(exits.DONE, "done", reached)
        if status == exits.USER_ERROR or _worker_user_error(run_dir):
            return Outcome(exits.USER_ERROR, "user_error", reached,
                           "a user error (exit 2): not restarted")
        if signalled:
            return Outcome(exits.STOPPED if status < 0 or status > 128 else status, "stopped",
                           reached, f"stopped by a signal (exit {status})")
        return Outcome(status if status > 0 else 128 - status, "failed", reached)


# -- processes ---------------------------------------------------------------------------------

def _ignore_warning_signal() -> None:
    """In torchrun (and so in the workers): SIGUSR2, Slurm's warning, is the supervisor's to
    forward; torchrun's default for it would be to die. And should the supervisor itself be
    killed, torchrun gets SIGTERM (its own shutdown of the workers) instead of running on
    unwatched in its session."""
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _become_subreaper() -> None:
    """Workers orphaned by a killed torchrun come back to this process, to be ended."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _children(pid: int) -> list[int]:
    """The direct children of `pid` (torchrun's workers), from /proc."""
    kids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 1 and int(fields[1]) == pid:
            kids.append(int(entry.name))
    return kids


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        kids = _children(todo.pop())
        found += kids
        todo += kids
    return found


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _kill_tree(pid: int) -> None:
    """SIGKILL the command and every process under it, each process group too (torchrun
    starts every worker in a session of its own)."""
    tree = [pid, *_descendants(pid)]
    for member in tree:
        try:
            os.killpg(member, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            _signal(member, signal.SIGKILL)


def _reap_orphans() -> None:
    """End and reap what is left of the attempt (workers orphaned to this subreaper)."""
    for pid in _children(os.getpid()):
        _signal(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.05)


def _worker_user_error(run_dir: Path) -> bool:
    return any((run_dir / WORKER_EXITS).glob("*"))


def record_worker_exit(code) -> None:
    """pretrain_gpt.py's exit with a user error's status (2: bad arguments, a flag that
    contradicts the launcher): recorded for the supervisor, as torchrun reports every worker
    failure as its own status 1."""
    run_dir = os.environ.get(RUN_DIR_ENV)
    if not run_dir or code != exits.USER_ERROR:
        return
    try:
        folder = Path(run_dir) / WORKER_EXITS
        folder.mkdir(parents=True, exist_ok=True)
        safe_files.write_text(folder / f"rank{os.environ.get('RANK', '0')}", str(code),
                              "worker exit status")
    except OSError:
        pass


def _last_complete(save: str | Path | None) -> int | None:
    """The iteration of SAVE's last complete checkpoint (training.checkpoint_scan's rule, the
    launcher's resume plan's too), or None (no SAVE, nothing complete there)."""
    return last_complete(Path(save))[0] if save else None


def _own_torchrun() -> bool:
    """Whether the word `torchrun` names this Python installation's torchrun: the one on PATH
    sits beside sys.executable (the launcher puts that folder first), or none is on PATH."""
    found = shutil.which("torchrun")
    if found is None:
        return True
    try:
        return os.path.samefile(os.path.dirname(os.path.abspath(found)),
                                os.path.dirname(os.path.abspath(sys.executable)))
    except OSError:
        return False


def _without(words: list[str], flags: tuple[str, ...]) -> list[str]:
    """The words without each of `flags` and its value (`--flag V` or `--flag=V`)."""
    out, skip = [], False
    for word in words:
        if skip:
            skip = False
            continue
        if word in flags:
            skip = True
            continue
        if word.split("=", 1)[0] in flags and "=" in word:
            continue
        out.append(word)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        print("usage: python -m training.resilience.supervise [options] -- COMMAND ...",
              file=sys.stderr)
        return exits.USER_ERROR
    split = argv.index("--")
    parser = cli.ArgumentParser(prog="python -m training.resilience.supervise",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--save", default=None)
    parser.add_argument("--restarts", type=cli.nonnegative_int, default=0)
    parser.add_argument("--backoff", type=float, default=10.0)
    parser.add_argument("--hang-timeout", type=float, default=0.0)
    parser.add_argument("--preemption", choices=("requeue", "stop"), default="stop")
    parser.add_argument("--poll", type=float, default=1.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv[:split])
    command = argv[split + 1:]
    if not command:
        parser.error("no command after --")
    args.run_dir.mkdir(parents=True, exist_ok=True)
    poll = min(args.poll, args.hang_timeout / 4) if args.hang_timeout > 0 else args.poll
    supervisor = Supervisor(Options(args.run_dir, command, args.save, args.restarts,
                                    args.backoff, args.hang_timeout, args.preemption,
                                    max(poll, 0.05)))
    supervisor.install()
    return supervisor.run()


if __name__ == "__main__":
    sys.exit(main())
