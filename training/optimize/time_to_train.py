"""Time to train an MLPerf recipe (llama31_8b, gpt_oss_20b) on N GPUs of a platform, on paper.

    python -m training.optimize.time_to_train [--benchmark gpt_oss_20b] [--json] KEY=VALUE ...

resolves the words as examples/mlperf/<benchmark>/run_<benchmark>.sh does (the recipe layer on
top: its model, sequence, batch size, LR from the RCP), projects one step
(training/optimize/project.py) and multiplies by the steps to converge: the samples to converge
of mlperf-logging's reference convergence points (RCPs) for the global batch size (their mean,
minimum and maximum; training/mlperf/rcp.py) over the batch size. Evaluation, the untimed
index step and start-up are not counted (the MLPerf clock includes evaluation: say so).
"""
from __future__ import annotations

import dataclasses
import math
import sys
from statistics import mean
from typing import Any

from .inputs import BadInput


def time_to_train(words: list[str], environ: dict[str, str] | None = None,
                  benchmark: str = "llama31_8b") -> dict[str, Any]:
    from training.mlperf import rcp as rcp_mod
    from training.mlperf import rules as rules_mod
    from training.mlperf.launch import resolve_mlperf

    from .project import project

    env = dict(environ or {}, DRY_RUN="1", PREFLIGHT_MEMORY="off")
    env.setdefault("MASTER_ADDR", "node0")
    # closed division needs the C4 files on this machine; the step is the same without them
    env.setdefault("MLPERF_DIVISION", "open")
    try:
        rules = rules_mod.load_benchmark(benchmark)
    except KeyError as err:
        raise BadInput(str(err).strip("'\"")) from None
    launch, _values, _config = resolve_mlperf(env, words, rules)
    # the reference convergence points count samples of the benchmark's model at its sequence:
    # another model's step times the 8B's step count is no time to train of anything
    values = {name: launch.settings.get(name) for name in rules.model}
    other = [b for b in rules_mod.rule_breaks(values, dataclasses.replace(rules, closed={}))
             if b.split("=", 1)[0] in rules.model]
    if other:
        raise BadInput(f"{'; '.join(other)}: the samples to converge (the RCPs) are "
                       f"{rules.model_name}'s, so a time to train needs the benchmark's model "
                       "and sequence; project another model's step with python -m "
                       "training.optimize.project")
    run = launch.run
    result = project(run)
    bs = run.layout.global_batch
    choice = rcp_mod.choose(bs, rcp_mod.load(rules.ruleset, rules.benchmark))
    samples = choice.rcp.samples_to_converge
    steps = {k: math.ceil(v / bs) for k, v in
             (("mean", mean(samples)), ("min", min(samples)), ("max", max(samples)))}
    step_s = result["step_s"]
    return {"benchmark": rules.benchmark, "ruleset": rules.ruleset, "global_batch": bs,
            "rcp": {"name": choice.rcp.name, "batch_size": choice.rcp.batch_size,
                    "samples_to_converge": list(samples), "exact": choice.exact,
                    "note": choice.note,
                    "file": str(rcp_mod.rcp_file(rules.ruleset, rules.benchmark))},
            "steps_to_converge": steps, "step_s": step_s,
            "minutes": {k: v * step_s / 60 for k, v in steps.items()},
            "projection": result,
            "not_counted": "evaluation (every MLPERF_EVAL_EVERY samples), the untimed index "
                           "step, start-up and checkpoint-free warm-up compilation"}


def render(r: dict[str, Any]) -> str:
    p = r["projection"]
    lay = p["layout"]
    m = r["minutes"]
    rcp = r["rcp"]
    lines = [f"time to train {r['benchmark']} (MLPerf {r['ruleset']}) on {lay['world_size']} "
             f"{p['platform']}, GBS {r['global_batch']}, {p['precision']}:",
             f"  samples to converge: RCP {rcp['name']} (BS {rcp['batch_size']}), "
             f"{len(rcp['samples_to_converge'])} reference runs, mean "
             f"{mean(rcp['samples_to_converge']):,.0f} ({rcp['file']})"]
    if rcp["note"]:
        lines.append(f"  note: {rcp['note']}")
    steps = r["steps_to_converge"]
    lines += [f"  steps: {steps['mean']:,} (min {steps['min']:,}, max {steps['max']:,}) x "
              f"projected step {r['step_s']:.3f} s",
              f"  time to train: {m['mean']:.1f} min (range {m['min']:.1f}-{m['max']:.1f} min over "
              f"the RCP runs; projected {p['tokens_per_s_per_gpu']:,.0f} tokens/s/GPU)",
              f"  with the projection's band: {m['mean'] * p['tokens_per_s_per_gpu'] / p['band']['high']:.1f}"
              f"-{m['mean'] * p['tokens_per_s_per_gpu'] / p['band']['low']:.1f} min",
              f"  not counted: {r['not_counted']}",
              "  projection assumptions:"]
    lines += [f"    - {a}" for a in p["assumptions"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from .project import run_cli, words_parser

    parser = words_parser("python -m training.optimize.time_to_train", __doc__.split("\n\n")[0],
                          family=False)
    parser.add_argument("--benchmark", default="llama31_8b",
                        help="the MLPerf recipe: llama31_8b (default) or gpt_oss_20b")
    return run_cli(parser, argv, lambda a: time_to_train(a.words, benchmark=a.benchmark),
                   render)


if __name__ == "__main__":
    sys.exit(main())
