"""Megatron's latest-checkpoint marker written atomically (the patch table's atomic_marker).

megatron.training.checkpointing writes SAVE/latest_checkpointed_iteration.txt once a save is
finalized (after the last rank's data and metadata.json; for --async-save in the finalize step
that runs when the background write has finished) with a plain write-mode open and write: a SIGKILL
between the truncation and the write leaves an empty marker, on which Megatron's next load
exits ("Invalid metadata file"), and nothing is flushed to the disk before the marker moves.

Here the marker is written to a temporary file beside it, flushed and fsynced, renamed over
the marker (os.replace: atomic on one filesystem), and the folder fsynced: at any kill the
marker names either the previous complete checkpoint or the new complete one. The
replacement is the checkpointing module's `maybe_msc` (the storage facade every open there
goes through): the marker's writes take this path, every other call is megatron-core's own.
Where Megatron's multi-storage client is on (object stores), it is left as it is.
"""
from __future__ import annotations

import os
from pathlib import Path

from training.checkpoint_scan import TRACKER


def write_marker(path: Path, text: str) -> None:
    """Put `text` in `path` atomically and durably: temp file, fsync, rename, fsync folder."""
    path = Path(path)
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(temp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temp, path)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


class _MarkerFile:
    """What Megatron's write-mode open of the marker hands it: collects the text, commits it on a clean close."""

    def __init__(self, path: Path):
        self.path, self.parts, self.closed = path, [], False

    def write(self, text: str) -> int:
        self.parts.append(text)
        return len(text)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            write_marker(self.path, "".join(self.parts))

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb) -> None:
        if kind is None:
            self.close()
        else:   # an error inside the block: the old marker stays
            self.closed = True


class AtomicMarkerStorage:
    """megatron-core's maybe_msc, whose write-mode open of the marker writes it atomically."""

    def __init__(self, original):
        self._original = original

    def open(self, file, mode: str = "r", *args, **kwargs):
        from megatron.core.msc_utils import MultiStorageClientFeature

        if (mode in ("w", "wt") and not args and not kwargs and Path(str(file)).name == TRACKER
                and not MultiStorageClientFeature.is_enabled()):
            return _MarkerFile(Path(str(file)))
        return self._original.open(file, mode, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._original, name)


def atomic_marker_storage(original, run) -> AtomicMarkerStorage:
    """The patch table's factory: the checkpointing module's maybe_msc, wrapped."""
    if isinstance(original, AtomicMarkerStorage):
        return original
    return AtomicMarkerStorage(original)
