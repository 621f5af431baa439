"""A fake point runner and prechecks: synthetic step times with a known effect and noise."""
from __future__ import annotations

import random
from pathlib import Path

from training.bench.stats import harmonic_tokens_per_s
from training.launch.recipes import RECIPES
from training.bench.sweep import PointSpec


class FakeRunner:
    """Each config has a true tokens/s/GPU (`speed`, default `base`); every repeat draws a
    process-level factor within ±noise (uniform), every step a small jitter.

    on_point: called with (spec, number of points already in the JSON on disk) before
    returning, so a test can check the incremental writes."""

    def __init__(self, speed: dict[str, float] | None = None, base: float = 35000.0,
                 noise: float = 0.005, step_jitter: float = 0.001, seed: int = 7,
                 fail: dict[str, str] | None = None, json_path: Path | None = None,
                 memory: dict[str, float] | None = None,
                 factors: dict[str, list[float]] | None = None):
        self.speed = speed or {}
        self.base, self.noise, self.jitter = base, noise, step_jitter
        self.rng = random.Random(seed)
        self.fail = fail or {}
        self.json_path = json_path
        self.memory = memory or {}
        self.factors = factors or {}   # config -> per-repeat process factor (replaces noise)
        self.calls: list[PointSpec] = []
        self.on_disk: list[int] = []

    def __call__(self, spec: PointSpec) -> dict:
        import json

        self.calls.append(spec)
        if self.json_path is not None:
            self.on_disk.append(len(json.loads(self.json_path.read_text())["points"]))
        if spec.config in self.fail:
            return {"side": spec.side, "returncode": 1, "error": self.fail[spec.config]}
        shape = spec.shape
        tokens = shape.global_batch * int(spec.env.get("SEQ_LENGTH", shape.seq_length)) \
            if spec.side == "ours" else shape.tokens_per_step
        speed = self.speed.get(spec.config, self.base)
        factor = (self.factors[spec.config][spec.repeat] if spec.config in self.factors
                  else 1 + self.rng.uniform(-self.noise, self.noise))
        step = tokens / (speed * factor) / shape.gpus
        times = [step * 4] + [step * (1 + self.rng.uniform(-self.jitter, self.jitter))
                              for _ in range(shape.warmup + shape.steps - 1)]
        warm = [i < shape.warmup for i in range(len(times))]
        steady = [t for t, w in zip(times, warm) if not w]
        tps = harmonic_tokens_per_s(steady, tokens, shape.gpus)
        return {"side": spec.side, "returncode": 0, "wall_s": 30 + sum(times),
                "samples": {"iteration": list(range(1, len(times) + 1)),
                            "step_time_s": times, "warmup": warm},
                "tokens_per_s_per_gpu": tps, "model_tflops_per_gpu": tps * 15.2e9 / 1e12,
                "peak_memory_gib": self.memory.get(spec.config, 54.0),
                "optimizer_state": f"{spec.side} optimizer"}


def fake_precheck(refuse: dict[str, str] | None = None,
                  correct: dict[str, tuple[str, str]] | None = None,
                  defaults: dict[str, str] | None = None):
    """A precheck that refuses when a toggle=value in `refuse` is asked for, and corrects
    (toggle -> (value, reason)) those in `correct`."""
    refuse, correct = refuse or {}, correct or {}
    base = {"TRANSFORMER_IMPL": "native", "NATIVE_KERNELS": "liger", "PRECISION": "bf16",
            "GRAD_REDUCE_IN_BF16": "1", "RECOMPUTE": "none", **(defaults or {})}

    def precheck(env: dict) -> dict:
        for pair, message in refuse.items():
            k, v = pair.split("=", 1)
            if env.get(k) == v:
                return {"status": "refused", "message": message}
        values = {**base, **{k: str(v) for k, v in env.items()}}
        corrections = []
        for k, (value, reason) in correct.items():
            if k in env:
                values[k] = value
                corrections.append({"toggle": k, "value": value, "reason": reason})
        return {"status": "ok", "values": values, "corrections": corrections,
                "layout": {"tp": 1, "pp": 1, "dp": 1, "world_size": 1}}

    return precheck


HEADER = {"name": "fake", "created": "2026-11-30T12:00:00", "command": "python -m training.bench x",
          "git_sha": "abc123", "host": "test", "gpu": {"name": "NVIDIA H200", "count": 1,
                                                       "driver": "580.0"},
          "versions": {"torch": "2.11.0", "megatron-core": "0.19.2", "liger-kernel": "0.8.5"}}
