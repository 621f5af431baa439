"""The page cache dropped before an MLPerf run (the rules' cache_clear), where this process may.

Two ways, in this order:
  hook         MLPERF_CACHE_CLEAR_CMD: a command the cluster provides (e.g.
               `sudo -n /usr/local/sbin/drop_caches`, a Slurm prolog's helper). Run without a
               shell (split like a shell line: no pipes or &&; wrap more in a script), once per
               node; exit status 0 means the cache was dropped.
  drop_caches  as root: sync, then 3 written to /proc/sys/vm/drop_caches (page cache, dentries
               and inodes), the kernel's own interface.
Neither: nothing is dropped, and the run says so (mlperf.log cache_clear false, with the
reason); the closed division's guard refuses such a launch before it starts, and a closed run
whose drop fails at run time stops before init_start.

`plan()` says what would be done (the launcher's guard, and the startup table); `clear()` does
it (training.mlperf.events, on each node's local rank 0, before init_start).
"""
from __future__ import annotations

import os
import shlex
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

DROP_CACHES = Path("/proc/sys/vm/drop_caches")
HOOK_TIMEOUT_S = 300


@dataclass(frozen=True)
class CacheClear:
    done: bool
    method: str          # "hook" | "drop_caches" | "none"
    detail: str          # what was run, or why nothing was

    def as_metadata(self) -> dict:
        return {"method": self.method, "detail": self.detail}

    def to_dict(self) -> dict:
        return asdict(self)


def _euid() -> int:
    return os.geteuid() if hasattr(os, "geteuid") else -1


def plan(command: str | None, drop_path: Path = DROP_CACHES, euid: int | None = None
         ) -> CacheClear:
    """What clear() would do here, without doing it: done=True means it can."""
    if command:
        try:
            words = shlex.split(command)
        except ValueError as err:
            return CacheClear(False, "hook", f"MLPERF_CACHE_CLEAR_CMD={command!r}: {err}")
        if not words:
            return CacheClear(False, "hook", "MLPERF_CACHE_CLEAR_CMD is blank")
        return CacheClear(True, "hook", f"runs {shlex.join(words)}")
    euid = _euid() if euid is None else euid
    if euid != 0:
        return CacheClear(False, "none",
                          f"not root (euid {euid}) and no MLPERF_CACHE_CLEAR_CMD: the page "
                          "cache cannot be dropped by this process")
    if not os.access(drop_path, os.W_OK):
        return CacheClear(False, "none",
                          f"root, but {drop_path} is not writable (a container without "
                          "--privileged mounts /proc/sys read-only); set MLPERF_CACHE_CLEAR_CMD")
    return CacheClear(True, "drop_caches", f"sync; echo 3 > {drop_path}")


def clear(command: str | None, drop_path: Path = DROP_CACHES, euid: int | None = None
          ) -> CacheClear:
    """Drop the page cache as plan() says; what was done (done=False with the reason when it
    could not, or when the hook failed)."""
    how = plan(command, drop_path, euid)
    if not how.done:
        return how
    if how.method == "hook":
        words = shlex.split(command or "")
        try:
            proc = subprocess.run(words, capture_output=True, text=True,
                                  timeout=HOOK_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as err:
            return CacheClear(False, "hook", f"{shlex.join(words)} failed: {err}")
        if proc.returncode != 0:
            said = (proc.stderr or proc.stdout).strip().splitlines()
            return CacheClear(False, "hook", f"{shlex.join(words)} exited {proc.returncode}"
                                             + (f": {said[-1]}" if said else ""))
        return CacheClear(True, "hook", f"ran {shlex.join(words)} (exit 0)")
    os.sync()
    try:
        with open(drop_path, "w") as f:
            f.write("3\n")
    except OSError as err:
        return CacheClear(False, "drop_caches", f"writing {drop_path}: {err.strerror or err}")
    return CacheClear(True, "drop_caches", f"sync; 3 written to {drop_path}")
