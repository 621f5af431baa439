"""`python -m training.mlperf.launch [--benchmark gpt_oss_20b] [KEY=VALUE ...] [--megatron-flags ...]`

Called by examples/mlperf/llama31_8b/run_llama31_8b.sh in place of `python -m training.launch`:
the same launcher (registry, guards, run folder, manifest, startup table, shell assignments on
stdout) with the llama31_8b recipe layer (training/mlperf/layer.py) on top of it (with
`--benchmark gpt_oss_20b`, examples/mlperf/gpt_oss_20b/run_gpt_oss_20b.sh: that benchmark's
config.yaml, on the gpt_oss family with the MoE family's layers under the recipe's):

  1. recipe values: every knob of config.yaml you did not set (environment or KEY=VALUE word)
     gets the recipe's value, with its reason (the rule, or the arithmetic from BS/LR); the
     table shows them with source "recipe";
  2. the layer's guard mlperf_closed_rules checks the resolved launch with the core's guards
     (closed: a break, or a Megatron --flag that would change a rule, is refused);
  3. `export MLPERF_RUN=<json>`: what the run needs for mlperf.log, the page cache drop and the
     stop at the target (every rank of every node reads it; node 0 also stores it in
     manifest.json as "mlperf"); MLPERF_INDEX: the untimed index step's arguments on node 0.
"""
from __future__ import annotations

import json
import os
import shlex
import sys
from dataclasses import asdict
from typing import Any

from training.cli import fail
from training.launch.settings import BadInput, LaunchError

from . import rules as rules_mod
from .layer import llama31_8b

RUN_ENV = "MLPERF_RUN"


def run_config(launch, rules: rules_mod.Rules) -> dict[str, Any]:
    """What the run needs (MLPERF_RUN): everything else it reads from Megatron's own args."""
    s = launch.settings
    return {"benchmark": rules.benchmark, "division": s["MLPERF_DIVISION"],
            "target_eval_loss": s["MLPERF_TARGET_LOSS"],
            "eval_every_samples": s["MLPERF_EVAL_EVERY"],
            "eval_samples": s["MLPERF_EVAL_SAMPLES"],
            "org": s.get("MLPERF_ORG"), "platform": s.get("MLPERF_PLATFORM"),
            "precision": launch.run.precision, "ruleset": rules.ruleset,
            "config_filename": rules.config_filename, **cache_plan(s)}


def cache_plan(settings) -> dict[str, Any]:
    """How the run drops the page cache (training.mlperf.cache), decided here, shown by the
    guard mlperf_cache_clear, done by each node's local rank 0 at the run's start."""
    from .cache import plan

    command = settings.get("MLPERF_CACHE_CLEAR_CMD")
    how = plan(command)
    return {"cache_clear": how.method if how.done else "none", "cache_clear_cmd": command,
            "cache_clear_why": how.detail}


def family_layers(family: str) -> list:
    """The layers a benchmark's model family brings under the recipe's (gpt_oss: the MoE
    family's toggles and guards, and gpt-oss's guards)."""
    if family != "gpt_oss":
        return []
    from training.moe.gpt_oss import GPT_OSS
    from training.moe.layer import MOE

    return [MOE, GPT_OSS]


def resolve_mlperf(environ: dict[str, str], words: list[str],
                   rules: rules_mod.Rules | None = None):
    """(launch, recipe values, run config); raises LaunchError like training.launch.resolve."""
    from training.launch.resolve import resolve

    rules = rules or rules_mod.load()
    launch = resolve(rules.family, environ, list(words),
                     layers=[llama31_8b(rules), *family_layers(rules.family)])
    return launch, launch.recipe_values, run_config(launch, rules)


def _benchmark(words: list[str]) -> tuple[str, list[str]]:
    """A leading `--benchmark NAME` (the entry script's), else llama31_8b."""
    if words[:1] == ["--benchmark"] and len(words) > 1:
        return words[1], words[2:]
    if words[:1] and words[0].startswith("--benchmark="):
        return words[0].split("=", 1)[1], words[1:]
    return "llama31_8b", words


def main(argv: list[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    from training.launch.__main__ import shell_assignments
    from training.launch.manifest import write_launch_manifest
    from training.launch.report import print_report
    from training.launch.runfolder import update_manifest

    benchmark, words = _benchmark(words)
    try:
        rules = rules_mod.load_benchmark(benchmark)
    except KeyError as err:
        print(f"error: --benchmark: {err.args[0]}", file=sys.stderr)
        return BadInput.exit_code
    try:
        launch, recipe, config = resolve_mlperf(dict(os.environ), words, rules)
    except LaunchError as err:
        fail(str(err))
        return err.exit_code
    except (OSError, KeyError, ValueError) as err:  # a broken config.yaml
        print(f"error: {rules.path}: {err}", file=sys.stderr)
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
    # node 0 builds the dataset indices before torchrun (training.mlperf.index, untimed)
    index = (["--world-size", str(launch.run.layout.world_size)]
             if launch.settings["NODE_RANK"] == 0 else [])
    sys.stdout.write(f"MLPERF_INDEX=({' '.join(index)})\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
