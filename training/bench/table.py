"""Markdown tables generated from benchmark JSONs (never typed by hand)."""
from __future__ import annotations

from . import analysis
from .catalog import PEER_SIDES
from .stats import VERDICT_RULE


def fmt_ratio(row: dict) -> str:
    ratio = row.get("tokens_per_s_ratio")
    if ratio is None:
        return "-"
    spread = row.get("ratio_spread")
    return f"{ratio:.3f}x" + (f" (±{spread / 2:.3f})" if spread is not None else "")


def fmt_mem(mem: dict | None) -> str:
    if not mem or (mem.get("baseline") is None and mem.get("with") is None):
        return "-"
    b, w = mem.get("baseline"), mem.get("with")
    return f"{b:.1f} → {w:.1f}" if b is not None and w is not None else f"{b or w:.1f}"


def _short(text: str, n: int = 160) -> str:
    text = " ".join(str(text).split()).replace("|", "/")
    return text if len(text) <= n else text[: n - 1] + "…"


def _source(data: dict) -> str:
    resumed = data.get("resumed")
    return (f"Source: `{data.get('name')}.json`, git {data.get('git_sha')}, "
            f"{(data.get('gpu') or {}).get('name')} x{(data.get('shape') or {}).get('gpus', 1)}, "
            f"driver {(data.get('gpu') or {}).get('driver')}, created {data.get('created')}."
            + (f" Resumed: {resumed['note']}." if resumed else ""))


def shape_line(data: dict) -> str:
    s = data.get("shape", {})
    repeats = s.get("repeats", 1)
    return (f"Shape: {s.get('model')} cut to {s.get('num_layers')} layers, seq "
            f"{s.get('seq_length')}, micro-batch {s.get('mbs')}, global batch "
            f"{s.get('global_batch')}, {s.get('gpus', 1)} GPU(s) (TP {s.get('tp', 1)}, "
            f"PP {s.get('pp', 1)}, DP {s.get('dp', s.get('gpus', 1))}), bf16; "
            f"{s.get('steps')} steady-state steps after {s.get('warmup')} warm-up, "
            f"{repeats} repeat(s).")


def peers_table(data: dict) -> str:
    groups = analysis.by_config(data.get("points", []))
    configs = data.get("configs") or [{"id": n, "status": "planned"} for n in groups]
    rows = {r["key"]: r for r in analysis.peers_results(data)}
    ours = configs[0]["id"] if configs else "native"
    lines = [shape_line(data), _source(data), "",
             "| side | tokens/s/GPU | model TFLOP/s/GPU | ours vs side | verdict | "
             "step-time range | peak memory GiB | optimizer state |",
             "|---|---|---|---|---|---|---|---|"]
    best = None
    for config in configs:
        side = config["id"]
        name = PEER_SIDES.get(side, side)
        if config.get("status", "planned") != "planned":
            lines.append(f"| {name} | {config['status']} | | | | | | "
                         f"{_short(config.get('message', ''))} |")
            continue
        summary = analysis.config_summary(groups.get(side, []))
        tps, tflops = summary["tokens_per_s"], summary["tflops"]
        if not tps.get("n"):
            reason = summary["failures"][0] if summary["failures"] else "no point"
            what = ("out of memory" if analysis.all_out_of_memory(groups.get(side, []))
                    else "failed")
            lines.append(f"| {name} | {what} | | | | | | {_short(reason)} |")
            continue
        key = f"TRANSFORMER_IMPL={side}" if side == "local" else f"peer:{side}"
        row = rows.get(key)
        if row and row.get("tokens_per_s_ratio") and (
                best is None or row["tokens_per_s_ratio"] < best[1]["tokens_per_s_ratio"]):
            best = (side, row)
        spread = f" (±{tps['spread'] / 2:.1%})" if tps["n"] > 1 else ""
        step = summary["step_spread"]
        opt = next((p.get("optimizer_state") for p in groups[side] if p.get("optimizer_state")), "")
        lines.append(
            f"| {name} | {tps['mean']:,.0f}{spread} | {tflops['mean']:.1f} | "
            f"{'-' if side == ours else fmt_ratio(row) if row else '-'} | "
            f"{'' if side == ours or not row else row['verdict']} | "
            f"{'-' if step is None else f'{step:.1%}'} | "
            f"{summary['peak_memory_gib']:.1f} | {opt} |")
    lines.append("")
    if best:
        lines.append(f"Ours vs the fastest peer ({PEER_SIDES.get(best[0], best[0])}): "
                     f"{fmt_ratio(best[1])}, {best[1]['verdict']}.")
    lines += ["", "± on tokens/s: half the range over repeats; ours vs side: ratio of means "
                  "(ours over that side) ± half the range of the paired per-repeat ratios; "
                  "step-time range: the largest within-run (max-min)/mean of steady-state "
                  "step times.", "", f"Verdict rule: {VERDICT_RULE}"]
    return "\n".join(lines)


def toggles_table(data: dict) -> str:
    groups = analysis.by_config(data.get("points", []))
    default = analysis.config_summary(groups.get("default", []))
    tps = default["tokens_per_s"]
    resolved = data.get("default_resolved", {})
    head = [shape_line(data), _source(data)]
    if tps.get("n"):
        head.append(f"Default run ({resolved.get('TRANSFORMER_IMPL', '?')} backend, "
                    f"{resolved.get('PRECISION', 'bf16')}): {tps['mean']:,.0f} tokens/s/GPU "
                    f"(±{tps['spread'] / 2:.1%}), {default['tflops'].get('mean', 0):.1f} model "
                    f"TFLOP/s/GPU, peak {default['peak_memory_gib'] or 0:.1f} GiB, "
                    f"{tps['n']} repeat(s).")
    if data.get("stopped"):
        head.append(f"Stopped early: {data['stopped']}")
    lines = head + ["", "| lever | set | vs | tokens/s ratio | verdict | TFLOP/s ratio | "
                        "peak GiB (vs → set) | repeats | notes |",
                    "|---|---|---|---|---|---|---|---|---|"]
    for row in analysis.toggles_results(data):
        verdict = row["verdict"] + (" (needs DP>1)" if row.get("needs_dp_gt_1")
                                    and (data.get("shape") or {}).get("dp", 1) == 1 else "")
        tflops = row.get("tflops_ratio")
        mem = row.get("peak_memory_gib") or {}
        # memory shown baseline -> set, whichever run that is
        lines.append(
            f"| {row['key']} | `{row['set']}` | `{row['baseline']}` | {fmt_ratio(row)} | "
            f"{verdict} | {'-' if tflops is None else f'{tflops:.3f}x'} | {fmt_mem(mem)} | "
            f"{row.get('repeats', 0)} | {_short('; '.join(n for n in row.get('notes', []) if n), 220)} |")
    lines += ["", "tokens/s ratio: `set` over `vs`, ratio of means ± half the range of the "
                  "paired per-repeat ratios.", "", f"Verdict rule: {VERDICT_RULE}"]
    return "\n".join(lines)


TABLE_KINDS = ("peers", "toggles", "levers")


def table(data: dict) -> str:
    if data.get("kind") == "peers":
        return peers_table(data)
    if data.get("kind") in ("toggles", "levers"):
        return toggles_table(data)
    raise ValueError(f"{data.get('name')}: no table for kind {data.get('kind')!r}")
