"""torchrun, with a failed worker told in one line instead of torchrun's traceback.

torchrun ends a run whose worker failed by raising ChildFailedError out of its main: a Python
traceback through torch's launcher and a box of fields, in every log of a crashed, killed or
restarted run, that says one thing: which rank ended how. The supervisor
(training.resilience.supervise) runs torchrun through this module, which calls torchrun's own
main and prints that as one line (exit 1, as torchrun's). Every other outcome is torchrun's.
"""
from __future__ import annotations

import signal
import sys


def describe(err) -> str:
    """One line for a ChildFailedError: each failed rank, its pid, exit status or signal."""
    parts = []
    for rank, failure in sorted(err.failures.items()):
        code = failure.exitcode
        how = (f"killed by {signal.Signals(-code).name}" if code < 0 and
               -code in signal.valid_signals() else f"exit {code}")
        parts.append(f"rank {rank} (pid {failure.pid}) {how}")
    return f"torchrun: {err.name} failed: {'; '.join(parts)}"


def main() -> int:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    try:
        torchrun_main()
    except ChildFailedError as err:
        print(describe(err), file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
