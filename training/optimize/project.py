"""Throughput projection: a launch's step time on N GPUs of a named platform, on paper.

    python -m training.optimize.project [--family llama3] [--vpp N] [--json] KEY=VALUE ...

takes the launcher's settings words (MODEL_SIZE=70B NNODES=8 GPUS_PER_NODE=8 TP=4 PP=4
PLATFORM=mi355x PRECISION=fp8 ...), resolves them with the launcher's own resolve (DRY_RUN,
so the layout is the one a launch would run, guards included) and projects one optimizer
step per GPU:

  compute      model FLOPs of the step (x 4/3 under full recompute) / (the platform's dense
               peak for the precision x the efficiency fitted to the published and recorded
               references: training/optimize/efficiency.py, docs/scale/references.md)
  bubble       the pipeline's idle share, (PP-1) / (VPP x micro-batches) of compute (1F1B,
               interleaved when VPP > 1)
  tp           tensor/sequence-parallel collectives: per layer and micro-batch 8 transfers of
               (TP-1)/TP of the activation (all-gather + reduce-scatter in and out of attention
               and MLP, forward and backward), not overlapped
  cp           context-parallel ring exchange of K and V (forward) and their gradients
               (backward), exposed only where it outlasts the attention it overlaps
  ep           expert all-to-all (dispatch and combine, forward and backward); overlapped with
               another micro-batch's compute where --overlap-moe-expert-parallel-comm is set
  dp           the data-parallel gradient reduce-scatter / all-reduce and the distributed
               optimizer's parameter all-gather; with OVERLAP_GRAD_REDUCE / OVERLAP_PARAM_GATHER
               only what outlasts the last micro-batch's backward / the first's forward is
               exposed; FSDP gathers and reduces every layer every micro-batch, prefetched: the
               first layer's gather is exposed, the rest where it outlasts compute

Every projection carries a band: the range of the leave-one-out errors of its class (dense or
MoE, by precision) in the reference table, the whole table's where the run has a feature no
reference informs.
Links come from training/platforms.py (per GPU per direction, with sources): a group inside
one NVLink/xGMI domain runs at the scale-up figure, one that spans domains at the network's.
Every assumption is printed beside the number (`assumptions`). Memory is the pre-flight's
estimate (training/optimize/memory.py). Errors against published figures:
docs/scale.md (python -m training.optimize.references).
"""
from __future__ import annotations

import json
import shlex
import sys
from dataclasses import dataclass
from typing import Any

from training.cli import ArgumentParser, positive_int
from training.platforms import PLATFORMS
from training.run_description import RunDescription

from . import efficiency
from .inputs import BadInput

BF16_BYTES = 2
VPP_FLAGS = ("--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank")
A2A_OVERLAP_FLAG = "--overlap-moe-expert-parallel-comm"


@dataclass(frozen=True)
class Term:
    key: str
    seconds: float
    how: str        # the formula with its numbers

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "seconds": self.seconds, "how": self.how}


def vpp_of(run: RunDescription) -> int:
    """Virtual pipeline stages per rank from EXTRA_MEGATRON_ARGS (1 when not set)."""
    words = shlex.split(str(run.get("EXTRA_MEGATRON_ARGS") or ""))
    for i, word in enumerate(words):
        flag, _, value = word.partition("=")
        if flag in VPP_FLAGS:
            value = value or (words[i + 1] if i + 1 < len(words) else "")
            try:
                n = int(value)
            except ValueError:
                raise BadInput(f"EXTRA_MEGATRON_ARGS: {flag} needs a whole number") from None
            if flag == VPP_FLAGS[1]:
                return n
            return max(run.model.num_layers // max(run.layout.pp * n, 1), 1)
    return 1


def a2a_overlapped(run: RunDescription) -> bool:
    """Megatron's expert all-to-all overlapped with another micro-batch's compute
    (--overlap-moe-expert-parallel-comm in EXTRA_MEGATRON_ARGS)."""
    return A2A_OVERLAP_FLAG in shlex.split(str(run.get("EXTRA_MEGATRON_ARGS") or ""))


def _gbs(bytes_: float, gbs: float) -> float:
    return bytes_ / (gbs * 1e9)


def group_bandwidth(platform, span: int, stride: int, gpus_per_node: int,
                    kind: str = "ring") -> tuple[float, str]:
    """(effective GB/s per GPU per direction, how) of a collective over `span` ranks `stride`
    apart. Inside one NVLink/xGMI domain: the scale-up figure. Across domains, with m of the
    group's ranks in each of k domains, each GPU driving its own NIC: a ring collective
    (all-gather, reduce-scatter, all-reduce) moves (k-1)/k of the data over the network split
    among the m ranks of a domain (NCCL/RCCL's rings, one per NIC); an all-to-all sends each
    rank's own (k-1)/k off the domain; a point-to-point send goes over the network whole. The
    per-rank volumes the terms count are the flat (n-1)/n ones, so the network figure is scaled
    by their ratio."""
    domain = platform.scale_up_domain if platform.scale_up_domain > 8 \
        else min(platform.scale_up_domain, max(gpus_per_node, 1))
    if span * stride <= domain:
        return platform.scale_up_gbs, f"scale-up {platform.scale_up_gbs:g} GB/s"
    net = platform.scale_out_gbs
    if kind == "p2p":
        return net, f"network {net:g} GB/s"
    per_domain = max(1, min(span, domain // max(stride, 1)))
    domains = span / per_domain
    flat = (span - 1) / span
    off = (domains - 1) / domains / (per_domain if kind == "ring" else 1)
    effective = min(platform.scale_up_gbs, net * flat / off)
    return effective, (f"network {net:g} GB/s across {domains:g} domains x {per_domain} ranks "
                       f"({kind}): {effective:.0f} GB/s effective")


def peak_for(platform, precision: str) -> float:
    """The dense peak a precision's GEMMs are counted against: bf16's, or the fp8 rate for the
    fp8 recipes, MXFP8 (where the tensor cores run MX) and the fp4 recipes (where the GPU runs
    them: nvfp4 on sm100+, mxfp4 on gfx950; the fitted fp4 coefficient carries their gain)."""
    from training.launch.recipes import RECIPES

    recipe = RECIPES.get(precision)
    peak = platform.peak_tflops(precision)
    if recipe is not None and recipe.kind == "fp4":
        sm, gfx = platform.sm, platform.gfx
        runs = ((recipe.min_sm is not None and sm is not None and sm >= recipe.min_sm)
                or (recipe.min_gfx is not None and gfx is not None and gfx >= recipe.min_gfx))
        peak = platform.peak_fp8_tflops if runs else None
    if peak is None:
        raise BadInput(f"PRECISION={precision}: {platform.name} does not run it (the projection "
                       "covers bf16, the fp8 recipes, mxfp8 where the GPU runs MX formats, "
                       "nvfp4 on sm100+ and mxfp4 on gfx950)")
    return peak


def bf16_share(model) -> float:
    """The share of a step's model FLOPs a low-precision recipe still runs in bf16: attention's
    scores and weighted sum (flash attention) and the output layer's logits (Megatron keeps
    the output layer out of the fp8/fp4 autocast)."""
    from training.metrics import flops_per_token

    from .efficiency import attention_share

    logits = 3 * 2 * model.hidden_size * model.vocab_size
    return attention_share(model) + logits / flops_per_token(model)


def compute_peak(run: RunDescription, platform) -> tuple[float, str]:
    """(the rate a step's FLOPs run at with a perfect efficiency, how): the precision's peak,
    or for a low-precision recipe the harmonic blend of its peak for the GEMMs and the bf16
    peak for the bf16 share (bf16_share)."""
    peak = peak_for(platform, run.precision)
    if run.precision == "bf16":
        return peak, f"{peak:g} TFLOP/s"
    share = bf16_share(run.model)
    blended = 1 / ((1 - share) / peak + share / platform.peak_bf16_tflops)
    return blended, (f"{blended:.0f} TFLOP/s ({run.precision} peak {peak:g} for the GEMMs, bf16 "
                     f"peak {platform.peak_bf16_tflops:g} for the {share:.1%} of the FLOPs in "
                     f"attention and logits)")


def recompute_factor(run: RunDescription) -> tuple[float, str]:
    """FLOPs executed over model FLOPs: full recompute runs every layer's forward again (4/3),
    selective the attention scores' forward (1 + their share / 3)."""
    from .efficiency import attention_share

    mode = run.get("RECOMPUTE") or "none"
    if mode == "full":
        return 4 / 3, "RECOMPUTE=full: every layer's forward again, 4/3 of the model FLOPs"
    if mode == "selective":
        share = attention_share(run.model)
        return 1 + share / 3, (f"RECOMPUTE=selective: the attention scores' forward again, "
                               f"1 + {share:.3f}/3 of the model FLOPs")
    return 1.0, ""


def project(run: RunDescription, vpp: int | None = None, model=None) -> dict[str, Any]:
    """The projected step of a resolved run on its platform. `model`: the fitted efficiency
    (training.optimize.references.model(), the default) with its error bands."""
    from training.metrics import flops_per_token

    from .memory import estimate

    platform = _platform(run)
    if model is None:
        from .references import model as fitted
        model = fitted()
    fit = model.fit
    vpp = vpp or vpp_of(run)
    m, lay = run.model, run.layout
    precision = run.precision
    assumptions: list[str] = list(getattr(run, "projection_notes", ()))
    peak = peak_for(platform, precision)
    rate, rate_how = compute_peak(run, platform)
    x = efficiency.features(run)
    eff = fit.efficiency(x)
    contributions = ", ".join(f"{k} {v:g} x {c:+.3f}" for k, v, c in fit.terms(x))
    assumptions.append(f"efficiency {eff:.3f} of {rate_how} = exp("
                       f"{contributions}), fitted to {len(fit.ids)} references "
                       f"(docs/scale/references.md)")
    missing = fit.uninformed(x)
    if missing:
        assumptions.append(f"no reference informs {', '.join(missing)}: the shared value is "
                           "used (the band is the widest of the table)")
    if precision == "mxfp4":
        assumptions.append("mxfp4 takes the fp4 coefficient the published nvfp4 runs inform "
                           "(no published mxfp4 training throughput is in the table)")
    factor, why = recompute_factor(run)
    if why:
        assumptions.append(why)
    fpt = flops_per_token(m)
    tokens_gpu = lay.global_batch * m.seq_length / lay.world_size
    compute = fpt * tokens_gpu * factor / (rate * 1e12 * eff)
    terms = [Term("compute", compute,
                  f"{fpt / 1e9:.1f} GFLOP/token x {tokens_gpu:,.0f} tokens/GPU"
                  f"{f' x {factor:.3f}' if factor != 1 else ''} / ({rate:.0f} TFLOP/s x "
                  f"{eff:.3f})")]
    terms += other_terms(run, platform, compute, vpp, assumptions)
    assumptions.append(f"{platform.name} peak {peak:g} TFLOP/s ({precision}) and links: "
                       f"{platform.sources}")
    step = sum(t.seconds for t in terms)
    tokens_s = tokens_gpu / step
    est = estimate(run)
    exposed = step - compute - sum(t.seconds for t in terms if t.key == "pp_bubble")
    band = model.band(run, uninformed=bool(missing))
    return {
        "platform": platform.name, "precision": precision, "backend": run.backend,
        "model": m.name, "num_layers": m.num_layers, "seq_length": m.seq_length,
        "layout": {"nnodes": lay.nnodes, "gpus_per_node": lay.gpus_per_node,
                   "world_size": lay.world_size, "tp": lay.tp, "pp": lay.pp, "vpp": vpp,
                   "cp": lay.cp, "ep": _ep(run)[0], "dp": lay.dp, "mbs": lay.mbs,
                   "global_batch": lay.global_batch, "microbatches": lay.microbatches,
                   "recompute": run.get("RECOMPUTE") or "none",
                   "distributed_optimizer": bool(run.get("DISTRIBUTED_OPTIMIZER")),
                   "fsdp": bool(run.get("FSDP"))},
        "terms": [t.to_dict() for t in terms],
        "step_s": step, "compute_s": compute, "exposed_comm_s": exposed,
        "efficiency": eff, "features": x,
        "tokens_per_s_per_gpu": tokens_s,
        "band": {"class": band.name, "low": tokens_s / (1 + band.high_pct / 100),
                 "high": tokens_s / (1 + band.low_pct / 100), "low_pct": band.low_pct,
                 "high_pct": band.high_pct, "references": band.count,
                 "how": band.how},
        "model_tflops_per_gpu": fpt * tokens_s / 1e12,
        "mfu": fpt * tokens_s / (peak * 1e12),
        "flops_per_token": fpt,
        "memory": {"peak_gib": est.peak_gib, "device_gib": float(platform.memory_gib),
                   "fits": est.peak_gib <= platform.memory_gib,
                   "estimator": "training/optimize/memory.py"},
        "assumptions": assumptions,
    }


def _platform(run: RunDescription):
    platform = PLATFORMS.get(run.platform or "")
    if platform is None:
        raise BadInput(f"PLATFORM={run.platform!r}: the projection needs a named platform "
                       f"({', '.join(PLATFORMS)})")
    return platform


def _ep(run: RunDescription) -> tuple[int, int]:
    from .memory import expert_parallel
    return expert_parallel(run)


def implied_compute(run: RunDescription, step_s: float, vpp: int | None = None) -> float:
    """The compute time that makes the projected step equal `step_s` (the layout's bubble and
    exposed communication added): bisection, the step growing with compute. 0 when the
    communication alone outlasts the step."""
    platform = _platform(run)
    vpp = vpp or vpp_of(run)

    def step(compute: float) -> float:
        return compute + sum(t.seconds for t in other_terms(run, platform, compute, vpp, []))

    low, high = 0.0, step_s
    if step(low) >= step_s:
        return 0.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if step(mid) < step_s else (low, mid)
    return (low + high) / 2


def other_terms(run: RunDescription, platform, compute: float, vpp: int,
                assumptions: list[str]) -> list[Term]:
    """Every term of the step but compute, given the compute time of the step."""
    from .memory import stage_expert_params, stage_params

    m, lay = run.model, run.layout
    tp, pp, cp, dp = lay.tp, lay.pp, lay.cp, lay.dp
    ep, etp = _ep(run)
    if vpp > 1 and pp == 1:
        raise BadInput(f"--vpp {vpp} with PP=1: virtual stages interleave the stages of a "
                       "pipeline, and this run has one stage; set PP above 1 or leave --vpp out")
    if vpp > 1 and (m.num_layers // pp) % vpp:
        raise BadInput(f"--vpp {vpp} does not divide the {m.num_layers // pp} layers of each of "
                       f"the {pp} pipeline stages (Megatron asserts it): choose a divisor")
    micro = lay.microbatches
    terms: list[Term] = []
    per_micro = compute / micro   # one micro-batch's forward + backward on one GPU

    # -- pipeline bubble ------------------------------------------------------------------------
    if pp > 1:
        bubble = compute * (pp - 1) / (vpp * micro)
        terms.append(Term("pp_bubble", bubble,
                          f"compute x (PP-1)/(VPP x micro-batches) = (PP {pp} - 1)/({vpp} x "
                          f"{micro})" + (" interleaved 1F1B" if vpp > 1 else " 1F1B")))
        bw, link = group_bandwidth(platform, pp, lay.world_size // pp, lay.gpus_per_node,
                                   kind="p2p")
        act = lay.mbs * m.seq_length / cp * m.hidden_size * BF16_BYTES / tp
        send = 2 * act / (bw * 1e9)                     # activation forward, gradient backward
        chunk = compute / (micro * vpp)                 # one micro-batch of one virtual stage
        exposed = max(0.0, send - chunk) * micro * vpp
        terms.append(Term("pp_p2p", exposed,
                          f"send/recv {act / 2**20:.0f} MiB x 2 per micro-batch and virtual stage "
                          f"/ {link} = {send * 1e3:.2f} ms, overlapped with {chunk * 1e3:.1f} ms "
                          f"of compute ({micro} x {vpp})"))
        assumptions.append("pipeline p2p overlaps the compute of the same micro-batch chunk "
                           "(Megatron's overlapped p2p); stages are balanced")

    layers = -(-m.num_layers // pp)
    tokens_micro = lay.mbs * m.seq_length / cp          # per rank before SP splits them
    # -- tensor / sequence parallel -------------------------------------------------------------
    if tp > 1:
        bw, link = group_bandwidth(platform, tp, 1, lay.gpus_per_node)
        act = tokens_micro * m.hidden_size * BF16_BYTES
        volume = layers * micro * 8 * (tp - 1) / tp * act
        terms.append(Term("tp", _gbs(volume, bw),
                          f"{layers} layers x {micro} micro-batches x 8 x (TP-1)/TP x "
                          f"{act / 2**20:.0f} MiB activation / {link}"))
        assumptions.append("TP collectives are not overlapped with GEMMs (no TP comm overlap "
                           "in the launcher); the GEMMs' efficiency at their TP split is the "
                           "fitted log_tp coefficient")
    # -- context parallel -----------------------------------------------------------------------
    if cp > 1:
        from .efficiency import attention_share

        bw, link = group_bandwidth(platform, cp, tp, lay.gpus_per_node, kind="p2p")
        kv = lay.mbs * (m.seq_length / cp) * 2 * m.kv_width / tp * BF16_BYTES
        comm = layers * micro * 3 * (cp - 1) * kv / (bw * 1e9)
        attention = compute * attention_share(m)
        exposed = max(0.0, comm - attention)
        terms.append(Term("cp", exposed,
                          f"ring K/V: {layers} layers x {micro} micro-batches x 3 x (CP-1) x "
                          f"{kv / 2**20:.1f} MiB / {link} = {comm * 1e3:.1f} ms, overlapped "
                          f"with attention {attention * 1e3:.1f} ms"))
    # -- expert parallel ------------------------------------------------------------------------
    if m.moe and ep > 1:
        dispatcher = run.get("MOE_TOKEN_DISPATCHER") or "alltoall"
        bw, link = group_bandwidth(platform, ep, tp * cp if etp == 1 else etp,
                                   lay.gpus_per_node, kind="alltoall" if dispatcher ==
                                   "alltoall" else "ring")
        local_tokens = tokens_micro / tp
        if dispatcher == "allgather":
            per = local_tokens * (ep - 1) * m.hidden_size * BF16_BYTES
            what = "all-gather/reduce-scatter of every rank's tokens"
        else:
            per = local_tokens * m.router_topk * (ep - 1) / ep * m.hidden_size * BF16_BYTES
            what = "all-to-all of top-k copies"
        comm = _gbs(layers * micro * 4 * per, bw)
        how = (f"{dispatcher}: {layers} MoE layers x {micro} micro-batches x 4 x "
               f"{per / 2**20:.0f} MiB ({what}) / {link} = {comm * 1e3:.1f} ms")
        if a2a_overlapped(run):
            terms.append(Term("ep", max(0.0, comm - compute),
                              how + f", overlapped with another micro-batch's compute "
                                    f"({compute * 1e3:.0f} ms)"))
            assumptions.append(f"{A2A_OVERLAP_FLAG}: the expert all-to-all runs behind "
                               "another micro-batch's compute")
        else:
            terms.append(Term("ep", comm, how + ", not overlapped"))
            assumptions.append(f"expert dispatch/combine are not overlapped (Megatron's "
                               f"{A2A_OVERLAP_FLAG} in EXTRA_MEGATRON_ARGS overlaps them)")
    # -- data parallel --------------------------------------------------------------------------
    terms.extend(_data_parallel(run, platform, per_micro, micro, dp, assumptions,
                                stage_params, stage_expert_params))
    return terms


def _data_parallel(run, platform, per_micro, micro, dp, assumptions, stage_params,
                   stage_expert_params) -> list[Term]:
    lay = run.layout
    if dp == 1:
        return []
    stage = "only" if lay.pp == 1 else "first"
    params = stage_params(run, stage)
    experts = stage_expert_params(run)
    dense = params - experts
    grad_bytes = 2 if run.get("GRAD_REDUCE_IN_BF16") else 4
    bw, link = group_bandwidth(platform, dp, lay.tp * lay.cp, lay.gpus_per_node)
    share = (dp - 1) / dp
    if run.get("FSDP"):
        volume = micro * dense * share * (2 * BF16_BYTES + grad_bytes)
        comm = _gbs(volume, bw)
        layers = max(run.model.num_layers // lay.pp, 1)
        first = _gbs(dense / layers * share * BF16_BYTES, bw)   # nothing to hide it behind
        exposed = first + max(0.0, comm - per_micro * micro)
        assumptions.append("FSDP: each layer's parameters gathered forward and backward and its "
                           "gradients reduced every micro-batch, prefetched behind the layer "
                           "before; the first layer's gather is exposed, the rest only where "
                           "it outlasts compute (the fitted fsdp coefficient: its contention)")
        return [Term("dp", exposed, f"FSDP {micro} x {dense / 1e9:.2f} B params x (DP-1)/DP x "
                                    f"({2 * BF16_BYTES}+{grad_bytes}) B / {link} = "
                                    f"{comm * 1e3:.1f} ms behind {per_micro * micro * 1e3:.0f} ms "
                                    f"of compute; first layer's gather {first * 1e3:.2f} ms")]
    dist_opt = bool(run.get("DISTRIBUTED_OPTIMIZER"))
    reduce = dense * share * grad_bytes * (1 if dist_opt else 2)
    gather = dense * share * BF16_BYTES if dist_opt else 0.0
    t_reduce, t_gather = _gbs(reduce, bw), _gbs(gather, bw)
    backward_window = per_micro * 2 / 3    # backward is 2/3 of a micro-batch's FLOPs
    forward_window = per_micro / 3
    exposed_reduce = max(0.0, t_reduce - backward_window) if run.get("OVERLAP_GRAD_REDUCE") \
        else t_reduce
    exposed_gather = max(0.0, t_gather - forward_window) if run.get("OVERLAP_PARAM_GATHER") \
        else t_gather
    assumptions.append("DP overlap windows: the gradient reduce hides behind the last "
                       "micro-batch's backward, the parameter gather behind the first's forward")
    assumptions.append("collectives run at the link's datasheet bandwidth (not measured: our "
                       "2-GPU runs hide DP communication entirely)")
    terms = [Term("dp_grad_reduce", exposed_reduce,
                  f"{'reduce-scatter' if dist_opt else 'all-reduce'} {dense / 1e9:.2f} B params "
                  f"x {grad_bytes} B{' x 2' if not dist_opt else ''} x (DP-1)/DP / {link} = "
                  f"{t_reduce * 1e3:.1f} ms"
                  + (f", {backward_window * 1e3:.0f} ms backward to hide behind"
                     if run.get("OVERLAP_GRAD_REDUCE") else ", not overlapped"))]
    if dist_opt:
        terms.append(Term("dp_param_gather", exposed_gather,
                          f"all-gather {dense / 1e9:.2f} B params x 2 B x (DP-1)/DP / {link} = "
                          f"{t_gather * 1e3:.1f} ms"
                          + (f", {forward_window * 1e3:.0f} ms forward to hide behind"
                             if run.get("OVERLAP_PARAM_GATHER") else ", not overlapped")))
    if experts:
        from .memory import expert_data_parallel
        edp = expert_data_parallel(run)
        if edp > 1:
            # the expert-data-parallel ranks lie EP x ETP apart (Megatron's expert grid): an
            # EP group that fills a node sends every expert gradient over the network
            ep, etp = _ep(run)
            ebw, elink = group_bandwidth(platform, edp, ep * etp, lay.gpus_per_node)
            gather = BF16_BYTES if dist_opt else grad_bytes
            vol = experts * (edp - 1) / edp * (grad_bytes + gather)
            t = _gbs(vol, ebw)
            terms.append(Term("dp_experts", max(0.0, t - backward_window)
                              if run.get("OVERLAP_GRAD_REDUCE") else t,
                              f"expert grads/params over expert-DP {edp}: "
                              f"{experts / 1e9:.2f} B params / {elink} = {t * 1e3:.1f} ms"))
    return terms


# Guards that refuse a launch for what it would compute, not for its speed: a projection of
# the published recipe past them is still a projection of its throughput (said in its notes).
NUMERICS_GUARDS = ("gpt_oss_te_backend", "low_precision_needs_te")
# Beside a numerics guard only: a flag of the published recipe that the backend the numerics
# rule chose cannot run (gpt-oss's expert all-to-all overlap is built on TE's linears).
BACKEND_GUARDS = ("flags_the_backend_cannot_honour",)


def resolve_run(family: str, words: list[str], environ: dict[str, str] | None = None
                ) -> RunDescription:
    """The launcher's resolve of these words (DRY_RUN, no pre-flight): the run it would launch.
    Where only a numerics guard refuses it (NUMERICS_GUARDS: gpt-oss's MoE block on Transformer
    Engine, which a low-precision recipe needs), the run is resolved at bf16 on its own backend
    and given the recipe back, with a note saying so (`projection_notes`)."""
    import os

    from training.launch.resolve import resolve
    from training.launch.guards import Refusals
    from training.launch.settings import Refusal
    from training.moe import presets as moe_presets
    from training.moe.gpt_oss import GPT_OSS
    from training.moe.layer import MOE

    env = dict(environ if environ is not None else os.environ)
    env.update(DRY_RUN="1", PREFLIGHT_MEMORY="off")
    # a projection of a cluster, not of this machine: its own rendezvous address (a loopback
    # one in this process's environment would be refused for several nodes) means nothing
    env["MASTER_ADDR"] = "node0"
    moe = family in moe_presets.MOE_FAMILIES or family == "gpt_oss"
    layers = [MOE, GPT_OSS] if moe else []

    def refused_by(launch_words):
        """(the run, None), or (None, (its guards, the refusal's first line))."""
        try:
            return resolve(family, env, launch_words, layers=layers).run, None
        except (Refusal, Refusals) as err:
            return None, ([r.guard for r in getattr(err, "refusals", [err])],
                          str(err).splitlines()[0], err)

    run, refused = refused_by(words)
    if run is not None:
        return run
    guards, refusal, err = refused
    if all(g in BACKEND_GUARDS for g in guards) \
            and not any(w.startswith("TRANSFORMER_IMPL=") for w in words):
        # a TE-only flag of the published recipe on the backend auto chose: the recipe's own
        # backend, unless a numerics rule is why auto did not choose it (then the fallback)
        run, refused_te = refused_by(list(words) + ["TRANSFORMER_IMPL=transformer_engine"])
        if run is not None:
            return run
        guards, refusal, _ = refused_te
    if not (all(g in NUMERICS_GUARDS + BACKEND_GUARDS for g in guards)
            and any(g in NUMERICS_GUARDS for g in guards)):
        raise err
    plain = [w for w in words
             if not w.startswith(("PRECISION=", "TRANSFORMER_IMPL=", "EXTRA_MEGATRON_ARGS="))]
    extra = next((w.split("=", 1)[1] for w in reversed(words)
                  if w.startswith("EXTRA_MEGATRON_ARGS=")), None)
    precision = next((w.split("=", 1)[1] for w in reversed(words)
                      if w.startswith("PRECISION=")), env.get("PRECISION", "bf16"))
    run = resolve(family, env, plain + ["PRECISION=bf16"], layers=layers).run
    run = run.with_values(PRECISION=precision, TRANSFORMER_IMPL="transformer_engine",
                          **({"EXTRA_MEGATRON_ARGS": extra} if extra is not None else {}))
    note = (f"the launcher refuses this launch ({refusal[:160]}...): projected as the "
            f"published recipe runs it, PRECISION={precision} on Transformer Engine")
    object.__setattr__(run, "projection_notes", (note,))
    return run


def render(result: dict[str, Any]) -> str:
    lay = result["layout"]
    state = ("FSDP" if lay["fsdp"] else "distributed optimizer" if lay["distributed_optimizer"]
             else "DDP")
    lines = [f"projection: {result['model']} ({result['num_layers']} layers, seq "
             f"{result['seq_length']}) {result['precision']} on {lay['world_size']} "
             f"{result['platform']} ({lay['nnodes']} node(s) x {lay['gpus_per_node']})",
             f"  layout TP {lay['tp']} PP {lay['pp']} VPP {lay['vpp']} CP {lay['cp']} EP "
             f"{lay['ep']} DP {lay['dp']}, MBS {lay['mbs']}, GBS {lay['global_batch']} "
             f"({lay['microbatches']} micro-batches), RECOMPUTE={lay['recompute']}, "
             f"{state}",
             "  step time per GPU:"]
    for term in result["terms"]:
        lines.append(f"    {term['seconds'] * 1e3:9.1f} ms  {term['key']:<16} {term['how']}")
    lines.append(f"    {result['step_s'] * 1e3:9.1f} ms  step (exposed communication "
                 f"{result['exposed_comm_s'] * 1e3:.1f} ms)")
    mem = result["memory"]
    band = result["band"]
    lines += [f"  tokens/s/GPU {result['tokens_per_s_per_gpu']:,.0f} (band {band['low']:,.0f} to "
              f"{band['high']:,.0f}: {band['how']}); model TFLOP/s/GPU "
              f"{result['model_tflops_per_gpu']:,.0f} (MFU {result['mfu']:.1%})",
              f"  memory {mem['peak_gib']:.1f} GiB of {mem['device_gib']:.0f} GiB "
              f"({'fits' if mem['fits'] else 'DOES NOT FIT'}; {mem['estimator']})",
              "  assumptions:"]
    lines += [f"    - {a}" for a in result["assumptions"]]
    return "\n".join(lines)


def words_parser(prog: str, description: str, family: bool = True) -> ArgumentParser:
    """The command line the projection's tools share: the launcher's KEY=VALUE words, --json."""
    parser = ArgumentParser(prog=prog, description=description)
    if family:
        parser.add_argument("--family", default="llama3")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("words", nargs="*", help="the launcher's KEY=VALUE settings")
    return parser


def run_cli(parser: ArgumentParser, argv, compute, text) -> int:
    """Parse, compute, print (text or JSON); bad input: one line on stderr, exit status 2."""
    from training.launch.settings import LaunchError

    args = parser.parse_intermixed_args(argv)   # options between the KEY=VALUE words too
    try:
        result = compute(args)
    except (BadInput, LaunchError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return getattr(err, "exit_code", 2)
    print(json.dumps(result, indent=2, default=str) if args.json else text(result))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = words_parser("python -m training.optimize.project",
                          "Project a launch's step time and tokens/s/GPU on N GPUs of a "
                          "platform (docs/scale.md).")
    parser.add_argument("--vpp", type=positive_int, default=None,
                        help="virtual pipeline stages per rank (default: EXTRA_MEGATRON_ARGS')")
    return run_cli(parser, argv,
                   lambda a: project(resolve_run(a.family, a.words), vpp=a.vpp), render)


if __name__ == "__main__":
    sys.exit(main())
