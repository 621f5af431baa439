"""The llama31_8b recipe as a recipe layer (training/launch/layers.py) on the core launcher.

training.mlperf.launch (run_llama31_8b.sh) resolves with it; nothing in training/launch/ imports
it. It brings
  toggles  MLPERF_DIVISION, MLPERF_TARGET_LOSS, MLPERF_EVAL_EVERY, MLPERF_EVAL_SAMPLES,
           MLPERF_ORG, MLPERF_PLATFORM: the benchmark's own knobs;
  values   every knob of config.yaml the user left unset, with its reason (the rule, or the
           arithmetic from the user's BS/LR): source "recipe" in the table;
  guards   mlperf_closed_rules: a break of a closed rule is refused (closed) or warned (open),
           the evaluation knobs must agree with the MLPerf cadence, and in the closed division
           Megatron --flags that would change a rule behind the recipe are refused;
           mlperf_seed: a seed drawn per run (closed: a SEED of the user's is refused);
           mlperf_cache_clear: closed, a launch that cannot drop the page cache is refused;
           mlperf_rcp: LR and warm-up from mlperf-logging's RCP of the batch size, and a
           warning where no RCP exists for it (or LR / warm-up differ from it);
           mlperf_reference_data: closed, a warning when the validation set's documents and
           tokens are not the reference's (the submission check would fail).
"""
from __future__ import annotations

from typing import Any

from training.launch.layers import RecipeLayer, RecipeValue
from training.launch.settings import Refusal, Settings
from training.launch.toggles import LAUNCHER, Toggle

from . import cache as cache_mod
from . import rcp as rcp_mod
from . import rules as rules_mod
from . import seed as seed_mod

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
    Toggle("MLPERF_CACHE_CLEAR_CMD", "str", None, LAUNCHER,
           "Command that drops this node's page cache before the run (a cluster's helper, e.g. "
           "'sudo -n /usr/local/sbin/drop_caches'; run without a shell). Without it, as root: "
           "sync + /proc/sys/vm/drop_caches. Closed: a launch that can do neither is refused.",
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
    put("MODEL_SIZE", rules.model["MODEL_SIZE"], f"{rules.model_name} (closed rule)")
    for name, value in rules.closed.items():
        put(name, value, "closed rule")
    free = rules.free
    bs = given("BS", free["BS"])
    choice = rcp_mod.choose(bs, rcp_mod.load(rules.ruleset, rules.benchmark))
    source = (f"the RCP of BS {bs}" if choice.exact else
              f"no RCP for BS {bs}: BS {choice.rcp.batch_size}'s RCP")
    lr = given("LR", choice.lr)
    put("BS", bs, "the reference's global batch (free)")
    put("LR", lr, f"{source} (mlperf-logging's rcps_{rules.benchmark}.json)")
    put("SEED", seed_mod.draw(), "drawn for this run from os.urandom (each run its own; every "
                                 "rank uses node 0's)")
    put("MIN_LR", rules_mod.min_lr(rules, lr), f"{rules.min_lr_ratio:g} x LR: the cosine decay "
                                               "ends at 0.1x the base LR")
    every = given("MLPERF_EVAL_EVERY", rules.closed["MLPERF_EVAL_EVERY"])
    samples = given("MLPERF_EVAL_SAMPLES", rules.closed["MLPERF_EVAL_SAMPLES"])
    put("EVAL_INTERVAL", rules_mod.eval_interval(every, bs),
        f"ceil(MLPERF_EVAL_EVERY {every} / BS {bs}): evaluate every {every} sequences")
    n = rules_mod.evaluated_sequences(samples, bs)
    put("EVAL_ITERS", rules_mod.eval_iters(samples, bs),
        f"ceil(MLPERF_EVAL_SAMPLES {samples} / BS {bs}): the first {n} validation sequences")
    put("WARMUP_ITERS", choice.warmup_iters,
        f"ceil({choice.warmup_samples} warm-up samples ({source}) / BS {bs})")
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


def mlperf_seed(ctx) -> None:
    """MLPerf: the seed is drawn per run (closed: a SEED or --seed of the user's is refused)."""
    s = ctx.settings
    explicit = s.is_explicit("SEED") or any(w == "--seed" or w.startswith("--seed=")
                                            for w in ctx.user_args)
    if not explicit:
        return
    if s["MLPERF_DIVISION"] == "closed":
        raise Refusal("mlperf_seed",
                      "MLPERF_DIVISION=closed: the seed is drawn per run (MLPerf's rules; the "
                      "seed checker refuses runs that log the same seed): unset SEED / --seed, "
                      "or set MLPERF_DIVISION=open to fix one.")
    s.info("mlperf_seed", f"MLPERF_DIVISION=open: your seed is used (closed runs draw one per run).")


def mlperf_cache_clear(ctx) -> None:
    """MLPerf: the page cache is dropped before the run; closed refuses a launch that cannot."""
    s = ctx.settings
    plan = cache_mod.plan(s.get("MLPERF_CACHE_CLEAR_CMD"))
    if plan.done:
        s.info("mlperf_cache_clear", f"the run drops the page cache at its start: {plan.detail}")
    elif s["MLPERF_DIVISION"] == "closed":
        raise Refusal("mlperf_cache_clear",
                      f"MLPERF_DIVISION=closed needs the page cache dropped before each run: "
                      f"{plan.detail}. Run as root where /proc/sys/vm/drop_caches is writable, "
                      "or set MLPERF_CACHE_CLEAR_CMD to your cluster's command (docs/mlperf.md).")
    else:
        s.warn("mlperf_cache_clear", f"the page cache is not dropped ({plan.detail}); "
                                     "mlperf.log says cache_clear false")


def rcp_guard(rules: rules_mod.Rules):
    def mlperf_rcp(ctx) -> None:
        """MLPerf: a batch size without an RCP (or another LR / warm-up than its RCP's) is named."""
        s = ctx.settings
        bs = s["BS"]
        choice = rcp_mod.choose(bs, rcp_mod.load(rules.ruleset, rules.benchmark))
        if not choice.exact:
            s.warn("mlperf_rcp", choice.note)
        for name, want in (("LR", choice.lr), ("WARMUP_ITERS", choice.warmup_iters)):
            if s.is_explicit(name) and not rules_mod._same(s[name], want):
                s.warn("mlperf_rcp", f"{name}={s[name]:g} differs from {want:g}, what the RCP of "
                                     f"BS {choice.rcp.batch_size} was measured with: the RCP "
                                     "checker compares your runs' convergence with those runs")
    return mlperf_rcp


def reference_data_guard(rules: rules_mod.Rules):
    def mlperf_reference_data(ctx) -> None:
        """MLPerf closed: a validation set that is not the reference's (documents, tokens) is named."""
        s = ctx.settings
        if s["MLPERF_DIVISION"] == "closed" and s.get("VALID_DATA_PATH"):
            other = _not_reference_valid(s["VALID_DATA_PATH"], s.get("TOKENIZER_MODEL"), rules)
            if other:
                s.warn("mlperf_reference_data", other)
    return mlperf_reference_data


def _not_reference_valid(prefix: str, tokenizer: str | None, rules: rules_mod.Rules
                         ) -> str | None:
    """Closed: the validation set's documents and tokens against the reference's."""
    from training.data.check import DataPathError, check_data_path

    ref = rules.reference_data
    try:
        info = check_data_path(prefix, tokenizer)
    except DataPathError:
        return None
    have = (info.documents[0], info.tokens[0])
    want = (ref.get("eval_dataset_documents"), ref.get("eval_dataset_tokens"))
    if have == want:
        return None
    return (f"VALID_DATA_PATH holds {have[0]:,} documents, {have[1]:,} tokens; the reference's "
            f"validation set {want[0]:,} and {want[1]:,} (config.yaml reference_data): the "
            "submission check will fail; adopt the reference's files or build with prepare_c4.sh "
            "(no BOS/EOD; docs/mlperf.md, Data)")


def llama31_8b(rules: rules_mod.Rules | None = None) -> RecipeLayer:
    """The recipe layer of MLPerf Training's llama31_8b (examples/mlperf/llama31_8b/config.yaml),
    or of the benchmark whose rules are given (gpt_oss_20b: examples/mlperf/gpt_oss_20b/)."""
    rules = rules or rules_mod.load()
    return RecipeLayer(name=f"MLPerf {rules.benchmark}",
                       values=lambda settings: recipe_values(rules, settings),
                       toggles=TOGGLES, guards=(closed_rules_guard(rules), mlperf_seed,
                                                mlperf_cache_clear, rcp_guard(rules),
                                                reference_data_guard(rules)))
