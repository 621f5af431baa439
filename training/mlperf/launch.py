"""`python -m training.mlperf.launch [KEY=VALUE ...] [--megatron-flags ...]`

Called by examples/mlperf/llama31_8b/run_llama31_8b.sh in place of `python -m training.launch`:
the same launcher (registry, guards, run folder, manifest, startup table, shell assignments on
stdout), with the llama31_8b recipe in front of it:

  1. recipe values: every knob of config.yaml you did not set (environment or KEY=VALUE word)
     gets the recipe's value, with its reason (the rule, or the arithmetic from BS/LR); the
     table shows them with source "recipe";
  2. the guard mlperf_closed_rules checks the resolved launch (closed: a break is refused);
  3. in the closed division, Megatron --flags that would change a rule are refused;
  4. `export MLPERF_RUN=<json>`: what the run needs for mlperf.log and the stop at the target
     (every rank of every node reads it; node 0 also stores it in manifest.json as "mlperf").
"""
from __future__ import annotations

import json
import os
import shlex
import sys
from dataclasses import asdict, dataclass
from typing import Any

from training.launch.settings import BadInput, LaunchError, Refusal, Setting

from . import rules as rules_mod

FAMILY = "llama3"
RUN_ENV = "MLPERF_RUN"


@dataclass
class RecipeValue:
    name: str
    value: Any
    why: str


def _word(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def recipe_values(rules: rules_mod.Rules, environ: dict[str, str],
                  assignments: dict[str, str]) -> list[RecipeValue]:
    """The recipe's value for every knob the user left unset (env or KEY=VALUE word)."""
    from training.launch.toggles import BY_NAME, parse_value

    given = {k: v for k, v in environ.items() if v != ""}
    given.update(assignments)

    def user(name: str) -> bool:
        return name in given

    def current(name: str, default: Any) -> Any:
        return parse_value(BY_NAME[name], given[name]) if user(name) else default

    out: list[RecipeValue] = []

    def put(name: str, value: Any, why: str) -> None:
        if not user(name):
            out.append(RecipeValue(name, value, why))

    put("MLPERF_DIVISION", "closed", "the benchmark's closed division (open: MLPERF_DIVISION=open)")
    put("MODEL_SIZE", rules.model["MODEL_SIZE"], "Llama 3.1 8B (closed rule)")
    for name, value in rules.closed.items():
        put(name, value, "closed rule")
    free = rules.free
    bs = current("BS", free["BS"])
    lr = current("LR", free["LR"])
    put("BS", bs, "the reference's global batch (free)")
    put("LR", lr, "the reference's peak LR at BS 32 (free)")
    put("MIN_LR", rules_mod.min_lr(rules, lr), f"{rules.min_lr_ratio:g} x LR: the cosine decay "
                                               "ends at 0.1x the base LR")
    every = current("MLPERF_EVAL_EVERY", rules.closed["MLPERF_EVAL_EVERY"])
    samples = current("MLPERF_EVAL_SAMPLES", rules.closed["MLPERF_EVAL_SAMPLES"])
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


def run_config(launch, rules: rules_mod.Rules) -> dict[str, Any]:
    """What the run needs (MLPERF_RUN): everything else it reads from Megatron's own args."""
    s = launch.settings
    return {"benchmark": rules.benchmark, "division": s["MLPERF_DIVISION"],
            "target_eval_loss": s["MLPERF_TARGET_LOSS"],
            "eval_every_samples": s["MLPERF_EVAL_EVERY"],
            "eval_samples": s["MLPERF_EVAL_SAMPLES"],
            "org": s.get("MLPERF_ORG"), "platform": s.get("MLPERF_PLATFORM"),
            "precision": launch.run.precision, "ruleset": rules.ruleset,
            "config_filename": rules.config_filename}


def resolve_mlperf(environ: dict[str, str], words: list[str],
                   rules: rules_mod.Rules | None = None):
    """(launch, recipe values, run config); raises LaunchError like training.launch.resolve."""
    from training.launch.resolve import resolve, split_words

    rules = rules or rules_mod.load()
    assignments, _flags = split_words(words)
    recipe = recipe_values(rules, environ, assignments)
    env = dict(environ, **{rules_mod.RECIPE_MARKER: rules.benchmark})
    launch = resolve(FAMILY, env, [f"{r.name}={_word(r.value)}" for r in recipe] + list(words))
    # Provenance: the recipe's values came in as words; the table says where they came from.
    for r in recipe:
        setting = launch.settings.values[r.name]
        if setting.source == "cli":
            launch.settings.values[r.name] = Setting(r.name, setting.value, "recipe",
                                                     f"MLPerf {rules.benchmark}: {r.why}")
    if launch.settings["MLPERF_DIVISION"] == "closed":
        flags = rules_mod.rule_flags(launch.user_args)
        if flags:
            raise Refusal("mlperf_closed_rules",
                          f"MLPERF_DIVISION=closed: {' '.join(flags)} would change a closed rule "
                          "behind the recipe (examples/mlperf/llama31_8b/config.yaml). Use the "
                          "KEY=VALUE knobs, or MLPERF_DIVISION=open.")
    return launch, recipe, run_config(launch, rules)


def main(argv: list[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    from training.launch.__main__ import shell_assignments
    from training.launch.manifest import write_launch_manifest
    from training.launch.report import print_report
    from training.launch.runfolder import update_manifest

    try:
        launch, recipe, config = resolve_mlperf(dict(os.environ), words)
    except LaunchError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    except (OSError, KeyError, ValueError) as err:  # a broken config.yaml
        print(f"error: {rules_mod.CONFIG}: {err}", file=sys.stderr)
        return BadInput.exit_code
    print(f"MLPerf {config['benchmark']} ({config['division']} division): "
          f"{len(recipe)} values from {config['config_filename']} (source 'recipe' below); "
          f"mllog to {launch.log_dir / 'mlperf.log'}", file=sys.stderr)
    print_report(launch)
    if launch.settings["NODE_RANK"] == 0:
        write_launch_manifest(launch)
        update_manifest(launch.log_dir, "mlperf", {**config, "recipe": [asdict(r) for r in recipe]})
    sys.stdout.write(shell_assignments(launch))
    sys.stdout.write(f"export {RUN_ENV}={shlex.quote(json.dumps(config))}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
