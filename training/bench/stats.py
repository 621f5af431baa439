"""Steady-state statistics over repeated samples."""
from __future__ import annotations

import statistics


def summarize(values: list[float]) -> dict:
    """mean, min, max, relative spread ((max-min)/mean) and stdev of a list of samples."""
    if not values:
        return {"n": 0}
    mean = statistics.fmean(values)
    return {"n": len(values), "mean": mean, "min": min(values), "max": max(values),
            "spread": (max(values) - min(values)) / mean if mean else 0.0,
            "stdev": statistics.stdev(values) if len(values) > 1 else 0.0}


def harmonic_tokens_per_s(step_times: list[float], tokens_per_step: int, gpus: int) -> float:
    """Tokens/s/GPU over steps of equal tokens: total tokens over total time."""
    return tokens_per_step * len(step_times) / sum(step_times) / gpus


def ratio_verdict(a: dict, b: dict) -> str:
    """'a faster', 'b faster' or 'within noise' for two summaries of per-repeat throughputs:
    a difference is real only when it exceeds both points' spreads."""
    if not a.get("n") or not b.get("n"):
        return "unmeasured"
    diff = abs(a["mean"] - b["mean"]) / max(a["mean"], b["mean"])
    noise = max(a.get("spread", 0.0), b.get("spread", 0.0))
    if diff <= noise:
        return "within noise"
    return "first faster" if a["mean"] > b["mean"] else "second faster"
