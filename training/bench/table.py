"""Markdown tables generated from benchmark JSONs (never typed by hand)."""
from __future__ import annotations

import statistics
from collections import defaultdict

from .stats import summarize

SIDE_NAMES = {
    "native": "ours (launcher default, native backend)",
    "local": "Megatron-core local spec",
    "transformer_engine": "ours (TE backend)",
    "hf": "HF LlamaForCausalLM (SDPA)",
    "hf_liger": "HF LlamaForCausalLM (SDPA) + Liger",
}


def peers_table(data: dict) -> str:
    by_side: dict[str, list[dict]] = defaultdict(list)
    for point in data["points"]:
        by_side[point["name"]].append(point)
    rows = []
    for side, points in by_side.items():
        ok = [p for p in points if p.get("tokens_per_s_per_gpu")]
        tps = summarize([p["tokens_per_s_per_gpu"] for p in ok])
        tflops = summarize([p["model_tflops_per_gpu"] for p in ok])
        mem = max((p.get("peak_memory_gib") or 0) for p in points) if ok else None
        failed = [p for p in points if not p.get("tokens_per_s_per_gpu")]
        cv = [_step_cv(p) for p in ok]
        rows.append((side, tps, tflops, mem, points[0].get("optimizer_state", ""), failed,
                     max(cv) if cv else None))
    best_peer = max((r[1]["mean"] for r in rows if r[0] != "native" and r[1].get("n")),
                    default=None)
    shape = data.get("shape", {})
    lines = [f"Shape: {shape.get('model')} cut to {shape.get('num_layers')} layers, seq "
             f"{shape.get('seq_length')}, micro-batch {shape.get('mbs')}, global batch "
             f"{shape.get('global_batch')}, {shape.get('dtype')}, {shape.get('gpus')} GPU "
             f"({data.get('gpu', {}).get('name')}); {shape.get('steps')} steady-state steps after "
             f"{shape.get('warmup')} warm-up, {shape.get('repeats')} repeat(s). Source: "
             f"`{data.get('name')}.json`, git {data.get('git_sha')}.", "",
             "| side | tokens/s/GPU | model TFLOP/s/GPU | vs best peer | step-time CV | "
             "peak memory GiB | optimizer state |", "|---|---|---|---|---|---|---|"]
    for side, tps, tflops, mem, opt, failed, cv in rows:
        name = SIDE_NAMES.get(side, side)
        if not tps.get("n"):
            reason = (failed[0].get("error") or "failed").strip().splitlines()
            short = next((l for l in reversed(reason) if "Error" in l), reason[-1] if reason else "")
            lines.append(f"| {name} | failed | | | | | {short[:120]} |")
            continue
        spread = f" (±{tps['spread'] / 2:.1%})" if tps["n"] > 1 else ""
        ratio = f"{tps['mean'] / best_peer:.3f}x" if best_peer else "-"
        lines.append(f"| {name} | {tps['mean']:,.0f}{spread} | {tflops['mean']:.1f} | {ratio} | "
                     f"{cv:.2%} | {mem:.1f} | {opt} |")
    lines += ["", "step-time CV: coefficient of variation of the steady-state step times within "
                  "a run (per-step noise); across repeats the ± column gives half the spread."]
    return "\n".join(lines)


def _step_cv(point: dict) -> float:
    samples = point.get("samples") or {}
    times = [t for t, warm in zip(samples.get("step_time_s", []), samples.get("warmup", []))
             if not warm]
    return statistics.stdev(times) / statistics.fmean(times) if len(times) > 1 else 0.0
