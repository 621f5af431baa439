"""Publishing a dataset: one run at a time, atomic, every file from the same run.

A run that writes PREFIX.bin, PREFIX.idx and the record PREFIX.dataset.json goes through a
`Publisher`:

1. `check_prefix`: a prefix that cannot be a DATA_PATH entry ('' , a space in it, .bin/.idx,
   a directory, a number) is refused before anything happens.
2. An exclusive lock on PREFIX.lock (flock: the kernel drops it when the process dies, so a
   killed run never leaves a lock behind). A second run on the same prefix is refused with
   the first one's pid, host and start time.
3. Under the lock: temporary files of earlier runs on this host whose process is gone are
   removed, said in one line; an existing dataset is refused unless `--overwrite`.
4. The run writes PREFIX.bin.tmp-HOST-PID, PREFIX.idx.tmp-HOST-PID. SIGINT, SIGTERM and SIGHUP
   (Ctrl-C, Slurm, docker stop, `timeout`) raise `Interrupted` while the publisher is open;
   any way out other than `publish()` removes the temporary files. Inside
   `deferred_signals()` (a worker pool's start) a signal waits until the block ends.
5. `publish()`: the .idx is checked against the .bin (training/data/index.py) and against the
   counts of the run; both files are fsynced; the record, with the size and SHA-256 of both
   files, is written to its temporary name and fsynced; then the old record goes, the old
   .idx goes, the new .bin and .idx are renamed in, and the record is renamed in last (the
   folder fsynced between). At every moment the prefix holds the old dataset, a .bin/.idx
   pair without a record (which the launcher refuses), or the new complete dataset.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import signal
import socket
import sys
import threading
import time
from typing import Any, Callable

from training.data import record as rec
from training.data.errors import InputError, Interrupted, RunError
from training.data.index import IndexProblem, read_index
from training.data.tokenizer import file_sha256

LOCK_SUFFIX = ".lock"
TMP_MARK = ".tmp-"
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# errno values that mean "no room to write": the message says to free space.
NO_SPACE = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


def output_paths(prefix: str) -> dict[str, str]:
    return {"bin": prefix + ".bin", "idx": prefix + ".idx", "record": rec.record_path(prefix)}


def temp_tag() -> str:
    return f"{TMP_MARK}{socket.gethostname()}-{os.getpid()}"


def temp_paths(prefix: str) -> dict[str, str]:
    tag = temp_tag()
    return {k: v + tag for k, v in output_paths(prefix).items()}


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def check_prefix(prefix: str, option: str = "--output-prefix") -> None:
    """Refuse a prefix that would write hidden or unreachable files or that DATA_PATH cannot name."""
    if not prefix.strip():
        raise InputError(f"{option} {prefix!r}: empty; name the dataset, e.g. data/c4_llama31 "
                         "(writes data/c4_llama31.bin, .idx and .dataset.json)")
    if any(c.isspace() for c in prefix):
        raise InputError(f"{option} {prefix!r}: contains whitespace; DATA_PATH separates datasets by "
                         "spaces, so the launcher could not name it: use '_' or '-' instead")
    if prefix.endswith((".bin", ".idx")):
        raise InputError(f"{option} {prefix}: give the prefix without .bin/.idx ({prefix[:-4]})")
    if prefix.endswith(os.sep) or os.path.isdir(prefix):
        raise InputError(f"{option} {prefix}: is a directory; the prefix names files, e.g. "
                         f"{os.path.join(prefix, 'train')}")
    if _is_number(prefix):
        raise InputError(f"{option} {prefix}: DATA_PATH would read it as a weight; write ./{prefix}")


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # an earlier run of this process: it is not writing now (we hold the lock)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _parse_tag(tag: str) -> tuple[str | None, int] | None:
    """(host, pid) of 'HOST-PID' (None for a bare 'PID', the earlier format), else None."""
    host, _, pid = tag.rpartition("-")
    return (host or None, int(pid)) if pid.isdigit() else None


def stale_temporaries(finals: list[str]) -> tuple[list[str], list[str]]:
    """Temporary files (FINAL.tmp-HOST-PID) of `finals`, all in one folder: (those of runs on
    this host whose process is gone, those of runs on other hosts)."""
    folder = os.path.dirname(finals[0]) or "."
    names = [os.path.basename(p) for p in finals]
    here = socket.gethostname()
    dead, elsewhere = [], []
    try:
        entries = sorted(os.listdir(folder))
    except OSError:
        return [], []
    for entry in entries:
        for name in names:
            if not entry.startswith(name + TMP_MARK):
                continue
            parsed = _parse_tag(entry[len(name + TMP_MARK):])
            if parsed is None:
                continue
            host, pid = parsed
            path = os.path.join(folder, entry)
            if host not in (None, here):
                elsewhere.append(path)
            elif not _alive(pid):
                dead.append(path)
    return dead, elsewhere


def clean_stale(finals: list[str], note: Callable[[str], None]) -> None:
    """Remove the temporary files of `finals` left by runs that are gone, saying so in one line."""
    dead, elsewhere = stale_temporaries(finals)
    if dead:
        remove_quietly(dead)
        pids = sorted({p.rpartition("-")[2] for p in dead})
        note(f"removed {len(dead)} temporary file(s) of an earlier run that is gone "
             f"(pid {', '.join(pids)}): {', '.join(os.path.basename(p) for p in dead)}")
    if elsewhere:
        note(f"note: {', '.join(elsewhere)} belong(s) to a run on another host; left alone "
             "(remove them once that run is over)")


def writable_folder(folder: str, what: str) -> None:
    """Create `folder` if it is not there; InputError, naming `what`, if it cannot be written."""
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise InputError(f"{what}: cannot create {folder} ({e.strerror or e})") from None
    if not os.access(folder, os.W_OK):
        raise InputError(f"{what}: {folder} is not writable")


def remove_quietly(paths) -> None:
    for p in paths:
        try:
            os.remove(p)
        except OSError:
            pass


def fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.EBADF):  # a folder on a file system that cannot
            raise
    finally:
        os.close(fd)


def remove_existing(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def os_error_message(e: OSError, prefix: str) -> str:
    """One line for an OSError met while writing a dataset, saying what to do."""
    where = e.filename or prefix
    if e.errno in NO_SPACE:
        folder = os.path.dirname(os.path.abspath(prefix))
        return (f"no space to write {where} ({e.strerror}); temporary files removed, nothing "
                f"published. Free space under {folder} (or pick another --output-prefix) and run again")
    return f"writing {where}: {e.strerror or e}; temporary files removed, nothing published"


_held: list[int] | None = None  # inside deferred_signals(): the trapped signals that arrived


@contextlib.contextmanager
def deferred_signals():
    """A trapped signal that arrives inside the block raises Interrupted when the block ends,
    not in the middle of it: for steps that an exception must not cut half-way (starting a
    process pool: its queues, its manager thread and a worker; cut there, the pool can neither
    run nor shut down, and the run ends in a traceback). Signals outside a SignalTrap are not
    affected."""
    global _held
    outer, _held = _held, []
    try:
        yield
    finally:
        held, _held = _held, outer
    if held:
        if outer is not None:
            outer.extend(held)
        else:
            raise Interrupted(held[0])


class SignalTrap:
    """While entered (in the main thread): SIGINT, SIGTERM and SIGHUP raise Interrupted, so
    that `finally`/`except BaseException` blocks remove temporary files. `ignore()` for the
    clean-up itself, `restore()` (or leaving the block) puts the previous handlers back."""

    def __init__(self):
        self._handlers: dict[int, Any] = {}

    @staticmethod
    def _raise(signum, frame):
        if _held is not None:
            _held.append(signum)
            return
        raise Interrupted(signum)

    def __enter__(self) -> "SignalTrap":
        if threading.current_thread() is threading.main_thread():
            for s in SIGNALS:
                self._handlers[s] = signal.signal(s, self._raise)
        return self

    def ignore(self) -> None:
        for s in self._handlers:
            signal.signal(s, signal.SIG_IGN)

    def restore(self) -> None:
        for s, handler in self._handlers.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        self._handlers = {}

    def __exit__(self, *exc) -> None:
        self.restore()


class Publisher:
    """Exclusive, atomic publication of PREFIX's dataset files (see the module docstring)."""

    def __init__(self, prefix: str, *, option: str = "--output-prefix",
                 note: Callable[[str], None] | None = None):
        check_prefix(prefix, option)
        self.prefix, self.option = prefix, option
        self.final = output_paths(prefix)
        self.tmp = temp_paths(prefix)
        self.note = note or (lambda line: print(line, file=sys.stderr, flush=True))
        self.lock_path = prefix + LOCK_SUFFIX
        self._fd: int | None = None
        self._signals = SignalTrap()
        self.published = False

    # -- lock ------------------------------------------------------------------------------

    def _holder(self) -> str:
        try:
            with open(self.lock_path) as f:
                return f.read().strip() or "another process"
        except OSError:
            return "another process"

    def _lock(self) -> None:
        writable_folder(os.path.dirname(os.path.abspath(self.prefix)), f"{self.option} {self.prefix}")
        while True:
            try:
                fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as e:
                raise InputError(f"cannot create {self.lock_path} ({e.strerror or e})") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise InputError(
                    f"{self.prefix}: another run ({self._holder()}) is writing this dataset now; wait for "
                    "it to finish, or choose another --output-prefix") from None
            except OSError as e:
                self.note(f"warning: cannot lock {self.lock_path} on this file system ({e.strerror or e}); "
                          f"make sure no other run writes {self.prefix} at the same time")
            # The previous holder removes the lock file on release; a file opened before that is
            # no longer the lock: open the current one again.
            try:
                same = os.stat(self.lock_path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            os.ftruncate(fd, 0)
            os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}, since "
                         f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode())
            self._fd = fd
            return

    def _unlock(self) -> None:
        if self._fd is None:
            return
        try:
            os.remove(self.lock_path)
        except OSError:
            pass
        os.close(self._fd)
        self._fd = None

    # -- context ---------------------------------------------------------------------------

    def __enter__(self) -> "Publisher":
        self._lock()
        try:
            self._signals.__enter__()
            clean_stale(list(self.final.values()), self.note)
        except BaseException:
            self._signals.restore()
            self._unlock()
            raise
        return self

    def check_existing(self, overwrite: bool, why: str | None = None) -> list[str]:
        """The dataset files already at the prefix; InputError if any and not `overwrite`
        (`why`: the reason the existing dataset cannot be kept, for the message)."""
        existing = [p for p in self.final.values() if os.path.exists(p)]
        if existing and not overwrite:
            if why:
                raise InputError(f"{self.prefix} already holds a dataset, but {why}; pass --overwrite "
                                 "to replace it")
            raise InputError(f"{existing[0]} already exists; pass --overwrite to replace the dataset")
        return existing

    def __exit__(self, exc_type, exc, tb) -> None:
        self._signals.ignore()  # a second signal must not cut the clean-up short
        try:
            if not self.published:
                remove_quietly(self.tmp.values())
        finally:
            self._signals.restore()
            self._unlock()

    # -- publish ---------------------------------------------------------------------------

    def publish(self, record: dict[str, Any], *, documents: int, tokens: int,
                bin_sha256: str | None = None) -> dict[str, Any]:
        """Check, fsync and rename the temporary .bin/.idx into place, the record last.
        Returns the record as written (with sizes and hashes)."""
        tmp, final = self.tmp, self.final
        try:
            facts = read_index(tmp["idx"], tmp["bin"])
        except IndexProblem as e:
            raise RunError(f"the index just written does not describe its .bin ({e}); nothing published") from None
        if (facts.documents, facts.tokens) != (documents, tokens):
            raise RunError(f"the index just written counts {facts.documents:,} documents and {facts.tokens:,} "
                           f"tokens, the run {documents:,} and {tokens:,}; nothing published")
        fsync_path(tmp["bin"])
        fsync_path(tmp["idx"])
        record = {**record,
                  "bin_bytes": os.path.getsize(tmp["bin"]),
                  "bin_sha256": bin_sha256 or file_sha256(tmp["bin"]),
                  "idx_bytes": facts.idx_bytes,
                  "idx_sha256": file_sha256(tmp["idx"])}
        record = rec.stamp(record)
        rec.write_json(tmp["record"], record)
        folder = os.path.dirname(os.path.abspath(self.prefix))
        remove_existing(final["record"])
        remove_existing(final["idx"])
        fsync_path(folder)
        os.replace(tmp["bin"], final["bin"])
        os.replace(tmp["idx"], final["idx"])
        fsync_path(folder)
        os.replace(tmp["record"], final["record"])
        fsync_path(folder)
        self.published = True
        return record
