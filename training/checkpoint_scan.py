"""Which checkpoints of a folder Megatron saves into are complete, read from the disk alone.

    SAVE/latest_checkpointed_iteration.txt   the marker: the last iteration saved ("release":
                                             an import)
    SAVE/iter_0000010/                       one checkpoint (torch_dist: metadata.json, .metadata,
                                             *.distcp; torch: mp_rank_*/model_optim_rng.pt)

A checkpoint is complete when the files its writer puts last are whole (incomplete_reason):
torch_dist, megatron's metadata.json and torch DCP's .metadata index; torch_dcp/fsdp_dtensor,
the index; torch (legacy), every rank's archive. `scan` judges every iter_* folder and the
marker, `last_complete` gives the iteration a resume takes. One rule for every reader: the
launcher's resume plan (training.launch.resume), the atomic marker (training.checkpoint_marker)
and the supervisor's restarts (training.resilience.supervise). The standard library only (the
supervisor runs it before torchrun); nothing here writes.
"""
from __future__ import annotations

import json
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

TRACKER = "latest_checkpointed_iteration.txt"   # megatron.training.checkpointing's marker
DIST_CONFIG = "metadata.json"     # megatron's dist_checkpointing config, written after the data
DCP_INDEX = ".metadata"           # torch.distributed.checkpoint's index, written after the data
_ITER = re.compile(r"^iter_(\d{7,})$")


def iteration_folder(iteration: int) -> str:
    """The subfolder megatron.training.checkpointing.get_checkpoint_name saves an iteration in."""
    return f"iter_{iteration:07d}"


def incomplete_reason(folder: Path, fmt: str | None = "torch_dist") -> str | None:
    """Why a checkpoint folder (iter_XXXXXXX/ or release/) is not a complete checkpoint, or
    None when it is; `fmt` is the format the run saves (CKPT_FORMAT; None: Megatron's
    default, torch_dist), which a torch_dist save killed between DCP's index and megatron's
    metadata.json would otherwise pass for (a torch_dcp checkpoint). torch_dist: megatron's metadata.json (written by dist_checkpointing.save
    after every rank's data, an async save's included) and torch DCP's .metadata index;
    torch_dcp/fsdp_dtensor: the .metadata index (written last by DCP's coordinator); torch
    (legacy): every mp_rank_*/model_optim_rng.pt a whole zip archive (torch.save's format: a
    truncated one has no central directory)."""
    if not folder.is_dir():
        return "not a folder"
    config = folder / DIST_CONFIG
    if config.is_file():
        try:
            backend = json.loads(config.read_text()).get("sharded_backend")
        except (OSError, ValueError, AttributeError):
            return f"{DIST_CONFIG} is cut short or unreadable (killed while it was written)"
        if not backend:
            return f"{DIST_CONFIG} names no sharded backend"
        if not (folder / DCP_INDEX).is_file():
            return f"{DIST_CONFIG} is there but the {DCP_INDEX} index is not"
        return None
    ranks = sorted(p for p in folder.glob("mp_rank_*") if p.is_dir())
    if ranks:
        for rank in ranks:
            files = list(rank.glob("*.pt"))
            if not files:
                return f"{rank.name}/ holds no .pt file (killed during the save)"
            for file in files:
                if not zipfile.is_zipfile(file):
                    return f"{rank.name}/{file.name} is cut short (killed during the save)"
        return None
    if (folder / DCP_INDEX).is_file() and fmt not in (None, "torch_dist"):
        return None
    if (folder / DCP_INDEX).is_file():
        return (f"the {DCP_INDEX} index is there but not {DIST_CONFIG}: killed at the end of "
                "the save")
    if not any(folder.iterdir()):
        return "empty (killed as the save began)"
    return (f"no {DIST_CONFIG} or {DCP_INDEX} yet: the save did not finish (killed or still "
            "writing)")


def checkpoint_format(folder: Path) -> str:
    """torch_dist | torch_dcp | torch: the format of a complete checkpoint folder."""
    if (folder / DIST_CONFIG).is_file():
        return "torch_dist"
    return "torch" if any(folder.glob("mp_rank_*")) else "torch_dcp"


@dataclass
class Scan:
    """A checkpoint folder as a resume sees it."""
    folder: Path
    marker: str | None                   # the marker's text (None: no marker)
    marker_iteration: int | None         # the iteration it names (None: none, release, unreadable)
    marker_problem: str | None           # why the marker cannot be used as it is
    complete: list[int] = field(default_factory=list)            # complete iterations, ascending
    incomplete: dict[int, str] = field(default_factory=dict)     # iteration -> why not complete
    release: bool = False                # the marker says "release" and release/ is complete

    @property
    def last_complete(self) -> int | None:
        return self.complete[-1] if self.complete else None

    @property
    def has_checkpoint(self) -> bool:
        return self.release or bool(self.complete)

    def skipped(self) -> list[str]:
        """Why each folder after the last complete one is not resumed from, one line each."""
        last = self.last_complete if self.last_complete is not None else -1
        return [f"{iteration_folder(i)}: {why}" for i, why in sorted(self.incomplete.items())
                if i > last]

    def nothing_to_resume(self) -> str:
        """Why the folder holds no checkpoint to resume (when has_checkpoint is False)."""
        if self.marker is None:
            what = f"no {TRACKER}"
        elif self.marker_problem:
            what = f"{TRACKER} {self.marker_problem}"
        elif self.marker_iteration in self.incomplete:
            what = (f"{TRACKER} names {iteration_folder(self.marker_iteration)}/, which is "
                    f"incomplete ({self.incomplete[self.marker_iteration]})")
        else:
            what = f"{TRACKER} names {iteration_folder(self.marker_iteration)}/, which is not there"
        skipped = [line for line in self.skipped() if not line.startswith(
            f"{iteration_folder(self.marker_iteration)}:")] if self.marker_iteration is not None \
            else self.skipped()
        return what + (f"; half-written: {'; '.join(skipped)}" if skipped else "")

    def redirect(self) -> str | None:
        """Why a resume must not take the marker's iteration (and takes last_complete
        instead), or None when the marker names the last complete checkpoint."""
        if self.release or self.last_complete is None:
            return None
        last = iteration_folder(self.last_complete)
        if self.marker is None:
            return (f"there is no {TRACKER} (killed after {last}/ was written, before the "
                    "marker)")
        if self.marker_problem:
            return f"{TRACKER} {self.marker_problem}"
        if self.marker_iteration in self.incomplete:
            return (f"{TRACKER} names {iteration_folder(self.marker_iteration)}/, which is "
                    f"incomplete ({self.incomplete[self.marker_iteration]})")
        if self.marker_iteration not in self.complete:
            return (f"{TRACKER} names {iteration_folder(self.marker_iteration)}/, which is "
                    "not there")
        if self.marker_iteration < self.last_complete:
            return (f"{TRACKER} names {iteration_folder(self.marker_iteration)}/, and {last}/ "
                    "after it is complete (killed after its last file, before the marker)")
        return None


def scan(folder: Path, fmt: str | None = "torch_dist") -> Scan:
    """Every checkpoint in `folder`, complete or not, and its marker (`fmt`: the format the
    run saves, as incomplete_reason)."""
    folder = Path(folder)
    marker, marker_iteration, problem, release = None, None, None, False
    path = folder / TRACKER
    if path.is_file():
        try:
            marker = path.read_text(errors="replace").strip()
        except OSError as err:
            marker, problem = "", f"cannot be read ({err.strerror or err})"
        if problem is None:
            if marker == "release":
                why = incomplete_reason(folder / "release", fmt)
                release = why is None
                problem = None if release else f"says release, and release/ is {why}"
            elif marker.isdigit():
                marker_iteration = int(marker)
            elif not marker:
                problem = "is empty (killed while Megatron wrote it)"
            else:
                problem = f"says {marker[:40]!r}, neither an iteration nor 'release'"
    result = Scan(folder, marker, marker_iteration, problem, release=release)
    if folder.is_dir():
        for sub in folder.iterdir():
            found = _ITER.match(sub.name)
            if not found or not sub.is_dir():
                continue
            why = incomplete_reason(sub, fmt)
            if why is None:
                result.complete.append(int(found.group(1)))
            else:
                result.incomplete[int(found.group(1))] = why
    result.complete.sort()
    return result


def last_complete(folder: Path, fmt: str | None = "torch_dist") -> tuple[int | None, list[str]]:
    """The last complete checkpoint's iteration in a SAVE folder (None: there is none), and
    one line for each folder after it that a resume skips, saying why."""
    found = scan(folder, fmt)
    return found.last_complete, found.skipped()
