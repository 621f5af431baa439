"""What a resume from a checkpoint folder (LOAD) starts from, read on the CPU before torchrun.

A folder Megatron saves into (`--save`) holds one subfolder per saved iteration and a marker:

    SAVE/latest_checkpointed_iteration.txt   the last iteration saved ("release": an import)
    SAVE/iter_0000010/                       one checkpoint (torch_dist: metadata.json, .metadata,
                                             *.distcp; torch: mp_rank_*/model_optim_rng.pt)

Megatron writes a checkpoint's files first and the marker last (after an async save's finalize
too), but a kill can still leave a folder half written (killed during the save: no
metadata.json yet) or, with megatron-core's own plain write, an empty marker (killed between
its truncation and its write). Our run writes the marker atomically
(training.checkpoint_marker, in the patch table); this module judges what is on disk, whoever
wrote it:

    scan(folder)          every iter_* folder, complete or not (and why), the marker, and the
                          iteration a resume takes: the last COMPLETE one
    last_complete(folder) that iteration and why each later folder was skipped (for a restart
                          loop: training/launch's RESTARTS)
    saved_run(folder)     the saved arguments and LR schedule of a torch_dist checkpoint,
                          read with megatron-core's own load_common_state_dict (the
                          checkpoint's small common object only, no tensor)
    schedule_changes(...) what a launch changes against the checkpoint's schedule, in
                          Megatron's own units (OptimizerParamScheduler counts samples)

Nothing here writes.
"""
from __future__ import annotations

import json
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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


# -- the saved run ---------------------------------------------------------------------------

# OptimizerParamScheduler.state_dict's fields, with the setting that makes each
# (megatron.training.training.get_optimizer_param_scheduler: steps are samples)
SCHEDULE_FIELDS = ("max_lr", "min_lr", "lr_warmup_steps", "lr_decay_steps", "lr_decay_style",
                   "start_wd", "end_wd", "wd_incr_steps")


@dataclass(frozen=True)
class SavedRun:
    """What a checkpoint says of the run that saved it."""
    iteration: int
    consumed_samples: int | None
    global_batch_size: int | None
    train_iters: int | None
    seq_length: int | None
    schedule: dict[str, Any]             # OptimizerParamScheduler.state_dict()
    wd_incr_style: str | None

    def iterations(self, steps: float | None) -> str:
        """Scheduler steps (samples) as iterations at the checkpoint's batch size."""
        if steps is None or not self.global_batch_size:
            return "?"
        value = steps / self.global_batch_size
        return f"{value:g}"


class UnreadableCheckpoint(ValueError):
    """A checkpoint whose saved arguments cannot be read (message says why)."""


def saved_run(folder: Path) -> SavedRun:
    """The saved arguments and schedule of one complete torch_dist checkpoint folder, read with
    megatron-core's load_common_state_dict (torch.load with weights_only and Megatron's safe
    globals; only the checkpoint's common object is read, never a tensor)."""
    if checkpoint_format(folder) != "torch_dist":
        raise UnreadableCheckpoint(f"{folder.name}/ is not a torch_dist checkpoint: its saved "
                                   "arguments are not read before torchrun")
    try:
        common = _load_common(folder)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as err:   # a foreign or damaged file (torch DCP's CheckpointException
        # is a BaseException): said in one line, not a traceback
        raise UnreadableCheckpoint(f"{folder.name}/'s saved state cannot be read "
                                   f"({type(err).__name__}: {str(err)[:200]})") from None
    if not isinstance(common, dict):
        raise UnreadableCheckpoint(f"{folder.name}/'s common state is no dictionary")
    args = common.get("args")
    schedule = common.get("opt_param_scheduler") or common.get("lr_scheduler") or {}

    def arg(name):
        return getattr(args, name, None) if args is not None else None

    return SavedRun(iteration=int(common.get("iteration", 0)),
                    consumed_samples=arg("consumed_train_samples"),
                    global_batch_size=arg("global_batch_size"),
                    train_iters=arg("train_iters"), seq_length=arg("seq_length"),
                    schedule=dict(schedule) if isinstance(schedule, dict) else {},
                    wd_incr_style=arg("weight_decay_incr_style"))


def _load_common(folder: Path) -> Any:
    """megatron-core's load_common_state_dict, its import's notices kept off the screen (no
    CUDA here, TE and apex absent: they say nothing about the checkpoint)."""
    import contextlib
    import io
    import logging
    import warnings

    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        logging.disable(logging.CRITICAL)
        try:
            from megatron.core.dist_checkpointing.serialization import load_common_state_dict

            return load_common_state_dict(str(folder))
        finally:
            logging.disable(logging.NOTSET)


# -- the launch's schedule against the checkpoint's -------------------------------------------

def launch_schedule(values: dict[str, Any]) -> dict[str, Any]:
    """The OptimizerParamScheduler fields a launch builds (Megatron's
    get_optimizer_param_scheduler for iteration-based training), from its settings."""
    bs, iters = values["BS"], values["TOTAL_ITERS"]
    decay = values.get("LR_DECAY_ITERS") or iters
    wd = values.get("WEIGHT_DECAY")
    return {"max_lr": values["LR"], "min_lr": values["MIN_LR"],
            "lr_warmup_steps": values["WARMUP_ITERS"] * bs, "lr_decay_steps": decay * bs,
            "lr_decay_style": values["LR_DECAY_STYLE"], "start_wd": wd, "end_wd": wd,
            "wd_incr_steps": iters * bs}


# which settings make each field (the first is the one a user sets for it)
FIELD_SETTINGS = {"max_lr": ("LR",), "min_lr": ("MIN_LR",),
                  "lr_warmup_steps": ("WARMUP_ITERS", "BS"),
                  "lr_decay_steps": ("LR_DECAY_ITERS", "TOTAL_ITERS", "BS"),
                  "lr_decay_style": ("LR_DECAY_STYLE",),
                  "start_wd": ("WEIGHT_DECAY",), "end_wd": ("WEIGHT_DECAY",),
                  "wd_incr_steps": ("TOTAL_ITERS", "BS")}
FIELD_WORDS = {"max_lr": "peak LR", "min_lr": "final LR", "lr_warmup_steps": "warm-up",
               "lr_decay_steps": "decay span", "lr_decay_style": "decay style",
               "start_wd": "weight decay", "end_wd": "final weight decay",
               "wd_incr_steps": "weight-decay span"}


@dataclass(frozen=True)
class Change:
    field: str
    checkpoint: Any
    launch: Any
    settings: tuple[str, ...]      # the settings behind the launch's value
    inert: bool = False            # no effect on training (the weight-decay span, constant wd)

    def text(self, saved: SavedRun, launch_bs: int) -> str:
        if self.field.endswith("_steps"):
            return (f"{FIELD_WORDS[self.field]} {saved.iterations(self.checkpoint)} -> "
                    f"{_num(self.launch / launch_bs)} iterations ({_num(self.checkpoint)} -> "
                    f"{_num(self.launch)} samples)")
        return f"{FIELD_WORDS[self.field]} {_num(self.checkpoint)} -> {_num(self.launch)}"


def _num(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def schedule_changes(saved: SavedRun, values: dict[str, Any]) -> list[Change]:
    """Each scheduler field whose launch value Megatron would find differs from the
    checkpoint's (its OptimizerParamScheduler.load_state_dict asserts them equal unless
    --use-checkpoint-opt_param-scheduler or --override-opt_param-scheduler)."""
    ours = launch_schedule(values)
    changes = []
    for name in SCHEDULE_FIELDS:
        if name not in saved.schedule:
            continue
        old, new = saved.schedule[name], ours[name]
        if old == new or (isinstance(old, float) and isinstance(new, (int, float))
                          and abs(old - new) <= 1e-12 * max(abs(old), abs(new))):
            continue
        inert = name == "wd_incr_steps" and (saved.wd_incr_style or "constant") == "constant"
        changes.append(Change(name, old, new, FIELD_SETTINGS[name], inert))
    return changes


def describe_schedule(schedule: dict[str, Any], bs: int | None) -> str:
    """A scheduler state in words: warm-up and decay in iterations at batch size `bs`."""
    def its(steps):
        return _num(steps / bs) if bs and steps is not None else "?"

    return (f"warm-up {its(schedule.get('lr_warmup_steps'))} it, "
            f"{schedule.get('lr_decay_style')} decay over {its(schedule.get('lr_decay_steps'))} "
            f"it, LR {_num(schedule.get('max_lr'))} -> {_num(schedule.get('min_lr'))}")


# -- the resume a launch makes -----------------------------------------------------------------

@dataclass
class ResumePoint:
    """LOAD as a launch resumes it: what is on disk, the iteration taken, the saved run."""
    scan: Scan
    iteration: int | None              # the iteration a resume loads (None: none to load)
    saved: SavedRun | None = None      # its saved arguments and schedule (torch_dist)
    unread: str | None = None          # why `saved` is None

    @property
    def folder(self) -> Path:
        return self.scan.folder


def resume_point(load: Path, fmt: str | None, ckpt_step: int | None) -> ResumePoint:
    """The checkpoint a launch with LOAD=load resumes: CKPT_STEP where given, else the last
    complete one (the marker's, unless it names a half-written or missing folder), and what
    that checkpoint saved."""
    found = scan(load, fmt)
    if ckpt_step is not None:
        iteration = ckpt_step
    elif found.release:
        return ResumePoint(found, 0, unread="an import (release): weights only")
    else:
        iteration = found.last_complete if found.redirect() else found.marker_iteration
    if iteration is None or iteration not in found.complete:
        return ResumePoint(found, iteration)
    try:
        return ResumePoint(found, iteration, saved_run(load / iteration_folder(iteration)))
    except UnreadableCheckpoint as err:
        return ResumePoint(found, iteration, unread=str(err))
