"""An output folder that appears whole or not at all.

Everything is written into a temporary sibling (.NAME.partial-PID, same filesystem) that is
renamed to NAME at the end. An existing NAME, a missing parent, or too little free space is
refused before anything is written; an error, Ctrl-C or SIGTERM/SIGHUP on the way removes the
temporary folder, and a disk that fills while writing is reported as such.
"""
from __future__ import annotations

import errno
import os
import shutil
import signal
import threading
from pathlib import Path

DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
MARGIN_BYTES = 64 << 20     # headers, index and side files beside the tensors


class OutputError(ValueError):
    """The output cannot be written (message printed as is)."""


class Interrupted(BaseException):
    """A signal ended the conversion (raised from the handler, like KeyboardInterrupt)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.2f} GiB"


def disk_error(exc: BaseException) -> OSError | None:
    """The disk-full OSError behind an exception, if any (torch.distributed.checkpoint wraps
    the writer's errors in a CheckpointException that keeps them per rank in `failures`)."""
    seen, todo = set(), [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in DISK_ERRNOS:
            return e
        todo += [e.__cause__, e.__context__]
        for failure in (getattr(e, "failures", None) or {}).values():
            todo.append(failure[0] if isinstance(failure, tuple) else failure)
    return None


class Staging:
    def __init__(self, out: Path, needed_bytes: int):
        self.out = Path(os.path.abspath(out))
        if self.out.exists() or self.out.is_symlink():
            raise OutputError(f"{out} exists: nothing was written. Choose a new output path "
                              "or remove the old one")
        parent = self.out.parent
        if not parent.is_dir():
            raise OutputError(f"the parent folder {parent} does not exist: create it first")
        free = shutil.disk_usage(parent).free
        if needed_bytes + MARGIN_BYTES > free:
            raise OutputError(f"{out} needs {gib(needed_bytes + MARGIN_BYTES)} and {parent} has "
                              f"{gib(free)} free: nothing was written. Free space or write "
                              "elsewhere")
        self.path = parent / f".{self.out.name}.partial-{os.getpid()}"
        self._handlers: dict[int, object] = {}
        self._committed = False

    def __enter__(self) -> "Staging":
        if self.path.exists():
            shutil.rmtree(self.path)
        self.path.mkdir()
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGHUP):
                self._handlers[signum] = signal.signal(signum, self._on_signal)
        return self

    @staticmethod
    def _on_signal(signum, frame):
        raise Interrupted(signum)

    def commit(self) -> None:
        if self.out.exists():
            raise OutputError(f"{self.out} appeared while converting: the result was not moved "
                              "there")
        os.rename(self.path, self.out)
        self._committed = True

    def __exit__(self, exc_type, exc, tb) -> bool:
        for signum, handler in self._handlers.items():
            signal.signal(signum, handler)
        if not self._committed:
            shutil.rmtree(self.path, ignore_errors=True)
        full = disk_error(exc) if exc is not None else None
        if full is not None:
            raise OutputError(f"the disk filled while writing {self.out} ({full.strerror}): "
                              f"nothing was written. Free space on {self.out.parent} and run "
                              "again") from None
        return False
