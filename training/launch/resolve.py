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
from .recipes import recipe_args, resolve_precision
from .runfolder import default_run_name, new_run_id, run_dir
from .settings import BadInput, LaunchError, Setting, Settings
from .toggles import (BY_NAME, DATA_ARGS, DISTRIBUTED_ARGS, EXTRA_ARGS, GPT_ARGS,
                      MEGATRON_BUCKETS, OUTPUT_ARGS, REGISTRY, TRAIN_ARGS, auto_backend,
                      auto_native_kernels, backend_flags, closest_toggle, nan_check_flags,
                      parse_value)

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
    s, preset = ctx.settings, ctx.preset
    buckets: dict[str, list[str]] = {b: [] for b in (*MEGATRON_BUCKETS, DISTRIBUTED_ARGS)}
    emitted: dict[str, list[str]] = {}

    def add(toggle_name: str, bucket: str, words: list[str]) -> None:
        buckets[bucket].extend(words)
        emitted.setdefault(toggle_name, []).extend(words)

    # Simple registry entries: the flag the value maps to, in the entry's bucket.
    for toggle in REGISTRY:
        if toggle.emitted_by is not None or toggle.bucket not in buckets:
            continue
        if toggle.name == "CROSS_ENTROPY_FUSION_IMPL" and not s["CROSS_ENTROPY_LOSS_FUSION"]:
            continue
        add(toggle.name, toggle.bucket, toggle.flags_for(s[toggle.name]))

    # Model preset, precision recipe, backend, recompute.
    add("MODEL_SIZE", GPT_ARGS, preset.gpt_args(s["NUM_LAYERS"], s["SEQ_LENGTH"]))
    add("SEQ_LENGTH", DATA_ARGS, ["--seq-length", str(s["SEQ_LENGTH"])])
    add("PRECISION", GPT_ARGS, recipe_args(ctx.recipe, s))
    backend = s["TRANSFORMER_IMPL"]
    gpt_words, train_words = backend_flags(backend, ctx.caps.masked_softmax_kernel)
    add("TRANSFORMER_IMPL", GPT_ARGS, gpt_words + ["--transformer-backend", backend])
    if train_words:
        add("TRANSFORMER_IMPL", TRAIN_ARGS, train_words)
    if backend == "native":
        add("NATIVE_KERNELS", GPT_ARGS, ["--native-kernels", s["NATIVE_KERNELS"]])
    if s["MANUAL_GC_INTERVAL"] < 0:
        raise BadInput(f"MANUAL_GC_INTERVAL={s['MANUAL_GC_INTERVAL']} is negative: use 0 "
                       "(Python's automatic GC) or N > 0 (collect every N iterations).")
    if s["MANUAL_GC_INTERVAL"] > 0:
        add("MANUAL_GC_INTERVAL", TRAIN_ARGS,
            ["--manual-gc", "--manual-gc-interval", str(s["MANUAL_GC_INTERVAL"])])
    add("NAN_CHECK", TRAIN_ARGS,
        ["--nan-check", s["NAN_CHECK"], *nan_check_flags(s["NAN_CHECK"])])
    recompute = s["RECOMPUTE"]
    if recompute == "selective":
        add("RECOMPUTE", GPT_ARGS, ["--recompute-granularity", "selective"])
    elif recompute == "full":
        add("RECOMPUTE", GPT_ARGS, ["--recompute-granularity", "full", "--recompute-method",
                                    "uniform", "--recompute-num-layers", "1"])

    # Data: a real dataset with its tokenizer (one split by SPLIT, or separate train and
    # validation sets), or mock data.
    from training.data.check import megatron_tokenizer_args, parse_data_path

    def blend_words(value: str) -> list[str]:
        words = []
        for weight, prefix in parse_data_path(value):
            words += ([repr(weight)] if weight is not None else []) + [prefix]
        return words

    if s.get("DATA_PATH") and s.get("VALID_DATA_PATH"):
        add("DATA_PATH", DATA_ARGS, ["--train-data-path", *blend_words(s["DATA_PATH"])])
        add("VALID_DATA_PATH", DATA_ARGS, ["--valid-data-path", *blend_words(s["VALID_DATA_PATH"])])
    elif s.get("DATA_PATH"):
        add("DATA_PATH", DATA_ARGS, ["--data-path", *blend_words(s["DATA_PATH"])])
        add("SPLIT", DATA_ARGS, ["--split", s["SPLIT"]])
    else:
        add("DATA_PATH", DATA_ARGS, ["--mock-data"])
    if s.get("TOKENIZER_MODEL"):
        add("TOKENIZER_MODEL", DATA_ARGS, megatron_tokenizer_args(s["TOKENIZER_MODEL"]))
    else:
        add("TOKENIZER_MODEL", DATA_ARGS, ["--tokenizer-type", "NullTokenizer",
                                           "--vocab-size", str(preset.vocab_size)])
    buckets[DATA_ARGS] += ["--no-create-attention-mask-in-dataloader"]

    # Output: run folder, metrics, TensorBoard, profiling, SIGTERM handling.
    buckets[OUTPUT_ARGS] += ["--run-dir", str(log_dir), "--tensorboard-dir",
                             str(log_dir / "tensorboard"), "--log-throughput",
                             "--log-memory-to-tensorboard"]
    if s["PROFILE"] != "none":
        words = ["--profile", "--profile-step-start", str(s["PROFILE_STEP_START"]),
                 "--profile-step-end", str(s["PROFILE_STEP_END"])]
        if s["PROFILE"] == "torch":
            words += ["--use-pytorch-profiler", "--profile-ranks",
                      *s["PROFILE_RANKS"].replace(",", " ").split()]
        add("PROFILE", OUTPUT_ARGS, words)
    buckets[TRAIN_ARGS] += ["--exit-signal-handler"]
    buckets[EXTRA_ARGS] += ["--distributed-backend", "nccl"]
    return buckets, emitted
