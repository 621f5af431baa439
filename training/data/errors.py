"""Errors of the data tools, each with the exit code its command-line front end uses.

`InputError` (exit 2): what the user gave cannot be used (a missing file, a glob that
matches nothing, a tokenizer without an end-of-document token, an output that exists).
Nothing has been written when it is raised.

`RunError` (exit 1): the run started and could not finish (a compressed file that is
truncated half-way, a disk that is full). Temporary outputs are removed.

Both carry a message meant to be printed as is, without a traceback.

`Interrupted` (exit 128 + the signal's number): SIGINT, SIGTERM or SIGHUP arrived while a
dataset was being written (training/data/publish.py turns them into this exception, so the
temporary files are removed on the way out). A BaseException, like KeyboardInterrupt, so that
no `except Exception` swallows it.
"""

from __future__ import annotations

import signal


class DataError(Exception):
    exit_code = 1


class InputError(DataError):
    exit_code = 2


class RunError(DataError):
    exit_code = 1


class Interrupted(BaseException):
    def __init__(self, signum: int):
        self.signum = signum
        self.exit_code = 128 + signum
        super().__init__(signal.Signals(signum).name)

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name
