"""What a resume from a checkpoint folder (LOAD) starts from, read on the CPU before torchrun.

Which checkpoints of LOAD are complete, and the iteration a resume takes, is
training.checkpoint_scan's (one rule for the launcher, the marker and the supervisor's
restarts); here:

    saved_run(folder)     the saved arguments and LR schedule of a torch_dist checkpoint,
                          read with megatron-core's own load_common_state_dict (the
                          checkpoint's small common object only, no tensor)
    schedule_changes(...) what a launch changes against the checkpoint's schedule, in
                          Megatron's own units (OptimizerParamScheduler counts samples)

Nothing here writes.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training.checkpoint_scan import Scan, checkpoint_format, iteration_folder, scan


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
