"""Named rules that refuse a launch or correct a setting, each with its reason.

A guard is a function of the launch context (what resolve.prepare read and derived: the
settings, the capabilities, the preset, the precision recipe, the run folder, the datasets).
It derives nothing itself, so the order the guards run in changes no result (a test runs
them reversed). It either
  - raises Refusal(name, message): the launch stops, the message says what to do instead, or
  - calls ctx.settings.correct(...): the value changes and the table shows the guard and why, or
  - calls ctx.settings.warn(...): the launch goes on with a visible warning.
A default a guard turns off is a correction; an explicit user value a guard cannot honour is
a refusal (never a silent override), except where a crash is certain (mxfp4's BF16 grad
buffer), which overrides loudly. All guards run; every refusal is reported together.
Where two rules could set the same value, one of them owns it (FSDP's rule owns the
optimizer and fusion toggles under FSDP=1), so their order cannot matter.

A recipe layer (training/launch/layers.py) adds guards of its own; they run after these.
"""
from __future__ import annotations

import ipaddress
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from training.run_description import Layout, divisors

from .capabilities import Capabilities
from .presets import FAMILIES, ModelPreset
from .recipes import (RECIPES, Recipe, hardware_rule, platforms_supporting, recipe_args,
                      spelling_conflict)
from training.checkpoint_scan import TRACKER as CHECKPOINT_TRACKER   # Megatron's latest-checkpoint marker
from .settings import LaunchError, Refusal, Settings, fmt_value
from .toggles import REGISTRY, Toggle, fused_linear_ce, step_host_reads


@dataclass
class LaunchContext:
    settings: Settings
    caps: Capabilities
    preset: ModelPreset
    recipe: Recipe
    family: str
    environ: dict[str, str] = field(default_factory=dict)
    toggles: tuple[Toggle, ...] = REGISTRY           # the core's, then the layers' entries
    guards: tuple[Callable[["LaunchContext"], None], ...] = ()   # the core's, then the layers'
    user_args: list[str] = field(default_factory=list)   # EXTRA_MEGATRON_ARGS + the --flags
    extra_args: list[str] = field(default_factory=list)  # EXTRA_MEGATRON_ARGS, split
    flag_problems: list[str] = field(default_factory=list)  # flags the launcher builds itself
    mapped_flags: list[tuple[str, str, str]] = field(default_factory=list)  # (toggle, value,
                                                     # as typed): flags that spell a setting
    clashes: list[str] = field(default_factory=list)     # two spellings of a knob disagree
    fork_given: dict[str, tuple[str, str]] = field(default_factory=dict)  # fork_vars.OWN given
    layer_given: dict[str, tuple[str, Any]] = field(default_factory=dict)  # another entry's
                                                     # layer variables: name -> (source, entry)
    run_name: str = ""                               # the run folder's name (EXP_NAME or derived)
    log_dir: Path | None = None                      # the run folder
    run_folder_problem: str | None = None            # why it cannot take this run, or None
    datasets: Any = None                # DATA_PATH's headers, the DataPathError, or None (mock)
    tokenizer: Any = None               # TOKENIZER_MODEL's Megatron words, the error, or None
    lookalikes: list[str] = field(default_factory=list)  # unknown names close to a toggle's
    passthrough: dict[str, str] = field(default_factory=dict)  # unknown KEY=VALUE words
    recipe_values: list = field(default_factory=list)    # what the recipe layers set
    megatron: Any = None    # megatron_info.RunningMegatron: the Megatron that runs the launch
    model_config: Any = None  # model_config.ModelConfig: the shape's checkpoint, or None (preset)
    resume: Any = None      # resume.ResumePoint: LOAD's checkpoint as a resume takes it, or None

    @property
    def layout(self) -> Layout:
        """World size, data parallelism, micro-batches (training.run_description.Layout)."""
        return Layout.from_values(self.settings.as_values())

    @property
    def backend(self) -> str:
        return self.settings["TRANSFORMER_IMPL"]


class Refusals(LaunchError):
    """Every refusal of one launch, reported together."""

    def __init__(self, refusals: list[Refusal]):
        self.refusals = refusals
        super().__init__("\n".join(str(r) for r in refusals))


GUARDS: list[Callable[[LaunchContext], None]] = []


def guard(fn: Callable[[LaunchContext], None]) -> Callable[[LaunchContext], None]:
    GUARDS.append(fn)
    return fn


def run_guards(ctx: LaunchContext, guards=None) -> None:
    """Every guard (default: the core's), then every refusal together."""
    refusals = []
    for fn in GUARDS if guards is None else guards:
        try:
            fn(ctx)
        except Refusal as refusal:
            refusals.append(refusal)
    if refusals:
        raise Refusals(refusals)


def _off_or_refuse(ctx: LaunchContext, name: str, guard_name: str, why: str, instead: str,
                   off=False) -> None:
    """Turn a toggle that is on (a bool's 1, a choice other than `off`) off with a reason;
    refuse when the user set it."""
    value = ctx.settings[name]
    if value == off:
        return
    if ctx.settings.is_explicit(name):
        shown = "1" if value is True else value
        raise Refusal(guard_name, f"{name}={shown} cannot run here: {why}. {instead}")
    ctx.settings.correct(name, off, guard_name, why)


# -- input -------------------------------------------------------------------------------------

@guard
def strict_toggle_names(ctx: LaunchContext) -> None:
    """STRICT=1: a variable or word that looks like a mistyped toggle is refused."""
    if ctx.lookalikes and ctx.settings.get("STRICT"):
        raise Refusal("strict_toggle_names", "STRICT=1: unknown toggle-like variables:\n  "
                      + "\n  ".join(ctx.lookalikes))


@guard
def megatron_flags(ctx: LaunchContext) -> None:
    """A --flag after the script name is one of megatron-core's parser."""
    from .megatron_flags import unknown_flags
    from .megatron_info import STOCK

    unknown = unknown_flags(ctx.user_args)
    if unknown and ctx.megatron is not None and ctx.megatron.build is not STOCK:
        ctx.settings.warn("megatron_flags", f"{', '.join(unknown)}: not a flag of megatron-core's "
                          f"parser; {ctx.megatron.build.name} may have it, else Megatron stops "
                          "at startup.")
    elif unknown:
        _refuse_each("megatron_flags", "flags megatron-core's parser does not have",
                     [f"{u}: megatron-core's parser has no such flag, so Megatron would stop "
                      "after torchrun started" for u in unknown])


def _refuse_each(name: str, title: str, problems: list[str]) -> None:
    if len(problems) == 1:
        raise Refusal(name, f"after the script name, {problems[0]}")
    if problems:
        raise Refusal(name, f"{title}:\n  " + "\n  ".join(problems))


@guard
def flags_against_settings(ctx: LaunchContext) -> None:
    """A Megatron flag after the script name that a launcher setting decides (training/launch/flag_classes.py: setting, contradicts) is that setting's value where it agrees with it, else refused naming the setting."""
    from .flag_classes import by_flag, given_flags

    problems = list(ctx.flag_problems)       # built flags, and a flag against its own toggle
    for flag, values in given_flags(ctx.user_args):
        entry = by_flag().get(flag)
        if entry is None or entry.cls != "contradicts":
            continue
        typed = " ".join([flag, *values])
        problems.append(f"{typed}: {entry.reason}: set {entry.setting} instead "
                        f"({_setting_now(ctx, entry.setting)}).")
    problems += _flags_without_effect(ctx)
    _refuse_each("flags_against_settings", "flags after the script name that contradict the "
                 "launcher's settings", problems)


def _setting_now(ctx: LaunchContext, name: str) -> str:
    toggle = next((t for t in ctx.toggles if t.name == name), None)
    value = ctx.settings.get(name)
    now = f"now {name}={fmt_value(value)}" if value is not None else f"{name} is unset"
    return now + (f"; one of {', '.join(toggle.choices)}" if toggle and toggle.choices else "")


def _flags_without_effect(ctx: LaunchContext) -> list[str]:
    """A flag that spells a setting which this launch does not pass to Megatron (--fp8-format
    with PRECISION=bf16): it would change nothing, so it is refused with the setting it needs."""
    if not ctx.mapped_flags or any(isinstance(v, Exception) for v in (ctx.datasets,
                                                                       ctx.tokenizer)):
        return []       # the data or the tokenizer is refused by its own guard first
    from .resolve import build_buckets

    buckets, _ = build_buckets(ctx, ctx.log_dir or Path("."))
    emitted = {w for words in buckets.values() for w in words}
    by_name = {t.name: t for t in ctx.toggles}
    out = []
    for name, _raw, typed in ctx.mapped_flags:
        flag = typed.split()[0]
        if flag in emitted:
            continue
        toggle = by_name[name]
        needs = toggle.emitted_by if toggle.emitted_by in by_name else None
        context = (f" with {needs}={fmt_value(ctx.settings.get(needs))}: drop it, or set "
                   f"{needs} to a value that uses {name}" if needs else
                   " with these settings: drop it")
        out.append(f"{typed} sets {name}, which this launch does not pass to Megatron: it "
                   f"would change nothing{context}.")
    return out


@guard
def flags_the_backend_cannot_honour(ctx: LaunchContext) -> None:
    """A Megatron flag that changes what a backend's modules compute is honoured by the backend that runs, or refused before torchrun (training/launch/flag_classes.py: semantic, backends, documents, workload)."""
    from .flag_classes import WORKLOAD_WHAT, by_flag, given_flags, verdict

    backend = ctx.backend
    experts = bool(getattr(ctx.preset, "num_experts", None))
    documents = any(t.name == "DOCUMENT_MASK" for t in ctx.toggles)
    problems = []
    for flag, values in given_flags(ctx.user_args):
        entry = by_flag().get(flag)
        if entry is None:
            continue
        typed = " ".join([flag, *values])
        if entry.cls == "workload":
            problems.append(f"{typed}: a flag of {entry.reason}; {WORKLOAD_WHAT}.")
        elif entry.cls == "documents" and not documents:
            problems.append(f"{typed}: document masking needs the DOCUMENT_MASK setting, "
                            "which this launcher does not have yet: the attention would run "
                            "over the whole packed sequence all the same. Drop it.")
        elif entry.experts and not experts and entry.cls in ("semantic", "backends"):
            problems.append(f"{typed}: {entry.reason}; {ctx.preset.name} has no experts, so it "
                            "would change nothing: drop it, or run an MoE model "
                            "(examples/moe/).")
        elif entry.cls in ("semantic", "backends"):
            why = verdict(entry, backend, values, ctx)
            if why:
                problems.append(f"{typed} ({entry.reason}): TRANSFORMER_IMPL={backend} {why}.")
    _refuse_each("flags_the_backend_cannot_honour", "flags after the script name that this "
                 "launch cannot honour", problems)


@guard
def fork_variables(ctx: LaunchContext) -> None:
    """The ROCm fork's variables are honoured or refused (training/launch/fork_vars.py); two spellings of a knob agree."""
    from . import fork_vars

    s = ctx.settings
    problems = list(ctx.clashes)
    for name, (raw, _source) in ctx.fork_given.items():
        var = fork_vars.OWN[name]
        value = raw.strip()
        if var.kind == "refuse":
            problems.append(f"{name}={raw}: {var.here}.")
        elif var.kind == "accept" and value not in var.accept:
            problems.append(f"{name}={raw} (the ROCm fork's {var.meaning}): {var.here}.")
        elif name == "MOCK_DATA" and (value == "1") == bool(s.get("DATA_PATH")):
            problems.append("MOCK_DATA=1 with DATA_PATH set: unset one of them (mock data is "
                            "what runs without DATA_PATH)." if value == "1" else
                            "MOCK_DATA=0 needs DATA_PATH=<dataset prefix> (without it the run "
                            "uses mock data).")
    if len(problems) == 1:
        raise Refusal("fork_variables", problems[0])
    if problems:
        raise Refusal("fork_variables", "\n  ".join(["variables this launcher cannot honour:",
                                                      *problems]))


@guard
def layer_variables(ctx: LaunchContext) -> None:
    """A recipe layer's variable (MLPERF_*, EP, MOE_*) given to an entry point without the layer is refused (one of the machine: a notice)."""
    by_entry: dict[Any, list[str]] = {}
    for name, (_source, entry) in ctx.layer_given.items():
        if name in entry.machine:
            ctx.settings.info("layer_variables", f"{name} is for {entry.script} ({entry.what}); "
                                                 "this launch does not use it.")
        else:
            by_entry.setdefault(entry, []).append(name)
    problems = [f"{', '.join(names)}: {'a variable' if len(names) == 1 else 'variables'} of "
                f"{entry.what}, which only {entry.script} applies, not this launch. Run "
                f"{entry.script}, or unset {' '.join(names)}." for entry, names in by_entry.items()]
    if problems:
        raise Refusal("layer_variables", "\n  ".join(problems))


@guard
def fp8_and_fp4_together(ctx: LaunchContext) -> None:
    """TE_FP8=1 with TE_FP4=1 names two recipes at once."""
    s = ctx.settings
    if s.get("TE_FP8") and s.get("TE_FP4"):
        raise Refusal("fp8_and_fp4_together",
                      "TE_FP8=1 and TE_FP4=1 together: FP8 and FP4 recipes cannot be combined. "
                      "Pick one, e.g. PRECISION=fp8 or PRECISION=mxfp4.")


@guard
def precision_spelling_conflict(ctx: LaunchContext) -> None:
    """PRECISION and ROCm Megatron-LM's TE_FP8/TE_FP4 spelling must agree; a *_RECIPE needs its switch."""
    s = ctx.settings
    for recipe_var, switch in (("TE_FP8_RECIPE", "TE_FP8"), ("TE_FP4_RECIPE", "TE_FP4")):
        if s.get(recipe_var) is not None and not s.get(switch):
            raise Refusal("precision_spelling_conflict",
                          f"{recipe_var}={s.get(recipe_var)} needs {switch}=1 (or use "
                          "PRECISION=... alone).")
    said = spelling_conflict(s)
    if said:
        raise Refusal("precision_spelling_conflict",
                      f"PRECISION={s['PRECISION']} disagrees with {said}. Use one spelling: "
                      "unset the TE_FP8/TE_FP4 variables or PRECISION.")


# -- backend and kernels ------------------------------------------------------------------------

@guard
def backend_available(ctx: LaunchContext) -> None:
    """TRANSFORMER_IMPL=transformer_engine needs Transformer Engine to import here."""
    if ctx.backend == "transformer_engine" and not ctx.caps.transformer_engine:
        raise Refusal("backend_available",
                      "TRANSFORMER_IMPL=transformer_engine but transformer_engine does not import "
                      f"here ({ctx.caps.source}). Use TRANSFORMER_IMPL=native (SDPA + Liger "
                      "kernels) or run inside the project's docker image.")


@guard
def low_precision_needs_te(ctx: LaunchContext) -> None:
    """fp8/fp4 recipes compute in Transformer Engine layers: other backends are refused."""
    if ctx.recipe.kind == "bf16" or ctx.backend == "transformer_engine":
        return
    chosen = ctx.settings.setting("TRANSFORMER_IMPL")
    why = ("Transformer Engine does not import here" if not ctx.caps.transformer_engine
           else f"TRANSFORMER_IMPL={ctx.backend}, {chosen.reason}"
           if chosen.source == "platform" else f"TRANSFORMER_IMPL={ctx.backend}")
    raise Refusal("low_precision_needs_te",
                  f"PRECISION={ctx.recipe.name} computes in Transformer Engine layers, but "
                  f"the backend is {ctx.backend} ({why}). Use PRECISION=bf16 here, or "
                  "TRANSFORMER_IMPL=transformer_engine on a node/image with TE.")


@guard
def precision_needs_hardware(ctx: LaunchContext) -> None:
    """Each recipe runs only on the GPUs that have its number formats (refused with the list)."""
    recipe = ctx.recipe
    if recipe.kind == "bf16":
        return
    can = ", ".join(platforms_supporting(recipe)) or "none known"
    if not ctx.caps.known:
        ctx.settings.warn("precision_needs_hardware",
                          f"PRECISION={recipe.name} needs specific hardware ({can}); the GPU here "
                          f"is not known ({ctx.caps.device_name or 'no GPU visible'}), so this "
                          "is unchecked. Set PLATFORM=<name> to check it before you launch.")
        return
    if not recipe.supports(ctx.caps.sm, ctx.caps.gfx):
        here = [name for name, r in RECIPES.items()
                if r.kind != "bf16" and r.supports(ctx.caps.sm, ctx.caps.gfx)]
        raise Refusal("precision_needs_hardware",
                      f"PRECISION={recipe.name} does not run on {ctx.caps.platform} "
                      f"({ctx.caps.info.arch}). Platforms that can: {can}. "
                      f"{hardware_rule(recipe)} "
                      f"Use PRECISION=bf16{''.join(f' or {n}' for n in here)} here.")


@guard
def recipe_needs_megatron_support(ctx: LaunchContext) -> None:
    """fp8/fp4 recipe flags must be offered by the Megatron that runs them (installed, or the named platform image's)."""
    recipe = ctx.recipe
    if recipe.kind == "bf16":
        return
    from .megatron_info import RECIPE_FLAGS

    build, where = ctx.megatron.build, ctx.megatron.where
    words = recipe_args(recipe, ctx.settings)
    missing = build.missing(words)
    if missing:
        raise Refusal("recipe_needs_megatron_support",
                      f"PRECISION={recipe.name} needs {'; '.join(missing)}, which {build.name} "
                      f"(the Megatron {where}) does not accept. Use a recipe it offers, or the "
                      "image whose Megatron has it (docker/Dockerfile.rocm runs ROCm/Megatron-LM, "
                      "whose --fp4-recipe offers mxfp4).")
    flags = " ".join(f"{a} {b}" for a, b in zip(words, words[1:]) if a in RECIPE_FLAGS)
    ctx.settings.info("recipe_needs_megatron_support",
                      f"PRECISION={recipe.name} ({flags}) checked against {build.name}, the "
                      f"Megatron {where} (choices from {build.source.split(':')[0]}).")


@guard
def mxfp8_uses_e4m3(ctx: LaunchContext) -> None:
    """mxfp8 with the hybrid fp8 format is known to diverge: refused."""
    if ctx.recipe.name == "mxfp8" and ctx.settings.get("FP8_FORMAT") == "hybrid":
        raise Refusal("mxfp8_uses_e4m3",
                      "PRECISION=mxfp8 with FP8_FORMAT=hybrid is known to diverge. "
                      "Leave FP8_FORMAT unset (the mxfp8 recipe uses e4m3).")


@guard
def precision_only_knobs(ctx: LaunchContext) -> None:
    """fp8/fp4 knobs without their recipe warn; selective-bf16 counts must leave fp4 layers."""
    s = ctx.settings
    if ctx.recipe.kind != "fp8" and s.is_explicit("FP8_FORMAT"):
        s.warn("precision_only_knobs",
               f"FP8_FORMAT has no effect with PRECISION={ctx.recipe.name}.")
    fp4_knobs = [n for n in ("FP4_SELECTIVE_BF16", "FP4_BF16_LAYERS_START",
                             "FP4_BF16_LAYERS_END") if s.is_explicit(n)]
    if ctx.recipe.kind != "fp4" and fp4_knobs:
        s.warn("precision_only_knobs",
               f"{', '.join(fp4_knobs)} has no effect with PRECISION={ctx.recipe.name}.")
    if ctx.recipe.kind == "fp4" and s["FP4_SELECTIVE_BF16"]:
        kept = s["FP4_BF16_LAYERS_START"] + s["FP4_BF16_LAYERS_END"]
        if kept >= s["NUM_LAYERS"]:
            raise Refusal("precision_only_knobs",
                          f"FP4_BF16_LAYERS_START+FP4_BF16_LAYERS_END={kept} keeps every one of "
                          f"the {s['NUM_LAYERS']} layers in bf16: use PRECISION=bf16, or fewer.")


@guard
def param_gather(ctx: LaunchContext) -> None:
    """FP8/FP4_PARAM_GATHER need their recipe; fp8 param gather needs the distributed optimizer, not FSDP."""
    s = ctx.settings
    for name, kind in (("FP8_PARAM_GATHER", "fp8"), ("FP4_PARAM_GATHER", "fp4")):
        if s[name] and ctx.recipe.kind != kind:
            raise Refusal("param_gather", f"{name}=1 all-gathers {kind} weights, but "
                                          f"PRECISION={ctx.recipe.name}: use an {kind} recipe or "
                                          f"unset {name}.")
    if s["FP8_PARAM_GATHER"] and s["FSDP"]:
        raise Refusal("param_gather", "FP8_PARAM_GATHER=1 with FSDP=1: megatron-core 0.19.2 turns "
                                      "fp8 param gather off under FSDP2 with TE >= 2.0. Use one.")
    if s["FP8_PARAM_GATHER"] and not s["DISTRIBUTED_OPTIMIZER"]:
        raise Refusal("param_gather", "FP8_PARAM_GATHER=1 needs DISTRIBUTED_OPTIMIZER=1 (the "
                                      "optimizer keeps the fp8 weights).")


@guard
def mxfp4_bf16_grad_buffer(ctx: LaunchContext) -> None:
    """AMD's a4w4 wgrad GEMM writes BF16 only: an FP32 grad buffer crashes under mxfp4."""
    s = ctx.settings
    fusion = s["GRADIENT_ACCUMULATION_FUSION"] and not s["FSDP"]   # FSDP turns it off
    if ctx.recipe.name == "mxfp4" and fusion and not s["GRAD_REDUCE_IN_BF16"]:
        s.correct("GRAD_REDUCE_IN_BF16", True, "mxfp4_bf16_grad_buffer",
                  "mxfp4 + gradient-accumulation fusion needs the BF16 grad buffer: the a4w4 "
                  "wgrad GEMM emits BF16 only ('gemm_a4w4_asm only support BFloat16 output "
                  "now!' with an FP32 buffer)")


@guard
def fsdp_constraints(ctx: LaunchContext) -> None:
    """FSDP2: TP=1 and PP=1; no gradient-accumulation fusion or distributed optimizer."""
    s = ctx.settings
    if not s["FSDP"]:
        return
    if s["TP"] != 1 or s["PP"] != 1:
        raise Refusal("fsdp_constraints",
                      f"FSDP=1 needs TP=1 and PP=1 (got TP={s['TP']} PP={s['PP']}): "
                      "FSDP2 shards parameters over all ranks. Set TP=1 PP=1, or FSDP=0.")
    _off_or_refuse(ctx, "GRADIENT_ACCUMULATION_FUSION", "fsdp_constraints",
                   "FSDP2 does not support gradient-accumulation fusion",
                   "Set GRADIENT_ACCUMULATION_FUSION=0 or FSDP=0.")
    for name in ("DISTRIBUTED_OPTIMIZER", "OVERLAP_PARAM_GATHER"):
        _off_or_refuse(ctx, name, "fsdp_constraints",
                       "FSDP2 shards optimizer state itself (Megatron's distributed optimizer "
                       "is for DDP)", f"Set {name}=0 or FSDP=0.")


# The linears that take the fused weight-gradient GEMM on each backend, and the kernels that can
# serve them, first choice first: "te" is Transformer Engine's own (fuse_wgrad_accumulation),
# "apex" apex's fused_weight_gradient_mlp_cuda, "native" the cuBLAS beta=1 GEMM of
# training/native/wgrad.py (installed by the run for the native and TE backends). Megatron's
# TE spec keeps Megatron's own ColumnParallelLinear for the output layer, which calls apex's
# kernel even under TE; the local backend is stock Megatron, so apex's kernel or none.
FUSED_WGRAD_LINEARS = {
    "transformer_engine": (("TE's linears (QKV, projection, FC1, FC2)", ("te",)),
                           ("the output layer (Megatron's ColumnParallelLinear)",
                            ("apex", "native"))),
    "native": (("every linear (Megatron's Column/RowParallelLinear)", ("apex", "native")),),
    "local": (("every linear (Megatron's Column/RowParallelLinear)", ("apex",)),),
}
WGRAD_KERNELS = {"te": "Transformer Engine's fused wgrad accumulation",
                 "apex": "apex's fused_weight_gradient_mlp_cuda",
                 "native": "the native cuBLAS GEMM accumulating into main_grad (torch.addmm)"}


def wgrad_kernels(backend: str, caps: Capabilities) -> list[tuple[str, str | None]]:
    """(linear, kernel or None) for every linear that takes the fused wgrad on this backend."""
    have = {"te": caps.transformer_engine, "apex": caps.apex_fused_wgrad, "native": True}
    return [(linear, next((k for k in kernels if have[k]), None))
            for linear, kernels in FUSED_WGRAD_LINEARS[backend]]


@guard
def grad_accum_fusion_kernel(ctx: LaunchContext) -> None:
    """Every linear that would take the fused wgrad needs a kernel: TE's, apex's, or the native one."""
    if not ctx.settings["GRADIENT_ACCUMULATION_FUSION"] or ctx.settings["FSDP"]:
        return                  # under FSDP=1, fsdp_constraints owns the fusion
    chosen = wgrad_kernels(ctx.backend, ctx.caps)
    lacking = [linear for linear, kernel in chosen if kernel is None]
    if lacking:
        _off_or_refuse(ctx, "GRADIENT_ACCUMULATION_FUSION", "grad_accum_fusion_kernel",
                       f"the {ctx.backend} backend needs apex's fused_weight_gradient_mlp_cuda "
                       f"for {', '.join(lacking)}, which is not installed here",
                       "Install apex, use TRANSFORMER_IMPL=native, or set it to 0.")
    elif len({kernel for _linear, kernel in chosen}) > 1:
        ctx.settings.info("grad_accum_fusion_kernel", "GRADIENT_ACCUMULATION_FUSION: " + "; ".join(
            f"{linear}: {WGRAD_KERNELS[kernel]}" for linear, kernel in chosen) + ".")


@guard
def te_cross_entropy(ctx: LaunchContext) -> None:
    """megatron-core 0.19.2 asserts on the TE cross-entropy fusion: refused, native is the default."""
    s = ctx.settings
    if not s["CROSS_ENTROPY_LOSS_FUSION"] or s["CROSS_ENTROPY_FUSION_IMPL"] != "te":
        return
    raise Refusal("te_cross_entropy",
                  "CROSS_ENTROPY_FUSION_IMPL=te: megatron-core 0.19.2's validate_args asserts "
                  "'Transformer Engine cross entropy loss fusion is disabled due to stability "
                  "issues'. Use CROSS_ENTROPY_FUSION_IMPL=native (the default).")


@guard
def cuda_graph(ctx: LaunchContext) -> None:
    """A CUDA graph of the step needs no host read of the GPU in it, bf16, an unmeasured capture.

    The host reads (training.launch.toggles.step_host_reads) are refused."""
    s = ctx.settings
    if s["CUDA_GRAPH"] == "none":
        if s.is_explicit("CUDA_GRAPH_WARMUP"):
            raise Refusal("cuda_graph", f"CUDA_GRAPH_WARMUP={s['CUDA_GRAPH_WARMUP']} counts the "
                                        "eager iterations before a CUDA graph's capture, and "
                                        "CUDA_GRAPH=none captures none: it would change nothing. "
                                        "Set CUDA_GRAPH=full_iteration, or unset "
                                        "CUDA_GRAPH_WARMUP.")
        return
    warmup = s["CUDA_GRAPH_WARMUP"]
    if warmup < 1:
        raise Refusal("cuda_graph", f"CUDA_GRAPH_WARMUP={warmup}: megatron-core needs at least "
                                    "one eager iteration before the capture. Use 1 or more "
                                    "(3 is Megatron's default).")
    if ctx.recipe.name != "bf16":
        raise Refusal("cuda_graph", f"CUDA_GRAPH={s['CUDA_GRAPH']} with PRECISION="
                                    f"{ctx.recipe.name}: the graphed step has been tried at "
                                    "bf16 only (a low-precision recipe's scaling state updates "
                                    "inside the graph, untested). Use PRECISION=bf16 or "
                                    "CUDA_GRAPH=none.")
    reads = step_host_reads(s["NAN_CHECK"], ctx.preset.num_experts or 0,
                            bool(s.get("MOE_DEVICE_COUNTS")))
    refused = [f"{why}: set {fix}" for _name, why, fix in reads]
    if refused:
        raise Refusal("cuda_graph", f"CUDA_GRAPH={s['CUDA_GRAPH']} captures the whole step, "
                                    "which must not read the GPU from the host; here: "
                                    + "; ".join(refused) + " (or CUDA_GRAPH=none).")
    need = warmup + 1   # the eager iterations and the capture's
    if s["METRICS_WARMUP_ITERS"] < need:
        if s.is_explicit("METRICS_WARMUP_ITERS"):
            raise Refusal("cuda_graph", f"METRICS_WARMUP_ITERS={s['METRICS_WARMUP_ITERS']} with "
                                        f"CUDA_GRAPH_WARMUP={warmup}: iteration {need} captures "
                                        "the graph and would be measured as a steady step. Use "
                                        f"METRICS_WARMUP_ITERS={need} or more.")
        s.correct("METRICS_WARMUP_ITERS", need, "cuda_graph",
                  f"{warmup} eager iterations and the capture's are not steady state")
    if s["TOTAL_ITERS"] <= need:
        s.warn("cuda_graph", f"TOTAL_ITERS={s['TOTAL_ITERS']}: the graph is captured at "
                             f"iteration {need} and never replayed.")


TE_FUSED_QKV_ROPE = (2, 8)   # transformer_engine.pytorch.attention.rope.apply_fused_qkv_rotary_pos_emb


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


@guard
def fused_qkv_rope_kernel(ctx: LaunchContext) -> None:
    """Fused QKV RoPE needs a kernel: the native backend's, or TE's (TE >= 2.8); the local backend has none."""
    if ctx.backend == "local":
        _off_or_refuse(ctx, "FUSED_SINGLE_QKV_ROPE", "fused_qkv_rope_kernel",
                       "the local backend has no fused QKV RoPE kernel (Megatron's needs "
                       "Transformer Engine)",
                       "Use TRANSFORMER_IMPL=native or transformer_engine, or set it to 0.")
    te = ctx.caps.te_version   # None on a named platform; "unknown" when TE has no __version__
    if (ctx.backend == "transformer_engine" and te and (0,) < _version(te) < TE_FUSED_QKV_ROPE):
        _off_or_refuse(ctx, "FUSED_SINGLE_QKV_ROPE", "fused_qkv_rope_kernel",
                       f"Transformer Engine {te} has no apply_fused_qkv_rotary_pos_emb (added in "
                       "2.8); Megatron would assert 'fused_single_qkv_rope requested but not "
                       "available'", "Use Transformer Engine >= 2.8, or set it to 0.")


@guard
def fused_qkv_rope_qk_norm(ctx: LaunchContext) -> None:
    """Q/K norms (Qwen3) sit between the QKV projection and RoPE: no fused QKV RoPE."""
    if ctx.preset.qk_layernorm:
        _off_or_refuse(ctx, "FUSED_SINGLE_QKV_ROPE", "fused_qkv_rope_qk_norm",
                       f"{ctx.preset.name} normalises each head's query and key before RoPE, "
                       "so RoPE cannot run on the packed QKV projection (megatron-core asserts "
                       "'fused_single_qkv_rope requested but not available/supported')",
                       "Set FUSED_SINGLE_QKV_ROPE=0.")


@guard
def te_only_kernels(ctx: LaunchContext) -> None:
    """ATTENTION_BACKEND and ROPE_FUSION=1 pick Transformer Engine kernels; GEMM_TUNING is TE's on AMD."""
    s = ctx.settings
    if ctx.backend == "transformer_engine":
        if s["GEMM_TUNING"] and ctx.caps.info is not None and ctx.caps.info.vendor != "amd":
            s.warn("te_only_kernels", f"GEMM_TUNING=1 tunes hipBLASLt GEMMs on AMD GPUs; "
                                      f"{ctx.caps.platform} is not one, so it does nothing here.")
        return
    named = [f"ATTENTION_BACKEND={s['ATTENTION_BACKEND']}"] if s["ATTENTION_BACKEND"] != "auto" \
        else []
    if s["ROPE_FUSION"] and s.is_explicit("ROPE_FUSION"):
        named.append("ROPE_FUSION=1")
    if named:
        raise Refusal("te_only_kernels",
                      f"{' and '.join(named)} pick Transformer Engine kernels, but the backend is "
                      f"{ctx.backend} (its attention is torch SDPA, its RoPE fused by "
                      "FUSED_SINGLE_QKV_ROPE). Use TRANSFORMER_IMPL=transformer_engine, or unset "
                      "them.")
    if s["GEMM_TUNING"]:
        s.warn("te_only_kernels", f"GEMM_TUNING=1 tunes Transformer Engine's hipBLASLt GEMMs; "
                                  f"the backend is {ctx.backend}, so it does nothing here.")


@guard
def ce_chunk_mem(ctx: LaunchContext) -> None:
    """CE_CHUNK_MEM sizes Liger's fused linear cross-entropy; anywhere else it does nothing."""
    s = ctx.settings
    value = s["CE_CHUNK_MEM"]
    if value < 1:
        raise Refusal("ce_chunk_mem", f"CE_CHUNK_MEM={value}: use an integer >= 1 (1 is "
                                      "Liger's default chunking).")
    if value == 1 or not s.is_explicit("CE_CHUNK_MEM"):
        return  # Liger's own chunking, or the launcher default (unused where it cannot act)
    kernels, why = fused_linear_ce(ctx.backend, bool(s["CROSS_ENTROPY_LOSS_FUSION"]), s["TP"],
                                   s["CP"], s["NATIVE_KERNELS"])
    if kernels == "torch":
        why = "NATIVE_KERNELS=torch has its own chunking"
    if kernels != "liger":
        raise Refusal("ce_chunk_mem", f"CE_CHUNK_MEM={value} sizes Liger's fused linear "
                                      f"cross-entropy (native or Transformer Engine backend, "
                                      f"TP=1); here {why}, so it would change nothing. Unset "
                                      "CE_CHUNK_MEM.")


@guard
def context_parallel_backend(ctx: LaunchContext) -> None:
    """Context parallelism needs Transformer Engine's attention."""
    if ctx.settings["CP"] > 1 and ctx.backend != "transformer_engine":
        raise Refusal("context_parallel_backend",
                      f"CP={ctx.settings['CP']} needs Transformer Engine's attention "
                      f"(backend here: {ctx.backend}). Use CP=1, or TRANSFORMER_IMPL="
                      "transformer_engine on a node with TE.")


@guard
def document_mask(ctx: LaunchContext) -> None:
    """DOCUMENT_MASK=1 only where the packed (THD) layout runs; RESET_POSITION_IDS follows it, alone refused.

    Alone, RESET_POSITION_IDS would change nothing under RoPE; every launch says whether
    documents are kept apart."""
    from . import documents

    s = ctx.settings
    mask = bool(s["DOCUMENT_MASK"])
    positions = s["RESET_POSITION_IDS"]
    if not mask:
        if positions and getattr(ctx.preset, "position_embedding_type", "rope") != \
                "learned_absolute":
            raise Refusal("document_mask", f"RESET_POSITION_IDS=1: {documents.POSITIONS_ALONE}.")
        s.info("document_mask", documents.kept_apart(False, bool(s.get("DATA_PATH"))))
        return
    from training.arguments import _given

    dropout = _given(ctx.user_args, "--attention-dropout")
    why = documents.conflicts(ctx.backend, s["CP"], s["CUDA_GRAPH"], s["PP"], s["MBS"],
                              float(dropout) if dropout is not None else 0.0)
    if why:
        raise Refusal("document_mask", "DOCUMENT_MASK=1 (--reset-attention-mask) cannot run "
                                       "here: " + "; ".join(why) + ".")
    if not positions and s.is_explicit("RESET_POSITION_IDS"):
        raise Refusal("document_mask", f"RESET_POSITION_IDS=0 with DOCUMENT_MASK=1: "
                                       f"{documents.POSITIONS_WITH_MASK}. Unset "
                                       "RESET_POSITION_IDS.")
    s.correct("RESET_POSITION_IDS", True, "document_mask", documents.POSITIONS_WITH_MASK)
    # a model whose own rule turns the fused QKV RoPE off (q/k norms: fused_qkv_rope_qk_norm;
    # YaRN: gpt_oss_kernels) owns the value, so the guards' order names no other reason
    if not (ctx.preset.qk_layernorm or getattr(ctx.preset, "yarn", False)):
        _off_or_refuse(ctx, "FUSED_SINGLE_QKV_ROPE", "document_mask", documents.FUSED_QKV_ROPE,
                       "Set FUSED_SINGLE_QKV_ROPE=0, or DOCUMENT_MASK=0.")
    s.info("document_mask", documents.kept_apart(True, bool(s.get("DATA_PATH"))))


# -- parallel layout ----------------------------------------------------------------------------

def _nearest(value: int, candidates: list[int]) -> str:
    below = [c for c in candidates if c <= value]
    above = [c for c in candidates if c >= value]
    near = sorted({max(below) if below else None, min(above) if above else None} - {None})
    return " or ".join(str(c) for c in near)


@guard
def parallel_sizes(ctx: LaunchContext) -> None:
    """TP*PP*CP divides the world, heads and KV groups divide by TP, layers by PP, BS by MBS*DP."""
    s, p = ctx.settings, ctx.preset
    layout = ctx.layout
    tp, pp, cp, world = layout.tp, layout.pp, layout.cp, layout.world_size
    model_parallel = layout.model_parallel
    if world % model_parallel:
        fits = divisors(world)
        raise Refusal("parallel_sizes",
                      f"TP*PP*CP={tp}*{pp}*{cp}={model_parallel} does not divide the world size "
                      f"{world} (NNODES*GPUS_PER_NODE). TP*PP*CP must be one of "
                      f"{', '.join(map(str, fits))}.")
    heads, groups = p.num_attention_heads, p.num_query_groups
    if heads % tp or groups % tp:
        valid = [d for d in divisors(groups) if heads % d == 0]
        raise Refusal("parallel_sizes",
                      f"TP={tp} must divide the attention heads ({heads}) and query groups "
                      f"({groups}) of {p.name}. Nearest valid TP: {_nearest(tp, valid)}.")
    layers = s["NUM_LAYERS"]
    if layers % pp:
        raise Refusal("parallel_sizes",
                      f"PP={pp} must divide NUM_LAYERS={layers}. Nearest valid PP: "
                      f"{_nearest(pp, divisors(layers))}.")
    dp = layout.dp
    step = s["MBS"] * dp
    if s["BS"] % step:
        lower = (s["BS"] // step) * step
        options = [v for v in (lower, lower + step) if v > 0]
        raise Refusal("parallel_sizes",
                      f"BS={s['BS']} is not a multiple of MBS*DP={s['MBS']}*{dp}={step}. "
                      f"Nearest valid BS: {' or '.join(map(str, options))}.")


@guard
def sequence_parallel(ctx: LaunchContext) -> None:
    """Sequence parallel asked for at TP=1 is turned off (unset, it follows TP: derived)."""
    s = ctx.settings
    if s["SEQUENCE_PARALLEL"] and s["TP"] == 1:
        s.correct("SEQUENCE_PARALLEL", False, "sequence_parallel",
                  "sequence parallel needs TP>1; Megatron would disable it at TP=1")


@guard
def local_norm_sequence_parallel(ctx: LaunchContext) -> None:
    """Megatron's local spec uses torch norms, which assert `not sequence_parallel`."""
    s = ctx.settings
    if ctx.backend == "local" and s["SEQUENCE_PARALLEL"] and s["TP"] > 1:  # TP=1: no SP anyway
        if s.is_explicit("SEQUENCE_PARALLEL"):
            raise Refusal("local_norm_sequence_parallel",
                          "SEQUENCE_PARALLEL=1 with TRANSFORMER_IMPL=local: Megatron's torch-norm "
                          "wrapper refuses sequence parallel. Use TRANSFORMER_IMPL=native, or "
                          "SEQUENCE_PARALLEL=0.")
        s.correct("SEQUENCE_PARALLEL", False, "local_norm_sequence_parallel",
                  "the local backend's torch norms do not support sequence parallel")


@guard
def optimizer_overlap(ctx: LaunchContext) -> None:
    """The overlapped param all-gather needs the distributed optimizer and overlapped grad reduce."""
    s = ctx.settings
    if s["FSDP"]:
        return                  # under FSDP=1, fsdp_constraints owns the param gather
    if s["OVERLAP_PARAM_GATHER"] and not (s["DISTRIBUTED_OPTIMIZER"] and s["OVERLAP_GRAD_REDUCE"]):
        _off_or_refuse(ctx, "OVERLAP_PARAM_GATHER", "optimizer_overlap",
                       "overlapping the param all-gather needs DISTRIBUTED_OPTIMIZER=1 and "
                       "OVERLAP_GRAD_REDUCE=1",
                       "Turn those on, or set OVERLAP_PARAM_GATHER=0.")


# -- optimizer state ------------------------------------------------------------------------------

# fp8/fp4 recipes whose weights are quantised tensors: Megatron then keeps fp32 main params
# itself under the precision-aware optimizer (only delayed-scaling fp8 leaves them to TE's Adam)
_MCORE_KEEPS_MAIN_PARAMS = ("fp8_tensorwise", "mxfp8", "mxfp4", "nvfp4")


@guard
def adam_impl(ctx: LaunchContext) -> None:
    """ADAM_IMPL=native: MixedPrecisionAdamW in place of TE's FusedAdam under the precision-aware optimizer; bf16 recipes only; said where it changes nothing."""
    from .optimizer_state import precision_aware

    s = ctx.settings
    if s["ADAM_IMPL"] != "native":
        return
    if ctx.recipe.kind != "bf16":
        raise Refusal("adam_impl",
                      f"ADAM_IMPL=native with PRECISION={ctx.recipe.name}: the native "
                      "MixedPrecisionAdamW updates bf16 weights, and an fp8 or fp4 recipe's "
                      "quantised weights keep their masters through TE's FusedAdam. Use "
                      "ADAM_IMPL=auto, or PRECISION=bf16.")
    if not precision_aware(s):        # a setting that would change nothing: said, not run
        raise Refusal("adam_impl", "ADAM_IMPL=native would change nothing here: it replaces TE's "
                                   "FusedAdam under the precision-aware optimizer only "
                                   "(ADAM_MOMENTS_DTYPE or MASTER_WEIGHTS not fp32, as the MoE "
                                   "lean step sets them); Megatron's default optimizer stays. "
                                   "Set those, or leave ADAM_IMPL=auto.")
    if not ctx.caps.transformer_engine and ctx.backend != "transformer_engine":
        raise Refusal("adam_impl", "ADAM_IMPL=native would change nothing here: Transformer "
                                   "Engine does not import, so Megatron's Adam is the native "
                                   "MixedPrecisionAdamW already. Leave ADAM_IMPL=auto.")
    s.info("adam_impl", "ADAM_IMPL=native: the native MixedPrecisionAdamW in place of TE's "
                        "FusedAdam (its speed against TE's is measured by the bench part "
                        "moe-te-adam; the default stays auto until then).")


@guard
def optimizer_state(ctx: LaunchContext) -> None:
    """Low-precision optimizer state and CPU offload: the distributed optimizer, a backend whose Adam takes them, no stochastic rounding under TE, an offload that keeps the fp32 state."""
    from .optimizer_state import precision_aware

    s = ctx.settings
    if not precision_aware(s):
        return
    asked = [f"{n}={fmt_value(s[n])}" for n in ("ADAM_MOMENTS_DTYPE", "MASTER_WEIGHTS",
                                                  "OPTIMIZER_CPU_OFFLOAD") if s.is_explicit(n)]
    what = ", ".join(asked) or "the optimizer-state toggles"
    if s["FSDP"] or not s["DISTRIBUTED_OPTIMIZER"]:   # FSDP=1: fsdp_constraints turns it off
        why = "FSDP=1" if s["FSDP"] else "DISTRIBUTED_OPTIMIZER=0"
        raise Refusal("optimizer_state",
                      f"{what} use Megatron's precision-aware optimizer, which megatron-core "
                      f"0.19.2 runs with the distributed optimizer only ({why}). Set "
                      "DISTRIBUTED_OPTIMIZER=1 (and FSDP=0), or leave them at fp32/0.")
    if ctx.backend == "local":
        raise Refusal("optimizer_state",
                      f"{what}: the local backend builds Megatron's torch AdamW, which keeps "
                      "fp32 state. Use TRANSFORMER_IMPL=native (MixedPrecisionAdamW) or "
                      "transformer_engine (TE's FusedAdam).")
    te_adam = ctx.backend == "transformer_engine" or ctx.caps.transformer_engine
    if s["MASTER_WEIGHTS"] == "stochastic" and te_adam:
        raise Refusal("optimizer_state",
                      "MASTER_WEIGHTS=stochastic: Megatron uses Transformer Engine's FusedAdam "
                      "where TE imports, and it has no stochastic rounding of bf16 master "
                      "weights. Use MASTER_WEIGHTS=remainder (an exact fp32 master in 2 B per "
                      "parameter).")
    if s["MASTER_WEIGHTS"] != "fp32" and ctx.recipe.name in _MCORE_KEEPS_MAIN_PARAMS:
        why = (f"MASTER_WEIGHTS={s['MASTER_WEIGHTS']} with PRECISION={ctx.recipe.name}: "
               "Megatron keeps fp32 main params of quantised weights itself, so the setting "
               "would change nothing")
        if s.is_explicit("MASTER_WEIGHTS"):
            raise Refusal("optimizer_state", f"{why}. Use MASTER_WEIGHTS=fp32 "
                                             "(ADAM_MOMENTS_DTYPE=bf16 still applies).")
        # a recipe layer's default (the MoE lean step's remainder masters): fp32, with the reason
        s.correct("MASTER_WEIGHTS", "fp32", "optimizer_state",
                  f"{why} (the 16-bit moments still apply)")
    if s["ADAM_MOMENTS_DTYPE"] == "bf16" and s["ADAM_BETA2"] > 0.99:
        s.warn("optimizer_state",
               f"ADAM_MOMENTS_DTYPE=bf16 with ADAM_BETA2={s['ADAM_BETA2']:g}: each step moves "
               f"the second moment by (1 - beta2) = {1 - s['ADAM_BETA2']:.3g} of the way to g^2, "
               "and bf16 keeps 8 bits: changes below 2^-9 of it round away, so it lags. "
               "Keep fp32 moments, or beta2 <= 0.99.")
    if not s["OPTIMIZER_CPU_OFFLOAD"]:
        return
    if s["ADAM_MOMENTS_DTYPE"] != "fp32" or s["MASTER_WEIGHTS"] != "fp32":
        raise Refusal("optimizer_state",
                      "OPTIMIZER_CPU_OFFLOAD=1 with low-precision state: Megatron's "
                      "HybridDeviceOptimizer keeps fp32 master weights and fp32 moments (it is "
                      "not given the state dtypes). Use ADAM_MOMENTS_DTYPE=fp32 "
                      "MASTER_WEIGHTS=fp32 with the offload, or no offload.")
    if s.get("LOAD") and not te_adam:
        raise Refusal("optimizer_state",
                      "OPTIMIZER_CPU_OFFLOAD=1 with LOAD on the native backend without TE: "
                      "megatron-core 0.19.2's checkpoint code reads torch's per-parameter Adam "
                      "steps from the offloaded optimizer before its first step, when it has "
                      "none. Resume without the offload, or under Transformer Engine.")


# -- cluster -----------------------------------------------------------------------------------

@guard
def multinode_master_addr(ctx: LaunchContext) -> None:
    """NNODES>1 needs a reachable MASTER_ADDR (not loopback) and NODE_RANK below NNODES."""
    s = ctx.settings
    if s["NNODES"] <= 1:
        return
    addr = s["MASTER_ADDR"]
    if not s.is_explicit("MASTER_ADDR") or is_loopback(addr):
        raise Refusal("multinode_master_addr",
                      f"NNODES={s['NNODES']} needs MASTER_ADDR set to node 0's reachable "
                      f"address (got {addr!r}). Set MASTER_ADDR=<node-0 hostname or IP>; "
                      "under Slurm, launchers/slurm/ sets it from the allocation.")
    if not 0 <= s["NODE_RANK"] < s["NNODES"]:
        raise Refusal("multinode_master_addr",
                      f"NODE_RANK={s['NODE_RANK']} must be in 0..{s['NNODES'] - 1}.")


@guard
def multinode_run_id(ctx: LaunchContext) -> None:
    """NNODES>1 without RUN_ID warns: the nodes would log into different run folders."""
    s = ctx.settings
    if s["NNODES"] > 1 and not s.is_explicit("RUN_ID"):
        s.warn("multinode_run_id",
               f"NNODES={s['NNODES']} without RUN_ID: each node names its run folder after its "
               "own start time, so the nodes' logs land in different folders. Set the same "
               "RUN_ID on every node (launchers/slurm/ sets it from the job id).")


def is_loopback(addr: str) -> bool:
    """localhost, or an address of the loopback range (other nodes cannot reach it)."""
    if addr in ("localhost", "localhost.localdomain", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False


# -- optimisation settings ------------------------------------------------------------------------

@guard
def adam_eps_at_high_lr(ctx: LaunchContext) -> None:
    """LR>=5e-4 with ADAM_EPS 1e-8 warns: at lr 8e-4 convergence tracked adam_eps."""
    s = ctx.settings
    if s["LR"] >= 5e-4 and s["ADAM_EPS"] <= 1e-8:
        s.warn("adam_eps_at_high_lr",
               f"LR={s['LR']:g} with ADAM_EPS={s['ADAM_EPS']:g}: at lr 8e-4 on Llama3-8B/C4, "
               "convergence was found to track adam_eps (1e-5 converged; 1e-8 plateaued near "
               "val loss 5.9, with or without bf16 grad reduce). The MLPerf llama3.1-8B config "
               "sets ADAM_EPS=1e-5.")


@guard
def schedule(ctx: LaunchContext) -> None:
    """Warm-up below the run length, MIN_LR not above LR, a steady-state window to measure."""
    s = ctx.settings
    iters = s["TOTAL_ITERS"]
    if s["WARMUP_ITERS"] >= iters:
        raise Refusal("schedule", f"WARMUP_ITERS={s['WARMUP_ITERS']} must be below "
                                  f"TOTAL_ITERS={iters}.")
    if s["MIN_LR"] > s["LR"]:
        raise Refusal("schedule", f"MIN_LR={s['MIN_LR']:g} is above LR={s['LR']:g}.")
    decay = s.get("LR_DECAY_ITERS")
    if decay is not None and decay <= s["WARMUP_ITERS"]:
        raise Refusal("schedule", f"LR_DECAY_ITERS={decay} is not above WARMUP_ITERS="
                                  f"{s['WARMUP_ITERS']}: the decay would end before the warm-up "
                                  "does (Megatron asserts it at startup). Give LR_DECAY_ITERS "
                                  "above the warm-up, or leave it unset (TOTAL_ITERS).")
    if s["METRICS_WARMUP_ITERS"] >= iters:
        s.warn("schedule", f"METRICS_WARMUP_ITERS={s['METRICS_WARMUP_ITERS']} >= TOTAL_ITERS="
                           f"{iters}: no steady-state window, throughput will be reported as "
                           "unmeasured.")


# Values that parse and that Megatron takes, but that no recipe we know uses: a warning names
# them (a typo such as WEIGHT_DECAY=1000 for 0.1 trains, badly).
PLAUSIBLE = {
    "WEIGHT_DECAY": (0.0, 1.0, "AdamW scales every weight by 1 - LR x WEIGHT_DECAY each step: "
                               "recipes use 0 to 0.1, and above 1 the decay, not the data, sets "
                               "the weights"),
    "LR": (0.0, 0.1, "pretraining recipes peak at 1e-4 to 1e-2; above 0.1 AdamW's steps are "
                     "the size of the weights themselves"),
    "MIN_LR": (0.0, 0.1, "the end of the decay is a tenth of a peak of 1e-4 to 1e-2 in recipes"),
    "ADAM_EPS": (0.0, 1e-3, "epsilon is added to the root of the squared-gradient average, far "
                            "below 1e-3 for a language model: larger, it outweighs it and AdamW "
                            "becomes a scaled SGD (recipes use 1e-8 to 1e-5)"),
    "CLIP_GRAD": (0.0, 100.0, "gradient norms of a healthy run are of order 1: a clip above 100 "
                              "never acts (0 turns clipping off)")}


@guard
def implausible_values(ctx: LaunchContext) -> None:
    """A value far outside what pretraining recipes use (WEIGHT_DECAY=1000, LR=5) is warned about."""
    s = ctx.settings
    for name, (low, high, why) in PLAUSIBLE.items():
        value = s.get(name)
        if s.is_explicit(name) and value is not None and not low <= value <= high:
            s.warn("implausible_values", f"{name}={value:g} is outside {low:g}..{high:g}, where "
                                         f"pretraining recipes put it ({why}): check for a typo.")


# A device as CUDA/HIP/ROCR_VISIBLE_DEVICES name it: an index, or a UUID (nvidia-smi -L)
_DEVICE_ID = re.compile(r"\d+|(GPU|MIG)-[0-9A-Za-z-]+(/\d+/\d+)?")


@guard
def visible_devices(ctx: LaunchContext) -> None:
    """CUDA/HIP/ROCR_VISIBLE_DEVICES list each device once, without empty entries."""
    for var in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"):
        value = ctx.environ.get(var)
        if value is None or value == "":
            continue
        ids = [d.strip() for d in value.split(",")]
        if "" in ids:
            raise Refusal("visible_devices", f"{var}={value!r} has an empty entry: list device "
                                             "ids separated by single commas, e.g. 0,1,2,3.")
        bad = [d for d in ids if not _DEVICE_ID.fullmatch(d)]
        if bad:
            raise Refusal("visible_devices", f"{var}={value!r} names {bad[0]!r}, not a device: "
                                             "the runtime stops at the first id it cannot use "
                                             "and hides it and every device after it (-1 hides "
                                             "them all). List device indices (0,1,2,3) or UUIDs "
                                             "(GPU-..., MIG-...), or unset it to use every GPU.")
        twice = sorted({d for d in ids if ids.count(d) > 1})
        if twice:
            raise Refusal("visible_devices", f"{var}={value!r} names device {', '.join(twice)} "
                                             "more than once, so two processes would share one "
                                             "GPU: list each device once.")


@guard
def gpus_per_node(ctx: LaunchContext) -> None:
    """GPUS_PER_NODE is at most the GPUs a node has (this one's visible ones, or PLATFORM's)."""
    s = ctx.settings
    have = visible_gpu_count(ctx.caps, ctx.environ)
    if not s.is_explicit("GPUS_PER_NODE") or not have or s["GPUS_PER_NODE"] <= have:
        return
    where = (f"this node shows {have}" if ctx.caps.source == "detected"
             else f"{ctx.caps.source} describes nodes of {have}")
    raise Refusal("gpus_per_node", f"GPUS_PER_NODE={s['GPUS_PER_NODE']} but {where} GPUs: "
                                   f"torchrun would start {s['GPUS_PER_NODE']} processes for "
                                   f"{have} GPUs. Set GPUS_PER_NODE={have} or fewer, and NNODES "
                                   "for more GPUs than one node has.")


@guard
def positions(ctx: LaunchContext) -> None:
    """A sequence longer than the model's positions is warned about, with what it means."""
    s = ctx.settings
    seq, have = s.get("SEQ_LENGTH"), ctx.preset.max_position_embeddings
    if not seq or not have or seq <= have:
        return
    source = ("its config.json (MODEL_CONFIG)" if ctx.model_config is not None
              else f"preset {ctx.preset.name}")
    s.warn("positions", f"SEQ_LENGTH={seq} is {seq / have:.3g}x the {have} positions of {source}: "
                        f"--max-position-embeddings becomes {seq}, and a checkpoint of this "
                        f"model has never seen RoPE positions past {have} (its long-context "
                        "quality is not the published one). Train at most at its positions, or "
                        "extend the context on purpose.")


@guard
def profile_window(ctx: LaunchContext) -> None:
    """The profiled iterations lie inside the run; profiled ranks exist."""
    s = ctx.settings
    if s["PROFILE"] == "none":
        return
    start, end = s["PROFILE_STEP_START"], s["PROFILE_STEP_END"]
    if not 0 < start < end <= s["TOTAL_ITERS"]:
        raise Refusal("profile_window",
                      f"PROFILE_STEP_START={start} and PROFILE_STEP_END={end} must satisfy "
                      f"0 < start < end <= TOTAL_ITERS={s['TOTAL_ITERS']}.")
    ranks = s["PROFILE_RANKS"].replace(",", " ").split()
    world = ctx.layout.world_size
    if not ranks or not all(r.isdigit() and int(r) < world for r in ranks):
        raise Refusal("profile_window",
                      f"PROFILE_RANKS={s['PROFILE_RANKS']!r} must list ranks below the world "
                      f"size {world}, e.g. PROFILE_RANKS=0.")


# -- checkpoints and data --------------------------------------------------------------------------

IMPORT_RECORD = "hf_import.json"   # written by `python -m training.checkpoint import`
# The record's "format": 2 also writes the final norm's `_extra_state` (Transformer Engine's
# final norm asks a load for it; format 1 lacked it, and Megatron's load raised in torch DCP);
# 3 records the whole shape (training.run_description.Model's fields), any family's.
IMPORT_FORMAT = 3
IMPORT_FORMAT_FINAL_NORM = 2


@guard
def checkpoint_format(ctx: LaunchContext) -> None:
    """CKPT_FORMAT fits the run: FSDP2 needs torch_dist or torch_dcp, which needs FSDP; fsdp_dtensor is Megatron-FSDP's."""
    s = ctx.settings
    fmt = s.get("CKPT_FORMAT")
    if fmt is None:
        return
    if fmt == "fsdp_dtensor":
        raise Refusal("checkpoint_format", "CKPT_FORMAT=fsdp_dtensor is Megatron-FSDP's format, "
                                           "which this launcher does not run: use torch_dist.")
    if s["FSDP"] and fmt not in ("torch_dist", "torch_dcp"):
        raise Refusal("checkpoint_format", f"CKPT_FORMAT={fmt} with FSDP=1: megatron-core 0.19.2 "
                                           "asserts FSDP2 saves torch_dist or torch_dcp.")
    if fmt == "torch_dcp" and not s["FSDP"]:
        raise Refusal("checkpoint_format", "CKPT_FORMAT=torch_dcp is only tested with FSDP=1 "
                                           "(megatron-core asserts): use torch_dist.")


@guard
def async_save(ctx: LaunchContext) -> None:
    """ASYNC_SAVE=1 writes torch_dist checkpoints (megatron-core's own async strategy) and
    needs SAVE."""
    s = ctx.settings
    if not s["ASYNC_SAVE"]:
        return
    fmt = s.get("CKPT_FORMAT") or "torch_dist"
    if fmt != "torch_dist":
        raise Refusal("async_save", f"ASYNC_SAVE=1 with CKPT_FORMAT={fmt}: megatron-core's own "
                                    "async save writes torch_dist only (its torch_dcp and "
                                    "fsdp_dtensor async paths need nvidia-resiliency-ext). Use "
                                    "CKPT_FORMAT=torch_dist, or ASYNC_SAVE=0.")
    if not s.get("SAVE"):
        s.warn("async_save", "ASYNC_SAVE=1 without SAVE: nothing is saved, so it does nothing.")


@guard
def wandb_logging(ctx: LaunchContext) -> None:
    """W&B logging (WANDB_PROJECT, or the fork's WANDB_API_KEY) needs wandb installed."""
    import importlib.util

    s = ctx.settings
    if importlib.util.find_spec("wandb") is not None:
        return
    if s.get("WANDB_PROJECT"):
        raise Refusal("wandb_logging", f"WANDB_PROJECT={s['WANDB_PROJECT']} logs to Weights & "
                                       "Biases, but wandb is not installed here: pip install "
                                       "wandb, or unset WANDB_PROJECT.")
    if "WANDB_API_KEY" in ctx.fork_given:
        message = ("WANDB_API_KEY is set, and the ROCm fork then logs to Weights & Biases; wandb "
                   "is not installed here, so this run logs to TensorBoard only (pip install "
                   "wandb to log there too).")
        if s["STRICT"]:
            raise Refusal("wandb_logging", f"STRICT=1: {message}")
        s.warn("wandb_logging", message)


@guard
def load_checkpoint(ctx: LaunchContext) -> None:
    """LOAD without a checkpoint is refused (no silent fresh start) unless RESUME=auto."""
    s = ctx.settings
    load = s.get("LOAD")
    if not load:
        return
    if Path(load).exists() and not Path(load).is_dir():
        raise Refusal("load_checkpoint", f"LOAD={load} is a file: point LOAD at the checkpoint "
                                         "folder (the SAVE of an earlier run).")
    point = ctx.resume
    if point is not None and point.scan.has_checkpoint:
        _check_resume_point(ctx, point)
        return
    half = f" ({point.scan.nothing_to_resume()})" if point is not None else \
        f" (no {CHECKPOINT_TRACKER})"
    if s["RESUME"] == "auto":
        s.info("load_checkpoint", f"LOAD={load} holds no complete checkpoint yet{half}: "
                                  "RESUME=auto starts fresh and will resume from it next time.")
        return
    if s.get("PRETRAINED_CHECKPOINT"):
        s.info("load_checkpoint", f"LOAD={load} holds no checkpoint yet{half}: the run starts "
                                  "from PRETRAINED_CHECKPOINT and resumes from LOAD once it "
                                  "holds one.")
        return
    raise Refusal("load_checkpoint",
                  f"LOAD={load} holds no complete checkpoint{half}, so training would silently "
                  "start from scratch. Point LOAD at a checkpoint directory, or set RESUME=auto "
                  "to start fresh when none exists yet.")


def _check_resume_point(ctx: LaunchContext, point) -> None:
    """The iteration a resume loads is a complete checkpoint that Megatron's load reaches."""
    from training.checkpoint_scan import checkpoint_format, iteration_folder

    s, load, found = ctx.settings, ctx.settings["LOAD"], point.scan
    done = ", ".join(iteration_folder(i) for i in found.complete) or "none"
    if s.is_explicit("CKPT_STEP") and s["CKPT_STEP"] not in found.complete:
        why = found.incomplete.get(s["CKPT_STEP"], "not there")
        raise Refusal("load_checkpoint", f"CKPT_STEP={s['CKPT_STEP']}: LOAD={load}'s "
                                         f"{iteration_folder(s['CKPT_STEP'])}/ is {why}. The "
                                         f"complete checkpoints there: {done}.")
    redirect = found.redirect()
    if redirect is None or s.is_explicit("CKPT_STEP"):
        return
    fix = (f"write the last complete iteration into the marker (printf {found.last_complete} "
           f"> {Path(load) / CHECKPOINT_TRACKER}) and launch again")
    if found.marker_problem:   # Megatron's read_metadata exits on it before --ckpt-step counts
        raise Refusal("load_checkpoint", f"LOAD={load}: {redirect}, and Megatron's load stops on "
                                         f"such a marker: {fix}.")
    if checkpoint_format(Path(load) / iteration_folder(found.last_complete)) == "torch" \
            and s["DISTRIBUTED_OPTIMIZER"]:
        raise Refusal("load_checkpoint", f"LOAD={load}: {redirect}; a torch-format checkpoint's "
                                         "distributed-optimizer state is read from the marker's "
                                         f"iteration whatever --ckpt-step says: {fix}.")
    skipped = found.skipped()
    s.warn("load_checkpoint", f"LOAD={load}: {redirect}; the resume takes "
                              f"{iteration_folder(found.last_complete)}/, the last complete "
                              "checkpoint (CKPT_STEP)"
           + (f"; skipped: {'; '.join(skipped)}" if skipped else "") + ".")


@guard
def resume_schedule(ctx: LaunchContext) -> None:
    """A resume's LR schedule: the checkpoint's or this launch's, said, never a mismatch
    Megatron's load asserts on after torchrun (RESUME_SCHEDULE); the plan in the notices."""
    from training.checkpoint_scan import iteration_folder

    from .resume import describe_schedule, launch_schedule, schedule_changes

    s, point = ctx.settings, ctx.resume
    if point is None or not point.scan.has_checkpoint or point.iteration not in \
            point.scan.complete:
        if s.is_explicit("RESUME_SCHEDULE") and not s.get("LOAD"):
            s.info("resume_schedule", f"RESUME_SCHEDULE={s['RESUME_SCHEDULE']} has no effect "
                                      "without LOAD (nothing is resumed).")
        return
    load, saved, iteration = s["LOAD"], point.saved, point.iteration
    if s["TOTAL_ITERS"] <= iteration:
        raise Refusal("resume_schedule", f"TOTAL_ITERS={s['TOTAL_ITERS']}, and LOAD={load} is "
                                         f"at iteration {iteration}: nothing is left to train. "
                                         f"Set TOTAL_ITERS above {iteration} to continue it.")
    head = (f"resume: LOAD={load} at iteration {iteration} "
            f"({iteration_folder(iteration)}/, complete)")
    if saved is None:   # never Megatron's assert after torchrun: the checkpoint's, said
        if s["RESUME_SCHEDULE"] == "auto":
            s.correct("RESUME_SCHEDULE", "checkpoint", "resume_schedule",
                      f"LOAD's saved schedule is not read here ({point.unread}): the "
                      "checkpoint's continues, whatever changed (RESUME_SCHEDULE=new takes "
                      "this launch's)")
        whose = "this launch" if s["RESUME_SCHEDULE"] == "new" else "the checkpoint"
        s.info("resume_schedule", f"{head}; trains iterations {iteration + 1}-"
                                  f"{s['TOTAL_ITERS']}; schedule: {whose}'s (its saved "
                                  "arguments not read before torchrun).")
        return
    values = s.as_values()
    changes = schedule_changes(saved, values)
    mine = ("LR", "MIN_LR", "WARMUP_ITERS", "LR_DECAY_ITERS", "LR_DECAY_STYLE", "WEIGHT_DECAY")
    yours = [c for c in changes if not c.inert
             and any(n in mine and s.is_explicit(n) for n in c.settings)]
    said = "; ".join(c.text(saved, s["BS"]) for c in changes)
    if s["RESUME_SCHEDULE"] == "auto" and yours:
        raise Refusal("resume_schedule",
                      f"LOAD={load}'s checkpoint (iteration {iteration}) was saved with another "
                      f"LR schedule than the one you set: {said}. RESUME_SCHEDULE=new applies "
                      "yours from its consumed samples on (Megatron's "
                      "--override-opt_param-scheduler); RESUME_SCHEDULE=checkpoint keeps the "
                      "checkpoint's (--use-checkpoint-opt_param-scheduler).")
    if s["RESUME_SCHEDULE"] == "auto" and changes:
        s.correct("RESUME_SCHEDULE", "checkpoint", "resume_schedule",
                  f"LOAD's checkpoint has another schedule than this launch derives ({said}); "
                  "the checkpoint's continues (RESUME_SCHEDULE=new takes this launch's)")
    which = s["RESUME_SCHEDULE"]
    follows = (launch_schedule(values), s["BS"]) if which == "new" else \
        (saved.schedule, saved.global_batch_size)
    changed = [f"{name} {old} -> {s[name]}" for name, old in
               (("TOTAL_ITERS", saved.train_iters), ("BS", saved.global_batch_size),
                ("SEQ_LENGTH", saved.seq_length)) if old is not None and old != s[name]]
    s.info("resume_schedule",
           f"{head}, {saved.consumed_samples} samples consumed; trains iterations "
           f"{iteration + 1}-{s['TOTAL_ITERS']}. Schedule: "
           f"{'this launch' if which == 'new' else 'the checkpoint'}'s "
           f"({describe_schedule(follows[0], follows[1])})"
           + (f"; changed against the checkpoint: {', '.join(changed)}" if changed else "")
           + (f"; schedule differences: {said}" if changes else "; schedule unchanged") + ".")
    if saved.global_batch_size and saved.global_batch_size != s["BS"]:
        s.warn("resume_schedule",
               f"BS {saved.global_batch_size} -> {s['BS']} on resume: Megatron's schedule "
               "counts samples, so the checkpoint's warm-up and decay keep their sample counts "
               f"({saved.consumed_samples} consumed); the data continues from that sample.")


@guard
def pretrained_checkpoint(ctx: LaunchContext) -> None:
    """PRETRAINED_CHECKPOINT is an import of the launch's shape (preset or MODEL_CONFIG) and layer count (off the native backend, one with TE's final-norm state), apart from LOAD/SAVE; LOAD is no import."""
    s = ctx.settings
    path, load = s.get("PRETRAINED_CHECKPOINT"), s.get("LOAD")
    if load and (Path(load) / IMPORT_RECORD).is_file():
        raise Refusal("pretrained_checkpoint",
                      f"LOAD={load} is an imported checkpoint; LOAD resumes a run from its own "
                      f"checkpoints. Start from it with PRETRAINED_CHECKPOINT={load} (LOAD and "
                      "SAVE then name this run's checkpoint folder).")
    if not path:
        return
    if s.get("SAVE") and Path(s["SAVE"]).resolve() == Path(path).resolve():
        raise Refusal("pretrained_checkpoint",
                      f"SAVE and PRETRAINED_CHECKPOINT are both {path}: the run would write its "
                      "checkpoints into the import. Give SAVE a folder of its own.")
    record = _import_record(Path(path))
    # the shape's fields decide (a record of format 3 holds them all); the name only where
    # the record has no more than a preset's fields (format 1 and 2)
    named = record.get("format", 1) < 3
    found = {**({"preset": record["preset"]} if named else {}),
             "num_layers": record["num_layers"], **record["preset_fields"]}
    launched = {"preset": ctx.preset.name, "num_layers": s["NUM_LAYERS"],
                **{key: getattr(ctx.preset, key, None) for key in record["preset_fields"]}}
    differs = [f"{key}: {found[key]} (checkpoint) vs {launched[key]} (launch)"
               for key in found if found[key] != launched[key]]
    if differs:
        sizes = {v: k for k, v in FAMILIES.get(ctx.family, ({}, None))[0].items()}
        fix = (f"MODEL_SIZE={sizes[record['preset']]} NUM_LAYERS={record['num_layers']}"
               if record["preset"] in sizes else
               f"MODEL_CONFIG={path} (its own shape) and no MODEL_SIZE" if not named else
               f"the {record['preset']} preset's family with NUM_LAYERS={record['num_layers']}")
        raise Refusal("pretrained_checkpoint",
                      f"PRETRAINED_CHECKPOINT={path} does not fit this launch: "
                      f"{'; '.join(differs)}. Launch it with {fix}.")
    if record["preset_fields"].get("num_experts") and s["TRANSFORMER_IMPL"] == "transformer_engine":
        raise Refusal("pretrained_checkpoint",
                      f"PRETRAINED_CHECKPOINT={path} is a mixture of experts, and the import "
                      "writes no fp8 state (_extra_state) for Transformer Engine's expert linears "
                      "or its separate pre-MLP norm, which Megatron's load would ask for (not "
                      "yet run with TE): use TRANSFORMER_IMPL=native, whose MoE layers load it.")
    if record.get("format", 1) < IMPORT_FORMAT_FINAL_NORM and s["TRANSFORMER_IMPL"] != "native":
        raise Refusal("pretrained_checkpoint",
                      f"PRETRAINED_CHECKPOINT={path} was imported before the import wrote the "
                      "final norm's _extra_state, which Transformer Engine's final norm asks "
                      f"for (TRANSFORMER_IMPL={s['TRANSFORMER_IMPL']}: Megatron's load would "
                      "stop on it): import it again with `python -m training.checkpoint "
                      "import`, or use TRANSFORMER_IMPL=native.")
    s.info("pretrained_checkpoint",
           f"starts from {path} ({record['preset']}, {record['num_layers']} layers, imported "
           f"from {record.get('source', '?')}): weights only, fresh optimizer, iteration 0"
           + (f"; a checkpoint in LOAD={load} is resumed instead" if load else "") + ".")


def tracker_problem(folder: Path) -> str | None:
    """What is wrong with a checkpoint folder's tracker (Megatron's
    latest_checkpointed_iteration.txt: an iteration number, or `release`): it must name a
    folder that is there (iter_0000100/, release/). None when it does."""
    try:
        text = (folder / CHECKPOINT_TRACKER).read_text(errors="replace").strip()
    except OSError as err:
        return f"{CHECKPOINT_TRACKER} cannot be read ({err.strerror or err})"
    if text == "release":
        sub = "release"
    elif text.isdigit():
        sub = f"iter_{int(text):07d}"
    else:
        return (f"{CHECKPOINT_TRACKER} says {text[:40]!r}, which is neither an iteration number "
                "nor 'release'")
    if not (folder / sub).is_dir():
        return f"{CHECKPOINT_TRACKER} names {sub}/, which is not there"
    return None


@guard
def model_config(ctx: LaunchContext) -> None:
    """MODEL_CONFIG is the shape's one source: not with MODEL_SIZE."""
    s, found = ctx.settings, ctx.model_config
    if found is None:
        return
    if s.is_explicit("MODEL_SIZE"):
        raise Refusal("model_config",
                      f"MODEL_SIZE={s['MODEL_SIZE']} and MODEL_CONFIG={s['MODEL_CONFIG']} both "
                      "give the model's shape: give one (MODEL_CONFIG takes every field from the "
                      "checkpoint).")


@guard
def checkpoint_vocabulary(ctx: LaunchContext) -> None:
    """A checkpoint's shape (MODEL_CONFIG, PRETRAINED_CHECKPOINT) with a dataset: Megatron's vocabulary is the data tokenizer's, padded; it must hold the checkpoint's rows."""
    s = ctx.settings
    if ctx.model_config is None or not isinstance(ctx.datasets, list) or not ctx.datasets:
        return
    vocab = ctx.datasets[0].vocab_size
    words = ctx.user_args
    divisor = (int(words[words.index("--make-vocab-size-divisible-by") + 1])
               if "--make-vocab-size-divisible-by" in words[:-1] else 128) * s["TP"]
    padded = -(-vocab // divisor) * divisor
    rows = ctx.preset.vocab_size
    if padded < rows:
        raise Refusal("checkpoint_vocabulary",
                      f"the data was tokenized with {ctx.datasets[0].tokenizer_model} (vocabulary "
                      f"{vocab}, {padded} rows as Megatron pads it), and the checkpoint's "
                      f"embedding has {rows} rows: the load would stop on the shapes. Tokenize "
                      "the data with the model's own tokenizer (python -m training.data.prepare ... "
                      "--tokenizer <the model's folder>), or pad with --make-vocab-size-divisible-by "
                      f"{rows} after the script name.")
    if vocab != rows:
        s.warn("checkpoint_vocabulary",
               f"the data's tokenizer ({ctx.datasets[0].tokenizer_model}) has {vocab} tokens and "
               f"the checkpoint {rows}: its token ids name other tokens than the ones the "
               "checkpoint learned (fine for a check of the plumbing, not for continued "
               "pretraining).")


def _import_record(path: Path) -> dict:
    """The record `python -m training.checkpoint import` writes beside its checkpoint (read
    here as JSON: the launcher imports no feature family)."""
    what = (f"PRETRAINED_CHECKPOINT={path} is not an imported checkpoint (no {CHECKPOINT_TRACKER} "
            f"and {IMPORT_RECORD})")
    if not (path / CHECKPOINT_TRACKER).is_file() or not (path / IMPORT_RECORD).is_file():
        raise Refusal("pretrained_checkpoint",
                      f"{what}: make one with `python -m training.checkpoint import HF_DIR OUT`; "
                      "a run's own checkpoints are resumed with LOAD.")
    problem = tracker_problem(path)
    if problem:
        raise Refusal("pretrained_checkpoint", f"PRETRAINED_CHECKPOINT={path}: {problem}: "
                                               "import the checkpoint again.")
    from training.records import ImportRecord, RecordError, read_record

    try:
        return read_record(path / IMPORT_RECORD, ImportRecord).model_dump()
    except RecordError as err:
        raise Refusal("pretrained_checkpoint", f"{err}: import the checkpoint again.") from None


@guard
def save_checkpoint(ctx: LaunchContext) -> None:
    """SAVE is a folder this user can write (created if missing)."""
    save = ctx.settings.get("SAVE")
    if not save:
        return
    from .runfolder import folder_problem, is_system_folder

    if is_system_folder(Path(save)):
        raise Refusal("save_checkpoint", f"SAVE={save} is a system folder or in one (or your "
                                         "home folder itself): checkpoints are not written "
                                         "there. Point SAVE at a folder of its own.")
    problem = folder_problem(Path(save))
    if problem:
        raise Refusal("save_checkpoint", f"SAVE={save}: {problem}, so the first checkpoint "
                                         "would fail after training has run. Point SAVE at a "
                                         "writable folder.")
    folder, load = Path(save), ctx.settings.get("LOAD")
    same_as_load = bool(load) and Path(os.path.realpath(load)) == Path(os.path.realpath(save))
    if (folder / IMPORT_RECORD).is_file():
        raise Refusal("save_checkpoint", f"SAVE={save} is an imported checkpoint: the run would "
                                         "write its own checkpoints into it. Start from it with "
                                         f"PRETRAINED_CHECKPOINT={save} and give SAVE a folder "
                                         "of its own.")
    if (folder / CHECKPOINT_TRACKER).is_file() and not same_as_load:
        raise Refusal("save_checkpoint", f"SAVE={save} holds another run's checkpoints: this run "
                                         "would save beside them and move their tracker. To "
                                         f"resume that run, set LOAD={save} too; otherwise give "
                                         "SAVE a new folder.")
    if folder.is_dir() and not same_as_load and any(
            not p.name.startswith(("iter_", "release", ".")) for p in folder.iterdir()):
        raise Refusal("save_checkpoint", f"SAVE={save} holds files that are not checkpoints: "
                                         "give SAVE an empty or new folder (or the folder of "
                                         "this run's earlier checkpoints, with LOAD set to it).")


@guard
def resilience(ctx: LaunchContext) -> None:
    """RESTARTS and PREEMPTION=requeue resume from SAVE's checkpoints: refused without SAVE;
    a HANG_TIMEOUT below a minute is a warning (a first step or a save may take longer)."""
    s = ctx.settings
    save = s.get("SAVE")
    if s["RESTARTS"] > 0 and not save:
        raise Refusal("resilience", f"RESTARTS={s['RESTARTS']} restarts a failed run from the "
                                    "last complete checkpoint in SAVE, and SAVE is not set: set "
                                    "SAVE (and SAVE_INTERVAL: a restart repeats the iterations "
                                    "since the last save), or RESTARTS=0.")
    if s["PREEMPTION"] == "requeue" and not save:
        raise Refusal("resilience", "PREEMPTION=requeue saves at a stop signal for the requeued "
                                    "job to resume, and SAVE is not set: set SAVE, or "
                                    "PREEMPTION=stop.")
    if s["RESTARTS"] > 0:
        load = s.get("LOAD")
        first = f"the first attempt loads LOAD={load}; " if load and \
            Path(os.path.realpath(load)) != Path(os.path.realpath(save)) else ""
        s.info("resilience", f"RESTARTS={s['RESTARTS']}: {first}a failed attempt restarts "
                             f"from the last complete checkpoint in SAVE={save}, after "
                             f"{s['RESTART_BACKOFF']} s (doubling); restarts.jsonl in the run "
                             "folder records each.")
    timeout = s["HANG_TIMEOUT"]
    if 0 < timeout < 60:
        s.warn("resilience", f"HANG_TIMEOUT={timeout} s: a first step (compilation), a save or an "
                             "evaluation that takes longer ends a healthy run as hung.")


@guard
def data_path(ctx: LaunchContext) -> None:
    """Every prefix exists and all were built with TOKENIZER_MODEL (or one shared tokenizer)."""
    s = ctx.settings
    path, valid = s.get("DATA_PATH"), s.get("VALID_DATA_PATH")
    if valid and not path:
        raise Refusal("data_path", "VALID_DATA_PATH needs DATA_PATH (the training set) too.")
    if not path:
        return
    if isinstance(ctx.datasets, Exception):       # resolve.prepare read the headers
        raise Refusal("data_path", str(ctx.datasets))
    from training.data.check import repeated_datasets

    repeated = repeated_datasets(path, valid)
    if repeated:
        raise Refusal("data_path", repeated + ".")
    if valid and s.is_explicit("SPLIT"):
        s.warn("data_path", "SPLIT has no effect with VALID_DATA_PATH (separate sets).")


@guard
def documents_in_a_sequence(ctx: LaunchContext) -> None:
    """A notice: how long the training data's documents are against SEQ_LENGTH, and whether document masking keeps them apart (training/data/doc_lengths.py)."""
    from training.data.doc_lengths import masking_verdict

    if not isinstance(ctx.datasets, list) or not ctx.datasets:
        return
    info = ctx.datasets[0]
    for prefix, lengths in dict(zip(info.prefixes, info.document_lengths)).items():
        if lengths is None:
            ctx.settings.info("documents_in_a_sequence",
                              f"{prefix}: its record has no document lengths (prepared before "
                              "they were recorded); `python -m training.data.check verify "
                              f"{prefix}` shows them.")
            continue
        ctx.settings.info("documents_in_a_sequence", f"{prefix}: " + masking_verdict(
            lengths, ctx.settings["SEQ_LENGTH"], documents_masked(ctx)))


def documents_masked(ctx: LaunchContext) -> bool | None:
    """Whether attention stops at each document's end in this launch: the DOCUMENT_MASK
    setting (Megatron's --reset-attention-mask spells it); None where the registry has no
    such setting (the attention runs over the whole packed sequence; the guard
    flags_the_backend_cannot_honour refuses Megatron's document flags there)."""
    if any(t.name == "DOCUMENT_MASK" for t in ctx.toggles):
        return bool(ctx.settings.get("DOCUMENT_MASK"))
    return None


@guard
def tokenizer_model(ctx: LaunchContext) -> None:
    """TOKENIZER_MODEL is a tokenizer folder, its tokenizer.json, or a hub id found in the cache or on the hub."""
    if isinstance(ctx.tokenizer, Exception) and not isinstance(ctx.datasets, Exception):
        raise Refusal("tokenizer_model", str(ctx.tokenizer))


@guard
def gpus_present(ctx: LaunchContext) -> None:
    """A real launch needs GPUs on this node; PLATFORM=<name> is for DRY_RUN only."""
    s = ctx.settings
    if s["DRY_RUN"]:
        return
    if ctx.caps.source == "detected" and ctx.caps.gpu_count == 0:
        raise Refusal("gpus_present",
                      "no GPU is visible on this node, so nothing can train here. "
                      "DRY_RUN=1 prints the resolved launch on any machine.")
    if ctx.caps.source != "detected":
        raise Refusal("gpus_present",
                      f"PLATFORM={ctx.caps.platform} describes another machine: use it with "
                      "DRY_RUN=1 to prepare a launch, and PLATFORM=auto (the default) to train.")


def visible_gpu_count(caps: Capabilities, environ: dict[str, str]) -> int:
    """GPUs this node's processes may use: CUDA/HIP_VISIBLE_DEVICES narrow the detected set."""
    for var in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"):
        value = environ.get(var)
        if value is not None and caps.source == "detected":
            return len([d for d in value.split(",") if d.strip()])
    return caps.gpu_count


# -- run folder, training loop, environment ---------------------------------------------------

def _name_problem(value) -> str | None:
    """Why a folder name or path typed for the run folder is not a visible one, or None."""
    if value is None or value == "":
        return None          # unset (an empty word or variable: the default, shown as such)
    text = str(value)
    if not text.strip():
        return "is blank"
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        return "holds a control character (a newline, a tab)"
    if text != text.strip():
        return "starts or ends with a space"
    return None


@guard
def run_folder(ctx: LaunchContext) -> None:
    """EXP_NAME and RUN_ID are single folder names; the run folder can be written and holds no run."""
    s = ctx.settings
    for knob, value in (("EXP_NAME", ctx.run_name), ("RUN_ID", s.get("RUN_ID") or "")):
        if "/" in value or value in ("", ".", "..") or "\0" in value:
            raise Refusal("run_folder", f"{knob}={value!r} must be a single folder name (no "
                                        "'/', not '.' or '..'): the run folder is "
                                        "EXPERIMENT_DIR/EXP_NAME/precision/RUN_ID.")
    for knob in ("EXP_NAME", "RUN_ID", "EXPERIMENT_DIR", "LOG_DIR"):
        problem = _name_problem(s.get(knob)) if s.is_explicit(knob) else None
        if problem:
            raise Refusal("run_folder", f"{knob}={s.get(knob)!r} {problem}: the run folder's "
                                        "path is written into logs, manifests and shell "
                                        "lines; give a visible name.")
    if s.get("LOG_DIR"):
        named = [n for n in ("EXP_NAME", "RUN_ID") if s.is_explicit(n)]
        if named:
            raise Refusal("run_folder",
                          f"LOG_DIR={s['LOG_DIR']} names the run folder whole, so "
                          f"{' and '.join(named)} would do nothing: set LOG_DIR alone, or "
                          f"{' and '.join(named)} without LOG_DIR.")
        if s.is_explicit("EXPERIMENT_DIR"):
            s.info("run_folder", f"LOG_DIR names the run folder: EXPERIMENT_DIR="
                                 f"{s['EXPERIMENT_DIR']} is not used by this launch.")
    if ctx.run_folder_problem:
        raise Refusal("run_folder",
                      f"the run folder cannot take this launch: {ctx.run_folder_problem}. Set "
                      "another RUN_ID or LOG_DIR (a launch never writes over a run), or an "
                      "EXPERIMENT_DIR you can write.")


# The variables examples/lib/launch.sh and the shell assignments of `python -m training.launch`
# define (a test keeps the list whole): a KEY=VALUE word of one of these names would replace
# them in the script (LOG_DIR= once broke the log file that way).
SCRIPT_VARIABLES = ("GPT_ARGS", "TRAIN_ARGS", "DATA_ARGS", "OUTPUT_ARGS", "EXTRA_ARGS",
                    "DISTRIBUTED_ARGS", "USER_ARGS", "PROFILER_PREFIX", "SUPERVISOR_ARGS",
                    "LOG_FILE",
                    "LAUNCH_LINE", "LAUNCH_LINE_WRAPPED", "REPO_ROOT", "PYTHON", "PATH",
                    "PYTHONPATH")


@guard
def script_variables(ctx: LaunchContext) -> None:
    """A KEY=VALUE word may not replace a variable of the launch script itself (LOG_FILE, PATH, ...)."""
    clash = [name for name in ctx.passthrough if name in SCRIPT_VARIABLES]
    if clash:
        raise Refusal("script_variables",
                      f"{', '.join(clash)} after the script name would replace the launch "
                      "script's own variable of that name. Set it in the environment before "
                      "the command if you mean the environment (e.g. PYTHON=python3 bash "
                      "train_llama3.sh), or leave it out.")


@guard
def manual_gc_interval(ctx: LaunchContext) -> None:
    """MANUAL_GC_INTERVAL is 0 (Python's automatic GC) or a positive interval."""
    interval = ctx.settings["MANUAL_GC_INTERVAL"]
    if interval < 0:
        raise Refusal("manual_gc_interval",
                      f"MANUAL_GC_INTERVAL={interval} is negative: use 0 (Python's automatic "
                      "GC) or N > 0 (collect every N iterations).")


@guard
def environment(ctx: LaunchContext) -> None:
    """FSDP=1 with CUDA_DEVICE_MAX_CONNECTIONS=1 set in your environment is refused (FSDP2 asserts)."""
    if ctx.settings["FSDP"] and ctx.environ.get("CUDA_DEVICE_MAX_CONNECTIONS") == "1":
        raise Refusal("environment",
                      "FSDP=1 but CUDA_DEVICE_MAX_CONNECTIONS=1 is set in your environment: "
                      "Megatron's torch FSDP2 path asserts it is unset or above 1. "
                      "Unset it (unset CUDA_DEVICE_MAX_CONNECTIONS) or use FSDP=0.")


__all__ = ["GUARDS", "LaunchContext", "Refusals", "run_guards", "visible_gpu_count",
           "is_loopback", "CHECKPOINT_TRACKER", "IMPORT_RECORD"]
