"""Environment + KEY=VALUE words (+ recipe layers) -> a resolved, checked launch.

The order, in three steps:
  prepare   registry defaults -> user values (env, then KEY=VALUE words) -> each recipe
            layer's values (source "recipe"; never over a user's) -> model preset (never over
            a user's or a layer's) -> derive, once: capabilities, GPUs, precision, backend,
            sequence parallel, warm-ups, the dataset's tokenizer, the run folder
  guards    every named rule of the core and the layers, on what prepare derived: all
            refusals reported together; a guard may correct a value, with its reason
  assemble  buckets, environment, the run description, the Launch
Everything a user sees in the table comes from the Settings this builds.
"""
from __future__ import annotations

import importlib.util
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from training import REPO_ROOT
from training.run_description import Model, RunDescription

from . import capabilities as capabilities_mod
from . import megatron_info
from .environment import resolve_environment
from training.credentials import carries_credentials, is_secret, mask_text, mask_value
from .guards import GUARDS, LaunchContext, run_guards, visible_gpu_count
from .layers import (LayerEntry, RecipeLayer, RecipeValue, apply_layers, entry_elsewhere,
                     registry_with)
from .presets import FAMILIES, preset_for
from .recipes import Recipe, derive_precision
from .runfolder import (default_run_name, folder_problem, holds_run, is_system_folder, new_run_id,
                        ownership_problem, run_dir)
from .settings import USER_SOURCES, BadInput, LaunchError, Setting, Settings, fmt_value
from .toggles import (CLOSING_WORDS, DISTRIBUTED_ARGS, MEGATRON_BUCKETS, OUTPUT_ARGS, Toggle,
                      auto_backend, auto_native_kernels, closest_toggle,
                      default_metrics_warmup_iters, parse_value, te_moe_blocker)
from .userflags import flag_owners, map_flags
from . import fork_vars
from .toggles import BY_NAME as _REGISTRY_BY_NAME

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
    recipe_values: list[RecipeValue] = field(default_factory=list)  # what the layers set

    @property
    def toggles(self) -> tuple[Toggle, ...]:
        """The registry of this launch: the core's entries, then the layers' own."""
        return self.ctx.toggles

    @property
    def command(self) -> list[str]:
        words = list(self.profiler_prefix) + ["torchrun", *self.buckets[DISTRIBUTED_ARGS],
                                              PRETRAIN_SCRIPT]
        for bucket in MEGATRON_BUCKETS:
            words += self.buckets[bucket]
        return words + self.user_args

    @property
    def supervisor_args(self) -> list[str]:
        """The supervisor's options (training/resilience/supervise.py: preemption, restarts,
        hangs) from the settings; examples/lib/launch.sh runs the command under it."""
        s = self.settings
        preemption = "stop" if s["PREEMPTION"] == "auto" else s["PREEMPTION"]
        words = ["--run-dir", str(self.log_dir), "--preemption", preemption,
                 "--restarts", str(s["RESTARTS"]), "--backoff", str(s["RESTART_BACKOFF"]),
                 "--hang-timeout", str(s["HANG_TIMEOUT"])]
        return words + (["--save", str(s["SAVE"])] if s.get("SAVE") else [])

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
            if key in assignments:
                raise BadInput(f"{key} is given twice after the script name ({key}="
                               f"{assignments[key]} and {key}={value}): give it once.")
            assignments[key] = value
        else:
            raise BadInput(f"unexpected word {word!r} after the script name: use KEY=VALUE "
                           "(e.g. TP=2) or Megatron --flags after them.")
    return assignments, flags


@dataclass
class _Given:
    """What the user gave: the settings it makes, and what the guards judge."""
    settings: Settings
    passthrough: dict[str, str]        # unknown KEY=VALUE words, exported to the run
    lookalikes: list[str]              # unknown names close to a knob's
    clashes: list[str]                 # two spellings of one knob that disagree
    flag_clashes: list[str]            # a flag after the script that contradicts its toggle
    fork: dict[str, tuple[str, str]]   # the fork's own variables given: name -> (raw, source)
    elsewhere: dict[str, tuple[str, LayerEntry]]  # a recipe layer's variable this launch
                                                  # does not run: name -> (source, layer)
    fork_spelled: bool = False         # a variable or spelling of the ROCm fork's was given


def _initial_settings(family: str, toggles: tuple[Toggle, ...], environ: dict[str, str],
                      assignments: dict[str, str],
                      flag_values: list[tuple[str, str, str]] = ()) -> _Given:
    """Defaults and the user's values: env, then KEY=VALUE words, then the Megatron flags
    after the script name that spell a toggle's value. A toggle may be given by its name,
    by an alias (the ROCm fork's SEQ_PARALLEL) or in one of its spellings (MODEL_SIZE=8);
    the fork's other variables (fork_vars.OWN) are collected for the guard fork_variables."""
    by_name = {t.name: t for t in toggles}
    aliases = {a.name: (t, a) for t in toggles for a in t.aliases}
    known = [*by_name, *aliases, *fork_vars.OWN]
    settings = Settings()
    for toggle in toggles:
        settings.values[toggle.name] = Setting(toggle.name, toggle.default, "default")
    settings.values["MODEL_SIZE"] = Setting("MODEL_SIZE", FAMILIES[family][1], "default")

    given = _Given(settings, {}, [], [], [], {}, {})
    said: dict[tuple[str, str], tuple[str, object]] = {}   # (toggle, source) -> (as typed, value)
    for source, values in (("env", environ), ("cli", assignments)):
        for name, raw in values.items():
            if raw == "" and source == "env" and name in known:
                continue  # VAR= in the environment means unset
            given.fork_spelled |= name in fork_vars.SIGNATURE
            if name in by_name or name in aliases:
                toggle, alias = (by_name[name], None) if name in by_name else aliases[name]
                try:
                    value = parse_value(toggle, alias.translate(toggle, raw) if alias else raw)
                except BadInput as err:
                    if alias is None:
                        raise
                    raise BadInput(f"{name}={raw!r} (the ROCm fork's name for {toggle.name}): "
                                   f"{str(err).split(': ', 1)[-1]}") from None
                typed = f"{name}={raw}"
                previous = said.get((toggle.name, source))
                if previous is not None and previous[1] != value:
                    given.clashes.append(f"{typed} and {previous[0]} give {toggle.name} two "
                                         "values: give one.")
                said[(toggle.name, source)] = (typed, value)
                spelled = _spelled(toggle, alias, raw)
                given.fork_spelled |= bool(spelled)
                settings.values[toggle.name] = Setting(toggle.name, value, source, spelled)
                continue
            if name in fork_vars.OWN:
                given.fork[name] = (raw, source)
                if source == "cli" and fork_vars.OWN[name].kind == "derive":
                    given.passthrough[name] = raw   # a credential the run itself reads
                continue
            entry = entry_elsewhere(name, toggles)
            if entry is not None:
                if raw != "" or source == "cli":
                    given.elsewhere[name] = (source, entry)
                continue
            close = closest_toggle(name, known) if _ENV_NAME.match(name) else None
            if close is not None:
                given.lookalikes.append(f"{name} is not a toggle; did you mean {close}? "
                                        f"({source})")
            if source == "cli":
                given.passthrough[name] = raw
    given.flag_clashes = _apply_flag_values(settings, by_name, flag_values)
    for text in given.lookalikes:
        settings.warn("unknown_toggle", text)
    for name in given.passthrough:
        if closest_toggle(name, known) is None and name not in fork_vars.OWN:
            settings.info("passthrough_env", f"{name} is not a toggle: exported to the run's "
                                             "environment as given.")
    return given


def _refuse_credentials_on_the_command_line(settings: Settings, user_args: list[str]) -> None:
    """A toggle's value becomes a torchrun argument (seen by every user of the node through
    ps) and a manifest entry: one that carries a password or token is refused, and so is a
    --flag after the script whose name says it holds one (training/credentials.py)."""
    for name, setting in settings.values.items():
        value = setting.value
        if setting.source in USER_SOURCES and isinstance(value, str) and carries_credentials(value):
            raise BadInput(f"{name}={mask_value(value)!r} carries a credential, which would be "
                           "written on torchrun's command line and into manifest.json: give the "
                           "address or model name alone and the credential through the "
                           "environment (e.g. HF_TOKEN, or ~/.netrc).")
    for i, word in enumerate(user_args):
        flag = word.split("=", 1)[0]
        if (word.startswith("--") and is_secret(flag)) or carries_credentials(word):
            raise BadInput(f"{mask_text(word)} after the script name carries a credential, "
                           "which would be written on torchrun's command line and into "
                           "manifest.json: pass it through the environment instead.")


def _spelled(toggle: Toggle, alias, raw: str) -> str:
    """The table's reason for a value given in another spelling (empty: the toggle's own)."""
    spelling = dict(toggle.spellings).get(raw.strip())
    if alias is not None:
        return f"{alias.name}={raw}: the ROCm fork's name for {toggle.name}"
    if spelling is not None:
        return f"{toggle.name}={raw}: the ROCm fork's spelling of {spelling}"
    return ""


def _apply_flag_values(settings: Settings, by_name: dict[str, Toggle],
                       flag_values) -> list[str]:
    """A toggle's value from a flag after the script name (userflags.map_flags); what
    contradicts the user's other spelling of the same toggle (the guard
    flags_against_settings)."""
    clashes: list[str] = []
    typed_for: dict[str, str] = {}
    for name, raw, typed in flag_values:
        try:
            value = parse_value(by_name[name], raw)
        except BadInput as err:
            raise BadInput(f"{typed} after the script name: {err}") from None
        current = settings.values[name]
        if current.source in USER_SOURCES and current.value != value:
            said = typed_for.get(name) or f"{name}={fmt_value(current.value)} ({current.source})"
            clashes.append(f"{typed} contradicts {said}: give one of them.")
        typed_for[name] = typed
        settings.values[name] = Setting(name, value, "cli", f"from {typed} after the script name")
    return clashes


def _derive_backend(settings: Settings, caps: capabilities_mod.Capabilities,
                    moe: bool = False, te_blocked: str | None = None) -> None:
    if settings["TRANSFORMER_IMPL"] == "auto":
        backend, why = auto_backend(caps.transformer_engine, moe,
                                    caps.info.arch if caps.info else None, settings["PRECISION"],
                                    te_blocked)
        settings.values["TRANSFORMER_IMPL"] = Setting(
            "TRANSFORMER_IMPL", backend, "platform", f"auto: {why} ({caps.source})")
    if settings.get("ROPE_FUSION") is None:
        te = settings["TRANSFORMER_IMPL"] == "transformer_engine"
        settings.put("ROPE_FUSION", te, "derived",
                     "Transformer Engine's fused RoPE" if te else
                     "no fused RoPE kernel without Transformer Engine (FUSED_SINGLE_QKV_ROPE is "
                     "the native one)")
    if settings.get("BIAS_DROPOUT_FUSION") is None:
        native = settings["TRANSFORMER_IMPL"] == "native"
        settings.put("BIAS_DROPOUT_FUSION", not native, "derived",
                     "the native backend's residual add runs eagerly: Megatron's fused one is "
                     "a torch.compile'd wrapper around the same add (host time per call)"
                     if native else "Megatron's default (fused bias-dropout-add)")
    if settings["NATIVE_KERNELS"] == "auto":
        kernels, why = auto_native_kernels(caps.liger)
        settings.values["NATIVE_KERNELS"] = Setting("NATIVE_KERNELS", kernels, "platform",
                                                    f"auto: {why}")


def _derive_megatron(caps: capabilities_mod.Capabilities, recipe: Recipe
                     ) -> megatron_info.RunningMegatron | None:
    """The Megatron the launch runs: a named platform's image's (recorded), or, for a recipe's
    flags, the one installed here (the pinned wheel answers from its record; another Megatron
    is asked through its parser, which takes seconds, so a bf16 launch here does not ask)."""
    if caps.source == "detected" and recipe.kind == "bf16":
        return None
    return megatron_info.running(caps)


def _derive_gpus(settings: Settings, caps: capabilities_mod.Capabilities,
                 environ: dict[str, str]) -> None:
    if settings.get("GPUS_PER_NODE") is not None:
        return
    count = visible_gpu_count(caps, environ)
    if count:
        settings.put("GPUS_PER_NODE", count, "platform", f"GPUs visible ({caps.source})")
    else:
        settings.put("GPUS_PER_NODE", 1, "platform",
                     "no GPU visible: a DRY_RUN assumes 1 (set GPUS_PER_NODE or PLATFORM)")


def _derive_schedule(settings: Settings) -> None:
    """Sequence parallel follows TP; the LR and metrics warm-ups follow the run's length."""
    s = settings
    if s.get("SEQUENCE_PARALLEL") is None:
        s.put("SEQUENCE_PARALLEL", s["TP"] > 1, "derived",
              "on with TP>1 (activations sharded along the sequence)" if s["TP"] > 1
              else "off with TP=1")
    if s.get("SAVE") and s.get("SAVE_INTERVAL") is None:   # Megatron asserts one with --save
        s.put("SAVE_INTERVAL", parse_value(_REGISTRY_BY_NAME["SAVE_INTERVAL"],
                                           fork_vars.BY_NAME["SAVE_INTERVAL"].defaults["llama3"]),
              "derived", "SAVE is set: the ROCm fork's default; Megatron also saves the last "
                         "iteration")
    iters = s["TOTAL_ITERS"]
    if s.get("WARMUP_ITERS") is None:
        s.put("WARMUP_ITERS", max(iters // 10, 0), "derived", "10% of TOTAL_ITERS")
    if s.get("METRICS_WARMUP_ITERS") is None:
        s.put("METRICS_WARMUP_ITERS", default_metrics_warmup_iters(iters), "derived",
              "20% of TOTAL_ITERS, between 2 and 10")


def _derive_resume(settings: Settings):
    """LOAD's checkpoint as a resume takes it (training.launch.resume): read once here, judged
    by the guard load_checkpoint. Where the marker names a half-written (or missing) folder,
    CKPT_STEP takes the last complete checkpoint."""
    from .resume import resume_point

    load = settings.get("LOAD")
    if not load or not Path(load).is_dir():
        return None
    point = resume_point(Path(load), settings.get("CKPT_FORMAT"), settings.get("CKPT_STEP"))
    why = point.scan.redirect()
    if settings.get("CKPT_STEP") is None and why and point.iteration is not None:
        settings.put("CKPT_STEP", point.iteration, "derived",
                     f"the last complete checkpoint in LOAD: {why}")
    return point


def _derive_tokenizer(settings: Settings, datasets) -> list[str] | Exception | None:
    """Megatron's tokenizer words for TOKENIZER_MODEL (a folder, tokenizer.json or a hub id,
    resolved to a local folder here), or the error the guard tokenizer_model refuses."""
    model = settings.get("TOKENIZER_MODEL")
    if not model:
        return None
    if isinstance(datasets, list) and datasets:
        model = datasets[0].tokenizer_model      # already resolved against the data
    from training.data.check import DataPathError, megatron_tokenizer_args

    try:
        return megatron_tokenizer_args(model)
    except DataPathError as err:
        return err


def _derive_wandb(settings: Settings, fork_given: dict[str, tuple[str, str]]) -> None:
    """WANDB_API_KEY set: the ROCm fork logs to Weights & Biases project LLama; so does this
    launcher where wandb is installed (without it the guard wandb_logging says so)."""
    if "WANDB_API_KEY" not in fork_given or settings.get("WANDB_PROJECT"):
        return
    if importlib.util.find_spec("wandb") is not None:
        settings.put("WANDB_PROJECT", "LLama", "derived",
                     "WANDB_API_KEY is set: W&B logging, the ROCm fork's project name")


def _fork_defaults(family: str, settings: Settings) -> None:
    """One line where the ROCm fork's script would run another shape with these variables
    (its defaults for what the user left unset: model, TP, batch, sequence, iterations)."""
    script = fork_vars.SCRIPTS.get(family)
    if script is None:
        return
    theirs, ours = [], []
    for var in fork_vars.SHAPE:
        fork = var.defaults.get(family)
        if fork is None or settings.is_explicit(var.target):
            continue
        value = parse_value(_REGISTRY_BY_NAME[var.target], fork)
        if value != settings[var.target]:
            theirs.append(f"{var.target}={fmt_value(value)}")
            ours.append(f"{var.target}={fmt_value(settings[var.target])}")
    if theirs:
        settings.info("fork_defaults",
                      f"the ROCm fork's {script} would run {' '.join(theirs)} with these "
                      f"variables; this launcher runs {' '.join(ours)}: set "
                      f"{' '.join(theirs)} for the fork's run.")


def _derive_preemption(settings: Settings) -> None:
    """PREEMPTION=auto: requeue when there is a checkpoint to resume from (SAVE); without
    SAVE it stays auto, which stops (the registry's help says so; every launch without SAVE
    would otherwise show the line)."""
    if settings["PREEMPTION"] == "auto" and settings.get("SAVE"):
        settings.values["PREEMPTION"] = Setting(
            "PREEMPTION", "requeue", "derived",
            "auto, SAVE is set: a stop signal saves at the next step, exit 75 to requeue")


def _derive_datasets(settings: Settings) -> list | Exception | None:
    """The datasets' headers (the data_path guard refuses a problem); TOKENIZER_MODEL, when
    unset, is the one they were built with."""
    path, valid = settings.get("DATA_PATH"), settings.get("VALID_DATA_PATH")
    if not path:
        return None
    from training.data.check import DataPathError, check_data_paths

    try:
        infos = check_data_paths([path] + ([valid] if valid else []),
                                 settings.get("TOKENIZER_MODEL"))
    except DataPathError as err:
        return err
    if settings.get("TOKENIZER_MODEL") is None:
        settings.put("TOKENIZER_MODEL", infos[0].tokenizer_model, "derived",
                     "the tokenizer the dataset was built with")
    return infos


def _derive_run_folder(settings: Settings, name: str, tag: str,
                       stamp: str | None = None) -> tuple[Path, str | None]:
    """The run folder (LOG_DIR, or EXPERIMENT_DIR/name/tag/RUN_ID) and what is wrong with it
    (the guard run_folder refuses it): it holds a run already, or cannot be written. A
    timestamp RUN_ID that names a folder holding a run gets a suffix instead (-2, -3, ...)."""
    s = settings
    if s.get("LOG_DIR"):
        log_dir = Path(s["LOG_DIR"])
        if ".." in log_dir.parts:
            raise BadInput(f"LOG_DIR={s['LOG_DIR']} climbs out with '..': name the run folder "
                           "by a path without '..'.")
        s.put("RUN_ID", log_dir.name, "derived", "the last folder of LOG_DIR")
    else:
        if s.get("RUN_ID") is None:
            s.put("RUN_ID", stamp or new_run_id(), "derived", "timestamp of this launch")
        log_dir = run_dir(s["EXPERIMENT_DIR"], name, tag, s["RUN_ID"])
        if is_system_folder(Path(s["EXPERIMENT_DIR"])):
            return log_dir, (f"EXPERIMENT_DIR={s['EXPERIMENT_DIR']} is a system folder (or your "
                             "home folder itself)")
    if not log_dir.is_absolute():
        log_dir = Path.cwd() / log_dir
    try:
        return _check_run_folder(s, log_dir)
    except OSError as err:   # a name too long for the file system, a folder we may not read
        return log_dir, f"{log_dir} cannot be used: {err.strerror or err}"


def _check_run_folder(s: Settings, log_dir: Path) -> tuple[Path, str | None]:
    taken = holds_run(log_dir, s["NNODES"], s["NODE_RANK"])
    if taken and not s.get("LOG_DIR") and s.setting("RUN_ID").source == "derived":
        stamp = s["RUN_ID"]
        for n in range(2, 1000):
            candidate = log_dir.with_name(f"{stamp}-{n}")
            if not holds_run(candidate, s["NNODES"], s["NODE_RANK"]):
                break
        s.values["RUN_ID"] = Setting("RUN_ID", candidate.name, "derived",
                                     f"timestamp of this launch; {stamp} holds a run ({taken})")
        log_dir, taken = candidate, None
    if taken:
        return log_dir, f"{log_dir} already holds a run ({taken})"
    return log_dir, ownership_problem(log_dir) or folder_problem(log_dir)


def _derive_model(family: str, settings: Settings):
    """(the shape, the ModelConfig it was read from or None): MODEL_CONFIG's checkpoint; unset,
    the import PRETRAINED_CHECKPOINT names when MODEL_SIZE is not given; else the preset."""
    from .model_config import IMPORT_RECORD, ConfigError, load_model_config

    value = settings.get("MODEL_CONFIG")
    pretrained = settings.get("PRETRAINED_CHECKPOINT")
    if (not value and pretrained and not settings.is_explicit("MODEL_SIZE")
            and (Path(pretrained) / IMPORT_RECORD).is_file()):
        settings.put("MODEL_CONFIG", pretrained, "derived",
                     "PRETRAINED_CHECKPOINT is an import and MODEL_SIZE is not given: its shape")
        value = pretrained
    if not value:
        return preset_for(family, settings["MODEL_SIZE"]), None
    try:
        found = load_model_config(str(value), preset_for(family, None).seq_length)
    except ConfigError as err:
        raise BadInput(f"MODEL_CONFIG={value}: {err}") from None
    _same_kind(family, found)
    if not settings.is_explicit("MODEL_SIZE"):   # both given: the guard model_config refuses
        settings.values["MODEL_SIZE"] = Setting("MODEL_SIZE", found.shape.name, "checkpoint",
                                                f"MODEL_CONFIG: {found.path}")
    return found.shape, found


def _same_kind(family: str, found) -> None:
    """A dense shape runs through a dense family's entry script, an MoE shape through an MoE
    one (its recipe layer and guards): BadInput naming the script to use otherwise."""
    from .presets import PRESETS, SCRIPTS

    from .model_config import READERS

    sizes, default = FAMILIES[family]
    moe = bool(found.shape.num_experts)
    kind = found.hf_config.get("model_type")
    if kind in READERS and kind in SCRIPTS and kind != family:
        raise BadInput(f"MODEL_CONFIG={found.path} is {kind}, whose own layers and guards its "
                       f"entry script adds: launch it with {SCRIPTS[kind]}.")
    if moe == bool(PRESETS[sizes[default]].num_experts):
        return
    script = (SCRIPTS.get(kind) or "examples/moe/train_qwen3_moe.sh") if moe \
        else SCRIPTS.get("llama3", "examples/llama/train_llama3.sh")
    raise BadInput(f"MODEL_CONFIG={found.path} is {'a mixture of experts' if moe else 'a dense model'} "
                   f"({kind}), and the {family} entry script runs {'dense' if moe else 'MoE'} "
                   f"models: launch it with {script}.")


def prepare(family: str, environ: dict[str, str], words: list[str] | None = None,
            layers: Sequence[RecipeLayer] = (), chosen: dict[str, Setting] | None = None
            ) -> LaunchContext:
    """The user's input, the layers' values and everything derived from them: what the guards
    look at. Raises BadInput only for input that cannot be read (a value of the wrong type, an
    unknown family or MODEL_SIZE, a stray word); every refusal is a guard's."""
    if family not in FAMILIES:
        raise BadInput(f"unknown family {family!r}: use one of {', '.join(FAMILIES)}.")
    toggles = registry_with(layers)
    by_name = {t.name: t for t in toggles}
    assignments, user_args = split_words(words or [])
    raw_extra = assignments.get("EXTRA_MEGATRON_ARGS", environ.get("EXTRA_MEGATRON_ARGS") or "")
    try:
        extra_words = shlex.split(raw_extra)
    except ValueError as err:
        raise BadInput(f"EXTRA_MEGATRON_ARGS cannot be split into words ({err}): close the "
                       "quote, or quote each flag's value on its own.") from None
    owners = flag_owners(toggles)
    extra, after = (map_flags(extra_words, owners, by_name),
                    map_flags(user_args, owners, by_name))
    user = _initial_settings(family, toggles, environ, assignments,
                             extra.values + after.values)
    settings = user.settings
    _refuse_credentials_on_the_command_line(settings, extra.kept + after.kept)
    applied = apply_layers(layers, settings, toggles)
    for name, setting in (chosen or {}).items():   # a chooser's (resolve): never over a user's
        settings.put(name, setting.value, setting.source, setting.reason)

    preset, model_config = _derive_model(family, settings)
    source = "checkpoint" if model_config is not None else "preset"
    why = f"MODEL_CONFIG: {model_config.path}" if model_config is not None else preset.name
    settings.put("NUM_LAYERS", preset.num_layers, source, why)
    settings.put("SEQ_LENGTH", preset.seq_length, source,
                 why if model_config is None else
                 f"the {family} default, at most the checkpoint's max_position_embeddings")
    for name, value in preset.train_defaults.items():
        settings.put(name, value, source, why)

    caps = capabilities_mod.resolve(settings["PLATFORM"])
    _derive_gpus(settings, caps, environ)
    recipe = derive_precision(settings)
    megatron = _derive_megatron(caps, recipe)
    moe = bool(getattr(preset, "num_experts", None))
    _derive_backend(settings, caps, moe=moe, te_blocked=te_moe_blocker(
        moe, getattr(preset, "linear_bias", False), getattr(preset, "clamped_swiglu", False)))
    applied += apply_layers(layers, settings, toggles, stage="derived")
    _derive_schedule(settings)
    _derive_preemption(settings)
    resume = _derive_resume(settings)
    datasets = _derive_datasets(settings)
    tokenizer = _derive_tokenizer(settings, datasets)
    _derive_wandb(settings, user.fork)
    if not layers and user.fork_spelled:   # only for someone typing the fork's command
        _fork_defaults(family, settings)

    name = settings.get("EXP_NAME") or default_run_name(
        preset.name, settings["NUM_LAYERS"], preset.preset_layers or preset.num_layers,
        settings["NNODES"],
        settings["GPUS_PER_NODE"], settings["TP"], settings["PP"], settings["CP"],
        settings["MBS"], settings["BS"], settings["SEQ_LENGTH"])
    log_dir, folder = _derive_run_folder(settings, name, recipe.name)

    return LaunchContext(settings, caps, preset, recipe, family, dict(environ),
                         toggles=toggles, guards=(*GUARDS, *(g for layer in layers for g in layer.guards)),
                         user_args=extra.kept + after.kept, extra_args=extra.kept,
                         flag_problems=extra.problems + after.problems + user.flag_clashes,
                         mapped_flags=extra.values + after.values,
                         clashes=user.clashes,
                         fork_given=user.fork, layer_given=user.elsewhere, run_name=name,
                         log_dir=log_dir, run_folder_problem=folder, datasets=datasets,
                         tokenizer=tokenizer,
                         lookalikes=user.lookalikes, passthrough=user.passthrough,
                         recipe_values=applied, megatron=megatron, model_config=model_config,
                         resume=resume)


def assemble(ctx: LaunchContext) -> Launch:
    """The checked launch: buckets, the run's environment, its description."""
    settings, caps = ctx.settings, ctx.caps
    buckets, emitted = build_buckets(ctx, ctx.log_dir)
    if ctx.extra_args:
        emitted["EXTRA_MEGATRON_ARGS"] = ctx.extra_args
    env = resolve_environment(caps.info.vendor if caps.info else None, ctx.environ,
                              fsdp=bool(settings["FSDP"]), platform=caps.platform,
                              backend=settings["TRANSFORMER_IMPL"],
                              toggles_on=frozenset(t.name for t in ctx.toggles
                                                   if t.kind == "bool" and settings.get(t.name)))
    run = RunDescription(ctx.family, Model.of(ctx.preset), settings.as_values(), caps.platform,
                         caps.to_dict())
    launch = Launch(ctx.family, settings, ctx, run, buckets, emitted, env, ctx.passthrough,
                    ctx.user_args, ctx.log_dir, recipe_values=ctx.recipe_values)
    if settings["PROFILE"] == "nsys":
        launch.profiler_prefix = [
            "nsys", "profile", "--capture-range=cudaProfilerApi", "--capture-range-end=stop",
            "--trace=cuda,nvtx,osrt", "--trace-fork-before-exec=true", "--force-overwrite=true",
            "-o", str(ctx.log_dir / "profile" / f"nsys_node{settings['NODE_RANK']}")]
    return launch


def resolve(family: str, environ: dict[str, str], words: list[str] | None = None,
            layers: Sequence[RecipeLayer] = (), choosers: Sequence = ()) -> Launch:
    """prepare -> every guard (core and layers') -> assemble. Raises LaunchError (BadInput,
    or Refusals with every guard's refusal) with one message for the user.

    choosers: functions of the resolved Launch that choose values nobody set (a reader above
    the launcher's floor plugs them in: the pre-flight's micro-batch), returning {name: (value,
    source, reason)}; the launch is then resolved again with them, each shown with its source
    and reason, and a user's or recipe's value is never replaced. Where the second resolve
    refuses, the first launch stands, with the refusal as an info line."""
    ctx = prepare(family, environ, words, layers)
    run_guards(ctx, ctx.guards)
    launch = assemble(ctx)
    chosen: dict[str, Setting] = {}
    for choose in choosers:
        chosen.update({name: Setting(name, value, source, reason)
                       for name, (value, source, reason) in choose(launch).items()})
    if not chosen:
        return launch
    try:
        again = prepare(family, environ, words, layers, chosen=chosen)
        run_guards(again, again.guards)
    except LaunchError as err:
        for name, setting in chosen.items():
            launch.settings.info(setting.source, f"{name}={fmt_value(setting.value)} was not "
                                 f"chosen: with it the launch is refused ({err})")
        return launch
    return assemble(again)


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

    for toggle in ctx.toggles:
        if toggle.built or toggle.bucket not in buckets:
            continue
        if toggle.when is not None and not toggle.when(s):
            continue
        add(toggle.name, toggle.bucket, toggle.flags_for(s[toggle.name]))
    buckets[OUTPUT_ARGS] += run_folder_words(log_dir)
    for toggle in ctx.toggles:
        for flags in toggle.emit(toggle, ctx) if toggle.emit else ():
            add(flags.toggle or toggle.name, flags.bucket, flags.words)
    for bucket, words in CLOSING_WORDS:
        buckets[bucket] += words
    return buckets, emitted


def run_folder_words(log_dir: Path) -> list[str]:
    """Where the run writes: the run folder (metrics.jsonl, train.log's siblings), TensorBoard."""
    return ["--run-dir", str(log_dir), "--tensorboard-dir", str(log_dir / "tensorboard"),
            "--log-throughput", "--log-memory-to-tensorboard"]
