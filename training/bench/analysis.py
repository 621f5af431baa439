"""From a benchmark JSON's points to its results: one row per measured lever or peer.

Results are always recomputed from the recorded points (never trusted from a stored field),
so tables, docs/levers.json and the README agree with the samples.
"""
from __future__ import annotations

import functools

from collections import defaultdict

from .catalog import PEER_SIDES, all_levers
from .shape import BenchShape
from .stats import effect, steady_step_spread, summarize


def config_of(point: dict) -> str:
    return point.get("config") or point["name"]


def by_config(points: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = defaultdict(list)
    for point in points:
        out[config_of(point)].append(point)
    return out


def ok(point: dict) -> bool:
    return bool(point.get("tokens_per_s_per_gpu")) and not point.get("error")


def tps_by_repeat(points: list[dict]) -> dict[int, float]:
    return {p.get("repeat", 0): p["tokens_per_s_per_gpu"] for p in points if ok(p)}


def config_summary(points: list[dict]) -> dict:
    good = [p for p in points if ok(p)]
    spreads = [s for s in (steady_step_spread(p) for p in good) if s is not None]
    mems = [p["peak_memory_gib"] for p in good if p.get("peak_memory_gib")]
    return {"tokens_per_s": summarize([p["tokens_per_s_per_gpu"] for p in good]),
            "tflops": summarize([p["model_tflops_per_gpu"] for p in good
                                 if p.get("model_tflops_per_gpu")]),
            "peak_memory_gib": max(mems) if mems else None,
            "step_spread": max(spreads) if spreads else None,
            "repeats_ok": len(good),
            "failures": [failure_line(p) for p in points if not ok(p)]}


def out_of_memory(point: dict) -> bool:
    """The point failed because the GPU ran out of memory (a deterministic failure: the same
    run would fail again)."""
    if ok(point):
        return False
    text = str(point.get("error") or "").lower()
    return "out of memory" in text or "outofmemoryerror" in text


def all_out_of_memory(points: list[dict]) -> bool:
    """Every run of a side ran out of GPU memory (and there was at least one)."""
    return bool(points) and all(out_of_memory(p) for p in points)


def failure_line(point: dict) -> str:
    """The most telling line of a failed point's error text: the runner's timeout when it
    stopped the run (the log's own lines are then whatever it printed last, warnings
    included), else the last line naming an error."""
    text = (point.get("error") or point.get("refusal") or "failed").strip().splitlines()
    if text and text[0].startswith("timed out after"):
        return text[0][:300]
    for marker in ("error:", "Error", "refused", "not runnable"):
        hit = next((line for line in reversed(text) if marker in line), None)
        if hit:
            return hit.strip()[:300]
    return (text[-1] if text else "failed")[:300]


def compare(set_points: list[dict], base_points: list[dict]) -> dict:
    """Effect of the `set` side over the `baseline` side, with memory and TFLOP/s."""
    s_sum, b_sum = config_summary(set_points), config_summary(base_points)
    row = effect(tps_by_repeat(set_points), tps_by_repeat(base_points),
                 s_sum["step_spread"], b_sum["step_spread"])
    row["peak_memory_gib"] = {"baseline": b_sum["peak_memory_gib"],
                              "with": s_sum["peak_memory_gib"]}
    row["tokens_per_s"] = {"set": s_sum["tokens_per_s"], "baseline": b_sum["tokens_per_s"]}
    row["tflops_ratio"] = (s_sum["tflops"]["mean"] / b_sum["tflops"]["mean"]
                           if s_sum["tflops"].get("n") and b_sum["tflops"].get("n") else None)
    failures = s_sum["failures"] + b_sum["failures"]
    row["notes"] = [row.pop("note")] if row.get("note") else []
    if failures:
        row["notes"].append("failed runs: " + " | ".join(sorted(set(failures))))
    # a side that ran out of GPU memory in every run: that is the measurement
    oom_set, oom_base = all_out_of_memory(set_points), all_out_of_memory(base_points)
    if oom_set != oom_base:
        row["verdict"] = "set out of memory" if oom_set else "baseline out of memory"
    return row


def _fill(text: str, default_values: dict) -> str:
    if "{default}" not in text:
        return text
    name = text.split("=", 1)[0]
    return text.replace("{default}", str(default_values.get(name, "default")))


@functools.lru_cache(maxsize=1)
def _catalogue_over() -> dict:
    """Today's levers measured over another, by key (built once)."""
    return {lv.key: lv for lv in all_levers(BenchShape()) if lv.over}


def _over(lever: dict) -> tuple[str | None, str, str]:
    """(the lever whose run is this one's baseline, or None for the default run; the baseline's
    words; the lever's note). A JSON written before levers had `over` takes all three from
    today's catalogue where the lever has one there."""
    now = _catalogue_over().get(lever["key"]) if "over" not in lever else None
    if now is not None:
        return now.over, now.baseline, now.note
    return lever.get("over"), lever["baseline"], lever.get("note", "")


def toggles_results(data: dict) -> list[dict]:
    """One row per lever of a `bench toggles` JSON; a lever `over` another is compared with
    that lever's run (its setting in the row's `at`), not the default run."""
    groups = by_config(data.get("points", []))
    default_points = groups.get("default", [])
    default_values = data.get("default_resolved", {})
    dp = (data.get("shape") or {}).get("dp", 1)
    rows = []
    for config in data.get("configs", []):
        lever = config.get("lever")
        if not lever:
            continue
        over, baseline, note = _over(lever)
        over_config = next((c for c in data.get("configs", []) if c["id"] == over), None)
        base = {"key": lever["key"], "id": lever["id"], "kind": lever["kind"],
                "set": _fill(lever["set"], default_values),
                "baseline": _fill(baseline, default_values),
                "needs_dp_gt_1": bool(lever.get("needs_dp")), "status": config["status"]}
        notes = [note] if note else []
        if config["status"] == "refused":
            rows.append({**base, "verdict": "refused", "tokens_per_s_ratio": None,
                         "ratio_spread": None, "repeats": 0,
                         "notes": notes + [config.get("message", "")]})
            continue
        if config["status"] != "planned":
            rows.append({**base, "verdict": "not measured", "tokens_per_s_ratio": None,
                         "ratio_spread": None, "repeats": 0,
                         "notes": notes + [f"{config['status']}: {config.get('message', '')}"]})
            continue
        variant = groups.get(config["id"], [])
        if over is None and default_points and not any(ok(p) for p in default_points):
            rows.append({**base, "verdict": "not measured", "tokens_per_s_ratio": None,
                         "ratio_spread": None, "repeats": 0,
                         "notes": notes + ["the default run failed: "
                                           + failure_line(default_points[0])]})
            continue
        if variant and all(p.get("refusal") for p in variant):
            # the launcher itself refused at run time (exit 2) although the precheck passed
            rows.append({**base, "status": "refused", "verdict": "refused",
                         "tokens_per_s_ratio": None, "ratio_spread": None, "repeats": 0,
                         "notes": notes + [variant[0]["refusal"]]})
            continue
        if over is not None:   # at the other lever's setting: its run is the baseline
            if over_config is None or not any(ok(p) for p in groups.get(over, [])):
                rows.append({**base, "verdict": "not measured", "tokens_per_s_ratio": None,
                             "ratio_spread": None, "repeats": 0,
                             "notes": notes + [f"its baseline, the {over} run, has no result"]})
                continue
            base["at"] = over_config["env"]
        baseline_points = groups[over] if over is not None else default_points
        set_pts, base_pts = ((baseline_points, variant) if lever["default_is_set"]
                             else (variant, baseline_points))
        row = compare(set_pts, base_pts)
        row["notes"] = notes + row["notes"]
        if lever.get("needs_dp") and dp == 1:
            row["notes"].append("needs DP>1: measured at DP=1, where it has nothing to act on")
        if config.get("corrections"):
            row["notes"].append("guard corrections in the variant run: " + "; ".join(
                f"{c['toggle']}={c['value']} ({c['reason']})" for c in config["corrections"]))
        rows.append({**base, **row})
    return rows


def peers_results(data: dict) -> list[dict]:
    """Ours (the launcher default) against each peer side of a `bench peers` JSON."""
    groups = by_config(data.get("points", []))
    configs = data.get("configs") or [{"id": name, "status": "planned"} for name in groups]
    ours_id = configs[0]["id"] if configs else "native"
    extra = " ".join(f"{k}={v}" for k, v in (configs[0].get("env") or {}).items()
                     if k != "TRANSFORMER_IMPL") if configs else ""
    rows = []
    for config in configs[1:]:
        side = config["id"]
        backend = side in ("local", "transformer_engine")   # ours on another backend
        key = f"TRANSFORMER_IMPL={side}" if backend else f"peer:{side}"
        base = {"key": key, "id": "TRANSFORMER_IMPL" if backend else f"peer:{side}",
                "kind": "backend" if backend else "peer",
                "set": (f"TRANSFORMER_IMPL={ours_id} {extra}" if extra
                        else f"TRANSFORMER_IMPL={ours_id} (launcher default)"),
                "baseline": (f"TRANSFORMER_IMPL={side}" if backend
                             else PEER_SIDES.get(side, side)),
                "needs_dp_gt_1": False, "status": config.get("status", "planned"),
                "optimizer_state": {
                    "set": _first(groups.get(ours_id, []), "optimizer_state"),
                    "baseline": _first(groups.get(side, []), "optimizer_state")}}
        if config.get("status", "planned") != "planned":
            rows.append({**base, "verdict": "not measured", "tokens_per_s_ratio": None,
                         "ratio_spread": None, "repeats": 0,
                         "notes": [f"{config['status']}: {config.get('message', '')}"]})
            continue
        rows.append({**base, **compare(groups.get(ours_id, []), groups.get(side, []))})
    return rows


def _first(points: list[dict], key: str):
    return next((p[key] for p in points if p.get(key)), None)


def results(data: dict) -> list[dict]:
    kind = data.get("kind")
    if kind == "peers":
        return peers_results(data)
    if kind in ("toggles", "levers"):
        return toggles_results(data)
    return []
