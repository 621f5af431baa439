"""The advisor's knowledge, as data: candidate levers per bottleneck, dead ends, defaults.

Nothing here is a measured number. A lever says when it applies, what it sets and why it
works; its measured effect is looked up in docs/levers.json by the toggles it sets. A dead end
says when it is one and why; it cites a levers.json entry where one exists (the `cite`
assignments) and is otherwise worded as a caution.

Thresholds that classify a shape (not measurements): a sequence is "long" from
LONG_SEQUENCE tokens; a trace's data-loading range matters above DATA_RANGE_PCT of the step.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from training.launch.toggles import BY_NAME, step_host_reads

from training.run_description import RunDescription

from .config import available, flce, optimizer_state

LONG_SEQUENCE = 16384
DATA_RANGE_PCT = 5.0
# A lever that costs throughput is proposed for memory only when the estimate says it saves at
# least this share of the peak.
MATERIAL_SAVING = 0.05
# "More GPUs" layouts assume nodes of this many GPUs (the platforms this launcher targets).
GPUS_PER_NODE_ASSUMED = 8

# Flows a candidate can serve.
MEMORY = "memory"
COMPUTE, COMM, IDLE, UNKNOWN = ("compute-bound", "communication-bound", "idle/launch-bound",
                                "unknown")
THROUGHPUT_FLOWS = (COMPUTE, COMM, IDLE, UNKNOWN)


@dataclass(frozen=True)
class Candidate:
    id: str
    title: str
    flows: tuple[str, ...]
    mechanism: str
    # (config, advisor context) -> why it applies here, or None
    applies: Callable[[RunDescription, Any], str | None]
    # run -> (toggles to set, the run with them: _lever)
    change: Callable[[RunDescription], tuple[dict[str, str], RunDescription]]
    costs_throughput: bool = False   # memory levers: a speed cost is expected (recompute, ...)
    baseline: Callable[[RunDescription], dict[str, str]] = lambda c: {}
    # like costs_throughput, pulled only while the estimate does not fit and only for a
    # material saving, but for another cost: the optimizer's numerics or code path change
    only_to_fit: bool = False
    # a last resort: proposed only where the run then fits (CPU offload, whose host memory
    # and speed cost are not worth paying on the way to another lever)
    must_fit: bool = False


def _set(**sets: Any) -> dict[str, str]:
    return {k: str(int(v)) if isinstance(v, bool) else str(v) for k, v in sets.items()}


def _lever(c: RunDescription, follows: dict[str, Any] | None = None,
           **sets: Any) -> tuple[dict[str, str], RunDescription]:
    """A lever's toggles (as the suggested command writes them) and the run with them set;
    `follows`: values that change with them without being set (a default a guard had turned
    off comes back when the guard's reason goes)."""
    return _set(**sets), c.with_values(**sets, **(follows or {}))


# -- memory levers, in the order an engineer pulls them: free ones first ------------------------

def _flce_applies(c: RunDescription, ctx) -> str | None:
    if not c["CROSS_ENTROPY_LOSS_FUSION"] and flce(c.with_values(CROSS_ENTROPY_LOSS_FUSION=True)):
        return "the logits are materialised (CROSS_ENTROPY_LOSS_FUSION=0)"
    return None


def _native_for_memory(c: RunDescription, ctx) -> str | None:
    if c.backend == "local" and c.layout.cp == 1:
        return ("the local backend's unfused attention keeps the s^2 softmax probabilities of "
                "every layer; SDPA keeps none")
    if (c.backend == "transformer_engine" and c.layout.tp == 1 and c.layout.cp == 1
            and c.precision == "bf16" and c["CROSS_ENTROPY_LOSS_FUSION"] and not flce(c)):
        return ("at TP=1 the native backend's fused linear cross-entropy never materialises "
                "the logits (Transformer Engine's path does without Liger)")
    return None


def _grad_bf16_applies(c: RunDescription, ctx) -> str | None:
    return None if c["GRAD_REDUCE_IN_BF16"] else "the gradient buffer is fp32 (4 B per parameter)"


def _dist_opt_applies(c: RunDescription, ctx) -> str | None:
    ranks = c.layout.dp * c.layout.cp
    if not c["DISTRIBUTED_OPTIMIZER"] and not c["FSDP"] and ranks > 1:
        return f"optimizer state is replicated on all {ranks} data-parallel ranks"
    return None


# Optimizer state (training/launch/optimizer_state.py; the guard optimizer_state says where
# each runs). Quantised-weight recipes keep Megatron's own fp32 main params.
_MCORE_MAIN_PARAMS_RECIPES = ("fp8_tensorwise", "mxfp8", "mxfp4", "nvfp4")


def _optimizer_state_possible(c: RunDescription) -> bool:
    return (bool(c["DISTRIBUTED_OPTIMIZER"]) and not c["FSDP"] and c.backend != "local"
            and not optimizer_state(c)[2])


def _remainder_applies(c: RunDescription, ctx) -> str | None:
    if (_optimizer_state_possible(c) and optimizer_state(c)[1] == "fp32"
            and c.precision not in _MCORE_MAIN_PARAMS_RECIPES):
        copy = " and a step-time fp32 copy of the gradients" if c["GRAD_REDUCE_IN_BF16"] else ""
        return f"the fp32 master weights are a 4 B copy per parameter{copy}"
    return None


def _moments_applies(c: RunDescription, ctx) -> str | None:
    if _optimizer_state_possible(c) and optimizer_state(c)[0] == "fp32":
        return "Adam's two moments are fp32 (8 B per parameter)"
    return None


def _stochastic_applies(c: RunDescription, ctx) -> str | None:
    master = optimizer_state(c)[1]
    if (_optimizer_state_possible(c) and master != "stochastic" and c.backend == "native"
            and not available(c, "transformer_engine")):
        return (f"the master weights still take {'2' if master == 'remainder' else '4'} B per "
                "parameter")
    return None


def _offload_applies(c: RunDescription, ctx) -> str | None:
    if (c["DISTRIBUTED_OPTIMIZER"] and not c["FSDP"] and c.backend != "local"
            and not optimizer_state(c)[2]):
        return "the optimizer state stays in GPU memory"
    return None


def _master_weights(cid: str, mode: str, title: str, mechanism: str, applies) -> Candidate:
    """A MASTER_WEIGHTS lever: pulled only while the estimate does not fit."""
    return Candidate(cid, title, (MEMORY,), mechanism, applies,
                     lambda c: _lever(c, MASTER_WEIGHTS=mode),
                     baseline=lambda c: _set(MASTER_WEIGHTS=optimizer_state(c)[1]),
                     only_to_fit=True)


def _mbs_down_applies(c: RunDescription, ctx) -> str | None:
    mbs = c.layout.mbs
    return f"MBS={mbs}: activations grow with the micro-batch" if mbs > 1 else None


def _mbs_down(c: RunDescription) -> tuple[dict[str, str], RunDescription]:
    """The largest smaller micro-batch that fits (estimate) and divides the batch, else 1."""
    from .memory import estimate

    new = 1
    for mbs in range(c.layout.mbs - 1, 1, -1):
        if c.layout.global_batch % (mbs * c.layout.dp) == 0 and \
                estimate(c.with_values(MBS=mbs)).fits:
            new = mbs
            break
    return _lever(c, MBS=new)


def _next_ep(c: RunDescription) -> int | None:
    """The next expert-parallel size the layout allows (it divides the experts, and
    EP x ETP x PP divides the world), or None."""
    from .memory import expert_parallel

    ep, etp = expert_parallel(c)
    world = c.layout.world_size
    for new in range(ep + 1, world + 1):
        if c.model.num_experts % new == 0 and world % (new * etp * c.layout.pp) == 0:
            return new
    return None


def _ep_up_applies(c: RunDescription, ctx) -> str | None:
    if not c.model.moe:
        return None
    new = _next_ep(c)
    if new is None:
        return None
    from .memory import expert_parallel

    return (f"the experts hold most of an MoE model's parameters; EP={new} splits them (and "
            f"their optimizer states) over {new} GPUs instead of {expert_parallel(c)[0]}")


def _ep_up(c: RunDescription) -> tuple[dict[str, str], RunDescription]:
    return _lever(c, EP=_next_ep(c))


def _selective_applies(c: RunDescription, ctx) -> str | None:
    if c["RECOMPUTE"] != "none":
        return None
    if c.backend == "local":
        return "recomputing the attention core drops the stored s^2 probabilities"
    return "recomputing the attention core drops its stored output"


def _full_applies(c: RunDescription, ctx) -> str | None:
    return None if c["RECOMPUTE"] == "full" else "each layer then keeps only its input"


MEMORY_LEVERS: tuple[Candidate, ...] = (
    Candidate("flce", "fused linear cross-entropy", (MEMORY,),
              "computes the loss chunk by chunk from the last hidden states: the "
              "[tokens x vocab] logits are never stored",
              _flce_applies, lambda c: _lever(c, CROSS_ENTROPY_LOSS_FUSION=True),
              baseline=lambda c: _set(CROSS_ENTROPY_LOSS_FUSION=0)),
    Candidate("backend_native_memory", "native backend (SDPA attention, fused linear CE)",
              (MEMORY,),
              "SDPA (cuDNN/flash) attention stores no s^2 scores; at TP=1 the loss is the "
              "fused linear cross-entropy",
              _native_for_memory,
              lambda c: _lever(c, {"CROSS_ENTROPY_LOSS_FUSION": True},
                               TRANSFORMER_IMPL="native"),
              baseline=lambda c: _set(TRANSFORMER_IMPL=c.backend)),
    Candidate("grad_bf16", "bf16 gradient buffer", (MEMORY,),
              "gradients accumulate and reduce in bf16: 2 B per parameter instead of 4",
              _grad_bf16_applies, lambda c: _lever(c, GRAD_REDUCE_IN_BF16=True),
              baseline=lambda c: _set(GRAD_REDUCE_IN_BF16=0)),
    Candidate("dist_opt", "distributed optimizer", (MEMORY,),
              "fp32 main params and Adam moments are sharded over the data-parallel ranks",
              _dist_opt_applies, lambda c: _lever(c, DISTRIBUTED_OPTIMIZER=True),
              baseline=lambda c: _set(DISTRIBUTED_OPTIMIZER=0)),
    _master_weights("master_remainder", "remainder", "fp32 master weights as 16-bit remainders",
                    "Megatron's precision-aware optimizer: the bf16 weights hold the high half "
                    "of the fp32 master and the optimizer the low 16 bits (exact; 2 B instead "
                    "of 4), and the step reads the gradient buffer in place instead of an fp32 "
                    "copy", _remainder_applies),
    Candidate("adam_moments_bf16", "bf16 Adam moments", (MEMORY,),
              "the two moments stored in bf16 (4 B instead of 8 per parameter), updated in "
              "fp32 in registers and rounded to nearest once per step",
              _moments_applies, lambda c: _lever(c, ADAM_MOMENTS_DTYPE="bf16"),
              baseline=lambda c: _set(ADAM_MOMENTS_DTYPE=optimizer_state(c)[0]),
              only_to_fit=True),
    _master_weights("master_stochastic", "stochastic",
                    "bf16 master weights with stochastic rounding",
                    "no master copy: each update is rounded to the bf16 weights stochastically "
                    "(unbiased, so updates below bf16's resolution still move them on average)",
                    _stochastic_applies),
    Candidate("ep_up", "more expert parallelism", (MEMORY,),
              "each rank holds E/EP experts; the tokens travel to them by all-to-all (the "
              "communication grows with EP)",
              _ep_up_applies, _ep_up, costs_throughput=True,
              baseline=lambda c: _set(EP=c.get("EP", 1))),
    Candidate("mbs_down", "smaller micro-batch, same global batch", (MEMORY,),
              "activations scale with the micro-batch; the global batch is kept by more "
              "gradient-accumulation steps",
              _mbs_down_applies, _mbs_down, costs_throughput=True,
              baseline=lambda c: _set(MBS=c.layout.mbs)),
    Candidate("recompute_selective", "selective activation recompute", (MEMORY,),
              "the attention core is recomputed in the backward pass instead of stored",
              _selective_applies, lambda c: _lever(c, RECOMPUTE="selective"),
              costs_throughput=True, baseline=lambda c: _set(RECOMPUTE=c["RECOMPUTE"])),
    # the parallel-layout search runs here (advisor.layout_search)
    Candidate("recompute_full", "full activation recompute", (MEMORY,),
              "every layer is recomputed in the backward pass; each keeps only its input",
              _full_applies, lambda c: _lever(c, RECOMPUTE="full"),
              costs_throughput=True, baseline=lambda c: _set(RECOMPUTE=c["RECOMPUTE"])),
    Candidate("optimizer_cpu_offload", "optimizer state offloaded to the CPU", (MEMORY,),
              "Megatron's HybridDeviceOptimizer keeps the fp32 master weights and moments in "
              "pinned host memory and runs their AdamW on the CPU, copying gradients and "
              "weights each step (it keeps fp32 state: the state dtypes go back to fp32)",
              _offload_applies,
              lambda c: _lever(c, {"OPTIMIZER_OFFLOAD_FRACTION": 1.0}, OPTIMIZER_CPU_OFFLOAD=True,
                               ADAM_MOMENTS_DTYPE="fp32", MASTER_WEIGHTS="fp32"),
              costs_throughput=True, baseline=lambda c: _set(OPTIMIZER_CPU_OFFLOAD=0),
              must_fit=True),
)
LAYOUT_AFTER = "recompute_selective"   # the layout search is tried after this lever


# -- throughput levers ---------------------------------------------------------------------------

def _native_for_speed(c: RunDescription, ctx) -> str | None:
    if c.backend == "local" and c.layout.cp == 1:
        return ("the local backend runs unfused attention (s^2 scores in memory) and torch "
                "norms; the native backend has SDPA/cuDNN attention and fused kernels")
    return None


def _liger_applies(c: RunDescription, ctx) -> str | None:
    if c.backend == "native" and c.kernels == "torch" and available(c, "liger"):
        return "NATIVE_KERNELS=torch while Liger-Kernel is installed"
    return None


CE_CHUNK_MEM_DEFAULT = BY_NAME["CE_CHUNK_MEM"].default


def _ce_chunk_applies(c: RunDescription, ctx) -> str | None:
    chunk = c.get("CE_CHUNK_MEM")   # None: a manifest from before CE_CHUNK_MEM existed
    if flce(c) and c.kernels == "liger" and chunk is not None and chunk < CE_CHUNK_MEM_DEFAULT:
        return (f"CE_CHUNK_MEM={chunk} runs the fused linear cross-entropy in many "
                "small chunks, each a read and write of the whole output-weight gradient")
    return None


def _deterministic_applies(c: RunDescription, ctx) -> str | None:
    return "DETERMINISTIC=1 selects slower deterministic kernels" if c["DETERMINISTIC"] else None


def _recompute_off_applies(c: RunDescription, ctx) -> str | None:
    if c["RECOMPUTE"] == "none":
        return None
    fits = ctx.fits(c.with_values(RECOMPUTE="none"))
    if fits:
        return f"RECOMPUTE={c['RECOMPUTE']} re-runs forward work, and the run fits without it"
    if c["RECOMPUTE"] == "full" and ctx.fits(c.with_values(RECOMPUTE="selective")):
        return "RECOMPUTE=full re-runs every layer; selective fits and recomputes far less"
    return None


def _mbs_up_applies(c: RunDescription, ctx) -> str | None:
    new = c.layout.mbs * 2
    if c.layout.global_batch % (new * c.layout.dp):
        return None
    if ctx.fits(c.with_values(MBS=new)):
        return (f"MBS={new} fits (estimate) and gives each GEMM and kernel launch twice "
                "the tokens")
    return None


def _tp_down_applies(c: RunDescription, ctx) -> str | None:
    if c.layout.tp <= 1:
        return None
    new = c.layout.tp // 2
    changed = c.with_values(TP=new)
    if c.layout.global_batch % (c.layout.mbs * changed.layout.dp):
        return None
    if ctx.fits(changed):
        return (f"TP={new} fits (estimate): less per-layer tensor-parallel communication "
                "and larger GEMMs per GPU")
    return None


def _te_applies(c: RunDescription, ctx) -> str | None:
    if c.backend == "native" and available(c, "transformer_engine"):
        return "Transformer Engine is installed: its fused attention and GEMM paths"
    return None


def _workers_applies(c: RunDescription, ctx) -> str | None:
    pct = ctx.data_range_pct()
    if pct is not None and pct > DATA_RANGE_PCT:
        return f"the trace's train/data range takes {pct:.1f}% of the step"
    return None


def _workers(c: RunDescription) -> tuple[dict[str, str], RunDescription]:
    new = 2 * max(c["NUM_WORKERS"], 1)
    return _lever(c, NUM_WORKERS=new)


def _cuda_graph_applies(c: RunDescription, ctx) -> str | None:
    """Megatron's full-iteration graph, where the guard cuda_graph would take it as it is:
    bf16, and no host read of the GPU inside the step (step_host_reads: the same rule). MoE
    models only: the graph's gain is measured on the lean MoE step; a dense step's is not
    (its fused cross-entropy read the host until session 14, so it was never tried)."""
    if c.get("CUDA_GRAPH", "none") != "none" or c.precision != "bf16":
        return None
    if not c.model.num_experts:
        return None
    reads = step_host_reads(c.get("NAN_CHECK", "step"), c.model.num_experts or 0,
                            bool(c.get("MOE_DEVICE_COUNTS")))
    if reads:
        return None
    return ("the step reads nothing from the GPU on the host, so it can be captured as one "
            "CUDA graph and replayed without a launch per kernel")


THROUGHPUT_LEVERS: tuple[Candidate, ...] = (
    Candidate("backend_native_speed", "native backend instead of Megatron's local spec",
              THROUGHPUT_FLOWS,
              "SDPA (cuDNN) attention, fused RMSNorm, fused QKV RoPE and SwiGLU, fused wgrad "
              "accumulation, fused AdamW and the fused linear cross-entropy",
              _native_for_speed,
              lambda c: _lever(c, {"GRADIENT_ACCUMULATION_FUSION": True},
                               TRANSFORMER_IMPL="native"),
              baseline=lambda c: _set(TRANSFORMER_IMPL=c.backend)),
    Candidate("liger_kernels", "Liger/Triton kernels in the native backend", THROUGHPUT_FLOWS,
              "Triton RMSNorm, RoPE, SwiGLU and fused linear CE instead of plain torch",
              _liger_applies, lambda c: _lever(c, NATIVE_KERNELS="liger"),
              baseline=lambda c: _set(NATIVE_KERNELS="torch")),
    Candidate("ce_chunk", "larger fused cross-entropy chunks", THROUGHPUT_FLOWS,
              "fewer, larger chunks of Liger's fused linear cross-entropy: fewer passes over "
              "the output-weight gradient for a little more transient memory",
              _ce_chunk_applies,
              lambda c: _lever(c, CE_CHUNK_MEM=CE_CHUNK_MEM_DEFAULT),
              baseline=lambda c: _set(CE_CHUNK_MEM=c.get("CE_CHUNK_MEM"))),
    Candidate("deterministic_off", "non-deterministic (default) kernels", THROUGHPUT_FLOWS,
              "deterministic mode forces slower kernels; keep it for debugging only",
              _deterministic_applies, lambda c: _lever(c, DETERMINISTIC=False),
              baseline=lambda c: _set(DETERMINISTIC=1)),
    Candidate("recompute_off", "less activation recompute", THROUGHPUT_FLOWS,
              "recompute buys memory with forward work; drop it where memory allows",
              _recompute_off_applies,
              lambda c: _lever(c, RECOMPUTE="selective" if c["RECOMPUTE"] == "full"
                               and not _fits_none(c) else "none"),
              baseline=lambda c: _set(RECOMPUTE=c["RECOMPUTE"])),
    Candidate("tp_down", "less tensor parallelism", (COMM, COMPUTE, UNKNOWN),
              "tensor parallelism adds communication inside every layer and shrinks the "
              "GEMMs; use the smallest TP that fits",
              _tp_down_applies,
              lambda c: _lever(c, TP=c.layout.tp // 2),
              baseline=lambda c: _set(TP=c.layout.tp)),
    Candidate("mbs_up", "larger micro-batch", (COMPUTE, IDLE, COMM, UNKNOWN),
              "more tokens per GEMM and per kernel launch, fewer accumulation steps per "
              "gradient reduce",
              _mbs_up_applies, lambda c: _lever(c, MBS=c.layout.mbs * 2),
              baseline=lambda c: _set(MBS=c.layout.mbs)),
    Candidate("cuda_graph", "full-iteration CUDA graph", (IDLE, UNKNOWN),
              "Megatron captures each micro-batch's forward and backward once and replays "
              "them: the host's kernel launches leave the step",
              _cuda_graph_applies, lambda c: _lever(c, CUDA_GRAPH="full_iteration"),
              baseline=lambda c: _set(CUDA_GRAPH="none")),
    Candidate("te_backend", "Transformer Engine backend", (COMPUTE, UNKNOWN),
              "TE's fused attention, LayerNorm-linear and GEMM kernels",
              _te_applies, lambda c: _lever(c, TRANSFORMER_IMPL="transformer_engine"),
              baseline=lambda c: _set(TRANSFORMER_IMPL="native")),
    Candidate("data_workers", "more data-loader workers", (IDLE, UNKNOWN),
              "the GPU waits while the host fetches the batch",
              _workers_applies, _workers),
)

# Perf toggles the user switched off (source env/cli) are candidates too: set them back to 1.
# Built per run by the advisor from the manifest's toggle rows and the registry. Besides the
# performance group, these; they all act across data-parallel ranks (at DP*CP=1 the
# distributed optimizer shards nothing and nothing is reduced or gathered), so they stay off
# there.
ON_TOGGLES_FOR_SPEED = ("DISTRIBUTED_OPTIMIZER", "OVERLAP_GRAD_REDUCE", "OVERLAP_PARAM_GATHER")
# MoE models: the default-on MoE toggles a user switched off are recommended back (their
# measured rows: docs/levers.md, the moe-levers parts)
MOE_ON_TOGGLES = ("MOE_GROUPED_GEMM", "MOE_PERMUTE_FUSION")


def _fits_none(c: RunDescription) -> bool:
    from .memory import estimate

    est = estimate(c.with_values(RECOMPUTE="none"))
    return bool(est.fits)


# -- dead ends -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DeadEnd:
    id: str
    title: str
    when: Callable[[RunDescription, Any], bool]
    caution: Callable[[RunDescription, Any], str]    # words; numbers only from the run or estimate
    cite: dict[str, str] = field(default_factory=dict)  # levers.json entry to quote, if any
    superseded_by: str | None = None   # a lever whose measured quote says it instead


def _launch_bound_caution(c: RunDescription, ctx) -> str:
    idle = ctx.trace_pct("idle_pct")
    where = (f"the trace shows {idle:.1f}% idle, so launch overhead is not what limits the step"
             if idle is not None else "without a trace nothing shows the step is launch-bound")
    return (f"CUDA graphs / torch.compile mode='reduce-overhead' only remove kernel-launch "
            f"overhead: {where}; the launcher has no such toggle. Do not chase it.")


def _lowp_when(c: RunDescription, ctx) -> bool:
    return c.precision == "bf16"


def _lowp_caution(c: RunDescription, ctx) -> str:
    if not available(c, "transformer_engine"):
        return ("fp8/fp4 recipes need Transformer Engine, which this platform's capabilities "
                "do not list: the launcher refuses them here. Low-precision compute is not a "
                "lever on this node.")
    return ("low-precision compute (PRECISION=fp8/mxfp8/...) is no throughput lever until it "
            "is measured faster at this shape: small GEMMs and the casts can make it slower, "
            "and it changes numerics.")


def _recompute_for_speed_when(c: RunDescription, ctx) -> bool:
    return ctx.bottleneck != "memory-bound" and c["RECOMPUTE"] == "none"


def _recompute_for_speed_caution(c: RunDescription, ctx) -> str:
    return ("activation recompute buys memory with extra forward work (full recompute runs "
            "the forward pass twice); with memory to spare it only slows the step.")


def _selective_flash_when(c: RunDescription, ctx) -> bool:
    return ctx.bottleneck == "memory-bound" and c.backend != "local" and c["RECOMPUTE"] == "none"


def _selective_flash_caution(c: RunDescription, ctx) -> str:
    from .memory import activation_bytes_per_token

    none = sum(activation_bytes_per_token(c, "none").values())
    selective = sum(activation_bytes_per_token(c, "selective").values())
    share = 100 * (none - selective) / none if none else 0.0
    return ("selective recompute was designed for the s^2 attention scores; SDPA/flash "
            f"attention does not store them, so it drops only {share:.0f}% of each layer's "
            "stored activations here (estimate), at the price of recomputing attention.")


def _global_batch_when(c: RunDescription, ctx) -> bool:
    return ctx.asked.get("global_batch") is not None


def _global_batch_caution(c: RunDescription, ctx) -> str:
    return ("a bigger global batch is more gradient accumulation: per-GPU memory depends on "
            "the micro-batch (MBS), not on BS; what it changes is the step time and the "
            "optimizer's batch.")


def _te_ce_when(c: RunDescription, ctx) -> bool:
    return not flce(c) and c["CROSS_ENTROPY_LOSS_FUSION"]


def _te_ce_caution(c: RunDescription, ctx) -> str:
    return ("CROSS_ENTROPY_FUSION_IMPL=te is refused: megatron-core 0.19.2's validate_args "
            "disables Transformer Engine's cross-entropy fusion ('stability issues').")


def _tp_over_nodes_when(c: RunDescription, ctx) -> bool:
    return c.layout.tp > c.layout.gpus_per_node


def _tp_over_nodes_caution(c: RunDescription, ctx) -> str:
    return (f"TP={c.layout.tp} spans more than one node ({c.layout.gpus_per_node} GPUs per "
            "node): tensor parallelism communicates inside every layer and belongs inside a node; use PP "
            "or more data parallelism across nodes.")


DEAD_ENDS: tuple[DeadEnd, ...] = (
    DeadEnd("reduce_overhead", "CUDA graphs / torch.compile reduce-overhead",
            lambda c, ctx: ctx.split != IDLE,
            _launch_bound_caution, cite={"TORCH_COMPILE": "reduce-overhead"}),
    DeadEnd("low_precision_compute", "low-precision (fp8/fp4) compute for speed", _lowp_when,
            _lowp_caution, cite={"PRECISION": "fp8"}, superseded_by="precision_recipe"),
    DeadEnd("recompute_for_speed", "activation recompute when memory is not the limit",
            _recompute_for_speed_when, _recompute_for_speed_caution,
            cite={"RECOMPUTE": "full"}),
    DeadEnd("selective_on_flash", "selective recompute as a memory lever on SDPA/TE attention",
            _selective_flash_when, _selective_flash_caution, cite={"RECOMPUTE": "selective"}),
    DeadEnd("global_batch_for_memory", "changing the global batch to change memory",
            _global_batch_when, _global_batch_caution),
    DeadEnd("te_cross_entropy", "Transformer Engine's cross-entropy fusion", _te_ce_when,
            _te_ce_caution),
    DeadEnd("tp_across_nodes", "tensor parallelism across nodes", _tp_over_nodes_when,
            _tp_over_nodes_caution),
)

# Toggles confirmed in "already on" (besides the registry's perf toggles), with the value that
# counts as on.
CONFIRM_TOGGLES: dict[str, tuple[str, ...]] = {
    "DISTRIBUTED_OPTIMIZER": ("1",),
    "OVERLAP_GRAD_REDUCE": ("1",),
    "OVERLAP_PARAM_GATHER": ("1",),
    "SEQUENCE_PARALLEL": ("1",),
    "NATIVE_KERNELS": ("liger",),
    "TRANSFORMER_IMPL": ("native", "transformer_engine"),
}
