"""Throughput projection: a launch's step time on N GPUs of a named platform, on paper.

    python -m training.optimize.project [--family llama3] [--vpp N] [--json] KEY=VALUE ...

takes the launcher's settings words (MODEL_SIZE=70B NNODES=8 GPUS_PER_NODE=8 TP=4 PP=4
PLATFORM=mi355x PRECISION=fp8 ...), resolves them with the launcher's own resolve (DRY_RUN,
so the layout is the one a launch would run, guards included) and projects one optimizer
step per GPU:

  compute      model FLOPs of the step / (the platform's dense peak for the precision x the
               efficiency we measured on one H200: training/optimize/efficiency.py), over the
               measured recompute and micro-batch ratios
  bubble       the pipeline's idle share, (PP-1) / (VPP x micro-batches) of compute (1F1B,
               interleaved when VPP > 1)
  tp           tensor/sequence-parallel collectives: per layer and micro-batch 8 transfers of
               (TP-1)/TP of the activation (all-gather + reduce-scatter in and out of attention
               and MLP, forward and backward), not overlapped
  cp           context-parallel ring exchange of K and V (forward) and their gradients
               (backward), exposed only where it outlasts the attention it overlaps
  ep           expert all-to-all (dispatch and combine, forward and backward), not overlapped
  dp           the data-parallel gradient reduce-scatter / all-reduce and the distributed
               optimizer's parameter all-gather; with OVERLAP_GRAD_REDUCE / OVERLAP_PARAM_GATHER
               only what outlasts the last micro-batch's backward / the first's forward is
               exposed; FSDP gathers and reduces every micro-batch, overlapped with it

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


def project(run: RunDescription, vpp: int | None = None, root=None) -> dict[str, Any]:
    """The projected step of a resolved run on its platform."""
    from training.metrics import flops_per_token

    from .memory import estimate, expert_parallel, stage_params, stage_expert_params

    platform = PLATFORMS.get(run.platform or "")
    if platform is None:
        raise BadInput(f"PLATFORM={run.platform!r}: the projection needs a named platform "
                       f"({', '.join(PLATFORMS)})")
    eff = efficiency.measured(root) if root else efficiency.measured()
    m, lay = run.model, run.layout
    tp, pp, cp, dp = lay.tp, lay.pp, lay.cp, lay.dp
    ep, etp = expert_parallel(run)
    vpp = vpp or vpp_of(run)
    if vpp > 1 and pp == 1:
        raise BadInput(f"--vpp {vpp} with PP=1: virtual stages interleave the stages of a "
                       "pipeline, and this run has one stage; set PP above 1 or leave --vpp out")
    if vpp > 1 and (m.num_layers // pp) % vpp:
        raise BadInput(f"--vpp {vpp} does not divide the {m.num_layers // pp} layers of each of "
                       f"the {pp} pipeline stages (Megatron asserts it): choose a divisor")
    micro = lay.microbatches
    precision = run.precision
    assumptions: list[str] = []

    # -- compute --------------------------------------------------------------------------------
    peak = platform.peak_tflops(precision)
    if peak is None:
        raise BadInput(f"PRECISION={precision}: no projection for it on {platform.name} (the "
                       "projection covers bf16, the fp8 recipes and mxfp8 where the GPU runs MX)")
    if m.moe:
        family = "mixtral" if "mixtral" in m.name else "qwen3"
        base = eff.moe_mfu[family]
        assumptions.append(f"MoE efficiency measured on our {family} run: {base}")
    else:
        base = eff.dense_mfu
        assumptions.append(f"dense efficiency (model FLOPs / peak) {base}, measured on "
                           f"{eff.measured_on}")
    ratio = eff.precision_ratio.get(precision)
    if ratio is None:
        raise BadInput(f"PRECISION={precision}: no measured speed-up over bf16 to project from")
    h200 = PLATFORMS["h200"]
    measured_peak = h200.peak_bf16_tflops if precision == "bf16" else h200.peak_fp8_tflops
    mfu = base.value * ratio.value * h200.peak_bf16_tflops / measured_peak
    if precision != "bf16":
        assumptions.append(f"{precision} over bf16 on {eff.measured_on}: {ratio}; efficiency at "
                           f"the {precision} peak = {base.value:.3f} x {ratio.value:.3f} x "
                           f"bf16/fp8 peak of the H200 = {mfu:.3f}")
    factor = 1.0
    recompute = run.get("RECOMPUTE") or "none"
    if recompute != "none":
        factor *= eff.recompute_ratio[recompute].value
        assumptions.append(f"RECOMPUTE={recompute}: {eff.recompute_ratio[recompute]}")
    if lay.mbs >= 2 and eff.mbs2_ratio:
        factor *= eff.mbs2_ratio.value
        assumptions.append(f"MBS {lay.mbs}: {eff.mbs2_ratio} (MBS > 2 taken as MBS 2)")
    if run.backend == "transformer_engine" and eff.backend_ratio and precision == "bf16":
        factor *= eff.backend_ratio.value
        assumptions.append(f"Transformer Engine backend: {eff.backend_ratio}")
    assumptions.append(f"{platform.name} peak {peak:g} TFLOP/s ({precision}) and links: "
                       f"{platform.sources}")
    assumptions.append("the efficiency measured at TP=1 holds at every TP/CP/EP split (smaller "
                       "GEMMs are not penalised) and pipeline stages are balanced")
    fpt = flops_per_token(m)
    tokens_gpu = lay.global_batch * m.seq_length / lay.world_size
    flops_gpu = fpt * tokens_gpu
    compute = flops_gpu / (peak * 1e12 * mfu * factor)
    terms = [Term("compute", compute,
                  f"{fpt / 1e9:.1f} GFLOP/token x {tokens_gpu:,.0f} tokens/GPU / ({peak:g} TFLOP/s "
                  f"x {mfu:.3f}{f' x {factor:.3f}' if factor != 1 else ''})")]
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
                           "(Megatron's overlapped p2p); the interleaved schedule's extra "
                           "activation memory is not in the estimate")

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
                           "in the launcher)")
    # -- context parallel -----------------------------------------------------------------------
    if cp > 1:
        bw, link = group_bandwidth(platform, cp, tp, lay.gpus_per_node, kind="p2p")
        kv = lay.mbs * (m.seq_length / cp) * 2 * m.kv_width / tp * BF16_BYTES
        comm = layers * micro * 3 * (cp - 1) * kv / (bw * 1e9)
        attention_share = (2 * m.seq_length * m.q_width) / (fpt / 3 / m.num_layers)
        attention = compute * attention_share * layers / m.num_layers * pp
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
        volume = layers * micro * 4 * per
        terms.append(Term("ep", _gbs(volume, bw),
                          f"{dispatcher}: {layers} MoE layers x {micro} micro-batches x 4 x "
                          f"{per / 2**20:.0f} MiB ({what}) / {link}"))
        assumptions.append("expert dispatch/combine are not overlapped")
    # -- data parallel --------------------------------------------------------------------------
    terms.extend(_data_parallel(run, platform, per_micro, micro, dp, assumptions,
                                stage_params, stage_expert_params))

    step = sum(t.seconds for t in terms)
    tokens_s = tokens_gpu / step
    est = estimate(run)
    exposed = step - compute - sum(t.seconds for t in terms if t.key == "pp_bubble")
    return {
        "platform": platform.name, "precision": precision, "backend": run.backend,
        "model": m.name, "num_layers": m.num_layers, "seq_length": m.seq_length,
        "layout": {"nnodes": lay.nnodes, "gpus_per_node": lay.gpus_per_node,
                   "world_size": lay.world_size, "tp": tp, "pp": pp, "vpp": vpp, "cp": cp,
                   "ep": ep, "dp": dp, "mbs": lay.mbs, "global_batch": lay.global_batch,
                   "microbatches": micro, "recompute": recompute,
                   "distributed_optimizer": bool(run.get("DISTRIBUTED_OPTIMIZER")),
                   "fsdp": bool(run.get("FSDP"))},
        "terms": [t.to_dict() for t in terms],
        "step_s": step, "compute_s": compute, "exposed_comm_s": exposed,
        "tokens_per_s_per_gpu": tokens_s,
        "model_tflops_per_gpu": fpt * tokens_s / 1e12,
        "mfu": fpt * tokens_s / (peak * 1e12),
        "flops_per_token": fpt,
        "memory": {"peak_gib": est.peak_gib, "device_gib": float(platform.memory_gib),
                   "fits": est.peak_gib <= platform.memory_gib,
                   "estimator": "training/optimize/memory.py"},
        "assumptions": assumptions,
    }


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
        exposed = max(0.0, comm - per_micro * micro)
        assumptions.append("FSDP: parameters gathered forward and backward and gradients "
                           "reduced every micro-batch, overlapped with it")
        return [Term("dp", exposed, f"FSDP {micro} x {dense / 1e9:.2f} B params x (DP-1)/DP x "
                                    f"({2 * BF16_BYTES}+{grad_bytes}) B / {link} = "
                                    f"{comm * 1e3:.1f} ms, overlapped with compute")]
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
            gather = BF16_BYTES if dist_opt else grad_bytes
            vol = experts * (edp - 1) / edp * (grad_bytes + gather)
            t = _gbs(vol, bw)
            terms.append(Term("dp_experts", max(0.0, t - backward_window)
                              if run.get("OVERLAP_GRAD_REDUCE") else t,
                              f"expert grads/params over expert-DP {edp}: "
                              f"{experts / 1e9:.2f} B params / {link} = {t * 1e3:.1f} ms"))
    return terms


def resolve_run(family: str, words: list[str], environ: dict[str, str] | None = None
                ) -> RunDescription:
    """The launcher's resolve of these words (DRY_RUN, no pre-flight): the run it would launch."""
    import os

    from training.launch.resolve import resolve
    from training.moe import presets as moe_presets
    from training.moe.layer import MOE

    env = dict(environ if environ is not None else os.environ)
    env.update(DRY_RUN="1", PREFLIGHT_MEMORY="off")
    # a projection of a cluster, not of this machine: its own rendezvous address (a loopback
    # one in this process's environment would be refused for several nodes) means nothing
    env["MASTER_ADDR"] = "node0"
    layers = [MOE] if family in moe_presets.MOE_FAMILIES else []
    return resolve(family, env, words, layers=layers).run


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
    lines += [f"  tokens/s/GPU {result['tokens_per_s_per_gpu']:,.0f}; model TFLOP/s/GPU "
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
