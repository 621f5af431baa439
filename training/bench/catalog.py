"""Every lever the harness knows: one change against the launcher's default, and how its
effect is reported.

A lever is measured as one *variant* run (the launcher default plus `env`) against the
*default* run of the same shape, in the same invocation. Its effect is reported the way a
user reads it: the tokens/s ratio of `set` over `baseline`. For a default-on toggle the
default is the `set` side (GRAD_REDUCE_IN_BF16=1 vs =0); for a lever a user opts into
(RECOMPUTE=full) the variant is the `set` side.

The five default-on toggles come from the registry (training.launch.toggles.PERF_TOGGLES),
the precision recipes from training.launch.recipes.RECIPES: nothing here redefines a knob.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import training.moe.gpt_oss  # noqa: F401 - registers gpt_oss (GPT_OSS_SHAPE)
import training.moe.presets  # noqa: F401 - registers the MoE families (the MoE parts' shape)
from training.launch.recipes import RECIPES
from training.launch.toggles import LAUNCHER, PERF_TOGGLES, REGISTRY
from training.optimize.levers import KINDS  # levers.json kinds: the reader's schema, one list

from .shape import BenchShape


@dataclass(frozen=True)
class Lever:
    key: str                    # unique: the variant's change, e.g. "RECOMPUTE=full"
    id: str                     # the toggle to set, e.g. "RECOMPUTE"
    kind: str                   # one of KINDS
    group: str                  # --levers selection name
    env: dict = field(default_factory=dict)  # the variant run's changes to the default
    set: str = ""               # the setting whose effect is reported
    baseline: str = ""          # what it is compared with
    default_is_set: bool = True  # the default run is the `set` side
    needs_dp: bool = False      # only acts with data parallelism (DP>1)
    needs_backend: str | None = None  # only means something on this backend
    note: str = ""
    over: str | None = None     # the key of another lever of the same part whose run is the
    #                             baseline instead of the default run: the effect at that setting

    @property
    def label(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.env.items())


def _switched_off(name: str, kind: str, group: str, note: str, needs_dp: bool = False) -> Lever:
    """A default-on toggle's lever: its variant sets it to 0, its effect is reported for 1."""
    return Lever(key=name, id=name, kind=kind, group=group, env={name: "0"}, set=f"{name}=1",
                 baseline=f"{name}=0", default_is_set=True, needs_dp=needs_dp, note=note)


def toggle_levers() -> list[Lever]:
    """Each default-on performance toggle, switched off."""
    out = []
    for t in PERF_TOGGLES:
        flce = t.name == "CROSS_ENTROPY_LOSS_FUSION"
        out.append(_switched_off(
            t.name, "flce" if flce else "toggle", "flce" if flce else "toggles",
            needs_dp=t.name == "DDP_AVERAGE_IN_COLLECTIVE",
            note=("fused linear cross-entropy (never materialises the logits) vs plain "
                  "cross-entropy on the native backend; one of the five default-on toggles"
                  if flce else "default-on performance toggle")))
    return out


def precision_levers() -> list[Lever]:
    """Each low-precision recipe against bf16 (guards refuse those the node cannot run)."""
    return [Lever(key=f"PRECISION={name}", id="PRECISION", kind="precision", group="precision",
                  env={"PRECISION": name}, set=f"PRECISION={name}", baseline="PRECISION=bf16",
                  default_is_set=False, note=f"{recipe.kind} recipe")
            for name, recipe in RECIPES.items() if name != "bf16"]


def other_levers(shape: BenchShape) -> list[Lever]:
    mbs2, seq2 = shape.mbs * 2, shape.seq_length // 2
    return [
        Lever("TRANSFORMER_IMPL=local", "TRANSFORMER_IMPL", "backend", "backend",
              {"TRANSFORMER_IMPL": "local"}, "TRANSFORMER_IMPL={default}",
              "TRANSFORMER_IMPL=local", True,
              note="Megatron-core's local spec (no TE) vs the launcher's default backend"),
        Lever("TRANSFORMER_IMPL=transformer_engine", "TRANSFORMER_IMPL", "backend", "backend",
              {"TRANSFORMER_IMPL": "transformer_engine"}, "TRANSFORMER_IMPL=transformer_engine",
              "TRANSFORMER_IMPL={default}", False,
              note="Transformer Engine layers where TE imports"),
        Lever("TRANSFORMER_IMPL=native", "TRANSFORMER_IMPL", "backend", "backend",
              {"TRANSFORMER_IMPL": "native"}, "TRANSFORMER_IMPL=native",
              "TRANSFORMER_IMPL={default}", False,
              note="the native backend (SDPA + Liger/Triton kernels) where the default is "
                   "another (Transformer Engine where it imports)"),
        Lever("NATIVE_KERNELS=torch", "NATIVE_KERNELS", "kernels", "kernels",
              {"NATIVE_KERNELS": "torch"}, "NATIVE_KERNELS={default}", "NATIVE_KERNELS=torch",
              True, needs_backend="native",
              note="Liger/Triton kernels vs plain torch ops in the native backend"),
        Lever("CE_CHUNK_MEM=1", "CE_CHUNK_MEM", "flce", "flce_chunk", {"CE_CHUNK_MEM": "1"},
              "CE_CHUNK_MEM={default}", "CE_CHUNK_MEM=1", True, needs_backend="native",
              note="the fused linear cross-entropy in the launcher's chunks vs Liger's default "
                   "(32 chunks of 256 tokens at 128k vocabulary, seq 8192)"),
        Lever("CE_CHUNK_MEM=32", "CE_CHUNK_MEM", "flce", "flce_chunk", {"CE_CHUNK_MEM": "32"},
              "CE_CHUNK_MEM=32", "CE_CHUNK_MEM={default}", False, needs_backend="native",
              note="the fused linear cross-entropy in one chunk per micro-batch at seq 8192 "
                   "(more transient memory) vs the launcher's chunks"),
        Lever("NAN_CHECK=bucket", "NAN_CHECK", "toggle", "nan_check",
              {"NAN_CHECK": "bucket"}, "NAN_CHECK=step", "NAN_CHECK=bucket", True,
              note="one NaN/Inf check of the loss and global gradient norm per iteration vs "
                   "Megatron's per-bucket check (a host-GPU sync per gradient bucket)"),
        Lever("MANUAL_GC_INTERVAL=100", "MANUAL_GC_INTERVAL", "toggle", "gc",
              {"MANUAL_GC_INTERVAL": "100"}, "MANUAL_GC_INTERVAL=100", "MANUAL_GC_INTERVAL=0",
              False, note="Megatron's manual garbage collection every 100 iterations vs "
                          "Python's automatic collector"),
        Lever("RECOMPUTE=selective", "RECOMPUTE", "recompute", "recompute",
              {"RECOMPUTE": "selective"}, "RECOMPUTE=selective", "RECOMPUTE=none", False,
              note="recompute the attention core in the backward pass (memory for time)"),
        Lever("RECOMPUTE=full", "RECOMPUTE", "recompute", "recompute",
              {"RECOMPUTE": "full"}, "RECOMPUTE=full", "RECOMPUTE=none", False,
              note="recompute every layer in the backward pass (memory for time)"),
        Lever("MBS", "MBS", "mbs", "mbs", {"MBS": str(mbs2)}, f"MBS={mbs2}",
              f"MBS={shape.mbs}", False,
              note=f"micro-batch {mbs2} vs {shape.mbs} at the same global batch"),
        Lever("SEQ_LENGTH", "SEQ_LENGTH", "seq", "seq", {"SEQ_LENGTH": str(seq2)},
              f"SEQ_LENGTH={seq2}", f"SEQ_LENGTH={shape.seq_length}", False,
              note="same global batch in sequences (half the tokens per step); "
                   "model TFLOP/s ratio given too, FLOPs per token differ"),
        Lever("DISTRIBUTED_OPTIMIZER", "DISTRIBUTED_OPTIMIZER", "dist_opt", "dist_opt",
              {"DISTRIBUTED_OPTIMIZER": "0"}, "DISTRIBUTED_OPTIMIZER=1",
              "DISTRIBUTED_OPTIMIZER=0", True, needs_dp=True,
              note="optimizer state sharded over DP ranks; with it off, OVERLAP_PARAM_GATHER "
                   "is turned off by the optimizer_overlap guard"),
        Lever("DP1_PLAIN_DDP", "DISTRIBUTED_OPTIMIZER", "dist_opt", "dp1_ddp",
              {"DISTRIBUTED_OPTIMIZER": "0", "OVERLAP_GRAD_REDUCE": "0",
               "OVERLAP_PARAM_GATHER": "0"},
              "DISTRIBUTED_OPTIMIZER=0 OVERLAP_GRAD_REDUCE=0 OVERLAP_PARAM_GATHER=0",
              "DISTRIBUTED_OPTIMIZER=1 OVERLAP_GRAD_REDUCE=1 OVERLAP_PARAM_GATHER=1", False,
              note="at one GPU the distributed optimizer shards nothing and the overlapped "
                   "reduce and gather have nothing to overlap, but their per-bucket hooks "
                   "still run on the host (the H200 profile: 52 grad-reduce and 434 "
                   "param-gather ranges per step); the plain optimizer without them"),
        Lever("OVERLAP_GRAD_REDUCE", "OVERLAP_GRAD_REDUCE", "overlap", "overlap",
              {"OVERLAP_GRAD_REDUCE": "0"}, "OVERLAP_GRAD_REDUCE=1", "OVERLAP_GRAD_REDUCE=0",
              True, needs_dp=True,
              note="grad reduce overlapped with backward; with it off, OVERLAP_PARAM_GATHER "
                   "is turned off by the optimizer_overlap guard"),
        Lever("OVERLAP_PARAM_GATHER", "OVERLAP_PARAM_GATHER", "overlap", "overlap",
              {"OVERLAP_PARAM_GATHER": "0"}, "OVERLAP_PARAM_GATHER=1",
              "OVERLAP_PARAM_GATHER=0", True, needs_dp=True,
              note="param all-gather overlapped with forward (distributed optimizer)"),
        Lever("BIAS_DROPOUT_FUSION=0", "BIAS_DROPOUT_FUSION", "toggle", "bda",
              {"BIAS_DROPOUT_FUSION": "1"}, "BIAS_DROPOUT_FUSION=0", "BIAS_DROPOUT_FUSION=1",
              True, needs_backend="native",
              note="the residual adds eager (the native default) vs Megatron's "
                   "torch.compile'd bias-dropout-add around the same add"),
        *optimizer_state_levers(),
    ]


def optimizer_state_levers() -> list[Lever]:
    """Megatron's precision-aware optimizer (training/launch/optimizer_state.py) against its
    fp32 state, and its CPU offload."""
    fp32 = "ADAM_MOMENTS_DTYPE=fp32 MASTER_WEIGHTS=fp32"

    def state(key, env, note):
        return Lever(key, next(iter(env)), "optimizer", "optimizer_state", env, _words(env),
                     " ".join(w for w in fp32.split() if w.split("=")[0] in env), False,
                     note=note)

    return [
        state("MASTER_WEIGHTS=remainder", {"MASTER_WEIGHTS": "remainder"},
              "the fp32 master as 16-bit remainders beside the bf16 weights (exact), fp32 "
              "moments; the step reads the gradient buffer in place"),
        state("ADAM_MOMENTS_DTYPE=bf16", {"ADAM_MOMENTS_DTYPE": "bf16"},
              "bf16 Adam moments, fp32 master copy"),
        state("OPT_STATE_BF16", _OPT_STATE_BF16,
              "bf16 moments and 16-bit-remainder masters: 6 B of state per parameter instead "
              "of 12 (the advisor's first memory levers for the full model on one GPU)"),
        state("OPT_STATE_BF16_SR", {"ADAM_MOMENTS_DTYPE": "bf16",
                                    "MASTER_WEIGHTS": "stochastic"},
              "bf16 moments, no master copy: bf16 weights updated with stochastic rounding "
              "(4 B of state per parameter, the HF peers' footprint)"),
        Lever("OPTIMIZER_CPU_OFFLOAD=1", "OPTIMIZER_CPU_OFFLOAD", "optimizer", "optimizer_state",
              {"OPTIMIZER_CPU_OFFLOAD": "1"}, "OPTIMIZER_CPU_OFFLOAD=1",
              "OPTIMIZER_CPU_OFFLOAD=0", False,
              note="Megatron's HybridDeviceOptimizer: fp32 master and moments of every "
                   "parameter in pinned host memory, their AdamW on the CPU"),
    ]


def moe_levers() -> list[Lever]:
    """MoE models only (the MoE parts' shape): their default-on toggles, switched off."""
    return [
        _switched_off("MOE_GROUPED_GEMM", "toggle", "moe",
                      "the experts as grouped GEMMs (native: torch's grouped_mm; TE: its "
                      "grouped linear) vs Megatron's SequentialMLP, one GEMM pair per expert "
                      "in turn"),
        _switched_off("MOE_PERMUTE_FUSION", "toggle", "moe",
                      "the dispatcher's permute/unpermute as gathers (native: the atomic-free "
                      "gather-sum; TE: its fused permute) vs Megatron's torch scatter-add"),
        Lever("MOE_DEVICE_COUNTS=1", "MOE_DEVICE_COUNTS", "toggle", "moe",
              {"MOE_DEVICE_COUNTS": "1"}, "MOE_DEVICE_COUNTS=1", "MOE_DEVICE_COUNTS=0", False,
              needs_backend="native",
              note="the tokens per expert left on the GPU vs Megatron's copy to the host and "
                   "wait for the GPU in each MoE layer's dispatch (EP = TP = 1)"),
        _switched_off("MOE_LEAN_STEP", "toggle", "moe",
                      "the MoE launch's lean step (MOE_DEVICE_COUNTS=1, Megatron's "
                      "cross-entropy, bf16 moments, remainder masters, where no host "
                      "synchronisation is left) vs the core defaults"),
        Lever("CUDA_GRAPH=full_iteration", "CUDA_GRAPH", "toggle", "moe",
              {"CUDA_GRAPH": "full_iteration"}, "CUDA_GRAPH=full_iteration", "CUDA_GRAPH=none",
              False, note="Megatron's full-iteration CUDA graph of the lean MoE step (one "
                          "launch per micro-batch's forward and backward) vs the eager step"),
        Lever("MOE_WGRAD_FUSION=1", "MOE_WGRAD_FUSION", "toggle", "moe",
              {"MOE_WGRAD_FUSION": "1"}, "MOE_WGRAD_FUSION=1", "MOE_WGRAD_FUSION=0", False,
              needs_backend="native",
              note="the experts' weight gradients added into main_grad by the Triton kernel "
                   "vs grouped_mm's whole gradient then DDP's add"),
        Lever("MOE_EXPERT_IMPL=te", "MOE_EXPERT_IMPL", "toggle", "moe",
              {"MOE_EXPERT_IMPL": "te"}, "MOE_EXPERT_IMPL=native", "MOE_EXPERT_IMPL=te", True,
              needs_backend="transformer_engine",
              note="TE backend: the native grouped experts (torch grouped_mm, the native "
                   "permute and the lean step they allow) vs Megatron's TEGroupedMLP on TE's "
                   "grouped linear (TE's fused permute, host counts, the core defaults)"),
        Lever("PRECISION=fp8+MOE_EXPERT_IMPL=te", "PRECISION", "precision", "moe",
              {"PRECISION": "fp8", "MOE_EXPERT_IMPL": "te"}, "PRECISION=fp8 MOE_EXPERT_IMPL=te",
              "PRECISION=bf16", False, needs_backend="transformer_engine",
              note="fp8 (delayed scaling) with the experts in TE's fp8 grouped linear too, vs "
                   "bf16 (PRECISION=fp8 alone keeps the native experts in bf16)"),
        Lever("PRECISION=fp8+MBS=2", "PRECISION", "precision", "moe",
              {"PRECISION": "fp8", "MBS": "2"}, "PRECISION=fp8 MBS=2", "PRECISION=bf16 MBS=2",
              False, needs_backend="transformer_engine", over="MBS",
              note="fp8 (delayed scaling, the native experts in bf16) against bf16, both at "
                   "micro-batch 2: the baseline is the same part's MBS run (issue 37: MoE fp8 "
                   "at MBS 1 and 2)"),
        Lever("MOE_SYNC_FREE", "MOE_DEVICE_COUNTS", "toggle", "moe", _SYNC_FREE,
              _words(_SYNC_FREE), "MOE_DEVICE_COUNTS=0 CROSS_ENTROPY_LOSS_FUSION=1", False,
              needs_backend="native",
              note="no host synchronisation left in the step: the tokens per expert on the GPU "
                   "and Megatron's cross-entropy instead of Liger's fused linear one (which "
                   "reads its token count on the host once per micro-batch)"),
        Lever("MOE_SYNC_FREE+OPT_STATE_BF16", "MOE_DEVICE_COUNTS", "toggle", "moe",
              {**_SYNC_FREE, **_OPT_STATE_BF16}, _words({**_SYNC_FREE, **_OPT_STATE_BF16}),
              "the default", False, needs_backend="native",
              note="the sync-free step with bf16 moments and 16-bit-remainder masters (the "
                   "configuration of session 11's CUDA-graph try)"),
        Lever("ADAM_IMPL=native", "ADAM_IMPL", "toggle", "moe", {"ADAM_IMPL": "native"},
              "ADAM_IMPL=native", "ADAM_IMPL=auto", False,
              note="with TE on the path: the lean step's precision-aware optimizer in the "
                   "native MixedPrecisionAdamW vs TE's FusedAdam (what Megatron builds where TE "
                   "imports; the recorded traces put TE's step at over twice ours)"),
    ]


_SYNC_FREE = {"MOE_DEVICE_COUNTS": "1", "CROSS_ENTROPY_LOSS_FUSION": "0"}
_OPT_STATE_BF16 = {"ADAM_MOMENTS_DTYPE": "bf16", "MASTER_WEIGHTS": "remainder"}


def _words(env: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in env.items())


def dispatcher_levers() -> list[Lever]:
    """MoE with expert parallelism (EP>1): the token dispatchers against the default
    (all-to-all over the EP ranks). flex is DeepEP's: refused by a guard where it is not
    installed."""
    return [Lever(f"MOE_TOKEN_DISPATCHER={name}", "MOE_TOKEN_DISPATCHER", "toggle", "moe",
                  {"MOE_TOKEN_DISPATCHER": name}, f"MOE_TOKEN_DISPATCHER={name}",
                  "MOE_TOKEN_DISPATCHER=alltoall", False, note=note)
            for name, note in (
                ("allgather", "every rank gathers all tokens of the EP group and keeps its "
                              "experts' vs the all-to-all that sends each token to its experts"),
                ("flex", "DeepEP's fused dispatch and combine kernels vs the all-to-all"))]


def documents_levers() -> list[Lever]:
    """Documents kept apart (issue 51) against plain causal attention, on the benchmark's mock
    data: Megatron's MockGPTDataset packs documents of 1 to 4095 tokens (uniform, EOD-ended;
    ~2k mean, so ~4 per sequence at seq 8192). Block-causal attention over them skips the
    blocks across documents; the packed (THD) layout also turns the fused QKV RoPE off (the
    guard document_mask), which this ratio includes: what a user pays or gains, all told."""
    return [Lever("DOCUMENT_MASK=1", "DOCUMENT_MASK", "toggle", "documents",
                  {"DOCUMENT_MASK": "1"}, "DOCUMENT_MASK=1", "DOCUMENT_MASK=0", False,
                  note="documents kept apart (block-causal over mock data's ~2k-token "
                       "documents at seq 8192: native flex attention, TE's THD attention) vs "
                       "plain causal attention across them")]


def checkpoint_levers() -> list[Lever]:
    """A checkpoint's cost to the training step: the async save against the sync one (at a
    shape that saves inside the measured steps: SAVE_SHAPE)."""
    return [Lever("ASYNC_SAVE=1", "ASYNC_SAVE", "checkpoint", "checkpoint",
                  {"ASYNC_SAVE": "1"}, "ASYNC_SAVE=1", "ASYNC_SAVE=0", False,
                  note="Megatron's --async-save (persistent worker, megatron-core's strategy): "
                       "the step after a save waits for the copy to host memory only")]


def all_levers(shape: BenchShape) -> list[Lever]:
    return (toggle_levers() + precision_levers() + other_levers(shape) + moe_levers()
            + dispatcher_levers() + documents_levers() + checkpoint_levers())


GROUPS = ("toggles", "flce", "flce_chunk", "nan_check", "gc", "bda", "precision", "backend",
          "kernels", "recompute", "mbs", "seq", "dist_opt", "dp1_ddp", "overlap",
          "optimizer_state", "moe", "documents", "checkpoint")

# Peers: sides of `bench peers` (levers.json kind "peer"; native vs local is also the
# TRANSFORMER_IMPL=local backend lever).
PEER_SIDES = {
    "native": "ours: launcher default (native backend: SDPA + Liger/Triton kernels)",
    "transformer_engine": "ours: Transformer Engine backend",
    "auto": "ours: every default with Transformer Engine installed (TRANSFORMER_IMPL=auto picks "
            "the backend by the launch's rule)",
    "local": "Megatron-core local spec (stock Megatron without TE), through our launcher",
    "hf": "HF transformers' model of the family (LlamaForCausalLM; Qwen3MoeForCausalLM, "
          "MixtralForCausalLM or GptOssForCausalLM for MoE), SDPA (flex attention for gpt-oss's "
          "sinks), bf16 params, fused AdamW",
    "hf_compile": "HF transformers' model of the family (LlamaForCausalLM; Qwen3MoeForCausalLM, "
                  "MixtralForCausalLM or GptOssForCausalLM for MoE), SDPA (flex attention for "
                  "gpt-oss's sinks), each decoder layer under torch.compile, bf16 params, "
                  "fused AdamW",
    "hf_liger": "HF transformers' model of the family (LlamaForCausalLM; Qwen3MoeForCausalLM, "
                "MixtralForCausalLM or GptOssForCausalLM for MoE), SDPA + Liger-Kernel, bf16, "
                "fused AdamW",
    "torchtitan": "torchtitan's trainer (its llama3 model; its Qwen3 model with MoE for MoE), "
                  "bf16 autocast, fused AdamW, torch.compile",
    "megatron_te": "Megatron-LM with Transformer Engine: Megatron's TE spec at Megatron's own "
                   "defaults (through our launcher: each toggle at the value that emits no flag; "
                   "without apex the output layer's fused wgrad is the native cuBLAS GEMM, the "
                   "same operation as apex's)",
    "native_no_te": "ours: the native backend with Transformer Engine taken off the Python path "
                    "(what TE's presence on the image costs the native backend: where TE "
                    "imports, Megatron's optimizer and multi-tensor kernels are TE's)",
}
PEER_KEYS = ("peer:hf", "peer:hf_liger", "peer:hf_compile", "peer:torchtitan",
             "peer:megatron_te", "peer:native_no_te")
SIDE_LABELS = {"megatron_te": "Megatron-LM with Transformer Engine"}   # README headline rows


# Toggles that emit a flag either way (Megatron has no flag for them; ours sets its
# TransformerConfig field): the value of Megatron's own field default (a test reads it).
MEGATRON_FIELD_DEFAULTS = {"FUSED_SINGLE_QKV_ROPE": "0"}   # fused_single_qkv_rope: False


def megatron_defaults() -> dict[str, str]:
    """The launcher's toggles at Megatron's own defaults: every on/off performance and
    data-parallel toggle at the value that emits no flag (the registry says which), or, for
    one that emits a flag either way, at Megatron's field default; and Megatron's per-bucket
    NaN check."""
    env = {}
    for toggle in REGISTRY:
        if (toggle.kind != "bool" or toggle.emitted_by or toggle.bucket == LAUNCHER
                or toggle.default is None or toggle.group not in ("performance", "parallel")):
            continue
        if toggle.on and not toggle.off:
            env[toggle.name] = "0"
        elif toggle.off and not toggle.on:
            env[toggle.name] = "1"
        else:
            env[toggle.name] = MEGATRON_FIELD_DEFAULTS[toggle.name]
    env["NAN_CHECK"] = "bucket"
    return env


# Peer sides that are our launcher with other settings: side -> its toggles (NotRunnable where
# the side cannot run here). Those in OURS_PEERS_TAKE_OURS_ENV take a suite's ours_env too
# (they are ours with one thing changed; Megatron-LM's defaults are not).
OURS_PEERS = {"megatron_te": lambda: {"TRANSFORMER_IMPL": "transformer_engine",
                                      **megatron_defaults()},
              "native_no_te": lambda: {"TRANSFORMER_IMPL": "native",
                                       "PYTHONPATH": _python_path_without_te()}}
OURS_PEERS_TAKE_OURS_ENV = ("native_no_te",)


def _python_path_without_te() -> str:
    from .ours import python_path_without_te   # (runs a probe: only when the side is planned)

    return python_path_without_te()


def select(shape: BenchShape, only: list[str] | None, groups: list[str] | None,
           keys: list[str] | None = None) -> list[Lever]:
    """The levers of one `bench toggles` invocation.

    only    default-on toggle names (default: all five)
    groups  lever groups (GROUPS; 'all'; default: precision), e.g. recompute,mbs
    keys    explicit lever keys; replaces both
    """
    levers = all_levers(shape)
    by_key = {lv.key: lv for lv in levers}
    if keys == ["default"]:  # the launcher default alone (a headline number, no lever)
        return []
    if keys:
        unknown = [k for k in keys if k not in by_key]
        if unknown:
            raise ValueError(f"unknown lever key(s) {', '.join(unknown)}: use one of "
                             f"{', '.join(by_key)}")
        return [by_key[k] for k in keys]
    toggle_names = [t.name for t in PERF_TOGGLES]
    if only is None:
        only = toggle_names
    bad = [n for n in only if n not in toggle_names]
    if bad:
        raise ValueError(f"--only takes default-on toggles ({', '.join(toggle_names)}); "
                         f"not {', '.join(bad)}")
    if groups is None:
        groups = ["precision"]
    if "all" in groups:
        groups = [g for g in GROUPS if g not in ("toggles", "flce", "moe", "checkpoint")]
    if "none" in groups:
        groups = []
    bad = [g for g in groups if g not in GROUPS]
    if bad:
        raise ValueError(f"unknown lever group(s) {', '.join(bad)}: use {', '.join(GROUPS)}, "
                         "all or none")
    chosen = [lv for lv in toggle_levers() if lv.id in only]
    chosen += [lv for lv in levers if lv.group in groups and lv not in chosen]
    return chosen


# `bench all`: parts small enough for one ~9-minute command each (a shared default run plus
# two measured variants, three repeats: 9 launcher runs), in the order they are worth most.
# Refused variants (precision recipes a node cannot run) cost no GPU time and ride along.
PARTS_DP1 = (
    ("toggles-a", ("GRADIENT_ACCUMULATION_FUSION", "NAN_CHECK=bucket",
                   *[f"PRECISION={n}" for n in RECIPES if n != "bf16"],
                   "TRANSFORMER_IMPL=transformer_engine")),
    ("toggles-b", ("FUSED_SINGLE_QKV_ROPE", "GRAD_REDUCE_IN_BF16")),
    # toggles-c (CROSS_ENTROPY_LOSS_FUSION, SEQ_LENGTH; session 3) measured the fused CE at
    # Liger's chunking: toggles-ce re-measures it at CE_CHUNK_MEM=8, levers-seq the sequence
    ("toggles-ce", ("CROSS_ENTROPY_LOSS_FUSION",)),
    # measured with CE_CHUNK_MEM=1 the default (keys CE_CHUNK_MEM=8, =32; session 4), whence
    # the default of 8; a re-measure (--force) compares Liger's own chunking and 32 with it
    ("levers-ce-chunk", ("CE_CHUNK_MEM=1", "CE_CHUNK_MEM=32")),
    ("levers-kernels-mbs", ("NATIVE_KERNELS=torch", "MBS")),
    ("levers-recompute", ("RECOMPUTE=selective", "RECOMPUTE=full")),
    # DDP_AVERAGE_IN_COLLECTIVE acts at DP>1 only: measured in dp2-comm, not here
    ("levers-ddp-gc", ("DP1_PLAIN_DDP", "MANUAL_GC_INTERVAL=100")),
    ("levers-seq", ("SEQ_LENGTH",)),
    # the precision-aware optimizer's states (issue 23's 8-layer bar: OPT_STATE_BF16_SR)
    ("levers-optimizer-state", ("OPT_STATE_BF16", "OPT_STATE_BF16_SR")),
    ("levers-optimizer-offload", ("OPTIMIZER_CPU_OFFLOAD=1", "MASTER_WEIGHTS=remainder")),
    # documents kept apart against plain causal attention (issue 51), the native backend
    ("levers-documents", ("DOCUMENT_MASK=1",)),
)
PARTS_DP2 = (
    ("dp2-comm", ("DDP_AVERAGE_IN_COLLECTIVE", "GRAD_REDUCE_IN_BF16")),
    ("dp2-optimizer", ("DISTRIBUTED_OPTIMIZER", "OVERLAP_GRAD_REDUCE")),
    ("dp2-overlap", ("OVERLAP_PARAM_GATHER", "GRADIENT_ACCUMULATION_FUSION")),
)

# Issue 27: full-node runs on 2 and 8 H200s, each part at its own shape (PART_SHAPES), each one
# ~9-minute command. The full Llama3-8B at seq 8192 and 8 sequences per GPU (global batch
# 8 x GPUs); the scaling series keeps that per-GPU batch from 1 to 2 to 8 GPUs. One H200 holds
# the full model only with the optimizer-state lever OPT_STATE_BF16 (bf16 moments, 16-bit
# remainder masters: the memory pre-flight's recommendation there), so the series is measured
# with it at every GPU count: its 1-GPU point is `scale-x1` (that state is its default run), its
# 2- and 8-GPU points the OPT_STATE_BF16 variant of `full-x2` / `full-x8`, beside the launcher
# default (fp32 state, sharded by the distributed optimizer).
FULL_PER_GPU_BATCH = 8
SCALE_STATE = "OPT_STATE_BF16"


def full_shape(gpus: int, repeats: int = 2, **changes) -> BenchShape:
    return BenchShape(num_layers=32, seq_length=8192, mbs=1,
                      global_batch=FULL_PER_GPU_BATCH * gpus, gpus=gpus, warmup=2, steps=3,
                      repeats=repeats, **changes)


def _scale_state() -> tuple[tuple[str, str], ...]:
    lever = next(lv for lv in optimizer_state_levers() if lv.key == SCALE_STATE)
    return tuple(lever.env.items())


# Issue 52: a checkpoint's cost to the step, sync against async, on the full Llama3-8B on one
# H200 (the lean optimizer state of scale-x1). 8 iterations, saved at 4 (inside the measured
# steps 3-8: the wall time from iteration 4's record to 5's holds the save) and at 8 (the
# last). The weights only (--no-save-optim --no-save-rng): the full state (~64 GB a save) does
# not fit the machine's disk twice; each run's SAVE is its own folder, removed after the run
# (bench/ours.py). One repeat: two launches of the 8B in one ~8-minute call.
SAVE_SHAPE = replace(full_shape(1, repeats=1, backend="native",
                                toggles=(*_scale_state(), ("SAVE_INTERVAL", "4"),
                                         ("EXTRA_MEGATRON_ARGS",
                                          "--no-save-optim --no-save-rng"))), steps=6)
# The DP-communication toggles at 8 GPUs, where they matter most: the full model at the MLPerf
# global batch of 32 (4 micro-batches per GPU, as the dp2-* parts at 2 GPUs), two levers and
# 2 repeats a part (6 launches). With the distributed optimizer off the fp32 state of the full
# model does not fit an H200: the pre-flight refuses that variant before any GPU work.
NODE_DP_SHAPE = BenchShape(num_layers=32, seq_length=8192, mbs=1, global_batch=32, gpus=8,
                           warmup=2, steps=3, repeats=2, backend="native")
# MoE at EP 2 and 8: Qwen3-30B-A3B at the one-GPU figure's depth and per-GPU batch (MOE_SHAPE:
# 8 layers, seq 4096, 8 sequences per GPU), the experts split over every GPU, the dispatchers
# against the all-to-all.
PARTS_NODE = (
    ("full-x8", "toggles", (SCALE_STATE,)),
    ("node-dp-comm", "toggles", ("GRAD_REDUCE_IN_BF16", "DDP_AVERAGE_IN_COLLECTIVE")),
    ("node-dp-optimizer", "toggles", ("DISTRIBUTED_OPTIMIZER", "OVERLAP_GRAD_REDUCE")),
    ("node-dp-overlap", "toggles", ("OVERLAP_PARAM_GATHER", "GRADIENT_ACCUMULATION_FUSION")),
    ("moe-ep8", "toggles", ("MOE_TOKEN_DISPATCHER=allgather", "MOE_TOKEN_DISPATCHER=flex")),
    ("node-toggles", "toggles", ("CROSS_ENTROPY_LOSS_FUSION", "FUSED_SINGLE_QKV_ROPE")),
)
PARTS_X2 = (
    ("full-x2", "toggles", (SCALE_STATE,)),
    ("moe-ep2", "toggles", ("MOE_TOKEN_DISPATCHER=allgather", "MOE_TOKEN_DISPATCHER=flex")),
)
# The 1-GPU point of the scaling series (`bench all --gpus 1 --parts scale-x1`; on the 2-GPU
# machine, alone on GPU 0): the launcher default but for the optimizer state.
PARTS_X1 = (("scale-x1", "toggles", ("default",)), ("save-async", "toggles", ("ASYNC_SAVE=1",)))
# Transformer Engine at 2 and 8 GPUs (`bench all --te --gpus N`, after the TE carry): the TE
# bf16 default, the best fp8 recipe on one H200 (fp8 delayed scaling, 1.29x TE bf16 in session
# 7) and the native backend, in one invocation.
TE_NODE_PARTS = {2: (("full-x2-te", "toggles", ("PRECISION=fp8", "TRANSFORMER_IMPL=native")),),
                 8: (("full-x8-te", "toggles", ("PRECISION=fp8", "TRANSFORMER_IMPL=native")),)}
PEER_PARTS = (
    ("peers", ("native", "hf", "hf_liger")),
    ("peers-local", ("native", "local")),
    ("peers-torchtitan", ("native", "torchtitan")),  # no run when torchtitan cannot run here
)
# Transformer Engine (`bench all --te`, one GPU, where TE imports): ours against Megatron-LM with
# TE and our TE backend; every recipe on the TE backend; its default-on toggles off. Two such
# parts side by side (one per GPU) fit one ~9-minute command at 2 repeats.
TE_PARTS = (
    ("peers", "peers-te", ("native", "megatron_te", "transformer_engine")),
    ("toggles", "te-recipes", tuple(f"PRECISION={n}" for n in RECIPES if n != "bf16")),
    ("toggles", "te-toggles-a", ("GRADIENT_ACCUMULATION_FUSION", "FUSED_SINGLE_QKV_ROPE")),
    ("toggles", "te-toggles-b", ("CROSS_ENTROPY_LOSS_FUSION", "GRAD_REDUCE_IN_BF16")),
    # documents kept apart on TE's THD attention against its plain causal attention (issue 51)
    ("toggles", "te-documents", ("DOCUMENT_MASK=1",)),
)
# MoE where users run it (issue 37), `bench all --te` after the TE carry: the TE image's
# default (TRANSFORMER_IMPL=auto with TE importable: the `auto` side, the launch's rule picks
# the backend) against the native backend and the compiled HF peer (moe-te-default, and
# -mixtral for Mixtral cut to 4 layers); the TE backend itself (TE's attention and linears, the
# experts MOE_EXPERT_IMPL=auto picks) the same way, the expert path and fp8 as levers of it.
MOE_TE_PARTS = (
    ("peers", "moe-te-default", ("auto", "native", "hf_compile")),
    ("peers", "moe-te-default-mixtral", ("auto", "native", "hf_compile")),
    ("peers", "moe-te-peers", ("transformer_engine", "native", "hf_compile")),
    ("toggles", "moe-te-levers", ("MOE_EXPERT_IMPL=te", "PRECISION=fp8",
                                  "PRECISION=fp8+MOE_EXPERT_IMPL=te")),
    ("peers", "moe-te-peers-mixtral", ("transformer_engine", "native", "hf_compile")),
    ("toggles", "moe-te-levers-mixtral", ("MOE_EXPERT_IMPL=te", "PRECISION=fp8")),
    # (mxfp8: refused on an H200, measured where the GPU has it, B300/MI355X)
    ("toggles", "moe-te-more", ("PRECISION=fp8_tensorwise", "PRECISION=fp8_blockwise", "MBS",
                                "PRECISION=fp8+MBS=2", "PRECISION=mxfp8")),
    # the TE backend against the native one at micro-batch 2 (moe-te-more's MBS row: the TE
    # backend 1.741x its micro-batch 1, host-bound there; does it overtake the native one?)
    ("peers", "moe-te-peers-mbs2", ("transformer_engine", "native")),
    # fp8 with TE's fp8 grouped experts on Mixtral's few wide experts (8 of FFN 14,336, where
    # a per-expert GEMM is large: on Qwen3's 128 small ones it measured 0.204x bf16)
    ("toggles", "moe-te-fp8-experts-mixtral", ("PRECISION=fp8+MOE_EXPERT_IMPL=te",)),
    # the native backend with TE on the path against the same with TE taken off it: sessions
    # 15-18 saw it ~4% slower with TE on the path, in separate calls (docs/moe.md "Session 18")
    ("peers", "moe-te-native-te-cost", ("native", "native_no_te")),
    ("peers", "moe-te-native-te-cost-mixtral", ("native", "native_no_te")),
    # TE's FusedAdam against the native MixedPrecisionAdamW in its place (ADAM_IMPL=native), on
    # the native backend with TE on the path (the TE image's MoE default) and on the TE backend
    ("toggles", "moe-te-adam", ("ADAM_IMPL=native",)),
    ("toggles", "moe-te-adam-te", ("ADAM_IMPL=native",)),
)
PART_BACKEND = {"te-recipes": "transformer_engine", "te-toggles-a": "transformer_engine",
                "te-toggles-b": "transformer_engine", "te-documents": "transformer_engine"}

# The MoE parts (`bench all` at one GPU, after the dense ones), at their own shape: Qwen3-30B-A3B
# cut to the depth that fits one H200 by the memory estimator (same width, 128 experts, top-8),
# seq 4096, global batch 8 (the MoE levers are noisy at batch 1), 2 repeats; 4 warm-up steps
# (the lean step's CUDA graph is captured at the 4th; session 14 also saw the eager step settle
# only by then), 3 measured.
MOE_SHAPE = BenchShape(family="qwen3_moe", model_size="30B-A3B", num_layers=8, seq_length=4096,
                       mbs=1, global_batch=8, warmup=4, steps=3, repeats=2)
# (part, kind, sides or lever keys), each a few minutes on one H200: moe-peers after the MoE
# GPU tests in one call (dev/gpu/moe.sh), the others in later calls (dev/gpu/bench.sh 1 PART).
MOE_PARTS = (
    ("moe-peers", "peers", ("native", "hf", "hf_liger")),
    ("moe-levers", "toggles", ("MOE_GROUPED_GEMM",)),
    ("moe-peers-torchtitan", "peers", ("native", "torchtitan")),
    ("moe-levers-permute", "toggles", ("MOE_PERMUTE_FUSION",)),
    # the host-side levers of a launch-bound step (session 8's profile: the MoE step at this
    # shape leaves the H200 about half idle): a micro-batch of 2 (half the launches per
    # token), the plain optimizer without the distributed one's per-bucket hooks, the eager
    # residual add against Megatron's compiled one, Python's garbage collector at fixed
    # iterations instead of inside a step (a step's stall in session 10's spread?)
    # (DP1_PLAIN_DDP left out since the lean step: its 16-bit state is the distributed
    # optimizer's, so the plain one would switch the lean step off with it)
    ("moe-levers-host", "toggles", ("MBS", "BIAS_DROPOUT_FUSION=0", "MANUAL_GC_INTERVAL=100")),
    # the tokens per expert kept on the GPU: no host synchronisation in each MoE layer's
    # dispatch (its own part: two configurations at two repeats, ~5 minutes)
    ("moe-levers-sync", "toggles", ("MOE_DEVICE_COUNTS=1",)),
    # what made session 11's sync-free configuration 1.22x the default (one process each,
    # dev/gpu_logs/2026-12-02_s11_*): Liger's per-micro-batch host read, both synchronisations,
    # the 16-bit optimizer state, or the two together
    # (measured at the core defaults, before MOE_LEAN_STEP made the last one the MoE default)
    ("moe-levers-syncfree", "toggles", ("CROSS_ENTROPY_LOSS_FUSION", "MOE_SYNC_FREE",
                                        "OPT_STATE_BF16", "MOE_SYNC_FREE+OPT_STATE_BF16")),
    # the MoE default since session 11 against the core defaults
    ("moe-levers-lean", "toggles", ("MOE_LEAN_STEP",)),
    # the lean step replayed from a CUDA graph (session 11's try: +4%, one process each)
    ("moe-levers-graph", "toggles", ("CUDA_GRAPH=full_iteration",)),
    # the lean step on the other MoE family (few wide experts, top-2: MIXTRAL_SHAPE)
    ("moe-levers-lean-mixtral", "toggles", ("MOE_LEAN_STEP",)),
    # issue 37's bar on the native backend (TRANSFORMER_IMPL=auto's MoE choice on SM90): ours
    # at the default against the compiled HF peer, same call
    ("moe-peers-compile", "peers", ("native", "hf_compile")),
    # the fused linear cross-entropy in the lean step since it reads nothing on the host
    # (session 14) against Megatron's cross-entropy over the logits (the lean step's before)
    # and in larger chunks (at hidden 2048 the default makes 8 chunks of 512 tokens, each a
    # pass over the bf16 output-weight gradient)
    ("moe-levers-ce", "toggles", ("CROSS_ENTROPY_LOSS_FUSION", "CE_CHUNK_MEM=32")),
    # gradient-accumulation fusion for the native grouped experts (session 14's Triton kernel;
    # the MoE default on SM90 since session 15, after this part and
    # tests/gpu/test_grouped_wgrad_gpu.py ran on an H200)
    ("moe-levers-wgrad", "toggles", ("MOE_WGRAD_FUSION=1",)),
    # issue 37's bar on the other MoE family (MIXTRAL_SHAPE): ours at the default against the
    # compiled HF peer, same call
    ("moe-peers-compile-mixtral", "peers", ("native", "hf_compile")),
)
# gpt-oss-20b cut to 8 layers (same width, 32 experts, top-4, sinks, the alternating window; the
# lean step's estimate 90.6 GiB on one H200), seq 8192, global batch 8: ours at the gpt-oss
# launch's default against transformers' GptOssForCausalLM (its flex attention, each decoder
# layer torch.compile'd: the hf_compile side, training/bench/hf_peer.py), issue 41's bar.
GPT_OSS_SHAPE = BenchShape(family="gpt_oss", model_size="20b", num_layers=8, seq_length=8192,
                           mbs=1, global_batch=8, warmup=2, steps=3, repeats=2, backend="native")
MOE_PARTS = MOE_PARTS + (("gpt-oss-peers", "peers", ("native", "hf_compile")),
                         # the micro-batch the pre-flight may choose (training/optimize/
                         # microbatch.py: a model's own MBS row only) for gpt-oss and Mixtral
                         ("gpt-oss-levers-mbs", "toggles", ("MBS",)),
                         ("moe-levers-mbs-mixtral", "toggles", ("MBS",)))

# Mixtral-8x7B cut to 4 layers (same width, 8 experts, top-2; the core defaults' estimate
# 114 GiB on one H200, the lean step's smaller), the MoE shape's sequence and batch.
MIXTRAL_SHAPE = replace(MOE_SHAPE, family="mixtral", model_size="8x7B", num_layers=4,
                        backend="native")


def moe_ep_shape(ep: int) -> BenchShape:
    return BenchShape(family=MOE_SHAPE.family, model_size=MOE_SHAPE.model_size,
                      num_layers=MOE_SHAPE.num_layers, seq_length=MOE_SHAPE.seq_length, mbs=1,
                      global_batch=MOE_SHAPE.global_batch * ep, gpus=ep, warmup=2, steps=3,
                      repeats=2, backend="native", toggles=(("EP", str(ep)),))


# Parts measured at their own shape, whatever the command line's (the others take it).
# The MoE levers measured against the core defaults, as they were before MOE_LEAN_STEP (the MoE
# launch's default since session 11) took them over: the grouped experts (the lean step needs
# them; off, it would change with the lever) and the parts that split the lean step itself.
MOE_CORE_SHAPE = replace(MOE_SHAPE, toggles=(("MOE_LEAN_STEP", "0"),))
MOE_CORE_PARTS = ("moe-levers", "moe-levers-sync", "moe-levers-syncfree")

PART_SHAPES: dict[str, BenchShape] = {
    **{name: MOE_CORE_SHAPE if name in MOE_CORE_PARTS else MOE_SHAPE
       for name, _kind, _keys in MOE_PARTS},
    "moe-levers-lean-mixtral": MIXTRAL_SHAPE,
    "moe-peers-compile-mixtral": MIXTRAL_SHAPE,
    # the graph is the lean step's default on SM90 since session 14: this part's baseline is
    # the eager step, set explicitly, against the graph
    "moe-levers-graph": replace(MOE_SHAPE, toggles=(("CUDA_GRAPH", "none"),)),
    # the experts' wgrad fusion is the MoE default on SM90 since session 15: this part's
    # baseline is the fusion off, set explicitly, against it on
    "moe-levers-wgrad": replace(MOE_SHAPE, toggles=(("MOE_WGRAD_FUSION", "0"),)),
    **{name: replace(MIXTRAL_SHAPE if "mixtral" in name else MOE_SHAPE,
                     backend=None if keys[0] == "auto" else "transformer_engine")
       for _kind, name, keys in MOE_TE_PARTS},
    "moe-te-peers-mbs2": replace(MOE_SHAPE, mbs=2, backend="transformer_engine"),
    "moe-te-native-te-cost": replace(MOE_SHAPE, backend="native"),
    "moe-te-adam": replace(MOE_SHAPE, backend="native"),
    "moe-te-native-te-cost-mixtral": replace(MIXTRAL_SHAPE, backend="native"),
    "gpt-oss-peers": GPT_OSS_SHAPE,
    "gpt-oss-levers-mbs": GPT_OSS_SHAPE,
    "moe-levers-mbs-mixtral": MIXTRAL_SHAPE,
    "scale-x1": full_shape(1, backend="native", toggles=_scale_state()),
    "save-async": SAVE_SHAPE,
    "full-x2": full_shape(2, backend="native"),
    "full-x8": full_shape(8, backend="native"),
    "full-x2-te": full_shape(2, backend="transformer_engine"),
    "full-x8-te": full_shape(8, backend="transformer_engine"),
    "node-dp-comm": NODE_DP_SHAPE, "node-dp-optimizer": NODE_DP_SHAPE,
    "node-dp-overlap": NODE_DP_SHAPE, "node-toggles": NODE_DP_SHAPE,
    "moe-ep2": moe_ep_shape(2), "moe-ep8": moe_ep_shape(8),
}
