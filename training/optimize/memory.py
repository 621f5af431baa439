"""Per-GPU memory estimate of a resolved run: the formula, term by term.

Units: bytes, shown in GiB (2**30). h hidden, f FFN width, n heads, g KV groups, d = h/n,
kv = g*d, V the vocabulary padded as Megatron pads it (to 128*TP), L the layers of one
pipeline stage, b the micro-batch, s the sequence, T = s*b/CP the tokens one rank holds per
micro-batch. TP divides what tensor parallelism shards; "/SP" is /TP with sequence
parallelism and 1 without.

Weights and optimizer (Megatron DDP, bf16 training), per parameter on the rank:
  bf16 weights 2 B + gradient buffer 2 B (GRAD_REDUCE_IN_BF16=1) or 4 B (fp32)
  + fp32 main params 4 B + Adam's two fp32 moments 8 B, both divided by DP*CP under the
  distributed optimizer (Megatron shards them over the data-parallel x context group).
  FSDP=1: everything divided by DP, plus two gathered layers (not calibrated).
  Optimizer step only: with a bf16 gradient buffer Megatron copies each rank's gradient
  shard to fp32 for the step (4 B/shard, freed at the next zero_grad); torch's multi-tensor
  AdamW (no TE/apex fused Adam, not the native backend) adds a sqrt(v) temporary (4 B/shard).
  Precision-aware optimizer (ADAM_MOMENTS_DTYPE / MASTER_WEIGHTS not fp32): the moments take
  4 B (bf16) or 8 B, the master 4 B (fp32 copy), 2 B (16-bit remainder) or 0 B (stochastic
  rounding of the bf16 weights), and the step reads the gradient buffer in place (no fp32
  copy). Its native optimizer's torch path (NATIVE_KERNELS=torch) works in a bounded fp32
  scratch (5 x 4 B x 2^24); its Triton kernel and TE's FusedAdam need none.
  OPTIMIZER_CPU_OFFLOAD=1 (Megatron's HybridDeviceOptimizer): for the share of parameters kept
  on the GPU, an fp32 copy, fp32 moments and the fp32 gradient it casts at the step
  (16 B/shard); the offloaded share's state lives in pinned host memory (a note).

Activations stored for backward, per layer and token (Korthikanti et al. 2022 "Reducing
activation recomputation", Table 2, redone tensor by tensor for this code: RMSNorm, SwiGLU,
GQA, no dropout (p=0), no biases):
  4 x 2h /SP         the two norms' inputs and outputs (the QKV and fc1 GEMM inputs)
  + 2(h + 2kv) /TP   q, k, v after RoPE, kept by the attention kernel
  + 2h /TP           the attention output
  + 2h /TP           native only, MBS > 1: the [s,b,h] copy of it the output projection keeps
                     (SDPA's cuDNN and flash kernels write their output [b,s,n,d] in memory;
                     at b = 1 the [s,b,h] view of it needs no copy: the H200 runs of session 8
                     measured ~2h x s less per layer than this term predicted at MBS 1)
  + 4f + 2f /TP      fc1's output (kept by SwiGLU) and SwiGLU's output (fc2's input)
  local backend (unfused attention): k and v are repeated to n heads (2*2h instead of 2*2kv)
  and the softmax probabilities are kept: + 2*n*s /TP bytes per token (the s^2 term
  that SDPA/flash attention does not store); its QK^T input buffer (2*b*n*s^2/TP) persists.
  RECOMPUTE=selective: the attention core is recomputed: q, k, v and its output stay,
  no probabilities, no repeated k/v.  RECOMPUTE=full: each layer keeps its input (2h /SP);
  one layer's full set is rebuilt at a time during backward.
  Pipeline: the first stage holds min(PP, micro-batches) micro-batches (1F1B).

Mixture of experts (MoE presets; E experts of FFN width f_e, top-k, shared expert f_s):
  parameters  the experts (E x 3h*f_e per layer) are split over EP x ETP: each rank holds
              E/EP experts of f_e/ETP; the router (E x h) is replicated; the attention as
              in a dense layer (with the head dim d: q width n*d, kv width g*d)
  optimizer   under the distributed optimizer the experts' fp32 main params, moments and the
              step's fp32 gradient copy are sharded over the expert-data-parallel ranks
              (world / (EP x ETP x PP)), the dense ones over DP*CP as before
  activations per token and MoE layer, in place of the MLP's 6f/TP:
                k x (2h + 6f_e/ETP)   each routed copy's fc1 input, fc1 output, SwiGLU output
                + 8E                  router logits and scores in fp32
                + 6f_s/TP             the shared expert, if any
  dispatch    EP>1: the all-to-all's send and receive buffers of one layer, 2 x k x 2h per
              token, transient (with the backward working set)
  backward    one MoE layer's input gradients: k x (6f_e/ETP + 2h) per token
Tokens dropped by a capacity factor are counted as routed (an upper bound).

Loss (last stage), at the end of the forward pass:
  final norm input and output 2 x 2h /SP per token, and
  - fused linear cross-entropy (CROSS_ENTROPY_LOSS_FUSION=1, TP=1, CP=1; the native backend,
    or Transformer Engine's with Liger: toggles.fused_linear_ce): no
    logits; it computes the gradients in the forward pass and keeps them: the input
    gradient 2h per token and the output-weight gradient 2*V*h (bf16), plus a second
    2*V*h when the backward pass scales it;
  - otherwise the logits: 2*V/TP per token in bf16 and 4*V/TP in fp32 for the loss
    (the fp32 softmax is kept for backward; the bf16 logits, later their gradient, are
    the transient part).
Backward of one layer adds its gradient working set: 6f/TP per token (fc1/fc2 input
gradients), and for the local backend 2 x 2*n*s/TP (probabilities' and scores' gradients).

fwd/bwd peak = weights+optimizer + persistent buffers + stored activations
               + max(loss-time extras, one layer's backward working set) + overhead
step peak    = weights+optimizer + step-only fp32 gradients/temporaries + persistent + overhead
peak         = the larger of the two, on the pipeline stage where it is largest.

Persistent buffers: the local backend's s^2 scores buffer; under an fp8/fp4 recipe on
Transformer Engine the layers' linear weights cast to the recipe's format with their
transposes (LOW_PRECISION_WEIGHT_BYTES per linear parameter).

Overhead: OVERHEAD_GIB, a stated constant for what the terms above do not name (cuBLAS and
cuDNN workspaces, RoPE tables, the causal mask, allocator rounding). It is not fitted per
run; docs/optimize.md reports the estimator's error against measured peaks with it.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from training.run_description import RunDescription

from .config import (available, device_gib, flce, flce_reason, fused_adam, optimizer_state,
                     precision_aware)

GIB = 2 ** 30
OVERHEAD_GIB = 1.0
# Transformer Engine keeps each fp8/fp4 linear weight cast once per step, in both layouts a
# GEMM needs (the weight and its transpose): 1 B each in fp8, about half that in fp4. fp8 measured
# on the H200 (tests/data/runs/h200_l8_te_fp8: 3.7 GiB more after a step than bf16, for 3.3 GiB
# of this term); the fp4 figure is the formats' size, not yet measured.
LOW_PRECISION_WEIGHT_BYTES = {"fp8": 2.0, "fp8_tensorwise": 2.0, "fp8_blockwise": 2.0,
                              "mxfp8": 2.0, "mxfp4": 1.0, "nvfp4": 1.0}
# Optimizer state per parameter on the rank holding its shard (training/native/adamw.py keeps
# exactly these; tests/native/test_adamw.py counts its tensors against them).
MOMENT_BYTES = {"fp32": 8, "bf16": 4}
MASTER_BYTES = {"fp32": 4, "remainder": 2, "stochastic": 0}
# Megatron's HybridDeviceOptimizer, per parameter whose state stays on the GPU: fp32 copy,
# fp32 moments, the fp32 gradient it casts for the step and keeps.
OFFLOAD_GPU_BYTES = 4 + 8 + 4
# MixedPrecisionAdamW's torch path: its flat fp32 scratch (training/native/adamw.py CHUNK).
TORCH_ADAMW_SCRATCH = 5 * 4 * 2 ** 24
# A run counts as memory-bound when its peak is above this share of the GPU's memory.
MEMORY_BOUND_FRACTION = 0.90


@dataclass
class Term:
    key: str
    label: str
    gib: float
    phase: str                   # static | activations | loss | backward | step | persistent
    formula: str
    in_peak: bool = True         # False: an alternative that is not the one at the peak

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Estimate:
    stage: str                   # which pipeline stage peaks: "only", "first" or "last"
    params_on_rank: float
    terms: list[Term]
    fwd_bwd_gib: float
    step_gib: float
    device_gib: float | None
    notes: list[str] = field(default_factory=list)

    @property
    def peak_gib(self) -> float:
        return max(self.fwd_bwd_gib, self.step_gib)

    @property
    def peak_phase(self) -> str:
        return "forward/backward" if self.fwd_bwd_gib >= self.step_gib else "optimizer step"

    @property
    def fraction(self) -> float | None:
        return self.peak_gib / self.device_gib if self.device_gib else None

    @property
    def fits(self) -> bool | None:
        if self.device_gib is None:
            return None
        return self.peak_gib <= MEMORY_BOUND_FRACTION * self.device_gib

    def term(self, key: str) -> Term | None:
        return next((t for t in self.terms if t.key == key), None)

    def to_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "params_on_rank": self.params_on_rank,
                "peak_gib": self.peak_gib, "peak_phase": self.peak_phase,
                "fwd_bwd_gib": self.fwd_bwd_gib, "step_gib": self.step_gib,
                "device_gib": self.device_gib, "fraction_of_device": self.fraction,
                "memory_bound_fraction": MEMORY_BOUND_FRACTION, "fits": self.fits,
                "overhead_gib": OVERHEAD_GIB,
                "terms": [t.to_dict() for t in self.terms], "notes": self.notes}


def _g(value: float) -> float:
    return value / GIB


def optimizer_state_bytes(moments: str, master_weights: str) -> int:
    """Adam moments + master weights, bytes per parameter (before sharding)."""
    return MOMENT_BYTES[moments] + MASTER_BYTES[master_weights]


_MASTER_LABELS = {"fp32": "fp32 main params",
                  "remainder": "fp32 master as 16-bit remainders (MASTER_WEIGHTS=remainder)",
                  "stochastic": "no master copy (MASTER_WEIGHTS=stochastic: bf16 weights, "
                                "stochastic rounding)"}


def layer_params(c: RunDescription) -> tuple[float, float]:
    """(tensor-parallel-sharded, replicated) non-expert parameters of one layer on one rank."""
    m, lay = c.model, c.layout
    h, f, q = m.hidden_size, m.ffn_hidden_size, m.q_width
    attention = h * (q + 2 * m.kv_width) + q * h         # QKV and output projections
    replicated = 2 * h + (2 * m.head_dim if m.qk_layernorm else 0)  # RMSNorms (q/k norms)
    if getattr(m, "qkv_bias", False):
        attention += q + 2 * m.kv_width                  # Qwen2's q/k/v biases
    if m.moe:
        mlp = 3 * h * m.shared_expert_ffn_hidden_size    # a shared expert, if any
        replicated += m.num_experts * h                  # the router
    else:
        mlp = 3 * h * f                                  # SwiGLU: fc1 (2f x h) + fc2 (h x f)
    return (attention + mlp) / lay.tp, replicated


def expert_parallel(c: RunDescription) -> tuple[int, int]:
    """(EP, ETP) of an MoE run (1, 1 for a dense one or a manifest without them)."""
    return int(c.get("EP", 1)), int(c.get("ETP", 1))


def expert_data_parallel(c: RunDescription) -> int:
    """The ranks the distributed optimizer shards the experts' states over: the world over
    EP x ETP x PP (Megatron's expert grid)."""
    ep, etp = expert_parallel(c)
    return max(c.layout.world_size // (ep * etp * c.layout.pp), 1)


def stage_expert_params(c: RunDescription) -> float:
    """The experts of one pipeline stage's MoE layers on one rank: E/EP experts of f_e/ETP."""
    m = c.model
    if not m.moe:
        return 0.0
    ep, etp = expert_parallel(c)
    per_layer = m.num_experts / ep * 3 * m.hidden_size * m.moe_ffn_hidden_size / etp
    return math.ceil(m.num_layers / c.layout.pp) * per_layer


def stage_params(c: RunDescription, stage: str) -> float:
    m, lay = c.model, c.layout
    sharded, replicated = layer_params(c)
    layers = math.ceil(m.num_layers / lay.pp)
    count = layers * (sharded + replicated) + stage_expert_params(c)
    embedding = m.padded_vocab(lay.tp) * m.hidden_size / lay.tp
    if stage in ("only", "first"):
        count += embedding                               # input embedding
    if stage in ("only", "last"):
        count += m.hidden_size                           # final norm
        # the output layer: its own weights, unless tied to the embedding on the same stage
        # (tied at PP>1, the last stage keeps a copy that Megatron keeps in sync)
        if not (getattr(m, "tied_embeddings", False) and stage == "only"):
            count += embedding
    return count


def activation_bytes_per_token(c: RunDescription,
                               recompute: str | None = None) -> dict[str, float]:
    """Stored bytes per token of one layer on one rank, split by how they are sharded."""
    m, lay = c.model, c.layout
    h, f, n, kv = m.hidden_size, m.ffn_hidden_size, m.num_attention_heads, m.kv_width
    q = m.q_width                                         # n*d: h unless the head dim is its own
    mode = recompute or c["RECOMPUTE"]
    sp_div = lay.tp if c["SEQUENCE_PARALLEL"] else 1
    if mode == "full":
        return {"sp": 2 * h / sp_div, "tp": 0.0, "scores": 0.0}
    norms = 4 * 2 * h
    mlp = 4 * f + 2 * f
    if m.moe:   # the routed copies (fc1 input, fc1 and SwiGLU outputs), router, shared expert
        etp = expert_parallel(c)[1]
        mlp = (m.router_topk * (2 * h + 6 * m.moe_ffn_hidden_size / etp) + 8 * m.num_experts
               + 6 * m.shared_expert_ffn_hidden_size)
    if mode == "selective":
        attention = 2 * (q + 2 * kv) + 2 * q
        scores = 0.0
    elif c.backend == "local":
        attention = 2 * q + 2 * 2 * q + 2 * q            # q, k and v repeated to n heads, context
        scores = 2 * n * m.seq_length                     # bf16 softmax probabilities
    elif c.backend == "native":
        attention = 2 * (q + 2 * kv) + 2 * q              # q, k, v, SDPA output
        if _native_attention_copy(c):
            attention += 2 * q                            # its [s,b,h] copy (MBS > 1)
        scores = 0.0
    else:                                                 # transformer_engine
        attention = 2 * (q + 2 * kv) + 2 * q
        scores = 0.0
    return {"sp": norms / sp_div, "tp": (attention + mlp) / lay.tp, "scores": scores / lay.tp}


def _native_attention_copy(c: RunDescription) -> bool:
    """The native backend's output projection keeps a copy of the attention output only when
    the [b,s,n,d] -> [s,b,h] reordering is not a view: micro-batches of more than one."""
    return c.layout.mbs > 1


def _formula_per_token(c: RunDescription, mode: str) -> str:
    text = _dense_formula_per_token(c, mode)
    m = c.model
    if m.moe:
        experts = ("k(2h + 6f_e" + ("/ETP" if expert_parallel(c)[1] > 1 else "") + ") + 8E"
                   + (" + 6f_s" if m.shared_expert_ffn_hidden_size else ""))
        text = text.replace("6f", experts)
    return text


def _dense_formula_per_token(c: RunDescription, mode: str) -> str:
    lay = c.layout
    sp = "/TP" if c["SEQUENCE_PARALLEL"] and lay.tp > 1 else ""
    if mode == "full":
        return "2h" + sp + " (layer input only)"
    tp = "/TP" if lay.tp > 1 else ""
    if mode == "selective":
        return f"8h{sp} + (2(h+2kv) + 2h + 6f){tp}"
    if c.backend == "local":
        return f"8h{sp} + (8h + 6f){tp} + 2ns{tp} (probabilities)"
    if c.backend == "native" and _native_attention_copy(c):
        return f"8h{sp} + (2(h+2kv) + 4h + 6f){tp}"
    return f"8h{sp} + (2(h+2kv) + 2h + 6f){tp}"


def _stage_estimate(c: RunDescription, stage: str) -> Estimate:
    m, lay = c.model, c.layout
    h, f, n = m.hidden_size, m.ffn_hidden_size, m.num_attention_heads
    V = m.padded_vocab(lay.tp)
    tokens = m.seq_length * lay.mbs / lay.cp
    sp_div = lay.tp if c["SEQUENCE_PARALLEL"] else 1
    layers = math.ceil(m.num_layers / lay.pp)
    params = stage_params(c, stage)
    terms: list[Term] = []
    notes: list[str] = []

    # -- weights, gradients, optimizer ---------------------------------------------------------
    grad_bytes = 2 if c["GRAD_REDUCE_IN_BF16"] else 4
    grad_name = "bf16" if c["GRAD_REDUCE_IN_BF16"] else "fp32"
    if c["FSDP"]:
        shard = lay.dp
        sharded, replicated = layer_params(c)
        gathered = 2 * (sharded + replicated) * (2 + grad_bytes)
        terms += [
            Term("weights", "bf16 weights (FSDP: /DP)", _g(params * 2 / shard), "static",
                 f"{params / 1e9:.3f}B params x 2 B / DP {shard}"),
            Term("grads", f"{grad_name} gradients (FSDP: /DP)", _g(params * grad_bytes / shard),
                 "static", f"params x {grad_bytes} B / DP {shard}"),
            Term("main_params", "fp32 main params (/DP)", _g(params * 4 / shard), "static",
                 f"params x 4 B / DP {shard}"),
            Term("adam", "Adam moments, 2 x fp32 (/DP)", _g(params * 8 / shard), "static",
                 f"params x 8 B / DP {shard}"),
            Term("fsdp_gathered", "FSDP: two layers gathered", _g(gathered), "static",
                 f"2 layers x {(sharded + replicated) / 1e6:.0f}M params x (2 + {grad_bytes}) B"),
        ]
        step_extra = 0.0
        notes.append("FSDP=1 is modelled as full sharding of weights, gradients and optimizer "
                     "state over DP plus two gathered layers; not calibrated on a measured run.")
    else:
        shard = lay.dp * lay.cp if c["DISTRIBUTED_OPTIMIZER"] else 1
        where = (f"/ (DP*CP = {shard})" if c["DISTRIBUTED_OPTIMIZER"]
                 else "(not sharded: DISTRIBUTED_OPTIMIZER=0)")
        # the experts' states shard over the expert-data-parallel ranks (world / EP*ETP*PP)
        experts = stage_expert_params(c)
        expert_shard = expert_data_parallel(c) if c["DISTRIBUTED_OPTIMIZER"] else 1
        if experts and c["DISTRIBUTED_OPTIMIZER"]:
            where += f"; the {experts / 1e9:.3f}B expert params / (expert DP = {expert_shard})"

        def sharded(per_param: float) -> float:
            return (params - experts) * per_param / shard + experts * per_param / expert_shard

        terms += [
            Term("weights", "bf16 weights", _g(params * 2), "static",
                 f"{params / 1e9:.3f}B params x 2 B"),
            Term("grads", f"{grad_name} gradient buffer", _g(params * grad_bytes), "static",
                 f"params x {grad_bytes} B (GRAD_REDUCE_IN_BF16={int(c['GRAD_REDUCE_IN_BF16'])})"),
        ]
        moments_dtype, master_weights, offload, fraction = optimizer_state(c)
        aware = precision_aware(c)
        if offload:
            terms.append(Term("main_params", "CPU offload: the GPU part's fp32 params, moments "
                                             "and gradients", _g(sharded(OFFLOAD_GPU_BYTES
                                                                         * (1.0 - fraction))),
                              "static", f"params x {OFFLOAD_GPU_BYTES} B x (1 - "
                                        f"OPTIMIZER_OFFLOAD_FRACTION {fraction:g}) {where}"))
            host = sharded(OFFLOAD_GPU_BYTES * fraction)
            notes.append(f"OPTIMIZER_CPU_OFFLOAD=1: {_g(host):.1f} GiB of optimizer state per "
                         "rank in pinned host memory (fp32 params, moments and gradients of "
                         f"{fraction:.0%} of the parameters), not in this estimate.")
        else:
            master = MASTER_BYTES[master_weights] if aware else 4
            moments = MOMENT_BYTES[moments_dtype] if aware else 8
            terms += [
                Term("main_params", _MASTER_LABELS[master_weights if aware else "fp32"],
                     _g(sharded(master)), "static", f"params x {master} B {where}"),
                Term("adam", f"Adam moments (2 x {moments_dtype if aware else 'fp32'})",
                     _g(sharded(moments)), "static", f"params x {moments} B {where}"),
            ]
        step_extra = 0.0
        if c["GRAD_REDUCE_IN_BF16"] and not aware:
            step_extra += sharded(4)
            terms.append(Term("step_fp32_grads", "fp32 copy of the gradient shard (step only)",
                              _g(sharded(4)), "step",
                              f"params x 4 B {where}: bf16 grads -> fp32 for the optimizer"))
        if (aware and not offload and c.backend == "native"
                and c["NATIVE_KERNELS"] == "torch" and not available(c, "transformer_engine")):
            step_extra += TORCH_ADAMW_SCRATCH
            terms.append(Term("step_adam_tmp", "MixedPrecisionAdamW torch path: fp32 scratch "
                                               "(step only)", _g(TORCH_ADAMW_SCRATCH), "step",
                              "5 x 4 B x 2^24 elements, whatever the model size"))
        if not fused_adam(c) and not aware:
            step_extra += sharded(4)
            terms.append(Term("step_adam_tmp", "torch multi-tensor AdamW temporary (step only)",
                              _g(sharded(4)), "step",
                              f"params x 4 B {where}: sqrt(v) of the unfused AdamW"))
    static = sum(t.gib for t in terms if t.phase == "static") * GIB

    # -- persistent buffers and overhead -----------------------------------------------------
    persistent = 0.0
    if c.backend == "local":
        buffer = 2 * lay.mbs * (n / lay.tp) * m.seq_length * m.seq_length
        persistent += buffer
        terms.append(Term("scores_buffer", "QK^T input buffer (local backend)", _g(buffer),
                          "persistent", "2 B x b x n/TP x s^2 (Megatron's global memory buffer)"))
    if c.backend == "transformer_engine" and c.precision in LOW_PRECISION_WEIGHT_BYTES:
        sharded_per_layer, _ = layer_params(c)
        linear = math.ceil(m.num_layers / lay.pp) * sharded_per_layer + stage_expert_params(c)
        per = LOW_PRECISION_WEIGHT_BYTES[c.precision]
        persistent += linear * per
        terms.append(Term("low_precision_weights", f"{c.precision} copies of the layers' "
                          "linear weights (Transformer Engine's cache)", _g(linear * per),
                          "persistent", f"{linear / 1e9:.3f}B linear params x {per:g} B: each "
                          "weight cast once per step and kept with its transpose for the "
                          "micro-batches (embedding and output layer stay bf16)"))
    terms.append(Term("overhead", "workspaces, tables, allocator (constant)", OVERHEAD_GIB,
                      "persistent", "stated constant (cuBLAS/cuDNN workspaces, RoPE, masks)"))
    persistent += OVERHEAD_GIB * GIB

    # -- activations ---------------------------------------------------------------------------
    inflight = min(lay.pp, lay.microbatches) if (stage == "first" and lay.pp > 1) else 1
    per_token = activation_bytes_per_token(c)
    per_token_total = sum(per_token.values())
    stored = layers * tokens * per_token_total * inflight
    label = f"activations, RECOMPUTE={c['RECOMPUTE']}"
    terms.append(Term("activations", label, _g(stored), "activations",
                      f"{layers} layers x {tokens:.0f} tokens x {per_token_total:.0f} B "
                      f"[{_formula_per_token(c, c['RECOMPUTE'])}]"
                      + (f" x {inflight} micro-batches in flight" if inflight > 1 else "")))

    full = activation_bytes_per_token(c, "none")
    # Backward of one layer: its input gradients (6f/TP per token); the local backend's
    # unfused attention also holds the probabilities' and scores' gradients (2 x 2ns/TP),
    # and under RECOMPUTE=selective the probabilities rebuilt for it (2ns/TP).
    attn_grads = 2 * 2 * n * m.seq_length / lay.tp if c.backend == "local" else 0.0
    if c.backend == "local" and c["RECOMPUTE"] == "selective":
        attn_grads += 2 * n * m.seq_length / lay.tp
    mlp_grads = 6 * f / lay.tp
    mlp_text = "6f/TP"
    if m.moe:   # the routed copies' input gradients; EP>1: the all-to-all's two buffers
        ep, etp = expert_parallel(c)
        mlp_grads = (m.router_topk * (6 * m.moe_ffn_hidden_size / etp + 2 * h)
                     + (2 * m.router_topk * 2 * h if ep > 1 else 0)) / lay.tp
        mlp_text = ("k(6f_e" + ("/ETP" if etp > 1 else "") + " + 2h)"
                    + (" + 2 x k x 2h (all-to-all buffers)" if ep > 1 else "") + "/TP")
    per_token_backward = max(mlp_grads, attn_grads)
    backward = tokens * per_token_backward
    backward_formula = (f"one layer: {mlp_text} per token" if c.backend != "local" else
                        f"one layer: max({mlp_text}, 2 x 2ns" +
                        (" + 2ns rebuilt" if c["RECOMPUTE"] == "selective" else "") +
                        "/TP) per token (attention probabilities' gradients)")
    if c["RECOMPUTE"] == "full":
        rebuilt = tokens * sum(full.values())
        backward += rebuilt
        backward_formula = (f"one layer rebuilt ({sum(full.values()):.0f} B/token) + "
                            + backward_formula.replace("one layer: ", ""))

    loss = 0.0
    if stage in ("only", "last"):
        norm = tokens * 4 * h / sp_div
        if flce(c):
            loss_stored = tokens * 2 * h + 2 * V * h
            loss_transient = 2 * V * h + tokens * 2 * h
            loss_formula = ("fused linear CE, no logits: 2h per token + output-weight "
                            "gradient 2Vh, x2 while backward scales it; final norm 4h")
        else:
            loss_stored = tokens * 4 * V / lay.tp
            loss_transient = tokens * 2 * V / lay.tp
            loss_formula = (f"logits ({flce_reason(c)}): (2 B bf16 + 4 B fp32) x V/TP per token; "
                            "final norm 4h")
        loss = norm + loss_stored + loss_transient
    at_loss = stored + loss
    at_backward = stored + backward
    loss_peak = at_loss >= at_backward
    if stage in ("only", "last"):
        terms.append(Term("loss", "loss: logits / fused CE, final norm", _g(loss), "loss",
                          loss_formula, in_peak=loss_peak))
    terms.append(Term("backward", "backward working set", _g(backward), "backward",
                      backward_formula, in_peak=not loss_peak))

    fwd_bwd = static + persistent + max(at_loss, at_backward)
    step = static + step_extra + persistent

    if c.precision != "bf16":
        notes.append(f"PRECISION={c.precision}: estimated as bf16 (Transformer Engine's fp8/fp4 "
                     "weight copies and low-precision activation storage are not modelled).")
    if c.backend == "transformer_engine":
        notes.append("Transformer Engine backend: activations follow the same tensor count "
                     "without the native backend's attention-output copy; not calibrated on a "
                     "measured TE run.")
    if lay.cp > 1:
        notes.append("CP>1: tokens per rank divided by CP; ring-attention KV buffers not modelled.")
    if precision_aware(c):
        notes.append("Precision-aware optimizer state (ADAM_MOMENTS_DTYPE, MASTER_WEIGHTS, "
                     "OPTIMIZER_CPU_OFFLOAD): its terms are the state's bytes per parameter "
                     "(counted from the optimizer's tensors in tests/native), calibrated on "
                     "the measured runs tests/data/runs/h200_*opt_state*, *cpu_offload and "
                     "the lean MoE runs h200_l8_moe_lean, h200_l4_mixtral_lean (python -m "
                     "training.optimize.calibration).")
    if m.moe:
        notes.append("MoE: routed tokens counted as balanced over the experts (a busy expert "
                     "holds more); calibrated on one GPU on Qwen3-30B-A3B cut to 8 layers and "
                     "Mixtral-8x7B cut to 4 (tests/data/runs/h200_l8_moe_*, h200_l4_mixtral_*), "
                     "not yet with expert parallelism.")
    return Estimate(stage=stage, params_on_rank=params, terms=terms, fwd_bwd_gib=_g(fwd_bwd),
                    step_gib=_g(step), device_gib=device_gib(c), notes=notes)


def estimate(c: RunDescription) -> Estimate:
    """The estimate on the pipeline stage whose peak is largest."""
    if c.layout.pp == 1:
        return _stage_estimate(c, "only")
    first, last = _stage_estimate(c, "first"), _stage_estimate(c, "last")
    return first if first.peak_gib >= last.peak_gib else last


def error_pct(estimated: float, measured: float) -> float:
    return 100.0 * (estimated - measured) / measured


# The estimate's phases and the names a run records them under (training/loop_hooks.PhasePeaks)
ESTIMATE_PHASES = (("forward/backward", "fwd_bwd_gib", "forward_backward"),
                   ("optimizer step", "step_gib", "optimizer_step"))


def phase_errors(est: Estimate, measured: dict[str, float]) -> dict[str, dict[str, float]]:
    """Estimated against measured peak per phase, for the phases the run recorded."""
    out = {}
    for label, attr, key in ESTIMATE_PHASES:
        if key in measured:
            estimated = getattr(est, attr)
            out[label] = {"estimated_gib": estimated, "measured_gib": measured[key],
                          "error_pct": error_pct(estimated, measured[key])}
    return out
