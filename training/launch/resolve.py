"""Environment + KEY=VALUE words -> a resolved, checked launch.

The order: registry defaults -> model preset -> user values (env, then KEY=VALUE words) ->
platform capabilities -> precision recipe -> backend -> guards -> buckets -> run folder.
Everything a user sees in the table comes from the Settings this builds.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from . import capabilities as capabilities_mod
from training.run_description import Model, RunDescription

from .environment import resolve_environment
from .guards import LaunchContext, run_guards, visible_gpu_count
from .presets import FAMILIES, preset_for
from .recipes import resolve_precision
from .runfolder import default_run_name, new_run_id, run_dir
from .settings import BadInput, LaunchError, Setting, Settings
from .toggles import (BY_NAME, CLOSING_WORDS, DISTRIBUTED_ARGS, MEGATRON_BUCKETS, OUTPUT_ARGS,
                      REGISTRY, auto_backend, auto_native_kernels, closest_toggle, parse_value)

REPO_ROOT = Path(__file__).resolve().parents[2]
PRETRAIN_SCRIPT = str(REPO_ROOT / "training" / "pretrain_gpt.py")
_ENV_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")


@dataclass
class Launch:
    family: str
    settings: Settings
    ctx: LaunchContext
    run: RunDescription                      # the resolved run, typed (manifest.json holds it)
    buckets: dict[str, list[str]]            # bucket -> Megatron words (and DISTRIBUTED_ARGS)
    emitted: dict[str, list[str]]            # toggle -> the words it contributed
    env: dict[str, tuple[str, str, str]]     # name -> (value, source, reason)
    passthrough_env: dict[str, str]          # unknown KEY=VALUE words, exported to the run
    user_args: list[str]                     # raw --flags after the script name
    log_dir: Path
    profiler_prefix: list[str] = field(default_factory=list)  # nsys wrapper, if any

    @property
    def command(self) -> list[str]:
        words = list(self.profiler_prefix) + ["torchrun", *self.buckets[DISTRIBUTED_ARGS],
                                              PRETRAIN_SCRIPT]
        for bucket in MEGATRON_BUCKETS:
            words += self.buckets[bucket]
        return words + self.user_args

    @property
    def command_line(self) -> str:
        return shlex.join(self.command)


def split_words(words: list[str]) -> tuple[dict[str, str], list[str]]:
    """KEY=VALUE words and --flags after the script name."""
    assignments: dict[str, str] = {}
    flags: list[str] = []
    for word in words:
        if word.startswith("--"):
            flags.append(word)
        elif flags:  # a value of a preceding --flag
            flags.append(word)
        elif "=" in word and _ENV_NAME.match(word.split("=", 1)[0]):
            key, value = word.split("=", 1)
            assignments[key] = value
        else:
            raise BadInput(f"unexpected word {word!r} after the script name: use KEY=VALUE "
                           "(e.g. TP=2) or Megatron --flags after them.")
    return assignments, flags


def _initial_settings(family: str, environ: dict[str, str], assignments: dict[str, str]
                      ) -> tuple[Settings, dict[str, str]]:
    settings = Settings()
    for toggle in REGISTRY:
        settings.values[toggle.name] = Setting(toggle.name, toggle.default, "default")
    settings.values["MODEL_SIZE"] = Setting("MODEL_SIZE", FAMILIES[family][1], "default")

    passthrough: dict[str, str] = {}
    lookalikes: list[str] = []
    for source, values in (("env", environ), ("cli", assignments)):
        for name, raw in values.items():
            toggle = BY_NAME.get(name)
            if toggle is not None:
                if raw == "" and source == "env":
                    continue  # VAR= in the environment means unset
                settings.values[name] = Setting(name, parse_value(toggle, raw), source)
                continue
            close = closest_toggle(name) if _ENV_NAME.match(name) else None
            if close is not None:
                lookalikes.append(f"{name} is not a toggle; did you mean {close}? ({source})")
            if source == "cli":
                passthrough[name] = raw
    if lookalikes and settings.get("STRICT"):
        raise BadInput("STRICT=1: unknown toggle-like variables:\n  " + "\n  ".join(lookalikes))
    for text in lookalikes:
        settings.warn("unknown_toggle", text)
    for name in passthrough:
        if closest_toggle(name) is None:
            settings.info("passthrough_env", f"{name} is not a toggle: exported to the run's "
                                             "environment as given.")
    return settings, passthrough


def _resolve_backend(settings: Settings, caps: capabilities_mod.Capabilities) -> None:
    if settings["TRANSFORMER_IMPL"] == "auto":
        backend, why = auto_backend(caps.transformer_engine)
        settings.values["TRANSFORMER_IMPL"] = Setting(
            "TRANSFORMER_IMPL", backend, "platform", f"auto: {why} ({caps.source})")
    if settings["NATIVE_KERNELS"] == "auto":
        kernels, why = auto_native_kernels(caps.liger)
        settings.values["NATIVE_KERNELS"] = Setting("NATIVE_KERNELS", kernels, "platform",
                                                    f"auto: {why}")


def resolve(family: str, environ: dict[str, str], words: list[str] | None = None) -> Launch:
    if family not in FAMILIES:
        raise BadInput(f"unknown family {family!r}: use one of {', '.join(FAMILIES)}.")
    assignments, user_args = split_words(words or [])
    settings, passthrough = _initial_settings(family, environ, assignments)

    preset = preset_for(family, settings["MODEL_SIZE"])
    settings.put("NUM_LAYERS", preset.num_layers, "preset", preset.name)
    settings.put("SEQ_LENGTH", preset.seq_length, "preset", preset.name)
    for name, value in preset.train_defaults.items():
        settings.put(name, value, "preset", preset.name)

    caps = capabilities_mod.resolve(settings["PLATFORM"])
    if settings.get("GPUS_PER_NODE") is None:
        count = visible_gpu_count(caps, environ)
        if count:
            settings.put("GPUS_PER_NODE", count, "platform", f"GPUs visible ({caps.source})")
        else:
            settings.put("GPUS_PER_NODE", 1, "platform",
                         "no GPU visible: a DRY_RUN assumes 1 (set GPUS_PER_NODE or PLATFORM)")

    recipe = resolve_precision(settings)
    _resolve_backend(settings, caps)
    ctx = LaunchContext(settings, caps, preset, recipe, family, dict(environ))
    run_guards(ctx)

    name = settings.get("EXP_NAME") or default_run_name(
        preset.name, settings["NUM_LAYERS"], preset.num_layers, settings["NNODES"],
        settings["GPUS_PER_NODE"], settings["TP"], settings["PP"], settings["CP"],
        settings["MBS"], settings["BS"], settings["SEQ_LENGTH"])
    if "/" in name or name in (".", ".."):
        raise BadInput(f"EXP_NAME={name!r} must be a single folder name (no '/').")
    if settings.get("RUN_ID") is None:
        settings.put("RUN_ID", new_run_id(), "derived", "timestamp of this launch")
    log_dir = run_dir(settings["EXPERIMENT_DIR"], name, recipe.name, settings["RUN_ID"])
    if not log_dir.is_absolute():
        log_dir = (Path.cwd() / log_dir)

    extra = shlex.split(settings.get("EXTRA_MEGATRON_ARGS") or "")
    user_args = extra + user_args
    buckets, emitted = build_buckets(ctx, log_dir)
    if extra:
        emitted["EXTRA_MEGATRON_ARGS"] = extra
    env = resolve_environment(caps.info.vendor if caps.info else None, environ,
                              fsdp=bool(settings["FSDP"]), platform=caps.platform,
                              backend=settings["TRANSFORMER_IMPL"])
    run = RunDescription(family, Model.of(preset), settings.as_values(), caps.platform,
                         caps.to_dict())
    launch = Launch(family, settings, ctx, run, buckets, emitted, env, passthrough, user_args,
                    log_dir)
    if settings["PROFILE"] == "nsys":
        launch.profiler_prefix = [
            "nsys", "profile", "--capture-range=cudaProfilerApi", "--capture-range-end=stop",
            "--trace=cuda,nvtx,osrt", "--trace-fork-before-exec=true", "--force-overwrite=true",
            "-o", str(log_dir / "profile" / f"nsys_node{settings['NODE_RANK']}")]
    return launch


def build_buckets(ctx: LaunchContext, log_dir: Path) -> tuple[dict[str, list[str]],
                                                              dict[str, list[str]]]:
    """bucket -> words, and toggle -> the words it contributed (the table's flag column).
    Each bucket: the toggles' value flags (registry order), the run folder's words (OUTPUT),
    the built flags (each entry's emit, registry order), then CLOSING_WORDS."""
    s = ctx.settings
    buckets: dict[str, list[str]] = {b: [] for b in (*MEGATRON_BUCKETS, DISTRIBUTED_ARGS)}
    emitted: dict[str, list[str]] = {}

    def add(toggle_name: str, bucket: str, words: list[str]) -> None:
        buckets[bucket].extend(words)
        emitted.setdefault(toggle_name, []).extend(words)

    for toggle in REGISTRY:
        if toggle.built or toggle.bucket not in buckets:
            continue
        if toggle.when is not None and not toggle.when(s):
            continue
        add(toggle.name, toggle.bucket, toggle.flags_for(s[toggle.name]))
    buckets[OUTPUT_ARGS] += run_folder_words(log_dir)
    for toggle in REGISTRY:
        for flags in toggle.emit(toggle, ctx) if toggle.emit else ():
            add(flags.toggle or toggle.name, flags.bucket, flags.words)
    for bucket, words in CLOSING_WORDS:
        buckets[bucket] += words
    return buckets, emitted


def run_folder_words(log_dir: Path) -> list[str]:
    """Where the run writes: the run folder (metrics.jsonl, train.log's siblings), TensorBoard."""
    return ["--run-dir", str(log_dir), "--tensorboard-dir", str(log_dir / "tensorboard"),
            "--log-throughput", "--log-memory-to-tensorboard"]
