"""Quiet, not blind: known third-party noise off the console, into a log, with a one-line count.

Megatron, Transformer Engine, torch and their neighbours print the same lines at every start
(Apex's fallbacks, TE's Jax notice, one_logger's pointer to an internal wiki, a SyntaxWarning
from Megatron's inference code, deprecation notices). They say nothing about this run and
bury what does. `install()` takes those lines, and only those (KNOWN: each a name and a
pattern, matched against a warning's text or a printed line), off the console: Python
warnings through `warnings.showwarning`, printed and logged lines through a line filter on
sys.stdout and sys.stderr. Each is written to the log file (the run folder's
third_party.log for a training run; a file under the temporary folder for a tool), and one
line says how many went there and where. Every other warning and line is printed as before.
QUIET=0 in the environment turns the filter off.

    training/pretrain_gpt.py   install("pretrain_gpt.py") before torch and Megatron import;
                               the run folder is known once the arguments are parsed
                               (set_log), and the count is printed at the first step
    python -m tools            install(<tool>) at the top of main(); the count at exit
"""
from __future__ import annotations

import atexit
import io
import os
import re
import sys
import tempfile
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

LOG_NAME = "third_party.log"


@dataclass(frozen=True)
class Noise:
    name: str        # what the count line calls it
    pattern: str     # a regular expression searched in the warning's text or the line


KNOWN: tuple[Noise, ...] = (
    Noise("Apex/TE fallback", r"(Apex is|Transformer Engine and Apex are) not installed"),
    Noise("TE's MoE version notice", r"Only transformer-engine>=\S+ supports MoE experts"),
    Noise("TE's Jax notice", r"Detected a Jax installation but could not find the shared "
                             r"object file for the Transformer Engine Jax"),
    Noise("one_logger's pointer", r"one_logger package is required to enable e2e metrics"),
    Noise("Megatron's SyntaxWarning", r"invalid escape sequence"),
    Noise("GPTModel deprecation", r"GPTModel IS DEPRECATED"),
    Noise("MimoModelConfig notice", r"MimoModelConfig is experimental"),
    Noise("CUDA_HOME notice", r"No CUDA runtime is found, using CUDA_HOME"),
    Noise("Liger's optional backends", r"(CuTe DSL|Ascend).* (not available|not installed)"),
    Noise("torch's barrier notice", r"barrier\(\): using the device under current context"),
    Noise("Megatron's ModelConfig advice", r"It is recommended to use a ModelConfig"),
    Noise("Megatron's mock-data cache notice", r"Unable to save MockGPTDataset indexes"),
    Noise("Megatron's rerun-state notice", r"RerunStateMachine initialized in mode"),
    Noise("AccumulateGrad stream notice", r"The AccumulateGrad node's stream does not match"),
    Noise("torch profiler's cycle notice", r"Profiler clears events at the end of each cycle"),
    Noise("deprecation notice", r"\b(DeprecationWarning|FutureWarning): "),
)
# a warning's source line, printed by showwarning under its message ("  warnings.warn(")
_SOURCE_LINE = re.compile(r"^\s+\S")


def match(text: str) -> Noise | None:
    """The known noise `text` is, or None."""
    for noise in KNOWN:
        if re.search(noise.pattern, text):
            return noise
    return None


class Quiet:
    """The filter of one process: what it took, where it wrote it."""

    def __init__(self, label: str, log: Path | None = None):
        self.label = label
        self.counts: Counter[str] = Counter()
        self.pending: list[str] = []        # taken before the log file is known
        self.log: Path | None = None
        self.reported = False
        self._skip_source = {"stdout": False, "stderr": False}
        if log is not None:
            self.set_log(log)

    def take(self, noise: Noise, text: str) -> None:
        self.counts[noise.name] += 1
        text = text if text.endswith("\n") else text + "\n"
        if self.log is None:
            self.pending.append(text)
            return
        with _open_log(self.log) as handle:
            handle.write(text)

    def set_log(self, path: Path) -> None:
        """Where the lines go from now on (and those taken so far)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        self.log = path
        with _open_log(path) as handle:
            handle.writelines(self.pending)
        self.pending = []

    def summary(self) -> str | None:
        """The one line: how many lines of which kind went where; None when none did."""
        total = sum(self.counts.values())
        if not total:
            return None
        kinds = ", ".join(f"{name} x{n}" for name, n in self.counts.most_common())
        where = self.log if self.log is not None else "nowhere (no log file)"
        return (f"[quiet] {total} known third-party warning line(s) at start ({kinds}) "
                f"went to {where}; QUIET=0 prints them")

    def report(self, stream=None) -> None:
        """Print the count line once (the first step of a run, or a tool's exit)."""
        if self.reported:
            return
        self.reported = True
        line = self.summary()
        if line is not None:
            if self.log is None:   # a tool's lines are kept in a file of their own
                self.set_log(Path(tempfile.gettempdir()) / f"{self.label}-{os.getpid()}.log")
                line = self.summary()
            print(line, file=stream or sys.__stderr__, flush=True)


class _LineFilter(io.TextIOBase):
    """Stands in for sys.stdout/sys.stderr: whole lines that are known noise go to the log
    (with a warning's source line under them), the rest to the real stream."""

    def __init__(self, quiet: Quiet, stream, name: str):
        self._quiet, self._stream, self._name, self._buffer = quiet, stream, name, ""

    def write(self, text: str) -> int:
        self._buffer += text
        while "\n" in self._buffer:
            line, self._buffer = self._buffer.split("\n", 1)
            self._line(line + "\n")
        if "\r" in self._buffer:   # a progress bar redraws in place: pass it on
            self._stream.write(self._buffer)
            self._buffer = ""
        return len(text)

    def _line(self, line: str) -> None:
        quiet = self._quiet
        if quiet._skip_source[self._name] and _SOURCE_LINE.match(line):
            quiet._skip_source[self._name] = False
            _append(quiet, line)
            return
        quiet._skip_source[self._name] = False
        noise = match(line)
        if noise is None:
            self._stream.write(line)
            return
        quiet.take(noise, line)
        quiet._skip_source[self._name] = "Warning:" in line

    def flush(self) -> None:
        if self._buffer:
            self._stream.write(self._buffer)
            self._buffer = ""
        self._stream.flush()

    def isatty(self) -> bool:
        return self._stream.isatty()

    def fileno(self) -> int:
        return self._stream.fileno()

    @property
    def encoding(self):
        return self._stream.encoding

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _open_log(path: Path):
    from training.safe_files import open_write

    return open_write(path, "notices log", append=True)


def _append(quiet: Quiet, line: str) -> None:
    """A warning's source line: into the log under its message, not counted again."""
    if quiet.log is None:
        quiet.pending.append(line)
    else:
        with _open_log(quiet.log) as handle:
            handle.write(line)


_ACTIVE: Quiet | None = None


def install(label: str, log: Path | None = None, report_at_exit: bool = True) -> Quiet | None:
    """Filter this process's warnings and printed lines (once; QUIET=0: not at all)."""
    global _ACTIVE
    if os.environ.get("QUIET", "1") == "0":
        return None
    if _ACTIVE is not None:
        return _ACTIVE
    quiet = _ACTIVE = Quiet(label, log)
    shown = warnings.showwarning

    def showwarning(message, category, filename, lineno, file=None, line=None):
        text = warnings.formatwarning(message, category, filename, lineno, line)
        noise = match(f"{category.__name__}: {message}")
        if noise is None:
            shown(message, category, filename, lineno, file, line)
        else:
            quiet.take(noise, text)

    warnings.showwarning = showwarning
    sys.stdout = _LineFilter(quiet, sys.stdout, "stdout")
    sys.stderr = _LineFilter(quiet, sys.stderr, "stderr")
    if report_at_exit:
        atexit.register(quiet.report)
    return quiet


def active() -> Quiet | None:
    return _ACTIVE
