"""manifest.json: what was resolved for a run, written before torchrun starts.

The run (rank 0) adds a `run` section (versions seen at start, GPU, final metrics) when it
finishes; bench, optimize and trace_report read the file.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import socket

from training import REPO_ROOT
from training.versions import launcher_versions

from .environment import shown
from training.credentials import mask_text
from .resolve import Launch
from .runfolder import git_sha, mark_ours, package_versions, write_json_atomic
from .settings import fmt_value
from .toggles import LAUNCHER

# 2: the sections of training.run_description (layout: + microbatches, - fsdp and
# distributed_optimizer, which are in values; + kernels, platform, tokens_per_step)
SCHEMA = 2


def toggle_rows(launch: Launch) -> list[dict[str, str]]:
    """One row per registry entry (the core's, then the recipe layers'), in registry order:
    the table and the manifest share it."""
    rows = []
    for toggle in launch.toggles:
        setting = launch.settings.setting(toggle.name)
        words = launch.emitted.get(toggle.name)
        if (setting.value is None and not words) or words is None:
            flag = "" if toggle.bucket == LAUNCHER or toggle.built else "-"
        else:
            flag = " ".join(words) if words else "(megatron default)"
        rows.append({"toggle": toggle.name, "value": shown(toggle.name, fmt_value(setting.value)),
                     "source": setting.source, "flag": flag, "bucket": toggle.bucket,
                     "reason": setting.reason, "group": toggle.group,
                     "requested": fmt_value(setting.requested) if setting.requested is not None
                     else None})
    return rows


def model_rows(launch: Launch) -> list[dict[str, str]]:
    """The shape's fields, one row each, when MODEL_CONFIG gave it (none for a preset)."""
    from .model_config import shape_rows

    if launch.ctx.model_config is None:
        return []
    return shape_rows(launch.ctx.preset, launch.command)


def fork_rows(launch: Launch) -> dict[str, dict[str, str]]:
    """The ROCm fork's own variables the launch was given (training/launch/fork_vars.py:
    accepted ones; the rest were refused), for the table and the manifest."""
    from .fork_vars import OWN

    return {name: {"value": shown(name, raw), "source": source, "meaning": OWN[name].meaning,
                   "here": OWN[name].here}
            for name, (raw, source) in launch.ctx.fork_given.items()}


def launch_manifest(launch: Launch) -> dict:
    """The run description's sections (family, model, layout, values, ...: read back with
    training.run_description.RunDescription.from_dict), then how the launch was resolved."""
    s = launch.settings
    return {
        "schema": SCHEMA,
        "created": _dt.datetime.now().isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "dry_run": bool(s["DRY_RUN"]),
        **launch.run.to_dict(),
        "toggles": toggle_rows(launch),
        "model_config": ({"path": str(launch.ctx.model_config.path),
                          "kind": launch.ctx.model_config.kind, "fields": model_rows(launch)}
                         if launch.ctx.model_config is not None else None),
        "notices": [dataclasses.asdict(n) for n in s.notices],
        "environment": {k: {"value": shown(k, v), "source": src, "reason": why}
                        for k, (v, src, why) in launch.env.items()},
        "passthrough_env": {k: shown(k, v) for k, v in launch.passthrough_env.items()},
        "fork_variables": fork_rows(launch),
        "buckets": launch.buckets,
        "user_args": launch.user_args,
        "command": launch.command,
        "command_line": mask_text(launch.command_line),
        "log_dir": str(launch.log_dir),
        "megatron": launch.ctx.megatron.to_dict() if launch.ctx.megatron else None,
        "git_sha": git_sha(REPO_ROOT),
        "versions": {**package_versions(), **launcher_versions()},
    }


def write_launch_manifest(launch: Launch) -> None:
    mark_ours(launch.log_dir)
    write_json_atomic(launch.log_dir / "manifest.json", launch_manifest(launch))
