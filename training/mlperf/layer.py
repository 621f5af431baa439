"""The llama31_8b recipe as a recipe layer (training/launch/layers.py) on the core launcher.

training.mlperf.launch (run_llama31_8b.sh) resolves with it; nothing in training/launch/ imports
it. It brings
  toggles  MLPERF_DIVISION, MLPERF_TARGET_LOSS, MLPERF_EVAL_EVERY, MLPERF_EVAL_SAMPLES,
           MLPERF_ORG, MLPERF_PLATFORM: the benchmark's own knobs;
  values   every knob of config.yaml the user left unset, with its reason (the rule, or the
           arithmetic from the user's BS/LR): source "recipe" in the table;
  guards   mlperf_closed_rules: a break of a closed rule is refused (closed) or warned (open),
           the evaluation knobs must agree with the MLPerf cadence, and in the closed division
           Megatron --flags that would change a rule behind the recipe are refused.
"""
from __future__ import annotations

from typing import Any

from training.launch.layers import RecipeLayer, RecipeValue
from training.launch.settings import Refusal, Settings
from training.launch.toggles import LAUNCHER, Toggle

from . import rules as rules_mod

GROUP = "mlperf"
TOGGLES: tuple[Toggle, ...] = (
    Toggle("MLPERF_DIVISION", "choice", None, LAUNCHER,
           "MLPerf llama31_8b division: closed refuses a break of the benchmark's rules (guard "
           "mlperf_closed_rules), open warns. run_llama31_8b.sh sets closed and adds mlperf.log, "
           "the in-order evaluation set and the stop at the target.",
           choices=("closed", "open"), group=GROUP),
    Toggle("MLPERF_TARGET_LOSS", "float", None, LAUNCHER,
           "Stop at the first evaluation with eval loss <= this (closed: 3.3).", group=GROUP),
    Toggle("MLPERF_EVAL_EVERY", "int", None, LAUNCHER,
           "Training sequences between evaluations (closed: 12288); EVAL_INTERVAL = "
           "ceil(this / BS).", group=GROUP),
    Toggle("MLPERF_EVAL_SAMPLES", "int", None, LAUNCHER,
           "Validation sequences per evaluation, the first ones of the set in file order "
           "(closed: 1024); EVAL_ITERS = ceil(this / BS).", group=GROUP),
    Toggle("MLPERF_ORG", "str", None, LAUNCHER,
           "submission_org in mlperf.log (default: 'unspecified').", group=GROUP),
    Toggle("MLPERF_PLATFORM", "str", None, LAUNCHER,
           "submission_platform in mlperf.log (default: nodes x GPUs x device name).",
           group=GROUP),
)


def recipe_values(rules: rules_mod.Rules, settings: Settings) -> list[RecipeValue]:
    """The recipe's value for every knob the user left unset (env or KEY=VALUE word); the
    derived ones follow the user's BS, LR and evaluation knobs where they were given."""
    out: list[RecipeValue] = []

    def given(name: str, default: Any) -> Any:
        return settings[name] if settings.is_explicit(name) else default

    def put(name: str, value: Any, why: str) -> None:
        if not settings.is_explicit(name):
            out.append(RecipeValue(name, value, why))

    put("MLPERF_DIVISION", "closed", "the benchmark's closed division (open: MLPERF_DIVISION=open)")
    put("MODEL_SIZE", rules.model["MODEL_SIZE"], "Llama 3.1 8B (closed rule)")
    for name, value in rules.closed.items():
        put(name, value, "closed rule")
    free = rules.free
    bs = given("BS", free["BS"])
    lr = given("LR", free["LR"])
    put("BS", bs, "the reference's global batch (free)")
    put("LR", lr, "the reference's peak LR at BS 32 (free)")
    put("MIN_LR", rules_mod.min_lr(rules, lr), f"{rules.min_lr_ratio:g} x LR: the cosine decay "
                                               "ends at 0.1x the base LR")
    every = given("MLPERF_EVAL_EVERY", rules.closed["MLPERF_EVAL_EVERY"])
    samples = given("MLPERF_EVAL_SAMPLES", rules.closed["MLPERF_EVAL_SAMPLES"])
    put("EVAL_INTERVAL", rules_mod.eval_interval(every, bs),
        f"ceil(MLPERF_EVAL_EVERY {every} / BS {bs}): evaluate every {every} sequences")
    n = rules_mod.evaluated_sequences(samples, bs)
    put("EVAL_ITERS", rules_mod.eval_iters(samples, bs),
        f"ceil(MLPERF_EVAL_SAMPLES {samples} / BS {bs}): the first {n} validation sequences")
    warmup = free["warmup_samples"]
    put("WARMUP_ITERS", rules_mod.warmup_iters(warmup, bs),
        f"ceil({warmup} warm-up samples (the reference's) / BS {bs})")
    put("TOTAL_ITERS", free["TOTAL_ITERS"], "give-up cap: the run stops at MLPERF_TARGET_LOSS")
    put("EXP_NAME", free["EXP_NAME"], "MLPerf run folder")
    return out


def closed_rules_guard(rules: rules_mod.Rules):
    def mlperf_closed_rules(ctx) -> None:
        """MLPERF_DIVISION=closed: a break of a llama31_8b closed rule is refused (open: warned); the evaluation knobs must agree."""
        s = ctx.settings
        found = rules_mod.findings(s, rules)
        for text in found.warnings:
            s.warn("mlperf_closed_rules", text)
        for text in found.infos:
            s.info("mlperf_closed_rules", text)
        refusals = list(found.refusals)
        flags = rules_mod.rule_flags(ctx.user_args) if s["MLPERF_DIVISION"] == "closed" else []
        if flags:
            refusals.append(f"MLPERF_DIVISION=closed: {' '.join(flags)} would change a closed "
                            "rule behind the recipe (examples/mlperf/llama31_8b/config.yaml). "
                            "Use the KEY=VALUE knobs, or MLPERF_DIVISION=open.")
        if refusals:
            raise Refusal("mlperf_closed_rules", " ".join(refusals))
    return mlperf_closed_rules


def llama31_8b(rules: rules_mod.Rules | None = None) -> RecipeLayer:
    """The recipe layer of MLPerf Training's llama31_8b (examples/mlperf/llama31_8b/config.yaml)."""
    rules = rules or rules_mod.load()
    return RecipeLayer(name=f"MLPerf {rules.benchmark}",
                       values=lambda settings: recipe_values(rules, settings),
                       toggles=TOGGLES, guards=(closed_rules_guard(rules),))
