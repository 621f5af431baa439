"""The project's own argument groups, added on top of Megatron's parser, and the launcher's
derivations for a plain `torchrun training/pretrain_gpt.py` invocation.

Group titles are routed to buckets by training.launch.toggles.GROUP_TO_BUCKET. Every argument
here that a toggle sets takes that toggle's registry default, so the launcher and a plain
invocation start from the same values; `as_the_launcher()` then derives what the launcher
derives from them (the same functions of training.launch.toggles), so a plain
`torchrun training/pretrain_gpt.py <model flags>` runs what `train_llama3.sh` would run with
those flags. The launcher passes every value explicitly: for its invocation nothing changes.
The launcher's guards (corrections of combinations, refusals) do not run under torchrun: a
combination they would correct fails there as Megatron or this project's code fails it.
"""
from __future__ import annotations

import argparse
import functools

from training.launch.toggles import (BY_NAME, auto_backend, auto_expert_impl,
                                     auto_native_kernels, backend_flags,
                                     default_metrics_warmup_iters, device_counts_conflicts,
                                     nan_check_flags, step_host_reads, te_moe_blocker)

# Our arguments a toggle sets: argparse dest -> registry entry.
TOGGLE_OF = {
    "fused_single_qkv_rope": "FUSED_SINGLE_QKV_ROPE",
    "transformer_backend": "TRANSFORMER_IMPL",
    "native_kernels": "NATIVE_KERNELS",
    "ce_chunk_mem": "CE_CHUNK_MEM",
    "nan_check": "NAN_CHECK",
    "metrics_warmup_iters": "METRICS_WARMUP_ITERS",
    "master_weights": "MASTER_WEIGHTS",
    "hang_timeout": "HANG_TIMEOUT",
    "adam_impl": "ADAM_IMPL",
}
# Set by the MoE recipe layer's MOE_PERMUTE_FUSION (training/moe/layer.py: the run imports no
# family, so its default is repeated here; tests/moe/test_moe_launch.py holds the two equal).
NATIVE_MOE_PERMUTE_DEFAULT = True


def _default(dest: str):
    return BY_NAME[TOGGLE_OF[dest]].default


def _choices(dest: str) -> tuple[str, ...]:
    return BY_NAME[TOGGLE_OF[dest]].choices


class MasterWeights(argparse.Action):
    """--master-weights also sets Megatron's store_param_remainders (an OptimizerConfig field
    without a flag of its own, copied from args): only 'remainder' keeps the fp32 master as
    the low 16 bits beside the bf16 weights."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        namespace.store_param_remainders = values == "remainder"


def add_training_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    model = parser.add_argument_group(title="launcher: model")
    # megatron-core 0.19.2 has TransformerConfig.fused_single_qkv_rope but no flag for it;
    # core_transformer_config_from_args copies any args attribute named like a config field.
    model.add_argument("--fused-single-qkv-rope", action=argparse.BooleanOptionalAction,
                       default=_default("fused_single_qkv_rope"),
                       help="Apply RoPE to the packed QKV tensor in one kernel (no split/concat).")
    model.add_argument("--transformer-backend", choices=_choices("transformer_backend"),
                       default=_default("transformer_backend"),
                       help="Layer spec: transformer_engine (Megatron's TE spec), native (SDPA + "
                            "Liger/torch kernels, this project's), local (Megatron's local "
                            "spec); auto: transformer_engine where it imports, else native.")
    model.add_argument("--native-kernels", choices=_choices("native_kernels"),
                       default=_default("native_kernels"),
                       help="Kernels of the native backend: Liger-Kernel (Triton) or plain "
                            "torch; auto: liger where installed.")
    model.add_argument("--native-moe-permute", action=argparse.BooleanOptionalAction,
                       default=NATIVE_MOE_PERMUTE_DEFAULT,
                       help="Native backend, MoE models: the token dispatchers' permute and "
                            "unpermute as gathers (no atomic scatter-add; Megatron's "
                            "--moe-permute-fusion is Transformer Engine's).")
    model.add_argument("--moe-expert-impl", choices=("auto", "native", "te"), default="auto",
                       help="MoE grouped experts: native (torch grouped_mm; on the TE backend "
                            "beside TE's attention and linears, bf16 under an fp8 recipe) or te "
                            "(TEGroupedMLP on TE's grouped linear); auto: the native backend's "
                            "own, on the TE backend the one measured faster on this GPU "
                            "(MOE_EXPERT_IMPL).")
    model.add_argument("--moe-device-counts", action="store_true",
                       help="Native grouped experts, MoE models at EP = TP = 1: the tokens per expert "
                            "stay on the GPU (the grouped experts' offsets computed there), so "
                            "no MoE layer's dispatch waits for the GPU (MOE_DEVICE_COUNTS).")
    model.add_argument("--moe-wgrad-fusion", action="store_true",
                       help="Native grouped experts with --gradient-accumulation-fusion: their "
                            "weight gradients added into main_grad by a Triton kernel instead "
                            "of a full gradient then DDP's add (MOE_WGRAD_FUSION).")
    model.add_argument("--ce-chunk-mem", type=int, default=_default("ce_chunk_mem"),
                       help="Liger fused linear cross-entropy's chunk_mem_const: each chunk's "
                            "logits stay under N x tokens x hidden (native or TE backend, "
                            "TP=1).")

    train = parser.add_argument_group(title="launcher: training")
    train.add_argument("--nan-check", choices=_choices("nan_check"),
                       default=_default("nan_check"),
                       help="step: stop at the first iteration whose loss or global gradient "
                            "norm is NaN/Inf (Megatron's per-bucket check off); bucket: "
                            "Megatron's per-bucket check only.")

    train.add_argument("--master-weights", choices=_choices("master_weights"),
                       default=_default("master_weights"), action=MasterWeights,
                       help="With --use-precision-aware-optimizer: the fp32 master weights as "
                            "a copy (fp32), as 16-bit remainders beside the bf16 weights "
                            "(remainder, exact), or none, the bf16 weights updated with "
                            "stochastic rounding (stochastic; the native backend's optimizer).")
    parser.set_defaults(store_param_remainders=False)
    train.add_argument("--adam-impl", choices=_choices("adam_impl"),
                       default=_default("adam_impl"),
                       help="The precision-aware optimizer's AdamW: auto (TE's FusedAdam where "
                            "TE imports, else the native MixedPrecisionAdamW) or native "
                            "(MixedPrecisionAdamW in place of TE's FusedAdam too; bf16).")

    run = parser.add_argument_group(title="launcher: run")
    run.add_argument("--run-dir", type=str, default=None,
                     help="Run folder: metrics.jsonl and the manifest's run section go here.")
    run.add_argument("--metrics-warmup-iters", type=int,
                     default=_default("metrics_warmup_iters"),
                     help="Iterations left out of the steady-state figures (default: 20%% of "
                          "--train-iters, between 2 and 10).")
    run.add_argument("--hang-timeout", type=int, default=_default("hang_timeout"),
                     help="Seconds without a heartbeat after which every rank writes its "
                          "stack to <run-dir>/stacks/ (training.resilience.heartbeat); 0: off.")
    return parser


@functools.cache
def megatron_parser() -> argparse.ArgumentParser:
    """megatron-core's parser with our arguments, as megatron.training.arguments.parse_args
    builds it."""
    from megatron.training.arguments import add_megatron_arguments

    parser = argparse.ArgumentParser(description="Megatron-LM Arguments", allow_abbrev=False)
    add_megatron_arguments(parser)
    return add_training_args(parser)


class ArgumentConflict(ValueError):
    """An explicit Megatron flag contradicts what our arguments imply."""


def _given(argv: list[str], flag: str) -> str | None:
    """The value given for a value flag in argv (the last one), or None."""
    value = None
    for i, word in enumerate(argv):
        if word == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif word.startswith(flag + "="):
            value = word.split("=", 1)[1]
    return value


# the setting each of step_host_reads' host reads names, as a plain torchrun's fix
_AS_FLAGS = {"NAN_CHECK": "use --nan-check step",
             "MOE_DEVICE_COUNTS": "add --moe-device-counts"}


def as_the_launcher(argv: list[str], caps=None) -> tuple[list[str], list[str]]:
    """(argv with the launcher's derivations added, one note per derivation).

    Our arguments left at auto or unset get the value the launcher would give them (appended,
    so they replace an explicit 'auto'); the Megatron flags the backend and the NaN check imply
    are prepended unless argv gives them, so an explicit flag keeps its value, and an explicit
    value that contradicts the backend raises ArgumentConflict. `caps`: the node's
    capabilities (training.launch.capabilities.detect() when None and needed)."""
    args = megatron_parser().parse_args(argv)
    notes: list[str] = []
    after: list[str] = []
    before: list[str] = []

    def capabilities():
        nonlocal caps
        if caps is None:
            from training.launch.capabilities import detect

            caps = detect()
        return caps

    backend = args.transformer_backend
    clamped_geglu = bool(getattr(args, "quick_geglu", False)) and \
        getattr(args, "activation_func_clamp_value", None) is not None
    te_blocked = te_moe_blocker(bool(args.num_experts), bool(args.add_bias_linear), clamped_geglu)
    precision = "fp8" if args.fp8 else "fp4" if args.fp4 else "bf16"
    why = "given"
    if backend == "auto":
        info = capabilities().info
        backend, why = auto_backend(capabilities().transformer_engine, bool(args.num_experts),
                                    info.arch if info else None, precision, te_blocked)
        after += ["--transformer-backend", backend]
        notes.append(f"--transformer-backend {backend} (auto: {why})")
    # what lifts the TE blocker, where anything does: biases the MoE was not meant to have
    unblock = (" (--disable-bias-linear lifts it for an MoE meant to have no biases)"
               if te_blocked and args.add_bias_linear and not clamped_geglu else "")
    if precision != "bf16" and backend != "transformer_engine":
        # only TE's layers compute in fp8/fp4: the flag would train in bf16 without a word
        fix = (f"Drop --{precision}-format: the TE backend it needs is kept off this model"
               f"{unblock}" if te_blocked else
               f"Drop --{precision}-format, or use --transformer-backend transformer_engine "
               "where it can run")
        raise ArgumentConflict(f"--{precision}-format needs the TE backend's layers, and the "
                               f"backend is {backend} ({why}). {fix}.")
    if backend == "transformer_engine" and te_blocked:
        raise ArgumentConflict(f"--transformer-backend transformer_engine: {te_blocked}. Use "
                               f"--transformer-backend native{unblock}.")
    kernels = args.native_kernels
    if kernels == "auto" and backend in ("native", "transformer_engine"):
        kernels, why = auto_native_kernels(capabilities().liger)
        after += ["--native-kernels", kernels]
        notes.append(f"--native-kernels {kernels} (auto: {why})")
    experts = args.moe_expert_impl
    if experts == "auto" and args.num_experts:
        platform = capabilities().info
        experts, why = auto_expert_impl(backend, platform.arch if platform else None)
        after += ["--moe-expert-impl", experts]
        notes.append(f"--moe-expert-impl {experts} (auto: {why})")
    if experts == "te" and args.num_experts and backend != "transformer_engine":
        raise ArgumentConflict(f"--moe-expert-impl te runs TE's grouped linear, which the "
                               f"{backend} backend does not build: use --moe-expert-impl native.")
    if args.metrics_warmup_iters is None:
        warmup = default_metrics_warmup_iters(args.train_iters)
        after += ["--metrics-warmup-iters", str(warmup)]
        notes.append(f"--metrics-warmup-iters {warmup} (20% of --train-iters, between 2 "
                     "and 10)")

    if args.moe_device_counts:   # the guard moe_device_counts, for a plain torchrun
        why = device_counts_conflicts(backend, experts, args.moe_grouped_gemm,
                                      args.expert_model_parallel_size,
                                      args.tensor_model_parallel_size,
                                      args.expert_tensor_parallel_size,
                                      args.moe_token_dispatcher_type,
                                      args.moe_expert_capacity_factor)
        if not args.num_experts:
            why.insert(0, "the model has no experts (--num-experts)")
        if why:
            raise ArgumentConflict(f"--moe-device-counts keeps the tokens per expert on the GPU "
                                   f"for the native grouped experts (--moe-expert-impl native) "
                                   f"at EP = TP = 1; here: "
                                   f"{'; '.join(why)}: drop --moe-device-counts.")
    if getattr(args, "cuda_graph_impl", "none") == "full_iteration":   # the guard cuda_graph
        reads = step_host_reads(args.nan_check, args.num_experts or 0, args.moe_device_counts)
        if reads:
            raise ArgumentConflict("--cuda-graph-impl full_iteration captures the whole step, "
                                   "which must not read the GPU from the host; here: "
                                   + "; ".join(f"{why}: {_AS_FLAGS[name]}"
                                               for name, why, _fix in reads) + ".")
    notes += _documents(args, argv, backend, after)
    softmax_kernel = backend != "local" or capabilities().masked_softmax_kernel
    gpt_words, train_words = backend_flags(backend, softmax_kernel)
    by_backend = f"--transformer-backend {backend}"
    implied = [(gpt_words, by_backend)]                 # ["--transformer-impl", value]
    implied += [([word], by_backend) for word in train_words]
    implied += [([word], f"--nan-check {args.nan_check}")
                for word in nan_check_flags(args.nan_check)]
    for words, because in implied:
        flag = words[0]
        if len(words) == 2:                             # a value flag
            given = _given(argv, flag)
            if given is not None and given != words[1]:
                raise ArgumentConflict(f"{flag} {given} contradicts {because}, which runs "
                                       f"with {flag} {words[1]}: drop {flag}.")
            if given is not None:
                continue
        elif flag in argv:
            continue
        before += words
        notes.append(f"{' '.join(words)} (implied by {because})")
    return before + argv + after, notes


def _documents(args, argv: list[str], backend: str, after: list[str]) -> list[str]:
    """The guard document_mask for a plain torchrun: --reset-attention-mask where the packed
    layout runs (with --reset-position-ids and without the fused QKV RoPE), and
    --reset-position-ids not alone under RoPE. Appends to `after`; returns the notes."""
    from training.launch import documents

    if not args.reset_attention_mask:
        if args.reset_position_ids and args.position_embedding_type != "learned_absolute":
            raise ArgumentConflict(f"--reset-position-ids: {documents.POSITIONS_ALONE}.")
        return []
    why = documents.conflicts(backend, args.context_parallel_size,
                              getattr(args, "cuda_graph_impl", "none") or "none",
                              args.pipeline_model_parallel_size, args.micro_batch_size,
                              args.attention_dropout or 0.0)
    if why:
        raise ArgumentConflict("--reset-attention-mask (the launcher's DOCUMENT_MASK=1) cannot "
                               "run here: " + "; ".join(why) + ".")
    notes = []
    if args.fused_single_qkv_rope:
        if "--fused-single-qkv-rope" in argv:
            raise ArgumentConflict(f"--fused-single-qkv-rope with --reset-attention-mask: "
                                   f"{documents.FUSED_QKV_ROPE}. Drop --fused-single-qkv-rope.")
        after.append("--no-fused-single-qkv-rope")
        notes.append(f"--no-fused-single-qkv-rope (--reset-attention-mask: "
                     f"{documents.FUSED_QKV_ROPE})")
    if not args.reset_position_ids:
        after.append("--reset-position-ids")
        notes.append(f"--reset-position-ids (--reset-attention-mask: "
                     f"{documents.POSITIONS_WITH_MASK})")
    return notes


def main(argv: list[str] | None = None) -> int:
    """`python -m training.arguments parse <words>`: parse the words as pretrain_gpt.py does
    (Megatron's parser with ours) and run nothing; argparse's message and exit 2 on a word it
    rejects (one line). The ROCm image's build runs it on the launcher's MI355X launch
    (`python -m training.deploy.image check-megatron rocm`)."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] != "parse":
        print("usage: python -m training.arguments parse <Megatron and launcher flags>",
              file=sys.stderr)
        return 2
    import types
    import warnings

    from training.cli import ArgumentParser

    with warnings.catch_warnings():  # Megatron's import-time notes (no apex, no TE): not about the words
        warnings.filterwarnings("ignore", category=UserWarning, module=r"megatron\.")
        parser = megatron_parser()
    # A rejected word is one line, without the usage block of every Megatron flag.
    parser.prog = "python -m training.arguments parse"
    parser.error = types.MethodType(ArgumentParser.error, parser)
    parser.parse_args(args[1:])
    return 0


if __name__ == "__main__":
    from training import quiet

    quiet.install("arguments")   # third-party notices at import: a count, not the console
    raise SystemExit(main())
