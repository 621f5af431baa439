"""Steady-state statistics over repeated samples, and the rule that calls an effect real.

VERDICT_RULE is printed with every table and stored in every JSON, so a reader sees how
'faster' / 'slower' / 'within noise' were decided.
"""
from __future__ import annotations

import statistics

VERDICT_RULE = (
    "Each repeat runs every configuration once, in a rotated order (drift hits all sides). "
    "Effect = ratio of mean tokens/s/GPU (set over baseline). Noise = the largest of: the "
    "relative range (max-min)/mean of either side's per-repeat tokens/s, and the range of the "
    "paired per-repeat ratios. 'faster'/'slower' only when |ratio-1| exceeds the noise and "
    "every paired repeat agrees in direction; otherwise 'within noise'. With a single "
    "repeat the noise is the within-run range of steady-state step times (process-to-process "
    "noise unsampled), noted as such. A side that ran out of GPU memory is not repeated, and "
    "gives the verdict 'set out of memory' or 'baseline out of memory'.")


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


def steady_step_spread(point: dict) -> float | None:
    """Within-run relative range of the steady-state step times of one point."""
    samples = point.get("samples") or {}
    times = [t for t, warm in zip(samples.get("step_time_s", []), samples.get("warmup", []))
             if not warm]
    if len(times) < 2:
        return None
    return (max(times) - min(times)) / statistics.fmean(times)


def effect(set_by_repeat: dict[int, float], base_by_repeat: dict[int, float],
           set_step_spread: float | None = None,
           base_step_spread: float | None = None) -> dict:
    """Ratio of means (set over baseline), paired ratios, spread, noise and the verdict.

    *_by_repeat: repeat index -> that repeat's tokens/s/GPU (only successful points).
    *_step_spread: within-run step-time range, used as noise when there is one repeat.
    """
    if not set_by_repeat or not base_by_repeat:
        return {"verdict": "not measured", "tokens_per_s_ratio": None, "ratio_spread": None,
                "paired_ratios": [], "noise": None, "repeats": 0}
    s, b = summarize(list(set_by_repeat.values())), summarize(list(base_by_repeat.values()))
    ratio = s["mean"] / b["mean"]
    paired = [set_by_repeat[r] / base_by_repeat[r]
              for r in sorted(set_by_repeat) if r in base_by_repeat]
    ratio_spread = max(paired) - min(paired) if len(paired) > 1 else None
    repeats = min(s["n"], b["n"])
    note = ""
    if repeats >= 2:
        noise = max(s["spread"], b["spread"], ratio_spread or 0.0)
    else:
        noise = max(x for x in (set_step_spread, base_step_spread, 0.0) if x is not None)
        note = "1 repeat: noise is the within-run step-time range only"
    agree = all(r > 1 for r in paired) or all(r < 1 for r in paired)
    if abs(ratio - 1) <= noise or not agree:
        verdict = "within noise"
    else:
        verdict = "faster" if ratio > 1 else "slower"
    return {"verdict": verdict, "tokens_per_s_ratio": ratio, "ratio_spread": ratio_spread,
            "paired_ratios": paired, "noise": noise, "repeats": repeats, "note": note}

