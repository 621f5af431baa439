"""Find a run's torch profiler traces and load them with Holistic Trace Analysis (HTA).

Every way this can go wrong for a user (missing path, empty folder, truncated file, two
traces claiming the same rank, an nsys capture instead of a torch one) ends in a
``TraceReportError`` with one line that says what is wrong and what to do.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import warnings
import zlib
from pathlib import Path
from typing import Iterator

from training.reading import RecordError

DEVICES = ("gpu", "cpu")
OUTPUT_NAMES = ("trace_report.md", "trace_report.json", "trace_breakdown.png")
PROFILE_SUBDIR = "profile"
RUN_MANIFEST = "manifest.json"  # marks a run folder (training/launch writes it)
TRACE_SUFFIXES = (".json", ".json.gz")


class TraceReportError(RecordError):
    """Bad input for the trace report: the message is shown to the user as is (the project's
    one user error for a file, training.reading.RecordError: one line, exit 2)."""


@contextlib.contextmanager
def quiet_hta() -> Iterator[None]:
    """HTA logs progress and warnings to stdout; the report states what matters itself."""
    hta_logger = logging.getLogger("hta")
    old_level = hta_logger.level
    hta_logger.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hta_logger.setLevel(old_level)


def require_hta() -> None:
    """HTA comes with the `profile` extra; say how to get it instead of failing on an import."""
    try:
        import hta.trace_analysis  # noqa: F401
    except ModuleNotFoundError as e:
        raise TraceReportError(
            f"the trace report needs HolisticTraceAnalysis (missing module {e.name!r}): "
            "pip install -e '.[profile]' (make setup installs it)"
        ) from None


def trace_dir_of(path: Path) -> Path:
    """The folder holding the traces: PATH/profile for a run folder, else PATH itself."""
    if not path.exists():
        raise TraceReportError(f"{path} does not exist (give a run folder or a folder of torch profiler traces)")
    if path.is_file():
        return path.parent
    profile = path / PROFILE_SUBDIR
    if profile.is_dir():
        return profile
    if (path / RUN_MANIFEST).is_file():
        raise TraceReportError(
            f"{path} is a run folder without {PROFILE_SUBDIR}/: nothing was profiled (run with PROFILE=torch)"
        )
    return path


def is_trace_name(name: str) -> bool:
    return name.endswith(TRACE_SUFFIXES) and name not in OUTPUT_NAMES and name != RUN_MANIFEST


def find_trace_files(path: Path) -> list[Path]:
    """The torch profiler trace files named by ``path`` (a run folder, a trace folder or one trace)."""
    folder = trace_dir_of(path)
    if path.is_file():
        if not is_trace_name(path.name):
            raise TraceReportError(f"{path} is not a torch profiler trace (expected a .json or .json.gz file)")
        return [path]
    files = sorted(p for p in folder.iterdir() if p.is_file() and is_trace_name(p.name))
    if files:
        return files
    nsys = sorted(p.name for p in folder.iterdir() if p.suffix in (".nsys-rep", ".qdrep"))
    if nsys:
        raise TraceReportError(
            f"{folder} holds nsys captures ({', '.join(nsys)}) but no torch profiler traces; this report reads "
            "PROFILE=torch traces (open nsys captures with nsys-ui or `nsys stats`)"
        )
    where = f"{folder}" if folder == path else f"{path} or {folder}"
    raise TraceReportError(
        f"no torch profiler traces (*.json, *.json.gz) in {where}; capture them with PROFILE=torch"
    )


def _check_readable(path: Path) -> str | None:
    """Why HTA cannot read ``path`` (None when it is a complete JSON document)."""
    from hta.common.trace_parser import parse_trace_dict

    try:
        with quiet_hta():
            data = parse_trace_dict(str(path))
    except (EOFError, OSError, zlib.error, gzip.BadGzipFile) as e:
        return f"{path.name} is truncated or not a gzip file ({e})"
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        return f"{path.name} is truncated or not valid JSON ({e})"
    except RecursionError:
        return f"{path.name} is JSON nested too deep to read, not a chrome trace"
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        return f"{path.name} is not a chrome trace (no traceEvents list)"
    if not data["traceEvents"]:
        return f"{path.name} has no trace events"
    return None


def rank_map(files: list[Path]) -> dict[int, str]:
    """rank -> trace file, with HTA's rank detection (distributedInfo.rank; 0 when absent)."""
    from hta.common.trace_file import create_rank_to_trace_dict

    ranks: dict[int, str] = {}
    for f in files:
        if f.stat().st_size == 0:
            raise TraceReportError(f"{f} is empty (0 bytes): the capture did not finish writing it; "
                                   "capture again with PROFILE=torch")
        try:
            with quiet_hta():
                _, found = create_rank_to_trace_dict([str(f)])
        except (EOFError, OSError, zlib.error, UnicodeDecodeError) as e:
            raise TraceReportError(f"cannot read {f}: truncated or not a trace ({e})") from None
        ((rank, _),) = found.items()
        if rank in ranks:
            raise TraceReportError(
                f"{Path(ranks[rank]).name} and {f.name} in {f.parent} both hold rank {rank} (traces of two "
                "captures, or traces without distributedInfo); keep one capture per folder"
            )
        ranks[rank] = str(f)
    return dict(sorted(ranks.items()))


def load(files: list[Path]):
    """An ``hta.trace_analysis.TraceAnalysis`` over ``files``.

    HTA drops the last profiled step (its default: the profiler may stop before that step's
    GPU work is complete) when the trace holds two or more steps.
    """
    from hta.trace_analysis import TraceAnalysis

    ranks = rank_map(files)
    try:
        with quiet_hta():
            return TraceAnalysis(trace_files=ranks, trace_dir=str(files[0].parent))
    except (ValueError, EOFError, OSError, zlib.error, KeyError, IndexError, TypeError, AttributeError,
            RecursionError) as e:
        # Only now read each file again, to name the one that is broken.
        for f in files:
            problem = _check_readable(f)
            if problem:
                raise TraceReportError(f"cannot read trace: {problem}") from None
        raise TraceReportError(
            f"HTA could not load the traces in {files[0].parent} ({type(e).__name__}: {e}); are they torch "
            "profiler chrome traces?"
        ) from None
