"""The MoE family as a recipe layer (training/launch/layers.py) on the core launcher.

training.moe.launch (examples/moe/train_*.sh) resolves with it; nothing in training/launch/
imports it. It brings
  toggles  EP, ETP and the MOE_* knobs: Megatron's MoE training choices around the preset's
           architecture (experts, top-k, expert FFN width: ModelPreset.gpt_args);
  values   none of its own: the preset gives MOE_AUX_LOSS_COEFF its published coefficient
           (training/moe/presets.py, source "preset");
  guards   megatron-core 0.19.2's own MoE rules, refused before torchrun: the expert-parallel
           layout, sequence parallel with TP, FSDP with EP, the kernels the dispatcher, the
           grouped experts and the permute fusion need, token dropping, the aux loss.
"""
from __future__ import annotations

from training.launch.guards import LaunchContext, _nearest, _off_or_refuse
from training.launch.recipes import RECIPES
from training.launch.layers import RecipeLayer, RecipeValue
from training.launch.settings import Refusal, Setting
from training.launch.toggles import (GPT_ARGS, LAUNCHER, Flags, Toggle, auto_expert_impl,
                                     device_counts_conflicts, step_host_reads)
from training.run_description import divisors

GROUP = "moe"


def _permute_flags(toggle: Toggle, ctx) -> list[Flags]:
    """The permute follows the experts: the native grouped experts (native backend, or the TE
    backend with MOE_EXPERT_IMPL=native) `--[no-]native-moe-permute`, always given; TE's
    grouped experts `--moe-permute-fusion` (TE's fused permute), when on; local none
    (moe_expert_kernels turns it off)."""
    s = ctx.settings
    backend, on = s["TRANSFORMER_IMPL"], s[toggle.name]
    if backend == "local":
        return []
    if s["MOE_EXPERT_IMPL"] == "native":
        return [Flags(GPT_ARGS, ["--native-moe-permute" if on else "--no-native-moe-permute"])]
    return [Flags(GPT_ARGS, ["--moe-permute-fusion"])] if on else []


def _capacity(settings) -> bool:
    return settings.get("MOE_CAPACITY_FACTOR") is not None


TOGGLES: tuple[Toggle, ...] = (
    Toggle("EP", "int", 1, GPT_ARGS,
           "Expert-parallel size: the experts of each MoE layer split over EP ranks (the "
           "tokens travel to them through the token dispatcher). EP x ETP x PP divides the "
           "world; the experts divide by EP.",
           flag="--expert-model-parallel-size", group=GROUP),
    Toggle("ETP", "int", 1, GPT_ARGS,
           "Expert-tensor-parallel size: each expert's FFN split over ETP ranks (1: experts "
           "whole, the usual choice for fine-grained experts; Megatron's own default is TP).",
           flag="--expert-tensor-parallel-size", group=GROUP),
    Toggle("MOE_GROUPED_GEMM", "bool", True, GPT_ARGS,
           "All local experts in one grouped GEMM per projection: TE's grouped linear on the "
           "TE backend, torch's grouped_mm on the native backend "
           "(training/native/grouped_experts.py); 0: Megatron's SequentialMLP, one GEMM pair "
           "per expert in turn.",
           on=("--moe-grouped-gemm",), group=GROUP, levers=True),
    Toggle("MOE_EXPERT_IMPL", "choice", "auto", GPT_ARGS,
           "Which grouped experts run (MOE_GROUPED_GEMM=1): native (torch grouped_mm, "
           "training/native/grouped_experts.py, with the native permute; on the TE backend "
           "beside TE's attention and dense linears, in bf16 under an fp8 recipe) or te "
           "(Megatron's TEGroupedMLP on TE's grouped linear, fp8 with the recipe; TE backend "
           "only). auto: native on the native backend; on the TE backend the one measured "
           "faster on this GPU (the reason says where that rests on no measurement).",
           flag="--moe-expert-impl", choices=("auto", "native", "te"), group=GROUP,
           levers=True),
    Toggle("MOE_DEVICE_COUNTS", "bool", False, GPT_ARGS,
           "Native grouped experts at EP = TP = ETP = 1, dropless: the tokens per "
           "expert stay on the GPU, where grouped_mm reads its offsets, instead of Megatron's "
           "copy to the host and wait for the GPU once per MoE layer and micro-batch (a "
           "launch-bound step pays that wait as GPU idle time). Off in the core defaults "
           "(alone it measured within noise); MOE_LEAN_STEP turns it on with the rest of the "
           "lean step where it applies.",
           on=("--moe-device-counts",), group=GROUP, levers=True),
    Toggle("MOE_WGRAD_FUSION", "bool", True, GPT_ARGS,
           "Gradient-accumulation fusion for the native grouped experts: with "
           "GRADIENT_ACCUMULATION_FUSION, each expert's weight gradient is added into "
           "Megatron's main_grad by a Triton kernel (training/native/grouped_wgrad.py) instead "
           "of a whole [experts, out, in] gradient per micro-batch that DDP then adds. On by "
           "default where it was measured: the native grouped experts with "
           "GRADIENT_ACCUMULATION_FUSION on SM90 (bench part moe-levers-wgrad, one H200: "
           "faster at the same peak memory; docs/levers.md). Elsewhere shown 0 with the reason "
           "(other experts, no gradient-accumulation fusion, an unmeasured GPU: there a 1 "
           "tries it).",
           on=("--moe-wgrad-fusion",), group=GROUP, levers=True),
    Toggle("MOE_LEAN_STEP", "bool", True, LAUNCHER,
           "Where the step can run without a host synchronisation (the native grouped experts "
           "on either backend, EP = TP = ETP = 1, dropless, all-to-all; bf16 or an fp8 recipe; "
           "the distributed optimizer "
           "without offload, ADAM_BETA2 <= 0.99), the "
           "MoE launch's defaults for three settings the user left unset: MOE_DEVICE_COUNTS=1, "
           "ADAM_MOMENTS_DTYPE=bf16 and MASTER_WEIGHTS=remainder (exact fp32 masters in 2 B); "
           "on the native backend in bf16 on SM90 (where it was measured) also "
           "CUDA_GRAPH=full_iteration (the step captured once, replayed without a launch per "
           "kernel; where the run is long enough); "
           "the fused linear cross-entropy stays on (sync-free since session 14; before, "
           "Liger's own entry read the host and the lean step turned it off). Measured together against the core defaults (bench "
           "parts moe-levers-syncfree, moe-levers-lean, moe-levers-lean-mixtral): faster and "
           "smaller on Qwen3's many small experts, where each alone was within noise; on "
           "Mixtral's few wide ones smaller at the same speed. 0: the core defaults.",
           group=GROUP, levers=True),
    Toggle("MOE_TOKEN_DISPATCHER", "choice", "alltoall", GPT_ARGS,
           "How tokens reach their experts: alltoall (all-to-all over EP; Megatron's choice "
           "for expert parallelism), allgather (every rank gathers all tokens), flex "
           "(DeepEP's kernels, when installed).",
           flag="--moe-token-dispatcher-type", choices=("alltoall", "allgather", "flex"),
           group=GROUP, levers=True),
    Toggle("MOE_PERMUTE_FUSION", "bool", True, GPT_ARGS,
           "Fused token permutation around the experts: TE's fused permute/unpermute on the "
           "TE backend, the native backend's atomic-free gather-sum "
           "(training/native/moe_permute.py) on native; the local backend has neither.",
           group=GROUP, emit=_permute_flags, levers=True,
           owns=("--native-moe-permute", "--no-native-moe-permute", "--moe-permute-fusion")),
    Toggle("MOE_ROUTER_DTYPE", "choice", "fp32", GPT_ARGS,
           "Precision of the router's logits and softmax (Megatron warns without it at 32 "
           "experts or more); none: the model's dtype.",
           flag="--moe-router-dtype", choices=("fp32", "fp64", "none"), group=GROUP,
           when=lambda s: s["MOE_ROUTER_DTYPE"] != "none"),
    Toggle("MOE_AUX_LOSS_COEFF", "float", None, GPT_ARGS,
           "Coefficient of the load-balancing loss (default: the preset's published "
           "router_aux_loss_coef; 0 turns the loss off).",
           flag="--moe-aux-loss-coeff", group=GROUP),
    Toggle("MOE_LOAD_BALANCING", "choice", "aux_loss", GPT_ARGS,
           "Load balancing: aux_loss (Switch/GShard, per micro-batch), seq_aux_loss (per "
           "sequence), global_aux_loss (over the global batch), sinkhorn, none.",
           flag="--moe-router-load-balancing-type",
           choices=("aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none"),
           group=GROUP),
    Toggle("MOE_CAPACITY_FACTOR", "float", None, GPT_ARGS,
           "Expert capacity as a multiple of the even share of tokens; tokens beyond it are "
           "dropped (MOE_TOKEN_DROP_POLICY). Unset: dropless, every token reaches its experts.",
           flag="--moe-expert-capacity-factor", group=GROUP),
    Toggle("MOE_TOKEN_DROP_POLICY", "choice", "probs", GPT_ARGS,
           "With a capacity factor, which tokens an overfull expert drops: probs (lowest "
           "routing probability) or position (latest in the sequence).",
           flag="--moe-token-drop-policy", choices=("probs", "position"), group=GROUP,
           when=_capacity),
    Toggle("MOE_PAD_TO_CAPACITY", "bool", False, GPT_ARGS,
           "With a capacity factor, pad every expert's tokens to its capacity (static shapes).",
           on=("--moe-pad-expert-input-to-capacity",), group=GROUP, when=_capacity),
)


# -- guards: megatron-core 0.19.2's MoE rules ----------------------------------------------------

def expert_parallel_sizes(ctx: LaunchContext) -> None:
    """EP, ETP >= 1; the experts divide by EP, the expert FFN by ETP; EP*ETP*PP divides the world.

    megatron-core 0.19.2's expert rank generator and validate_args."""
    s, p = ctx.settings, ctx.preset
    ep, etp, pp, world = s["EP"], s["ETP"], s["PP"], ctx.layout.world_size
    for name in ("EP", "ETP"):
        if s[name] < 1:
            raise Refusal("expert_parallel_sizes", f"{name}={s[name]} must be at least 1.")
    if p.num_experts % ep:
        raise Refusal("expert_parallel_sizes",
                      f"EP={ep} must divide the {p.num_experts} experts of {p.name} (Megatron: "
                      "'Number of experts should be a multiple of expert model parallel_size'). "
                      f"Nearest valid EP: {_nearest(ep, divisors(p.num_experts))}.")
    if p.moe_ffn_hidden_size % etp:
        raise Refusal("expert_parallel_sizes",
                      f"ETP={etp} must divide the experts' FFN width {p.moe_ffn_hidden_size}. "
                      f"Nearest valid ETP: {_nearest(etp, divisors(p.moe_ffn_hidden_size))}.")
    if world % (ep * etp * pp):
        fits = [d for d in divisors(world // pp) if p.num_experts % d == 0] if world % pp == 0 \
            else []
        raise Refusal("expert_parallel_sizes",
                      f"EP*ETP*PP={ep}*{etp}*{pp}={ep * etp * pp} does not divide the world size "
                      f"{world} (megatron-core: 'world_size is not divisible by "
                      "expert_tensor_model_pipeline_parallel size'). With ETP=1 and this PP, EP "
                      f"can be {', '.join(map(str, fits)) or 'none: change PP'}.")


def moe_sequence_parallel(ctx: LaunchContext) -> None:
    """MoE with TP>1 needs sequence parallel (Megatron's MoE layer raises without it)."""
    s = ctx.settings
    # the local backend's torch norms refuse sequence parallel (local_norm_sequence_parallel
    # turns it off there): read it as that guard leaves it, whatever the guards' order
    if s["TP"] == 1 or (s["SEQUENCE_PARALLEL"] and ctx.backend != "local"):
        return
    why = ("the local backend's torch norms refuse sequence parallel" if ctx.backend == "local"
           else "SEQUENCE_PARALLEL=0 was asked for")
    raise Refusal("moe_sequence_parallel",
                  f"TP={s['TP']} with MoE layers needs sequence parallel (megatron-core's MoE "
                  f"layer raises without it), and {why}. Use TP=1 (experts split by EP), or "
                  "SEQUENCE_PARALLEL=1 on the native or TE backend.")


def fsdp_expert_parallel(ctx: LaunchContext) -> None:
    """Torch FSDP2 with expert parallelism: refused (validate_args asserts)."""
    s = ctx.settings
    if s["FSDP"] and s["EP"] > 1:
        raise Refusal("fsdp_expert_parallel",
                      f"FSDP=1 with EP={s['EP']}: megatron-core 0.19.2 asserts "
                      "'--use-torch-fsdp2 is not supported with expert parallelism'. Use FSDP=0 "
                      "(the distributed optimizer shards the experts' states over the "
                      "expert-data-parallel ranks), or EP=1.")


def moe_dispatcher_kernels(ctx: LaunchContext) -> None:
    """The flex dispatcher needs DeepEP and TP x EP > 1."""
    s = ctx.settings
    if s["MOE_TOKEN_DISPATCHER"] != "flex":
        return
    if not ctx.caps.deep_ep:
        raise Refusal("moe_dispatcher_kernels",
                      "MOE_TOKEN_DISPATCHER=flex runs DeepEP's kernels (deep_ep), which are not "
                      f"installed ({ctx.caps.source}). Use MOE_TOKEN_DISPATCHER=alltoall.")
    if s["TP"] * s["EP"] == 1:
        raise Refusal("moe_dispatcher_kernels",
                      "MOE_TOKEN_DISPATCHER=flex needs TP*EP > 1 (Megatron: 'DeepEP dispatcher "
                      "requires TPxEP > 1'). Use MOE_TOKEN_DISPATCHER=alltoall on one GPU.")


def moe_expert_kernels(ctx: LaunchContext) -> None:
    """Grouped GEMM and permute fusion need TE's kernels or the native backend's (not local's).

    Megatron's local spec builds SequentialMLP whatever --moe-grouped-gemm says."""
    if ctx.backend != "local":
        return
    _off_or_refuse(ctx, "MOE_GROUPED_GEMM", "moe_expert_kernels",
                   "Megatron's local spec always builds SequentialMLP (grouped experts are TE's "
                   "or the native backend's)",
                   "Use TRANSFORMER_IMPL=native or transformer_engine, or set it to 0.")
    _off_or_refuse(ctx, "MOE_PERMUTE_FUSION", "moe_expert_kernels",
                   "the local backend has no fused permute (Megatron's is TE's, the native "
                   "backend has its own)",
                   "Use TRANSFORMER_IMPL=native or transformer_engine, or set it to 0.")


def _counts_conflicts(s) -> list[str]:
    """device_counts_conflicts for these settings (backend and experts resolved)."""
    return device_counts_conflicts(s["TRANSFORMER_IMPL"], s["MOE_EXPERT_IMPL"],
                                   s["MOE_GROUPED_GEMM"], s["EP"], s["TP"], s["ETP"],
                                   s["MOE_TOKEN_DISPATCHER"], s.get("MOE_CAPACITY_FACTOR"))


def moe_expert_impl(ctx: LaunchContext) -> None:
    """MOE_EXPERT_IMPL=te needs TE's grouped linear: the TE backend."""
    s = ctx.settings
    if s["MOE_EXPERT_IMPL"] == "te" and ctx.backend != "transformer_engine" \
            and s["MOE_GROUPED_GEMM"]:
        raise Refusal("moe_expert_impl",
                      f"MOE_EXPERT_IMPL=te runs TE's grouped linear, which the {ctx.backend} "
                      "backend does not build. Use MOE_EXPERT_IMPL=native (or auto), or "
                      "TRANSFORMER_IMPL=transformer_engine where TE is installed.")


def moe_device_counts(ctx: LaunchContext) -> None:
    """MOE_DEVICE_COUNTS=1 needs the layout where the counts are the only host value the
    dispatcher computes, and the experts that take them on the GPU."""
    s = ctx.settings
    if not s["MOE_DEVICE_COUNTS"]:
        return
    why = _counts_conflicts(s)
    if why:
        raise Refusal("moe_device_counts",
                      f"MOE_DEVICE_COUNTS=1 keeps the tokens per expert on the GPU only for the "
                      f"native grouped experts (MOE_EXPERT_IMPL=native) at EP = TP = ETP = 1, "
                      f"dropless, with the "
                      f"all-to-all dispatcher; here: {'; '.join(why)}. Set MOE_DEVICE_COUNTS=0.")


# GPU architectures where MOE_WGRAD_FUSION was measured (bench part moe-levers-wgrad, H200)
WGRAD_MEASURED_ARCHS = ("sm90",)


def _arch(settings) -> str | None:
    """The GPU architecture of PLATFORM (auto: this node's), None where unknown."""
    from training.launch.capabilities import resolve as capabilities

    platform = capabilities(settings["PLATFORM"]).info
    return platform.arch if platform else None


def wgrad_fusion_conflicts(s) -> list[str]:
    """Why MOE_WGRAD_FUSION would change nothing with these settings (none: it acts). Backend
    and experts resolved."""
    why = []
    if not s["GRADIENT_ACCUMULATION_FUSION"]:
        why.append("GRADIENT_ACCUMULATION_FUSION=0 (the kernel adds into its main_grad)")
    elif s["FSDP"]:
        why.append("FSDP=1 (FSDP2 runs without gradient-accumulation fusion)")
    if s["TRANSFORMER_IMPL"] == "local" or not s["MOE_GROUPED_GEMM"]:
        setting = ("TRANSFORMER_IMPL=local" if s["TRANSFORMER_IMPL"] == "local"
                   else "MOE_GROUPED_GEMM=0")
        why.append(f"the experts are Megatron's SequentialMLP ({setting}), not the native "
                   "grouped experts")
    elif s["MOE_EXPERT_IMPL"] != "native":
        why.append(f"the experts are TE's grouped linear (MOE_EXPERT_IMPL="
                   f"{s['MOE_EXPERT_IMPL']}), not the native grouped experts")
    return why


def wgrad_fusion(settings) -> None:
    """MOE_WGRAD_FUSION's default (on) where it acts and was measured; elsewhere, unless the
    user set it, 0 with why (a user's 1 where it acts on an unmeasured GPU is kept; where it
    would change nothing, refused by the guard moe_wgrad_fusion)."""
    if not settings["MOE_WGRAD_FUSION"] or settings.is_explicit("MOE_WGRAD_FUSION"):
        return
    why = wgrad_fusion_conflicts(settings)
    arch = _arch(settings)
    if not why and arch not in WGRAD_MEASURED_ARCHS:
        why.append(f"measured on {', '.join(WGRAD_MEASURED_ARCHS)} only: "
                   f"PLATFORM={settings['PLATFORM']} "
                   f"({arch or 'its GPU architecture is unknown'}) unmeasured; set "
                   "MOE_WGRAD_FUSION=1 to try")
    if why:
        settings.put("MOE_WGRAD_FUSION", False, "derived", "not here: " + "; ".join(why))


def moe_wgrad_fusion(ctx: LaunchContext) -> None:
    """MOE_WGRAD_FUSION=1 acts on the native grouped experts with gradient-accumulation fusion
    only: a user's 1 elsewhere would be ignored, so it is refused; the default's is turned off
    with why (a core guard may have turned the fusion off after the derivation)."""
    s = ctx.settings
    if not s["MOE_WGRAD_FUSION"]:
        return
    why = wgrad_fusion_conflicts(s)
    if not why:
        return
    if s.is_explicit("MOE_WGRAD_FUSION"):
        raise Refusal("moe_wgrad_fusion", f"MOE_WGRAD_FUSION=1 would change nothing here: "
                                          f"{'; '.join(why)}. Unset MOE_WGRAD_FUSION.")
    s.correct("MOE_WGRAD_FUSION", False, "moe_wgrad_fusion", "; ".join(why))


def moe_capacity(ctx: LaunchContext) -> None:
    """Token dropping: a positive capacity factor, with a load balancing that allows it.

    Padding to capacity and the drop policy act only with a capacity factor."""
    s = ctx.settings
    factor = s.get("MOE_CAPACITY_FACTOR")
    if factor is None:
        if s["MOE_PAD_TO_CAPACITY"]:
            raise Refusal("moe_capacity",
                          "MOE_PAD_TO_CAPACITY=1 needs MOE_CAPACITY_FACTOR (megatron-core: "
                          "'moe_expert_capacity_factor must be set to use "
                          "moe_pad_expert_input_to_capacity'). Set MOE_CAPACITY_FACTOR, e.g. 1.25.")
        if s.is_explicit("MOE_TOKEN_DROP_POLICY"):
            s.warn("moe_capacity", "MOE_TOKEN_DROP_POLICY has no effect without "
                                   "MOE_CAPACITY_FACTOR (dropless: no token is dropped).")
        return
    if factor <= 0:
        raise Refusal("moe_capacity", f"MOE_CAPACITY_FACTOR={factor:g} must be positive (unset "
                                      "it for dropless routing).")
    if s["MOE_LOAD_BALANCING"] == "sinkhorn":
        raise Refusal("moe_capacity",
                      "MOE_CAPACITY_FACTOR with MOE_LOAD_BALANCING=sinkhorn: megatron-core "
                      "accepts a capacity factor only with aux_loss, seq_aux_loss, "
                      "global_aux_loss or none. Change one of them.")


def moe_aux_loss(ctx: LaunchContext) -> None:
    """A load-balancing loss needs a coefficient >= 0."""
    s = ctx.settings
    if s["MOE_AUX_LOSS_COEFF"] < 0:
        raise Refusal("moe_aux_loss", f"MOE_AUX_LOSS_COEFF={s['MOE_AUX_LOSS_COEFF']:g} must be "
                                      ">= 0 (0 turns the load-balancing loss off).")


# -- derived: the lean step ----------------------------------------------------------------------

LEAN_STEP = (("MOE_DEVICE_COUNTS", True, "the tokens per expert stay on the GPU (no wait in "
                                         "each MoE layer's dispatch)"),
             ("ADAM_MOMENTS_DTYPE", "bf16", "16-bit Adam moments"),
             ("MASTER_WEIGHTS", "remainder", "exact fp32 masters as 16-bit remainders"))


def lean_step_conflicts(s) -> list[str]:
    """Why the lean step does not apply to these settings (none: it does)."""
    why = _counts_conflicts(s)
    if RECIPES[s["PRECISION"]].kind == "fp4":
        why.append(f"PRECISION={s['PRECISION']} (the fp4 recipes keep the core defaults: not "
                   "measured with the lean step)")
    if s["OPTIMIZER_CPU_OFFLOAD"]:
        why.append("OPTIMIZER_CPU_OFFLOAD=1 (the offload keeps fp32 state)")
    if s["FSDP"] or not s["DISTRIBUTED_OPTIMIZER"]:
        why.append(f"{'FSDP=1' if s['FSDP'] else 'DISTRIBUTED_OPTIMIZER=0'} (the 16-bit state is "
                   "the distributed optimizer's)")
    if s["ADAM_BETA2"] > 0.99:
        why.append(f"ADAM_BETA2={s['ADAM_BETA2']:g} (bf16 moments lag above 0.99)")
    return why


LEAN_GRAPH = ("Megatron's full-iteration CUDA graph of the lean step: one launch per "
              "micro-batch instead of every kernel, so the step no longer waits on the host "
              "(measured faster on the lean step: docs/levers.md, the CUDA_GRAPH rows)")


# GPU architectures where the lean step's graph was measured (bench part moe-levers-graph, H200)
GRAPH_MEASURED_ARCHS = ("sm90",)


def lean_graph_conflicts(s) -> list[str]:
    """Why the lean step is not graphed here (none: CUDA_GRAPH=full_iteration is its default).
    Only where the graph was measured and tested: the native backend in bf16, a plain step."""
    why = []
    arch = _arch(s)
    if arch not in GRAPH_MEASURED_ARCHS:
        why.append(f"PLATFORM={s['PLATFORM']} ({arch or 'its GPU architecture is unknown'}: "
                   f"the graph is measured on {', '.join(GRAPH_MEASURED_ARCHS)} only)")
    if s["TRANSFORMER_IMPL"] != "native":
        why.append(f"TRANSFORMER_IMPL={s['TRANSFORMER_IMPL']} (the graph is measured on the "
                   "native backend only)")
    if s["PRECISION"] != "bf16":
        why.append(f"PRECISION={s['PRECISION']} (the graph is tried at bf16 only)")
    # the core's rule for a step a graph can capture (the lean step keeps the counts on the GPU)
    why += [reason for _name, reason, _fix in step_host_reads(s["NAN_CHECK"], 1, True)]
    if s["RECOMPUTE"] != "none":
        why.append(f"RECOMPUTE={s['RECOMPUTE']} (untested under the graph)")
    if s["PROFILE"] != "none":
        why.append(f"PROFILE={s['PROFILE']} (a replayed graph hides the step's kernels from "
                   "the trace's host ranges)")
    need = s["CUDA_GRAPH_WARMUP"] + 1      # the eager iterations and the capture's
    if s.is_explicit("METRICS_WARMUP_ITERS") and s["METRICS_WARMUP_ITERS"] < need:
        why.append(f"METRICS_WARMUP_ITERS={s['METRICS_WARMUP_ITERS']} (it would measure the "
                   f"eager iterations and the capture; {need} or more allows the graph)")
    if s["TOTAL_ITERS"] is not None and s["TOTAL_ITERS"] <= need:
        why.append(f"TOTAL_ITERS={s['TOTAL_ITERS']} (the graph, captured at iteration {need}, "
                   "would never be replayed)")
    return why


def lean_step(settings) -> list[RecipeValue]:
    """MOE_LEAN_STEP's defaults where they apply (moe-levers-syncfree, session 11: 1.259x
    together, each part within noise alone), and the step graphed where that was measured
    (lean_graph_conflicts); where they do not, MOE_LEAN_STEP is shown 0 with why (a user's 1
    there is refused by the guard moe_lean_step)."""
    if not settings["MOE_LEAN_STEP"]:
        return []
    why = lean_step_conflicts(settings)
    if why:
        if not settings.is_explicit("MOE_LEAN_STEP"):
            settings.put("MOE_LEAN_STEP", False, "derived", "not here: " + "; ".join(why))
        return []
    values = [RecipeValue(name, value, f"MOE_LEAN_STEP: {reason}")
              for name, value, reason in LEAN_STEP]
    no_graph = lean_graph_conflicts(settings)
    if not no_graph:
        values.append(RecipeValue("CUDA_GRAPH", "full_iteration", f"MOE_LEAN_STEP: {LEAN_GRAPH}"))
    elif not settings.is_explicit("CUDA_GRAPH"):
        settings.put("CUDA_GRAPH", "none", "derived",
                     "the lean MoE step is not graphed here: " + "; ".join(no_graph))
    return values


def moe_lean_step(ctx: LaunchContext) -> None:
    """MOE_LEAN_STEP=1 set by the user where the lean step cannot apply is refused."""
    s = ctx.settings
    if s["MOE_LEAN_STEP"] and s.is_explicit("MOE_LEAN_STEP"):
        why = lean_step_conflicts(s)
        if why:
            raise Refusal("moe_lean_step",
                          f"MOE_LEAN_STEP=1 needs the layout where the MoE step can run "
                          f"without a host synchronisation; here: {'; '.join(why)}. Set "
                          f"MOE_LEAN_STEP=0 (or leave it unset).")


def expert_impl(settings) -> None:
    """MOE_EXPERT_IMPL=auto resolved for the derived backend and this GPU (shown as derived,
    with why: training.launch.toggles.auto_expert_impl)."""
    if settings["MOE_EXPERT_IMPL"] != "auto":
        return
    experts, why = auto_expert_impl(settings["TRANSFORMER_IMPL"], _arch(settings))
    # a user's explicit auto is replaced too, as TRANSFORMER_IMPL=auto is (resolve)
    settings.values["MOE_EXPERT_IMPL"] = Setting("MOE_EXPERT_IMPL", experts, "derived",
                                                 f"auto: {why}")


def derived(settings) -> list[RecipeValue]:
    """After the core's derivation: the experts for the backend, their weight-gradient
    fusion, then the lean step."""
    expert_impl(settings)
    wgrad_fusion(settings)
    return lean_step(settings)


def moe_low_precision(ctx: LaunchContext) -> None:
    """An fp8 recipe on an MoE model: what was measured at the closest shape, quoted from
    docs/levers.json (the advisor's measurements), and whether that recommends it (a notice;
    the run goes ahead)."""
    from training import REPO_ROOT
    from training.optimize.config import shape_key
    from training.optimize.inputs import BadInput
    from training.optimize.levers import load_default, quote
    from training.platforms import platform_for_device_name
    from training.run_description import Model, RunDescription

    s = ctx.settings
    recipe = s["PRECISION"]
    if RECIPES[recipe].kind != "fp8":
        return
    te_experts = s["MOE_EXPERT_IMPL"] == "te"
    experts = ("TE's grouped linear computes the experts in fp8 too" if te_experts else
               "the native grouped experts stay bf16")
    try:
        book = load_default(None, REPO_ROOT)
    except BadInput as err:
        s.info("moe_low_precision", f"PRECISION={recipe} on an MoE model: the measurements "
               f"cannot be read ({err}); nothing is quoted ({experts}).")
        return
    platform = ctx.caps.platform          # the GPU this launch runs on (None: not a known one)
    run = RunDescription(ctx.family, Model.of(ctx.preset), s.as_values(), platform,
                         ctx.caps.to_dict())
    shape = {**shape_key(run), "precision": "bf16"}   # the rows' baseline: bf16
    sets = {"PRECISION": recipe, **({"MOE_EXPERT_IMPL": "te"} if te_experts else {})}
    match = book.find(sets, shape, platform, measured=True,
                      without=() if te_experts else ("MOE_EXPERT_IMPL",))
    said = " ".join(f"{k}={v}" for k, v in sets.items())
    if match is None or not match.exact:     # another recipe's row says nothing of this one
        why = book.note or f"docs/levers.json has no row of {said}"
        s.info("moe_low_precision",
               f"{said} on an MoE model: not measured ({why}; {experts}); measure it before "
               "relying on it for throughput (`python -m training.bench all --te --parts "
               "moe-te-more` on this GPU).")
        return
    entry = match.entry
    measured_on = platform_for_device_name(entry.hardware or "")
    if platform is None or measured_on is None or measured_on.name != platform:
        verdict = (f"measured on {entry.hardware} only, not on "
                   f"{platform or 'this GPU (not a known platform)'}: no verdict here")
    elif entry.verdict == "faster" and (entry.ratio or 0) > 1:
        verdict = "measured faster than bf16 there"
    else:
        verdict = "not recommended for throughput: measured no faster than bf16 there"
    s.info("moe_low_precision",
           f"{said} on an MoE model ({experts}), {verdict}: "
           f"{quote(entry, match.differs, match.exact)}. docs/moe.md has every MoE fp8 row.")


GUARDS = (expert_parallel_sizes, moe_sequence_parallel, fsdp_expert_parallel,
          moe_dispatcher_kernels, moe_expert_kernels, moe_expert_impl, moe_device_counts,
          moe_wgrad_fusion,
          moe_capacity, moe_aux_loss, moe_lean_step, moe_low_precision)

MOE = RecipeLayer("moe", values=lambda settings: [], toggles=TOGGLES, guards=GUARDS,
                  derived=derived)
