"""The toggle registry: the one place every knob of the launcher is defined.

Each entry names the environment variable, its type, its default, the Megatron argument
bucket it lands in and the flag(s) it emits. The toggle table (docs/toggles.md), the DRY_RUN report
and the tests are generated from or checked against this list; nothing else defines a knob.

Buckets follow the Megatron argument group that defines each flag (checked by a test against
megatron-core's own parser): model and precision flags in GPT_ARGS, the training loop in
TRAIN_ARGS, data and tokenizer in DATA_ARGS, logging/checkpointing/profiling in OUTPUT_ARGS,
data-parallel communication in EXTRA_ARGS. DISTRIBUTED_ARGS are torchrun's, LAUNCHER entries
steer the launcher itself and emit no flag.
"""
from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

GPT_ARGS, TRAIN_ARGS, DATA_ARGS, OUTPUT_ARGS, EXTRA_ARGS = (
    "GPT_ARGS", "TRAIN_ARGS", "DATA_ARGS", "OUTPUT_ARGS", "EXTRA_ARGS")
DISTRIBUTED_ARGS, LAUNCHER = "DISTRIBUTED_ARGS", "LAUNCHER"
MEGATRON_BUCKETS = (GPT_ARGS, TRAIN_ARGS, DATA_ARGS, OUTPUT_ARGS, EXTRA_ARGS)

# Megatron argument-group title -> bucket. Our own groups (training/arguments.py) are listed
# too. A flag whose group is not here cannot be routed: the registry test fails.
GROUP_TO_BUCKET = {
    "transformer configuration": GPT_ARGS,
    "network size": GPT_ARGS,
    "mixed precision": GPT_ARGS,
    "Transformer-Engine": GPT_ARGS,
    "launcher: model": GPT_ARGS,
    "training": TRAIN_ARGS,
    "launcher: training": TRAIN_ARGS,
    "learning rate and weight decay": TRAIN_ARGS,
    "regularization": TRAIN_ARGS,
    "RNG and initialization": TRAIN_ARGS,
    "data and dataloader": DATA_ARGS,
    "tokenizer": DATA_ARGS,
    "validation": DATA_ARGS,
    "logging": OUTPUT_ARGS,
    "checkpointing": OUTPUT_ARGS,
    "profiling": OUTPUT_ARGS,
    "launcher: run": OUTPUT_ARGS,
    "distributed init": EXTRA_ARGS,
    "experimental": TRAIN_ARGS,     # 0.19.2 defines the precision-aware optimizer's flags here
    "moe": GPT_ARGS,
}


class Flags(NamedTuple):
    """Words an entry's `emit` adds to a bucket; `toggle` names the entry they are shown under
    when it is not the emitting one (DATA_PATH's emit builds SPLIT's --split)."""
    bucket: str
    words: list[str]
    toggle: str | None = None


# emit(toggle, ctx) -> the flags built from the launch context (training.launch.guards.
# LaunchContext: settings, caps, preset, recipe): flags that are more than `--flag VALUE`.
Emit = Callable[["Toggle", Any], list[Flags]]


@dataclass(frozen=True)
class Range:
    """The numbers a knob accepts (every float must also be finite): `low`/`high` bound it,
    inclusive unless `low_open`/`high_open`. Checked when the value is read, exit 2 before
    torchrun; the toggle table's values column shows `text`."""
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def problem(self, value: Any) -> str | None:
        if isinstance(value, float) and not math.isfinite(value):
            return "is not a finite number"
        below = self.low is not None and (value <= self.low if self.low_open else value < self.low)
        above = self.high is not None and (value >= self.high if self.high_open
                                           else value > self.high)
        return "is out of range" if below or above else None

    @property
    def text(self) -> str:
        low, high = _num(self.low), _num(self.high)
        if self.low is not None and self.high is not None:
            return (f"in {'(' if self.low_open else '['}{low}, {high}{')' if self.high_open else ']'}"
                    if self.low_open or self.high_open else f"from {low} to {high}")
        if self.low is not None:
            return f"{'>' if self.low_open else '>='} {low}"
        return f"{'<' if self.high_open else '<='} {high}" if self.high is not None else ""


def _num(value: float | None) -> str:
    if value is None:
        return ""
    return f"{int(value):,}" if float(value).is_integer() else f"{value:g}"


@dataclass(frozen=True)
class Alias:
    """Another spelling of a toggle: the ROCm fork's (ROCm/Megatron-LM examples/llama;
    training/launch/fork_vars.py lists them all). Read like the toggle itself, shown in the
    table under the toggle's name with the alias in its reason; `values` translates the
    alias's values to the toggle's (empty: the same values)."""
    name: str
    values: tuple[tuple[str, str], ...] = ()

    def translate(self, toggle: "Toggle", raw: str) -> str:
        if not self.values:
            return raw
        table = dict(self.values)
        if raw.strip() not in table:
            from .settings import BadInput

            raise BadInput(f"{self.name}={raw!r} is not accepted: use one of "
                           f"{', '.join(table)} (the ROCm fork's spelling of {toggle.name}: "
                           + ", ".join(f"{k} -> {toggle.name}={v}" for k, v in table.items())
                           + ").")
        return table[raw.strip()]


@dataclass(frozen=True)
class Form:
    """A text knob's accepted form: `problem(value)` says what is wrong, or None."""
    text: str
    problem: Callable[[str], str | None]


def host_problem(value: str) -> str | None:
    """Why VALUE is not a bare host name or address (what torchrun's --master-addr takes)."""
    import ipaddress

    if not value.strip():
        return "empty: give a host name or address"
    if any(c.isspace() for c in value):
        return "a host name or address is one word, without spaces"
    if "://" in value or "@" in value or "/" in value:
        return ("a host name or address only, without a scheme, user or path "
                "(e.g. node0 or 10.0.0.1)")
    if ":" in value:
        try:
            ipaddress.IPv6Address(value.strip("[]"))
        except ValueError:
            return "a host name or address without a port: give the port as MASTER_PORT"
    return None


def _split_form(value: str) -> str | None:
    from training.data.check import DataPathError, parse_split

    try:
        parse_split(value)
    except DataPathError as err:
        return str(err).split(": ", 1)[-1]
    return None


HOST = Form("a host name or address", host_problem)
SPLIT_FORM = Form("train,valid,test proportions", _split_form)
POSITIVE = Range(0, low_open=True)          # > 0
AT_LEAST_0 = Range(0)
AT_LEAST_1 = Range(1)
PARALLEL_SIZE = Range(1, 1024)
FRACTION = Range(0, 1, high_open=True)      # [0, 1)
FINITE = Range()                            # any finite number: a float toggle without a check


@dataclass(frozen=True)
class Toggle:
    """One knob. How its flags are built, in the order resolve.build_buckets adds them:
      value flags   `flag` (--flag VALUE) or `on`/`off` (bool), in registry order; `when`
                    (a test of the settings) can leave them out;
      built flags   `emit`, in registry order after every value flag: flags that need the
                    model, the recipe, the backend or other toggles;
      `emitted_by`  names the entry whose emit builds this one's flags (NUM_LAYERS: MODEL_SIZE).
    """
    name: str
    kind: str                      # bool | int | float | str | choice | path
    default: Any
    bucket: str
    help: str
    flag: str | None = None        # value flag: `--flag VALUE` (int/float/str/choice/path)
    on: tuple[str, ...] = ()       # bool: flags emitted when 1
    off: tuple[str, ...] = ()      # bool: flags emitted when 0
    choices: tuple[str, ...] = ()
    group: str = "training"        # section in the README table
    perf: bool = False             # a default-on performance toggle
    emitted_by: str | None = None  # the entry (or step) that builds this one's flags
    aliases: tuple[Alias, ...] = field(default=())   # other names of this knob (the fork's)
    spellings: tuple[tuple[str, str], ...] = ()      # other values meaning one of ours: 8 -> 8B
    when: Callable[[Any], bool] | None = None   # settings -> whether the value flag applies
    emit: Emit | None = None                    # built flags (see the class docstring)
    levers: bool = False           # docs/levers.md has rows that measure it (a test checks)
    check: Range | Form | None = None           # accepted numbers or text (parse_value)
    owns: tuple[str, ...] = ()     # other flags its emit builds (refused after the script name)
    multi: bool = False            # its flag takes several words (refused after the script)

    @property
    def description(self) -> str:
        """What the knob does, and where its measured effect is (never the figures: they
        live in docs/levers.json, regenerated from the benchmarks)."""
        if not self.levers:
            return self.help
        return f"{self.help} Measured: docs/levers.md, `{self.name}` rows."

    @property
    def built(self) -> bool:
        """Its flags come from an emit (its own or another entry's), not from its value."""
        return self.emit is not None or self.emitted_by is not None

    def flags_for(self, value: Any) -> list[str]:
        """The Megatron/torchrun words this toggle emits for a value (value flags only)."""
        if self.built or value is None:
            return []
        if self.kind == "bool":
            return list(self.on if value else self.off)
        if self.flag is None:
            return []
        return [self.flag, str(value)]

    @property
    def megatron_flags(self) -> tuple[str, ...]:
        """Every Megatron flag this entry can emit (for the bucket-routing test)."""
        flags = set(self.on) | set(self.off)
        if self.flag:
            flags.add(self.flag)
        return tuple(sorted(flags))


def _bool(name, default, bucket, help, on=(), off=(), **kw) -> Toggle:
    return Toggle(name, "bool", default, bucket, help, on=tuple(on), off=tuple(off), **kw)


def _perf(name, bucket, help, on=(), off=()) -> Toggle:
    return _bool(name, True, bucket, help, on=on, off=off, group="performance", perf=True,
                 levers=True)


# -- built flags: each entry's emit (registry order below is the order they are added) ---------

def _value_flag(toggle: Toggle, ctx) -> list[Flags]:
    """--flag VALUE, added with the built flags (after the model's)."""
    return [Flags(toggle.bucket, [toggle.flag, str(ctx.settings[toggle.name])])]


def _model_flags(toggle: Toggle, ctx) -> list[Flags]:
    """the preset's architecture at NUM_LAYERS and SEQ_LENGTH"""
    s = ctx.settings
    words = ctx.preset.gpt_args(s["NUM_LAYERS"], s["SEQ_LENGTH"])
    given = set(ctx.user_args) & set(MODEL_DEFAULT_FLAGS)   # the user's value goes once
    for flag in given:
        i = words.index(flag)
        del words[i:i + 2]
    return [Flags(GPT_ARGS, words)]


def _precision_flags(toggle: Toggle, ctx) -> list[Flags]:
    """the precision recipe's flags (training/launch/recipes.py)"""
    from .recipes import recipe_args

    return [Flags(GPT_ARGS, recipe_args(ctx.recipe, ctx.settings))]


def _backend_flags(toggle: Toggle, ctx) -> list[Flags]:
    """the layer spec, and Megatron's fusions the backend has no kernel for"""
    backend = ctx.settings["TRANSFORMER_IMPL"]
    gpt, train = backend_flags(backend, ctx.caps.masked_softmax_kernel)
    return [Flags(GPT_ARGS, gpt + ["--transformer-backend", backend])] + \
        ([Flags(TRAIN_ARGS, train)] if train else [])


def _native_kernels_flags(toggle: Toggle, ctx) -> list[Flags]:
    """`--native-kernels VALUE` with the native backend, and with Transformer Engine's (there
    it picks the fused linear cross-entropy: fused_linear_ce)"""
    if ctx.settings["TRANSFORMER_IMPL"] not in ("native", "transformer_engine"):
        return []
    return _value_flag(toggle, ctx)


def _fp8_param_gather_flags(toggle: Toggle, ctx) -> list[Flags]:
    """fp8 recipes: `--fp8-param-gather` (mxfp8 without FSDP also reuses the grad buffer for
    the all-gather, as TE cannot swap an MXFP8 tensor's storage)"""
    if not ctx.settings[toggle.name] or ctx.recipe.kind != "fp8":
        return []
    words = ["--fp8-param-gather"]
    if ctx.recipe.name == "mxfp8" and not ctx.settings["FSDP"]:
        words.append("--reuse-grad-buf-for-mxfp8-param-ag")
    return [Flags(toggle.bucket, words)]


def _wandb_flags(toggle: Toggle, ctx) -> list[Flags]:
    """`--wandb-project P --wandb-exp-name <run name> --wandb-save-dir <run>/wandb`"""
    project = ctx.settings.get(toggle.name)
    if not project:
        return []
    return [Flags(toggle.bucket, ["--wandb-project", project, "--wandb-exp-name", ctx.run_name,
                                  "--wandb-save-dir", str(ctx.log_dir / "wandb")])]


def _by_value(table: dict[Any, tuple[str, ...]]) -> Emit:
    """The words each value emits (a value not in the table emits nothing)."""
    def emit(toggle: Toggle, ctx) -> list[Flags]:
        words = table.get(ctx.settings[toggle.name])
        return [Flags(toggle.bucket, list(words))] if words else []
    emit.__doc__ = "; ".join(f"{value}: `{' '.join(words)}`" for value, words in table.items())
    return emit


def _manual_gc_flags(toggle: Toggle, ctx) -> list[Flags]:
    """N > 0: `--manual-gc --manual-gc-interval N`"""
    interval = ctx.settings[toggle.name]
    return [Flags(toggle.bucket, ["--manual-gc", "--manual-gc-interval", str(interval)])] \
        if interval > 0 else []


def _nan_check_flags(toggle: Toggle, ctx) -> list[Flags]:
    """`--nan-check VALUE`; step also turns Megatron's per-bucket check off"""
    value = ctx.settings[toggle.name]
    return [Flags(toggle.bucket, ["--nan-check", value, *nan_check_flags(value)])]


def _data_flags(toggle: Toggle, ctx) -> list[Flags]:
    """the dataset (split by SPLIT, or separate train and validation sets), or mock data"""
    from training.data.check import parse_data_path

    def blend(value: str) -> list[str]:
        words = []
        for weight, prefix in parse_data_path(value):
            words += ([repr(weight)] if weight is not None else []) + [prefix]
        return words

    s = ctx.settings
    train, valid = s.get("DATA_PATH"), s.get("VALID_DATA_PATH")
    if train and valid:
        return [Flags(DATA_ARGS, ["--train-data-path", *blend(train)]),
                Flags(DATA_ARGS, ["--valid-data-path", *blend(valid)], "VALID_DATA_PATH")]
    if train:
        return [Flags(DATA_ARGS, ["--data-path", *blend(train)]),
                Flags(DATA_ARGS, ["--split", s["SPLIT"]], "SPLIT")]
    return [Flags(DATA_ARGS, ["--mock-data"])]


def _tokenizer_flags(toggle: Toggle, ctx) -> list[Flags]:
    """the dataset's tokenizer, or none (mock data: the preset's vocabulary)"""
    if ctx.tokenizer:      # resolve.prepare resolved TOKENIZER_MODEL (a hub id to its folder)
        return [Flags(DATA_ARGS, list(ctx.tokenizer))]
    return [Flags(DATA_ARGS, ["--tokenizer-type", "NullTokenizer",
                              "--vocab-size", str(ctx.preset.vocab_size)])]


def _profile_flags(toggle: Toggle, ctx) -> list[Flags]:
    """Megatron's profiling window (torch: the torch profiler on PROFILE_RANKS)"""
    s = ctx.settings
    if s["PROFILE"] == "none":
        return []
    words = ["--profile", "--profile-step-start", str(s["PROFILE_STEP_START"]),
             "--profile-step-end", str(s["PROFILE_STEP_END"])]
    if s["PROFILE"] == "torch":
        words += ["--use-pytorch-profiler", "--profile-ranks",
                  *s["PROFILE_RANKS"].replace(",", " ").split()]
    return [Flags(OUTPUT_ARGS, words)]


def _optimizer_state_flags(toggle: Toggle, ctx) -> list[Flags]:
    """not fp32/0: Megatron's precision-aware optimizer with the state dtypes, the master
    weights' storage (`--master-weights`), the CPU offload (training/launch/optimizer_state.py)"""
    from .optimizer_state import optimizer_state_words

    return [Flags(TRAIN_ARGS, words, name)
            for name, words in optimizer_state_words(ctx.settings).items()]


_RECOMPUTE_WORDS = {"selective": ("--recompute-granularity", "selective"),
                    "full": ("--recompute-granularity", "full", "--recompute-method", "uniform",
                             "--recompute-num-layers", "1")}

# The model preset's architecture flags (presets.ModelPreset.gpt_args; --num-layers is
# NUM_LAYERS's own): built from MODEL_SIZE, never taken from the words after the script.
MODEL_FLAGS = ("--hidden-size", "--ffn-hidden-size", "--num-attention-heads",
               "--max-position-embeddings", "--position-embedding-type", "--rotary-base",
               "--normalization", "--norm-epsilon", "--swiglu",
               "--untie-embeddings-and-output-weights", "--disable-bias-linear",
               "--group-query-attention", "--num-query-groups", "--use-rope-scaling",
               "--rope-scaling-factor", "--kv-channels", "--qk-layernorm", "--add-qkv-bias",
               # an MoE preset's experts (ModelPreset.gpt_args)
               "--num-experts", "--moe-router-topk", "--moe-ffn-hidden-size",
               "--moe-shared-expert-intermediate-size",
               # gpt-oss's (training/moe/gpt_oss.py, GptOssPreset.gpt_args): its activation,
               # YaRN positions, sliding window and attention sinks
               "--quick-geglu", "--glu-linear-offset", "--activation-func-clamp-value",
               "--rotary-scaling-factor", "--yarn-original-max-position-embeddings",
               "--yarn-beta-fast", "--yarn-beta-slow", "--yarn-correction-range-round-to-int",
               "--no-yarn-correction-range-round-to-int", "--window-size",
               "--window-attn-skip-freq", "--softmax-type")
# The preset's training defaults among them, not its shape: a flag after the script name
# replaces the preset's word (Megatron gets it once; the table shows it as an extra flag).
MODEL_DEFAULT_FLAGS = ("--attention-dropout", "--hidden-dropout", "--init-method-std")

# Words every launch carries, after the toggles' flags of their bucket.
CLOSING_WORDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (DATA_ARGS, ("--no-create-attention-mask-in-dataloader",)),
    (TRAIN_ARGS, ("--exit-signal-handler",)),
    (EXTRA_ARGS, ("--distributed-backend", "nccl")),
)


REGISTRY: tuple[Toggle, ...] = (
    # -- default-on performance toggles (=0 disables) ---------------------------------------
    _perf("GRADIENT_ACCUMULATION_FUSION", TRAIN_ARGS,
          "Weight-gradient GEMM accumulates straight into the fp32/bf16 main_grad buffer "
          "(TE, apex's fused wgrad, or the native backend's cuBLAS beta=1 GEMM; the native "
          "grouped experts: a Triton kernel).",
          off=("--no-gradient-accumulation-fusion",)),
    _perf("GRAD_REDUCE_IN_BF16", GPT_ARGS,
          "Gradient buffer and data-parallel reduce in bf16 instead of fp32: half the gradient "
          "memory and reduce traffic (its convergence check: docs/convergence.md; set 0 if a "
          "run is sensitive to it).",
          on=("--grad-reduce-in-bf16",)),
    _perf("DDP_AVERAGE_IN_COLLECTIVE", EXTRA_ARGS,
          "Average gradients inside the reduce collective instead of pre-scaling.",
          on=("--ddp-average-in-collective",)),
    _perf("CROSS_ENTROPY_LOSS_FUSION", GPT_ARGS,
          "Fused cross-entropy: at TP=1 the fused linear cross-entropy that never materialises "
          "the logits (native backend; Transformer Engine's with Liger's kernel), elsewhere "
          "Megatron's fused vocab-parallel cross-entropy.",
          on=("--cross-entropy-loss-fusion",)),
    _perf("FUSED_SINGLE_QKV_ROPE", GPT_ARGS,
          "RoPE applied to the packed QKV projection in one kernel, no split/concat.",
          on=("--fused-single-qkv-rope",), off=("--no-fused-single-qkv-rope",)),
    Toggle("CROSS_ENTROPY_FUSION_IMPL", "choice", "native", GPT_ARGS,
           "Implementation of the fused cross-entropy; 'te' fails megatron-core 0.19.2's "
           "validate_args ('disabled due to stability issues').",
           flag="--cross-entropy-fusion-impl", choices=("native", "te"), group="performance",
           when=lambda s: bool(s["CROSS_ENTROPY_LOSS_FUSION"])),
    Toggle("CE_CHUNK_MEM", "int", 8, GPT_ARGS,
           "Chunking of Liger's fused linear cross-entropy (native or Transformer Engine "
           "backend, TP=1): "
           "each chunk's transient logits stay under N x tokens x hidden (Liger's "
           "chunk_mem_const). A larger N makes fewer, larger chunks: fewer passes over the "
           "bf16 output-weight gradient, each chunk adding its product into it, for more "
           "transient memory; 1 is Liger's default. Inert outside Liger's path at TP=1.",
           flag="--ce-chunk-mem", group="performance", levers=True),

    # -- model and precision -----------------------------------------------------------------
    Toggle("MODEL_SIZE", "str", None, GPT_ARGS,
           "Model preset (llama3: 8B, 70B, 3.1-8B, tiny; llama2: 7B, 13B, 70B, tiny; the "
           "ROCm fork's 8, 70, 7, 13 mean the same).",
           group="model", emit=_model_flags, owns=MODEL_FLAGS,
           spellings=(("8", "8B"), ("70", "70B"), ("7", "7B"), ("13", "13B"))),
    Toggle("MODEL_CONFIG", "path", None, GPT_ARGS,
           "The model's shape from a checkpoint instead of a preset: a Hugging Face folder, its "
           "config.json, or an import of `python -m training.checkpoint import` (Llama, "
           "Mistral, Qwen2/2.5, Qwen3, Qwen3-MoE, Mixtral; gpt-oss through "
           "examples/moe/train_gpt_oss.sh). Every architecture field comes from "
           "it (source checkpoint); unset with PRETRAINED_CHECKPOINT and no MODEL_SIZE: that "
           "import's shape.", group="model", emitted_by="MODEL_SIZE"),
    Toggle("NUM_LAYERS", "int", None, GPT_ARGS, "Override the preset's layer count.",
           flag="--num-layers", group="model", emitted_by="MODEL_SIZE", check=Range(1, 1024)),
    Toggle("SEQ_LENGTH", "int", None, DATA_ARGS, "Sequence length (preset default).",
           flag="--seq-length", group="model", emit=_value_flag, levers=True,
           check=Range(1, 2 ** 20)),
    Toggle("PRECISION", "choice", "bf16", GPT_ARGS,
           "Precision recipe; the run folder is tagged by it.",
           choices=("bf16", "fp8", "fp8_tensorwise", "fp8_blockwise", "mxfp8", "mxfp4", "nvfp4"),
           group="precision", emit=_precision_flags, levers=True,
           owns=("--bf16", "--fp8-recipe", "--fp8-amax-history-len", "--fp8-amax-compute-algo",
                 "--fp4-format", "--fp4-recipe")),
    _bool("TE_FP8", None, LAUNCHER, "ROCm Megatron-LM spelling: 1 = an fp8 recipe "
          "(TE_FP8_RECIPE picks which). Conflicts with PRECISION are refused.", group="precision"),
    Toggle("TE_FP8_RECIPE", "choice", None, LAUNCHER,
           "With TE_FP8=1: delayed -> fp8, tensorwise -> fp8_tensorwise, blockwise -> "
           "fp8_blockwise, mxfp8 -> mxfp8.",
           choices=("delayed", "tensorwise", "blockwise", "mxfp8"), group="precision"),
    _bool("TE_FP4", None, LAUNCHER, "ROCm Megatron-LM spelling: 1 = an fp4 recipe "
          "(TE_FP4_RECIPE picks which).", group="precision"),
    Toggle("TE_FP4_RECIPE", "choice", None, LAUNCHER,
           "With TE_FP4=1: mxfp4 or nvfp4.", choices=("mxfp4", "nvfp4"), group="precision"),
    Toggle("FP8_FORMAT", "choice", None, GPT_ARGS,
           "fp8 format (recipe default: hybrid for fp8/fp8_tensorwise, e4m3 for fp8_blockwise "
           "and mxfp8).",
           flag="--fp8-format", choices=("hybrid", "e4m3"), group="precision",
           emitted_by="PRECISION"),
    _bool("FP4_SELECTIVE_BF16", None, GPT_ARGS,
          "Keep the first/last layers in bf16 under fp4 (recipe default: mxfp4 0 = every layer "
          "fp4, the MLPerf recipe; nvfp4 1, the paper recipe).",
          on=("--first-last-layers-bf16",), group="precision", emitted_by="PRECISION"),
    Toggle("FP4_BF16_LAYERS_START", "int", 1, GPT_ARGS,
           "Layers at the start kept in bf16 when FP4_SELECTIVE_BF16=1.",
           flag="--num-layers-at-start-in-bf16", group="precision", emitted_by="PRECISION",
           check=AT_LEAST_0, aliases=(Alias("FP4_BF16_START"),)),
    Toggle("FP4_BF16_LAYERS_END", "int", 1, GPT_ARGS,
           "Layers at the end kept in bf16 when FP4_SELECTIVE_BF16=1.",
           flag="--num-layers-at-end-in-bf16", group="precision", emitted_by="PRECISION",
           check=AT_LEAST_0, aliases=(Alias("FP4_BF16_END"),)),
    _bool("FP8_PARAM_GATHER", False, GPT_ARGS,
          "fp8 recipes: the optimizer keeps the fp8 weights and all-gathers them in fp8 (needs "
          "DISTRIBUTED_OPTIMIZER=1; not under FSDP).", on=("--fp8-param-gather",),
          group="precision", emit=_fp8_param_gather_flags,
          owns=("--reuse-grad-buf-for-mxfp8-param-ag",)),
    _bool("FP4_PARAM_GATHER", False, GPT_ARGS,
          "fp4 recipes: the weights are all-gathered in fp4.", on=("--fp4-param-gather",),
          group="precision", when=lambda s: s["PRECISION"] in ("mxfp4", "nvfp4")),
    Toggle("TRANSFORMER_IMPL", "choice", "auto", GPT_ARGS,
           "Layer backend: transformer_engine (TE spec), native (SDPA + Liger/torch kernels), "
           "local (Megatron's local spec); auto picks TE where it imports, else native.",
           flag="--transformer-backend",
           choices=("auto", "transformer_engine", "native", "local"), group="backend",
           emit=_backend_flags, levers=True,
           owns=("--transformer-impl", "--no-persist-layer-norm", "--no-masked-softmax-fusion")),
    Toggle("NATIVE_KERNELS", "choice", "auto", GPT_ARGS,
           "Native backend kernels: liger (Triton) or torch; auto = liger where installed. "
           "With Transformer Engine, liger puts Liger's fused linear cross-entropy on the "
           "output layer at TP=1 (torch: Megatron's fused cross-entropy).",
           flag="--native-kernels", choices=("auto", "liger", "torch"), group="backend",
           emit=_native_kernels_flags, levers=True),
    Toggle("ATTENTION_BACKEND", "choice", "auto", GPT_ARGS,
           "Transformer Engine's attention kernels: auto (TE picks), flash, fused, unfused; the "
           "native backend's attention is torch SDPA, which picks its own.",
           flag="--attention-backend", choices=("auto", "flash", "fused", "unfused"),
           group="backend", when=lambda s: s["ATTENTION_BACKEND"] != "auto",
           aliases=(Alias("USE_FLASH_ATTN", (("1", "flash"), ("0", "fused"))),)),
    _bool("ROPE_FUSION", None, TRAIN_ARGS,
          "Megatron's fused RoPE (Transformer Engine's kernel): on with TE, off elsewhere (the "
          "native backend fuses RoPE with FUSED_SINGLE_QKV_ROPE).",
          off=("--no-rope-fusion",), group="backend",
          when=lambda s: s["TRANSFORMER_IMPL"] == "transformer_engine"),
    _bool("BIAS_DROPOUT_FUSION", None, TRAIN_ARGS,
          "Megatron's fused bias-dropout-add (a torch.compile'd function) at each residual add; "
          "default on with Transformer Engine and the local spec, off on the native backend: "
          "with bias-free linears and no hidden dropout it wraps one add, whose compiled "
          "wrapper and guards cost the host ~200 us per call, twice per layer and micro-batch "
          "(session 8's MoE profile); unfused it is that add.",
          off=("--no-bias-dropout-fusion",), group="backend", levers=True),
    _bool("GEMM_TUNING", False, LAUNCHER,
          "Transformer Engine's hipBLASLt GEMM tuning on AMD GPUs (sets TE_HIPBLASLT_TUNING_* "
          "as the ROCm fork does); off by default here, no effect elsewhere.", group="backend"),
    Toggle("RECOMPUTE", "choice", "none", GPT_ARGS,
           "Activation recompute: none, selective (attention core), full (every layer); the "
           "ROCm fork's 0 and 1 mean none and full.",
           choices=("none", "selective", "full"), group="model",
           emit=_by_value(_RECOMPUTE_WORDS), levers=True,
           owns=("--recompute-granularity", "--recompute-method", "--recompute-num-layers"),
           spellings=(("0", "none"), ("1", "full"))),
    Toggle("MANUAL_GC_INTERVAL", "int", 0, TRAIN_ARGS,
           "0: Python's automatic garbage collector. N > 0: Megatron's manual GC (automatic "
           "collection off, one gc.collect() every N iterations, between steps): no collection "
           "pause inside a step, the same moment on every rank.",
           group="training", emit=_manual_gc_flags, levers=True,
           owns=("--manual-gc", "--manual-gc-interval")),
    Toggle("NAN_CHECK", "choice", "step", TRAIN_ARGS,
           "Where a NaN/Inf gradient stops the run: step (the global gradient norm and loss, "
           "once per iteration, before a checkpoint can save them) or bucket (Megatron's check "
           "of each gradient bucket before its reduce: names the bucket, costs a host-GPU "
           "sync per bucket in every backward).",
           choices=("step", "bucket"), group="training", emit=_nan_check_flags,
           levers=True, owns=("--nan-check", "--no-check-for-nan-in-loss-and-grad")),
    Toggle("CUDA_GRAPH", "choice", "none", GPT_ARGS,
           "CUDA graphs of the training step: none, or full_iteration (Megatron's: the forward "
           "and backward of every micro-batch captured as one graph after CUDA_GRAPH_WARMUP "
           "eager iterations, then replayed, so the host issues one launch instead of every "
           "kernel; the batches are copied into static buffers). It needs a step with no host "
           "synchronisation inside it: the guard cuda_graph refuses what reads the GPU from the "
           "host (NAN_CHECK=bucket, an MoE dispatcher with host counts). Off by default, but "
           "the lean MoE step's default on the native backend in bf16, where it measured "
           "faster (docs/levers.md, docs/moe.md); the advisor proposes it where a step "
           "qualifies.",
           flag="--cuda-graph-impl", choices=("none", "full_iteration"), group="training",
           when=lambda s: s["CUDA_GRAPH"] != "none", levers=True),
    Toggle("CUDA_GRAPH_WARMUP", "int", 3, GPT_ARGS,
           "With CUDA_GRAPH: eager iterations before the capture (Megatron's "
           "--cuda-graph-warmup-steps, default 3). The capture's iteration and those before it "
           "are kept out of the measured steps (METRICS_WARMUP_ITERS).",
           flag="--cuda-graph-warmup-steps", group="training",
           when=lambda s: s["CUDA_GRAPH"] != "none"),
    _bool("DETERMINISTIC", False, GPT_ARGS, "Megatron's deterministic mode (slower).",
          on=("--deterministic-mode",), group="model"),

    # -- parallelism --------------------------------------------------------------------------
    Toggle("TP", "int", 1, GPT_ARGS, "Tensor-parallel size.",
           flag="--tensor-model-parallel-size", group="parallel", check=PARALLEL_SIZE),
    Toggle("PP", "int", 1, GPT_ARGS, "Pipeline-parallel size.",
           flag="--pipeline-model-parallel-size", group="parallel", check=PARALLEL_SIZE),
    Toggle("CP", "int", 1, GPT_ARGS, "Context-parallel size.",
           flag="--context-parallel-size", group="parallel", check=PARALLEL_SIZE),
    _bool("SEQUENCE_PARALLEL", None, GPT_ARGS, "Sequence parallel (default: on when TP>1).",
          on=("--sequence-parallel",), group="parallel", aliases=(Alias("SEQ_PARALLEL"),)),
    _bool("FSDP", False, EXTRA_ARGS, "Torch FSDP2 instead of DDP + distributed optimizer.",
          on=("--use-torch-fsdp2",), group="parallel"),
    _bool("DISTRIBUTED_OPTIMIZER", True, EXTRA_ARGS,
          "Shard optimizer state over data-parallel ranks.",
          on=("--use-distributed-optimizer",), group="parallel", levers=True),
    _bool("OVERLAP_GRAD_REDUCE", True, EXTRA_ARGS,
          "Overlap the gradient reduce with the backward pass.",
          on=("--overlap-grad-reduce",), group="parallel", levers=True),
    _bool("OVERLAP_PARAM_GATHER", True, EXTRA_ARGS,
          "Overlap the parameter all-gather with the forward pass (distributed optimizer).",
          on=("--overlap-param-gather",), group="parallel", levers=True),

    # -- optimizer state (training/native/adamw.py; Megatron's precision-aware optimizer) --------
    Toggle("ADAM_MOMENTS_DTYPE", "choice", "fp32", TRAIN_ARGS,
           "dtype of Adam's two moments: bf16 halves them (8 -> 4 B per parameter, sharded like "
           "the optimizer). Not fp32: Megatron's precision-aware optimizer "
           "(--use-precision-aware-optimizer), which also hands the optimizer the gradient "
           "buffer itself (no fp32 gradient copy at the step): Transformer Engine's FusedAdam "
           "under TE, the native backend's MixedPrecisionAdamW otherwise.",
           choices=("fp32", "bf16"), group="optimizer", emit=_optimizer_state_flags,
           levers=True, owns=("--use-precision-aware-optimizer", "--exp-avg-dtype",
                              "--exp-avg-sq-dtype", "--main-grads-dtype")),
    Toggle("MASTER_WEIGHTS", "choice", "fp32", TRAIN_ARGS,
           "How the fp32 master weights are kept. fp32: a copy (4 B per parameter); "
           "remainder: the low 16 bits beside the bf16 weights (2 B, exact: TE's "
           "store_param_remainders); stochastic: none (0 B), the bf16 weights are the master, "
           "each update rounded stochastically (native backend without TE only). Not fp32: "
           "the precision-aware optimizer, as ADAM_MOMENTS_DTYPE.",
           choices=("fp32", "remainder", "stochastic"), group="optimizer",
           emitted_by="ADAM_MOMENTS_DTYPE", levers=True,
           owns=("--main-params-dtype", "--master-weights")),
    Toggle("ADAM_IMPL", "choice", "auto", TRAIN_ARGS,
           "Which AdamW runs the precision-aware optimizer (ADAM_MOMENTS_DTYPE or "
           "MASTER_WEIGHTS not fp32: the MoE lean step's default). auto: Transformer Engine's "
           "FusedAdam where TE imports, the native MixedPrecisionAdamW otherwise; native: "
           "MixedPrecisionAdamW in place of TE's FusedAdam too (bf16 only; the recorded traces "
           "put TE's step at over twice ours at the Qwen3 MoE shape, docs/moe.md: measured by "
           "the bench part moe-te-adam before it becomes the default). Megatron's default optimizer "
           "(fp32 moments and masters) is TE's FusedAdam either way.",
           flag="--adam-impl", choices=("auto", "native"), group="optimizer", levers=True),
    _bool("OPTIMIZER_CPU_OFFLOAD", False, TRAIN_ARGS,
          "Megatron's HybridDeviceOptimizer: the optimizer state and step of "
          "OPTIMIZER_OFFLOAD_FRACTION of the parameters on the CPU (fp32 master and moments in "
          "pinned host memory, gradients and weights copied each step); frees that share of "
          "the GPU's optimizer memory for host-device copies and a CPU AdamW.",
          group="optimizer", emitted_by="ADAM_MOMENTS_DTYPE", levers=True,
          owns=("--optimizer-cpu-offload", "--overlap-cpu-optimizer-d2h-h2d")),
    Toggle("OPTIMIZER_OFFLOAD_FRACTION", "float", 1.0, TRAIN_ARGS,
           "Share of the parameters whose optimizer state OPTIMIZER_CPU_OFFLOAD=1 moves to the "
           "CPU (0 < f <= 1).",
           flag="--optimizer-offload-fraction", group="optimizer",
           emitted_by="ADAM_MOMENTS_DTYPE", check=Range(0, 1, low_open=True)),

    # -- training loop ------------------------------------------------------------------------
    Toggle("MBS", "int", 1, TRAIN_ARGS, "Micro-batch size per GPU. Unset, the example "
           "scripts' pre-flight may choose a larger one that docs/levers.json measured faster "
           "for this GPU, backend and model and that fits (source preflight; "
           "docs/optimize.md).",
           flag="--micro-batch-size", levers=True, check=Range(1, 4096)),
    Toggle("BS", "int", 128, TRAIN_ARGS, "Global batch size (sequences per optimizer step).",
           flag="--global-batch-size", check=Range(1, 2 ** 24)),
    Toggle("TOTAL_ITERS", "int", 20, TRAIN_ARGS, "Training iterations.", flag="--train-iters",
           check=Range(1, 10 ** 9)),
    Toggle("LR", "float", 3e-4, TRAIN_ARGS, "Peak learning rate.", flag="--lr", check=POSITIVE),
    # MIN_LR=0 (Megatron's own default: decay to zero) is a schedule, not a mistake
    Toggle("MIN_LR", "float", 3e-5, TRAIN_ARGS, "Final learning rate of the decay.",
           flag="--min-lr", check=AT_LEAST_0),
    Toggle("WARMUP_ITERS", "int", None, TRAIN_ARGS,
           "Linear warm-up iterations (default: 10% of TOTAL_ITERS).", flag="--lr-warmup-iters",
           check=AT_LEAST_0),
    Toggle("LR_DECAY_STYLE", "choice", "cosine", TRAIN_ARGS, "Learning-rate decay.",
           flag="--lr-decay-style", choices=("cosine", "linear", "constant", "WSD")),
    Toggle("LR_DECAY_ITERS", "int", None, TRAIN_ARGS,
           "Iterations the LR decay spans (Megatron's default: TOTAL_ITERS).",
           flag="--lr-decay-iters", check=AT_LEAST_1),
    Toggle("ADAM_EPS", "float", 1e-8, TRAIN_ARGS,
           "AdamW epsilon (Megatron's default 1e-8; the MLPerf llama3.1-8B recipe uses 1e-5).",
           flag="--adam-eps", check=AT_LEAST_0),
    Toggle("ADAM_BETA1", "float", 0.9, TRAIN_ARGS, "AdamW beta1.", flag="--adam-beta1",
           check=FRACTION),
    Toggle("ADAM_BETA2", "float", 0.95, TRAIN_ARGS, "AdamW beta2.", flag="--adam-beta2",
           check=FRACTION),
    Toggle("WEIGHT_DECAY", "float", 0.1, TRAIN_ARGS, "AdamW weight decay.",
           flag="--weight-decay", check=AT_LEAST_0),
    Toggle("CLIP_GRAD", "float", 1.0, TRAIN_ARGS, "Gradient-norm clip.", flag="--clip-grad",
           check=AT_LEAST_0),
    Toggle("SEED", "int", 1234, TRAIN_ARGS, "Random seed (also fixes the data order).",
           flag="--seed", check=Range(0, 2 ** 31 - 1)),

    # -- data -----------------------------------------------------------------------------------
    Toggle("EXTRA_MEGATRON_ARGS", "str", None, EXTRA_ARGS,
           "More Megatron flags, shell-split and appended as given (like --flags after the "
           "script name; handy where only the environment reaches the script).",
           group="training", emitted_by="passthrough"),
    Toggle("DATA_PATH", "str", None, DATA_ARGS,
           "Indexed dataset prefix or weighted blend ('0.7 pA 0.3 pB'); mock data when unset.",
           flag="--data-path", group="data", emit=_data_flags, multi=True,
           owns=("--train-data-path", "--mock-data")),
    Toggle("VALID_DATA_PATH", "str", None, DATA_ARGS,
           "Separate validation dataset/blend (then DATA_PATH is the training set, no SPLIT).",
           flag="--valid-data-path", group="data", emitted_by="DATA_PATH", multi=True),
    Toggle("TOKENIZER_MODEL", "path", None, DATA_ARGS,
           "Hugging Face tokenizer directory, tokenizer.json, or hub id (org/name: from the "
           "hub's cache, or downloaded where the hub is reachable) (default: the dataset's).",
           flag="--tokenizer-model", group="data", emit=_tokenizer_flags,
           owns=("--tokenizer-type", "--vocab-size")),
    Toggle("SPLIT", "str", "98,2,0", DATA_ARGS, "train,valid,test split of DATA_PATH.",
           flag="--split", group="data", emitted_by="DATA_PATH", check=SPLIT_FORM),
    Toggle("EVAL_INTERVAL", "int", 1000, DATA_ARGS, "Iterations between evaluations.",
           flag="--eval-interval", group="data", check=AT_LEAST_1),
    Toggle("EVAL_ITERS", "int", 10, DATA_ARGS, "Batches per evaluation (0: none).",
           flag="--eval-iters", group="data", check=AT_LEAST_0),
    Toggle("NUM_WORKERS", "int", 2, DATA_ARGS, "Data-loader worker processes.",
           flag="--num-workers", group="data", check=Range(0, 256)),
    Toggle("DATA_CACHE_PATH", "path", None, DATA_ARGS,
           "Where Megatron caches the dataset's sample indices (default: beside the data); on "
           "many nodes, a folder every node sees.", flag="--data-cache-path", group="data"),
    _bool("EOD_MASK_LOSS", False, DATA_ARGS,
          "1: the loss leaves out the positions whose token is the tokenizer's end-of-document "
          "(Megatron's --eod-mask-loss; MLPerf gpt_oss_20b's reference sets it).",
          on=("--eod-mask-loss",), group="data"),
    _bool("DOCUMENT_MASK", False, DATA_ARGS,
          "1: documents kept apart: attention stops at each end-of-document token (Megatron's "
          "--reset-attention-mask, which means the same when passed through), as Llama 3 was "
          "trained. Every backend runs it as the packed (THD) layout with the documents' "
          "cu_seqlens, never a dense mask: the native backend block-causal (flex attention on "
          "the GPU), Transformer Engine its padding-causal THD attention; positions restart "
          "per document (RESET_POSITION_IDS follows). Off by default (Megatron's and the "
          "peers' default; the MLPerf recipes pin their references' 0); docs/documents.md.",
          on=("--reset-attention-mask",), group="data", levers=True),
    _bool("RESET_POSITION_IDS", False, DATA_ARGS,
          "Positions restart at each document (Megatron's --reset-position-ids). Follows "
          "DOCUMENT_MASK (the packed layout rotates each document from 0); alone it is "
          "refused: Megatron's RoPE takes no position ids, so it would change nothing.",
          on=("--reset-position-ids",), group="data"),

    # -- output -------------------------------------------------------------------------------
    Toggle("EXPERIMENT_DIR", "path", "experiment", LAUNCHER, "Root of run folders.",
           group="output"),
    Toggle("EXP_NAME", "str", None, LAUNCHER,
           "Run-folder name (default: model, nodes, parallelism and batch).", group="output"),
    Toggle("RUN_ID", "str", None, LAUNCHER,
           "Last level of the run folder (default: a timestamp; set it once for all nodes).",
           group="output"),
    Toggle("LOG_DIR", "path", None, LAUNCHER,
           "The run folder itself, named whole (the ROCm fork's LOG_DIR); unset: "
           "EXPERIMENT_DIR/EXP_NAME/precision/RUN_ID. A folder that holds a run is refused.",
           group="output"),
    Toggle("LOG_INTERVAL", "int", 1, OUTPUT_ARGS, "Iterations between log lines.",
           flag="--log-interval", group="output", check=AT_LEAST_1),
    Toggle("METRICS_WARMUP_ITERS", "int", None, OUTPUT_ARGS,
           "Iterations left out of steady-state figures (default: 20% of TOTAL_ITERS, 2-10).",
           flag="--metrics-warmup-iters", group="output", check=AT_LEAST_0),
    Toggle("SAVE", "path", None, OUTPUT_ARGS, "Checkpoint directory to save to.",
           flag="--save", group="output", aliases=(Alias("SAVE_CKPT_PATH"),)),
    Toggle("SAVE_INTERVAL", "int", None, OUTPUT_ARGS,
           "Iterations between checkpoints (the last iteration is saved too). Unset with SAVE: "
           "the ROCm fork's default, shown as derived.",
           flag="--save-interval", group="output", check=AT_LEAST_1),
    Toggle("LOAD", "path", None, OUTPUT_ARGS,
           "Checkpoint directory to resume from; empty is refused unless RESUME=auto.",
           flag="--load", group="output"),
    Toggle("CKPT_FORMAT", "choice", None, OUTPUT_ARGS,
           "Checkpoint format (Megatron's default: torch_dist; FSDP=1 needs torch_dist or "
           "torch_dcp).", flag="--ckpt-format",
           choices=("torch", "torch_dist", "torch_dcp", "fsdp_dtensor"), group="output"),
    _bool("ASYNC_SAVE", False, OUTPUT_ARGS,
          "1: checkpoints are written in the background (Megatron's --async-save, on its "
          "persistent checkpoint worker and megatron-core's own async strategy): a save costs "
          "the step only its copy to host memory; the latest-checkpoint marker moves once the "
          "write is finished. torch_dist format only (CKPT_FORMAT).",
          group="output", emit=_by_value({True: ("--async-save", "--use-persistent-ckpt-worker",
                                                 "--async-strategy", "mcore")}),
          owns=("--async-save", "--use-persistent-ckpt-worker", "--async-strategy"),
          levers=True),
    _bool("TEE_OUTPUT", True, LAUNCHER,
          "1: the run's output goes to the console and to the run folder's log; 0: to the log "
          "only.", group="output"),
    Toggle("WANDB_PROJECT", "str", None, OUTPUT_ARGS,
           "Also log to this Weights & Biases project (needs wandb), run named after the run "
           "folder; set to LLama when WANDB_API_KEY is (as the ROCm fork does).",
           flag="--wandb-project", group="output", emit=_wandb_flags,
           owns=("--wandb-exp-name", "--wandb-save-dir")),
    Toggle("RESUME", "choice", "require", LAUNCHER,
           "require: LOAD must hold a checkpoint; auto: start fresh when it holds none.",
           choices=("require", "auto"), group="output"),
    Toggle("RESUME_SCHEDULE", "choice", "auto", TRAIN_ARGS,
           "Which LR schedule a resume follows when this launch's differs from LOAD's "
           "checkpoint (a longer TOTAL_ITERS, another BS or LR). checkpoint: the saved one "
           "(Megatron's --use-checkpoint-opt_param-scheduler); new: this launch's, from the "
           "checkpoint's consumed samples on (--override-opt_param-scheduler); auto: the "
           "checkpoint's where only derived values changed, a refusal where a schedule "
           "setting you gave differs. DRY_RUN shows the plan.",
           choices=("auto", "checkpoint", "new"), group="output",
           emit=_by_value({"checkpoint": ("--use-checkpoint-opt_param-scheduler",),
                           "new": ("--override-opt_param-scheduler",)}),
           owns=("--use-checkpoint-opt_param-scheduler", "--use-checkpoint-opt-param-scheduler",
                 "--override-opt_param-scheduler", "--override-opt-param-scheduler")),
    Toggle("CKPT_STEP", "int", None, OUTPUT_ARGS,
           "The iteration a resume loads from LOAD (Megatron's --ckpt-step; default: the "
           "marker's, or the last complete checkpoint where the marker names a half-written "
           "one, shown as derived).", flag="--ckpt-step", group="output", check=AT_LEAST_1),
    Toggle("PRETRAINED_CHECKPOINT", "path", None, OUTPUT_ARGS,
           "Start from this checkpoint's weights (fresh optimizer, iteration 0): a Hugging Face "
           "import of `python -m training.checkpoint import` whose preset and layers are the "
           "launch's. Not a resume: a LOAD that holds a checkpoint is resumed instead.",
           flag="--pretrained-checkpoint", group="output"),
    Toggle("PROFILE", "choice", "none", OUTPUT_ARGS,
           "torch: torch-profiler traces into <run>/profile; nsys: wrap the launch with nsys.",
           choices=("none", "torch", "nsys"), group="profile", emit=_profile_flags,
           owns=("--profile", "--use-pytorch-profiler"),
           aliases=(Alias("ENABLE_PROFILING", (("1", "torch"), ("0", "none"))),)),
    Toggle("PROFILE_STEP_START", "int", 5, OUTPUT_ARGS, "First profiled iteration.",
           flag="--profile-step-start", group="profile", emitted_by="PROFILE",
           check=AT_LEAST_0),
    Toggle("PROFILE_STEP_END", "int", 7, OUTPUT_ARGS, "Iteration the profile stops at.",
           flag="--profile-step-end", group="profile", emitted_by="PROFILE", check=AT_LEAST_0),
    Toggle("PROFILE_RANKS", "str", "0", OUTPUT_ARGS, "Ranks to profile (space or comma list).",
           flag="--profile-ranks", group="profile", emitted_by="PROFILE", multi=True),

    # -- preemption, restarts, hangs (training/resilience; docs/launch.md, "Runs that last") ---
    Toggle("PREEMPTION", "choice", "auto", LAUNCHER,
           "A stop signal (SIGTERM, Ctrl-C, Slurm's warning SIGUSR2) lets every rank finish its "
           "step, save when SAVE is set, and stop. requeue: the run exits 75 once that "
           "checkpoint is complete, for the scheduler to requeue it (launchers/slurm/"
           "train.sbatch does) and resume; stop: exit 143; auto: requeue with SAVE, stop "
           "without.", choices=("auto", "requeue", "stop"), group="resilience"),
    Toggle("RESTARTS", "int", 0, LAUNCHER,
           "Restart a failed run up to N times, each from the last complete checkpoint in SAVE, "
           "after RESTART_BACKOFF seconds (doubling); every restart is a line of the run "
           "folder's restarts.jsonl. Never after success, a user error (exit 2) or a "
           "preemption; not again once the same iteration failed twice in a row.",
           group="resilience", check=Range(0, 1000)),
    Toggle("RESTART_BACKOFF", "int", 10, LAUNCHER,
           "Seconds before the first restart; each next one waits twice as long (at most 600).",
           group="resilience", check=Range(0, 600)),
    Toggle("HANG_TIMEOUT", "int", 0, OUTPUT_ARGS,
           "Seconds without progress on any rank (no iteration ended, no save or evaluation "
           "began) after which the run counts as hung: every rank's Python stack goes to the "
           "run folder's stacks/, a one-line diagnosis (which rank is behind, where) to the log "
           "and hang.txt, and the run ends with status 124 (or restarts, with RESTARTS). Above "
           "the longest step, save and evaluation; below the NCCL timeout (600 s) to act "
           "first. 0: off.", flag="--hang-timeout", group="resilience", check=AT_LEAST_0,
           when=lambda s: s["HANG_TIMEOUT"] > 0),

    # -- cluster (torchrun) -----------------------------------------------------------------------
    Toggle("NNODES", "int", 1, DISTRIBUTED_ARGS, "Nodes in the job.", flag="--nnodes",
           group="cluster", check=Range(1, 65536)),
    Toggle("NODE_RANK", "int", 0, DISTRIBUTED_ARGS, "This node's rank.", flag="--node-rank",
           group="cluster", check=Range(0, 65535)),
    Toggle("MASTER_ADDR", "str", "localhost", DISTRIBUTED_ARGS, "Rendezvous host (node 0).",
           flag="--master-addr", group="cluster", check=HOST),
    Toggle("MASTER_PORT", "int", 29500, DISTRIBUTED_ARGS, "Rendezvous port.",
           flag="--master-port", group="cluster", check=Range(1, 65535)),
    Toggle("GPUS_PER_NODE", "int", None, DISTRIBUTED_ARGS,
           "Processes per node (default: the GPUs visible).", flag="--nproc-per-node",
           group="cluster", check=Range(1, 256)),

    # -- launcher -------------------------------------------------------------------------------
    Toggle("PLATFORM", "choice", "auto", LAUNCHER,
           "Capabilities of a named platform without its hardware; auto detects this node.",
           choices=("auto", "h100", "h200", "b200", "b300", "gb200", "gb300",
                    "mi300x", "mi325x", "mi355x"), group="launcher"),
    _bool("DRY_RUN", False, LAUNCHER, "Print the resolved launch and exit; touches no GPU.",
          group="launcher"),
    _bool("STRICT", False, LAUNCHER, "Unknown toggle-like variables are errors, not warnings.",
          group="launcher"),
    _bool("VERBOSE", False, LAUNCHER,
          "Print the full toggle table and the Megatron buckets by name; off: a one-screen "
          "summary (the run, what differs from the defaults and why, the notices, the torchrun "
          "line). The full table is always in the run folder's launch.txt.", group="launcher"),
    Toggle("PREFLIGHT_MEMORY", "choice", "refuse", LAUNCHER,
           "Before torchrun, the memory estimate of the resolved launch (training/optimize) "
           "against the GPU's memory: refuse stops a launch whose estimated peak is above it "
           "(exit 2, the estimate by term and the levers that fit), and warns between 90% and "
           "100%; warn only warns; off skips the check.",
           choices=("refuse", "warn", "off"), group="launcher"),

)

BY_NAME: dict[str, Toggle] = {t.name: t for t in REGISTRY}
# alias name -> (the toggle, the alias)
BY_ALIAS: dict[str, tuple[Toggle, Alias]] = {a.name: (t, a) for t in REGISTRY for a in t.aliases}
PERF_TOGGLES: tuple[Toggle, ...] = tuple(t for t in REGISTRY if t.perf)


# -- values derived from others, written once: the launcher (resolve, guards) and a plain
#    `torchrun training/pretrain_gpt.py` (training/arguments.py) both call these, so the
#    two derive the same run --------------------------------------------------------------

def default_metrics_warmup_iters(total_iters: int | None) -> int:
    """METRICS_WARMUP_ITERS left unset: 20% of TOTAL_ITERS, between 2 and 10."""
    return min(max((total_iters or 0) // 5, 2), 10)


# MoE models in bf16 where TE imports, by GPU architecture: the native backend where it was
# measured faster than the TE backend at the MoE bench shape (bench part moe-te-peers,
# docs/benchmarks/moe-te-peers_h200_*; the TE backend there with the native grouped experts
# and the lean step). Elsewhere TE stays, and the reason says nothing was measured there.
MOE_NATIVE_BACKEND_ARCHS = ("sm90",)


def te_moe_blocker(moe: bool, biased: bool, clamped_geglu: bool) -> str | None:
    """Why the TE backend must not run this model, or None. gpt-oss's MoE block (biased experts
    and router, the clamped quick-GeGLU) on the TE backend computed far from Hugging Face's
    GptOssForCausalLM on an H200, while the native backend matches it; its attention (sinks,
    the window) matched there. Which of the block's parts the TE backend gets wrong is not
    isolated, so all of them keep it off TE. One rule for TRANSFORMER_IMPL=auto, the guard
    gpt_oss_te_backend and a plain torchrun (training.arguments)."""
    if not (moe and (biased or clamped_geglu)):
        return None
    parts = " and ".join(p for p, on in (("biased experts and router", biased),
                                         ("the clamped quick-GeGLU", clamped_geglu)) if on)
    return (f"an MoE block with {parts} (gpt-oss's) on the TE backend gave logits 96x Hugging "
            "Face's own bf16 error away from its GptOssForCausalLM on an H200 with TE 2.20.2: "
            "layer 0's attention with the sinks and the window matched to bf16 rounding, its "
            "MoE block did not (dev/gpu/gpt_oss_te_diag.py; docs/gpt_oss.md, Backends), where "
            "the native backend matches both")


def auto_backend(transformer_engine: bool, moe: bool = False, arch: str | None = None,
                 precision: str = "bf16", te_blocked: str | None = None) -> tuple[str, str]:
    """TRANSFORMER_IMPL=auto: (backend, why). A model the TE backend is known to compute wrong
    (`te_blocked`, te_moe_blocker's reason) runs the native backend; an MoE model in bf16
    runs the native backend where that was measured faster on this GPU's architecture
    (MOE_NATIVE_BACKEND_ARCHS); a precision recipe other than bf16 needs TE's layers."""
    if not transformer_engine:
        return "native", "transformer_engine is not installed"
    if te_blocked:
        return "native", f"transformer_engine imports, but {te_blocked}"
    if moe and precision == "bf16":
        if arch in MOE_NATIVE_BACKEND_ARCHS:
            return "native", ("transformer_engine imports, but for MoE in bf16 the native "
                              f"backend measured faster than the TE backend on {arch} "
                              "(docs/levers.md, peer rows of moe-te-peers)")
        return "transformer_engine", ("transformer_engine imports (MoE: the native backend "
                                      f"is not measured against it on {arch or 'this GPU'}; "
                                      "compare with TRANSFORMER_IMPL=native)")
    return "transformer_engine", "transformer_engine imports"


def auto_native_kernels(liger: bool) -> tuple[str, str]:
    """NATIVE_KERNELS=auto: (kernels, why)."""
    if liger:
        return "liger", "Liger-Kernel is installed"
    return "torch", "Liger-Kernel is not installed: plain torch kernels"


def fused_linear_ce(backend: str, ce_fusion: bool, tp: int, cp: int, kernels: str | None
                    ) -> tuple[str | None, str]:
    """Which fused linear cross-entropy the run's output layer and loss use: (liger | torch |
    None, why). None: Megatron's cross-entropy over materialised logits. One rule for the
    training script (pretrain_gpt), the guards and the memory estimate."""
    if not ce_fusion:
        return None, "CROSS_ENTROPY_LOSS_FUSION=0: plain cross-entropy over the logits"
    if tp > 1 or cp > 1:
        return None, (f"{'TP' if tp > 1 else 'CP'}>1: Megatron's vocab-parallel fused "
                      "cross-entropy (the fused linear one needs the whole vocabulary and "
                      "sequence on a rank)")
    if backend == "native":
        return kernels, f"the native backend's fused linear cross-entropy ({kernels} kernels)"
    if backend == "transformer_engine":
        if kernels == "liger":
            return "liger", ("Liger's fused linear cross-entropy on the output layer (Megatron's "
                             "own ColumnParallelLinear under the TE spec)")
        return None, ("NATIVE_KERNELS=torch: Megatron's fused cross-entropy (the torch fused "
                      "linear one is the native backend's CPU path, slower on a GPU)")
    return None, f"the {backend} backend: Megatron's fused cross-entropy"


def step_host_reads(nan_check: str, experts: int, device_counts: bool
                    ) -> list[tuple[str, str, str]]:
    """What reads the GPU from the host inside a training step, as (setting, why, the setting
    that avoids it): a CUDA graph of the step (CUDA_GRAPH) cannot capture it. One rule for the
    guard cuda_graph and a plain torchrun (training.arguments). The fused linear
    cross-entropy is not among them: Liger's kernel runs in a loop of ours without a host read
    (training/native/cross_entropy.py, SyncFreeLigerLinearCrossEntropy)."""
    reads = []
    if nan_check == "bucket":
        reads.append(("NAN_CHECK", "NAN_CHECK=bucket checks every gradient bucket on the host "
                                   "(megatron-core asserts --no-check-for-nan-in-loss-and-grad "
                                   "with a full-iteration graph)", "NAN_CHECK=step"))
    if experts and not device_counts:
        reads.append(("MOE_DEVICE_COUNTS", "the MoE dispatcher copies the tokens per expert to "
                                           "the host in every MoE layer (MOE_DEVICE_COUNTS=1 "
                                           "keeps them on the GPU where the layout allows)",
                      "MOE_DEVICE_COUNTS=1"))
    return reads


# MOE_EXPERT_IMPL=auto on the TE backend, by GPU architecture: (experts, why). Measured on an
# H200 (bench part moe-te-levers, docs/levers.md's MOE_EXPERT_IMPL row); elsewhere the reason
# says what it rests on instead of a measurement.
EXPERTS_BY_ARCH = {
    "sm90": ("native", "measured on an H200: torch grouped_mm's grouped GEMM ahead of TE's "
                       "grouped linear at the MoE bench shape (docs/levers.md, MOE_EXPERT_IMPL)"),
    "sm100": ("native", "not measured on this GPU: torch grouped_mm has its SM100 kernel and was "
                        "ahead on SM90; compare with MOE_EXPERT_IMPL=te"),
}


def auto_expert_impl(backend: str, arch: str | None) -> tuple[str, str]:
    """MOE_EXPERT_IMPL=auto: which grouped experts a backend runs, (te | native, why). The
    native backend has only its own; the TE backend takes the one measured faster on this
    GPU's architecture, and TE's (Megatron's choice) where nothing says otherwise."""
    if backend == "local":
        return "native", "the local backend builds SequentialMLP (no grouped experts there)"
    if backend != "transformer_engine":
        return "native", "the native backend's grouped experts (torch grouped_mm)"
    if arch in EXPERTS_BY_ARCH:
        return EXPERTS_BY_ARCH[arch]
    return "te", (f"not measured on {arch or 'an unknown GPU'}: Megatron's TEGroupedMLP on TE's "
                  "grouped linear; compare with MOE_EXPERT_IMPL=native")


def device_counts_conflicts(backend: str, experts: str, grouped: bool, ep: int, tp: int,
                            etp: int | None, dispatcher: str, capacity: float | None
                            ) -> list[str]:
    """Why MOE_DEVICE_COUNTS=1 (training/moe/layer.py) cannot act in this layout (none: it
    can). `experts`: the resolved MOE_EXPERT_IMPL (native | te). One rule for the MoE layer's
    guard and a plain torchrun (training.arguments)."""
    needs = [(backend == "local", "the local backend (Megatron's SequentialMLP, split by host "
                                  "counts)"),
             (backend != "local" and experts != "native",
              f"MOE_EXPERT_IMPL={experts} (the native grouped experts take the counts on the "
              "GPU; TE's grouped linear wants a host list)"),
             (not grouped, "MOE_GROUPED_GEMM=0 (the sequential experts split by host counts)"),
             (ep > 1, f"EP={ep} (the all-to-all needs its split sizes on the host)"),
             (tp > 1, f"TP={tp} (the tensor-parallel gather needs host sizes)"),
             (etp is not None and etp > 1, f"ETP={etp}"),
             (dispatcher != "alltoall", f"MOE_TOKEN_DISPATCHER={dispatcher} (it is the "
                                        "all-to-all dispatcher's synchronisation)"),
             (capacity is not None, "MOE_CAPACITY_FACTOR (token dropping sizes its output on "
                                    "the host)")]
    return [reason for applies, reason in needs if applies]


def backend_flags(backend: str, masked_softmax_kernel: bool) -> tuple[list[str], list[str]]:
    """The Megatron flags a resolved backend implies: (GPT_ARGS words, TRAIN_ARGS words).

    Megatron's --transformer-impl is TE's or the local one (the native backend builds on the
    local spec). Without TE, Megatron's RoPE fusion (TE's kernel) must be off, the native
    backend has its own fused QKV RoPE (FUSED_SINGLE_QKV_ROPE), and Megatron's persistent
    LayerNorm (apex/TE's) is off: the torch and native norms have none. The local spec's
    attention softmax: Megatron's fused kernel is apex's scaled_masked_softmax_cuda; absent,
    the first forward at seq <= 4096 dies with ModuleNotFoundError, so torch's softmax runs
    instead (numerically the same)."""
    gpt = ["--transformer-impl",
           "transformer_engine" if backend == "transformer_engine" else "local"]
    train = []
    if backend != "transformer_engine":
        train += ["--no-rope-fusion", "--no-persist-layer-norm"]
    if backend == "local" and not masked_softmax_kernel:
        train += ["--no-masked-softmax-fusion"]
    return gpt, train


def nan_check_flags(value: str) -> list[str]:
    """NAN_CHECK=step replaces Megatron's per-bucket NaN/Inf check (a host-GPU sync for every
    gradient bucket in each backward) with one check of the loss and global gradient norm per
    iteration (training.loop_hooks); NAN_CHECK=bucket keeps Megatron's."""
    return ["--no-check-for-nan-in-loss-and-grad"] if value == "step" else []


def closest_toggle(name: str, names=None) -> str | None:
    """The registry name (of `names`, default the core's) closest to a (mistyped) variable."""
    matches = difflib.get_close_matches(name, BY_NAME if names is None else names, n=1,
                                        cutoff=0.8)
    return matches[0] if matches else None


def parse_value(toggle: Toggle, raw: str) -> Any:
    """Parse a raw env string for a toggle; raises ValueError with an accepted-values text."""
    from .settings import BadInput

    value = _parse(toggle, raw)
    check = _check(toggle)
    problem = check.problem(value) if check is not None else None
    if problem and isinstance(check, Form):
        raise BadInput(f"{toggle.name}={raw!r}: {problem}.")
    if problem:
        raise BadInput(f"{toggle.name}={raw!r} {problem}: use {_accepted(toggle)}.")
    return value


def _check(toggle: Toggle) -> Range | Form | None:
    """The toggle's check; a float without one is still refused nan and inf (FINITE)."""
    return FINITE if toggle.check is None and toggle.kind == "float" else toggle.check


def _accepted(toggle: Toggle) -> str:
    """What a knob accepts, in words (the README's values column and refusals say it)."""
    kind = {"int": "an integer", "float": "a number"}.get(toggle.kind, "a value")
    check = _check(toggle)
    if isinstance(check, Form):
        return check.text
    return f"{kind} {check.text}" if check is not None and check.text else kind


def _parse(toggle: Toggle, raw: str) -> Any:
    from .settings import BadInput

    raw = dict(toggle.spellings).get(raw.strip(), raw)
    text = raw.strip()
    if toggle.kind == "bool":
        if text in ("0", "1"):
            return text == "1"
        raise BadInput(f"{toggle.name}={raw!r} is not a toggle value: use 0 or 1.")
    if toggle.kind == "int":
        try:
            return int(text)
        except ValueError:
            raise BadInput(f"{toggle.name}={raw!r} is not an integer: "
                           f"use a whole number, e.g. {toggle.name}="
                           f"{toggle.default if toggle.default is not None else 1}.") from None
    if toggle.kind == "float":   # nan and inf parse: the check refuses them (parse_value)
        try:
            return float(text)
        except ValueError:
            raise BadInput(f"{toggle.name}={raw!r} is not a number: use e.g. "
                           f"{toggle.name}={toggle.default if toggle.default is not None else 1.0}.") from None
    if toggle.kind == "path" and toggle.flag and not text:
        raise BadInput(f"{toggle.name}= is empty, which Megatron would take as a folder named '': "
                       f"leave {toggle.name} out, or give a folder.")
    if toggle.kind == "choice":
        if text in toggle.choices:
            return text
        raise BadInput(f"{toggle.name}={raw!r} is not accepted: use one of "
                       f"{', '.join(toggle.choices)}.")
    return raw
