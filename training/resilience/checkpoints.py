"""Which checkpoint of a SAVE folder is the last complete one.

Megatron's distributed checkpoint (torch_dist, torch_dcp, fsdp_dtensor) writes its
iter_NNNNNNN/metadata.json last, when every rank's shards are finalized
(megatron.core.dist_checkpointing.serialization.save): a folder without it was cut short
(SIGKILL during the write). The tracker, latest_checkpointed_iteration.txt, is written after
that by rank 0; a save killed between the two leaves it one checkpoint behind, and a kill
during its own write leaves it empty. A `torch`-format checkpoint has no such mark: there the
tracker alone says which is complete.

NOTE for the lead (issue 52): helper 52a builds the atomic latest-checkpoint marker and its
own finder; `last_complete_checkpoint` is the one function the restart loop calls, to be
unified with 52a's.
"""
from __future__ import annotations

import re
from pathlib import Path

TRACKER = "latest_checkpointed_iteration.txt"     # Megatron's
DIST_COMPLETE = "metadata.json"                   # dist_checkpointing's last file
_ITER = re.compile(r"^iter_(\d{7})$")


def tracker_iteration(save_dir: Path) -> int | None:
    """The tracker's iteration, or None (absent, empty, `release` or unreadable)."""
    try:
        text = (Path(save_dir) / TRACKER).read_text(errors="replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def complete_iterations(save_dir: Path) -> list[int]:
    """The iterations whose distributed checkpoint is complete, ascending."""
    found = []
    try:
        entries = list(Path(save_dir).iterdir())
    except OSError:
        return []
    for entry in entries:
        match = _ITER.match(entry.name)
        if match and (entry / DIST_COMPLETE).is_file():
            found.append(int(match.group(1)))
    return sorted(found)


def last_complete_checkpoint(save_dir: str | Path | None) -> int | None:
    """The iteration of the last complete checkpoint in `save_dir`, or None (none there).

    Distributed checkpoints: the newest iteration whose metadata.json is written, whatever
    the tracker says (a save killed after its shards, before the tracker, is complete).
    `torch` format (no metadata.json anywhere): the tracker's iteration, if its folder exists."""
    if not save_dir:
        return None
    save_dir = Path(save_dir)
    complete = complete_iterations(save_dir)
    if complete:
        return complete[-1]
    tracked = tracker_iteration(save_dir)
    if tracked is not None and (save_dir / f"iter_{tracked:07d}").is_dir():
        return tracked
    return None
