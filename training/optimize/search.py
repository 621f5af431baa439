"""Layout search: the layouts of a model on N GPUs of a platform that fit, ranked by projection.

    python -m training.optimize.search [--family llama3] [--top 5] [--json] KEY=VALUE ...

The words are the launcher's (MODEL_SIZE=70B NNODES=8 GPUS_PER_NODE=8 PLATFORM=mi355x
PRECISION=fp8 BS=128 ...); they are resolved once with the launcher's resolve (DRY_RUN), then
every layout is the same run with the layout's toggles changed (RunDescription.with_values):
TP (within a node), PP, VPP (EXTRA_MEGATRON_ARGS --num-layers-per-virtual-pipeline-stage), CP,
EP (MoE), MBS (1-8, as far as memory allows), RECOMPUTE and the optimizer state (fp32, or bf16 moments with the fp32 master
as remainders). A layout is kept when its sizes divide (heads, query groups, layers, the
global batch) and the pre-flight's estimate (training/optimize/memory.py) is at most 90% of the
GPU (the pre-flight neither refuses nor warns). The kept ones are ranked by projected
tokens/s/GPU (training/optimize/project.py) and printed as levers in the advisor's format, each
with its `DRY_RUN=1 bash <entry script> ...` command.
"""
from __future__ import annotations

import sys
from typing import Any

from training.platforms import PLATFORMS
from training.run_description import RunDescription, divisors

from .inputs import BadInput

VPP_FLAG = "--num-layers-per-virtual-pipeline-stage"
OPTIMIZER_STATES = {"fp32": {"ADAM_MOMENTS_DTYPE": "fp32", "MASTER_WEIGHTS": "fp32"},
                    "bf16": {"ADAM_MOMENTS_DTYPE": "bf16", "MASTER_WEIGHTS": "remainder"}}
RECOMPUTES = ("none", "selective", "full")
MICRO_BATCHES = (1, 2, 4, 8)   # the GPU's memory (the pre-flight's estimate) decides which fit
TIE = 0.005   # projected tokens/s within 0.5% rank as equal (the projection's resolution)


def _complexity(cand: dict[str, Any]) -> tuple:
    v = cand["values"]
    return (v["TP"] * v["PP"] * v["CP"] * v.get("EP", 1), cand["vpp"],
            cand["state"] != "fp32", RECOMPUTES.index(v["RECOMPUTE"]), v["MBS"])


def _refused(run: RunDescription, sets: dict[str, str]) -> str | None:
    """The launcher's refusal of the run with these toggles (its own resolve, DRY_RUN), if any."""
    from training.launch.settings import LaunchError

    from .project import resolve_run

    words = [f"{k}={v}" for k, v in _launch_words(run).items()] + \
        [f"{k}={v}" for k, v in sets.items()]
    try:
        resolve_run(run.family, words, environ={})
    except LaunchError as err:
        return str(err).splitlines()[0]
    return None


def _launch_words(run: RunDescription) -> dict[str, str]:
    """The user's settings that define the search (model, GPUs, batch, precision, platform)."""
    keep = ("MODEL_SIZE", "NUM_LAYERS", "NNODES", "GPUS_PER_NODE", "BS", "SEQ_LENGTH",
            "PRECISION", "PLATFORM", "TRANSFORMER_IMPL")
    words = {k: str(run.values[k]) for k in keep if run.values.get(k) not in (None, "auto")}
    if run.model.num_layers == run.model.preset_layers:
        words.pop("NUM_LAYERS", None)
    return words


def _vpp_words(run: RunDescription, pp: int, vpp: int) -> str:
    """EXTRA_MEGATRON_ARGS with the user's own words and the VPP flag (when VPP > 1)."""
    from .project import VPP_FLAGS

    import shlex
    words = shlex.split(str(run.get("EXTRA_MEGATRON_ARGS") or ""))
    kept, skip = [], False
    for word in words:
        if skip:
            skip = False
            continue
        if word.partition("=")[0] in VPP_FLAGS:
            skip = "=" not in word
            continue
        kept.append(word)
    if vpp > 1:
        kept += [VPP_FLAG, str(run.model.num_layers // (pp * vpp))]
    return " ".join(kept) or None


def candidates(run: RunDescription) -> list[dict[str, Any]]:
    """Every layout's toggles for this run's model, GPU count and global batch."""
    m, lay = run.model, run.layout
    world = lay.world_size
    out = []
    tps = [t for t in divisors(lay.gpus_per_node)
           if m.num_attention_heads % t == 0 and m.num_query_groups % t == 0]
    eps = [e for e in divisors(world) if m.num_experts and m.num_experts % e == 0] \
        if m.moe else [1]
    cps = [c for c in (1, 2, 4, 8) if m.seq_length // c >= 2048 and m.seq_length % (2 * c) == 0]
    for tp in tps:
        for cp in cps:
            for pp in divisors(world // (tp * cp)):
                if m.num_layers % pp:
                    continue
                dp = world // (tp * cp * pp)
                vpps = [1] if pp == 1 else [v for v in divisors(m.num_layers // pp) if v <= 10]
                for vpp in vpps:
                    for ep in eps:
                        if ep > dp * cp * tp or (dp * cp * tp) % ep:
                            continue
                        for mbs in MICRO_BATCHES:
                            if lay.global_batch % (mbs * dp):
                                continue
                            if pp > 1 and lay.global_batch // (mbs * dp) < pp:
                                continue
                            for recompute in RECOMPUTES:
                                for state in OPTIMIZER_STATES:
                                    values = {"TP": tp, "PP": pp, "CP": cp, "MBS": mbs,
                                              "RECOMPUTE": recompute,
                                              "SEQUENCE_PARALLEL": tp > 1,
                                              **OPTIMIZER_STATES[state]}
                                    if m.moe:
                                        values["EP"] = ep
                                    out.append({"values": values, "vpp": vpp, "state": state})
    return out


def _sets(run: RunDescription, cand: dict[str, Any]) -> dict[str, str]:
    v = cand["values"]
    sets = {"TP": str(v["TP"]), "PP": str(v["PP"]), "CP": str(v["CP"]), "MBS": str(v["MBS"]),
            "RECOMPUTE": v["RECOMPUTE"]}
    if "EP" in v:
        sets["EP"] = str(v["EP"])
    if cand["state"] != "fp32":
        sets.update(OPTIMIZER_STATES[cand["state"]])
    extra = _vpp_words(run, v["PP"], cand["vpp"])
    if extra:
        sets["EXTRA_MEGATRON_ARGS"] = extra
    return sets


def search(run: RunDescription, top: int = 5) -> dict[str, Any]:
    from .config import script
    from .memory import MEMORY_BOUND_FRACTION, estimate
    from .project import project

    platform = PLATFORMS.get(run.platform or "")
    if platform is None:
        raise BadInput(f"PLATFORM={run.platform!r}: the search needs a named platform "
                       f"({', '.join(PLATFORMS)})")
    limit = MEMORY_BOUND_FRACTION * platform.memory_gib
    ranked, tried, too_big = [], 0, 0
    for cand in candidates(run):
        tried += 1
        variant = run.with_values(**cand["values"])
        peak = estimate(variant).peak_gib
        if peak > limit:
            too_big += 1
            continue
        result = project(variant, vpp=cand["vpp"])
        ranked.append((result["tokens_per_s_per_gpu"], cand, variant, result, peak))
    # Rank by projected tokens/s; layouts within TIE of the best of their bin keep the
    # simpler one first (fewer model-parallel ranks, no VPP, Megatron's fp32 state, less
    # recompute): the projection cannot tell them apart.
    best = max((r[0] for r in ranked), default=1.0)
    ranked.sort(key=lambda r: (-round(r[0] / (best * TIE)), _complexity(r[1]), -r[0]))
    levers, refused = [], []
    for tokens, cand, variant, result, peak in ranked:
        if len(levers) >= top:
            break
        sets = _sets(run, cand)
        why = _refused(run, sets)
        if why:
            refused.append({"set": sets, "refused": why})
            continue
        exposed = {t["key"]: t["seconds"] for t in result["terms"] if t["key"] != "compute"}
        worst = max(exposed, key=exposed.get) if exposed else None
        levers.append({
            "set": " ".join(f"{k}={v}" if " " not in v else f"{k}='{v}'"
                            for k, v in sets.items()),
            "sets": sets,
            "title": f"layout TP {cand['values']['TP']} PP {cand['values']['PP']} VPP "
                     f"{cand['vpp']} CP {cand['values']['CP']}"
                     + (f" EP {cand['values']['EP']}" if "EP" in cand["values"] else "")
                     + f" DP {variant.layout.dp}",
            "estimate": {"peak_gib": peak, "fraction_of_device": peak / platform.memory_gib},
            "projected": {"tokens_per_s_per_gpu": tokens,
                          "model_tflops_per_gpu": result["model_tflops_per_gpu"],
                          "step_s": result["step_s"], "exposed_comm_s": result["exposed_comm_s"]},
            "measured_text": f"projected {tokens:,.0f} tokens/s/GPU, "
                             f"{result['model_tflops_per_gpu']:,.0f} TFLOP/s/GPU; step "
                             f"{result['step_s']:.2f} s"
                             + (f", largest overhead {worst} {exposed[worst] * 1e3:.0f} ms"
                                if worst and exposed[worst] >= 5e-4 else "")
                             + " (projection, not measured)",
            "command": _command(run, sets, script(run)),
            "projection": result})
    return {"platform": platform.name, "model": run.model.name,
            "world_size": run.layout.world_size, "global_batch": run.layout.global_batch,
            "precision": run.precision, "tried": tried, "over_memory": too_big,
            "fit": len(ranked), "memory_limit_gib": limit, "levers": levers,
            "refused_by_launcher": refused}


def _command(run: RunDescription, sets: dict[str, str], entry: str) -> str:
    import shlex

    words = {**_launch_words(run), **sets}
    return "DRY_RUN=1 bash " + entry + " " + " ".join(f"{k}={shlex.quote(v)}"
                                                       for k, v in words.items())


def render(report: dict[str, Any]) -> str:
    lines = [f"layout search: {report['model']} on {report['world_size']} {report['platform']}, "
             f"GBS {report['global_batch']}, {report['precision']}: {report['tried']} layouts, "
             f"{report['over_memory']} above 90% of the GPU's memory "
             f"({report['memory_limit_gib']:.0f} GiB), {report['fit']} fit",
             "  levers (ranked by projected tokens/s/GPU):"]
    for i, rec in enumerate(report["levers"], 1):
        est = rec["estimate"]
        lines.append(f"    {i}. {rec['set']}: {rec['title']}; estimate {est['peak_gib']:.1f} GiB "
                     f"({est['fraction_of_device']:.0%}); {rec['measured_text']}")
    if report["levers"]:
        lines.append(f"  try: {report['levers'][0]['command']}")
    else:
        lines.append("  no layout fits: more GPUs, or a shorter sequence")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from training.cli import positive_int

    from .project import resolve_run, run_cli, words_parser

    parser = words_parser("python -m training.optimize.search",
                          "Rank the layouts that fit by projected tokens/s/GPU (docs/scale.md).")
    parser.add_argument("--top", type=positive_int, default=5)
    return run_cli(parser, argv, lambda a: search(resolve_run(a.family, a.words), top=a.top),
                   render)


if __name__ == "__main__":
    sys.exit(main())
