"""The toggle, recipe and guard tables, generated from the registry and the guards (one source
of truth), in docs/toggles.md (README.md is a front page that links there).

`python -m training.launch.docs` rewrites the core's blocks between the markers in
docs/toggles.md; `--check` exits 1 when the page is out of date (a test runs it). A recipe
layer renders its own toggles and guards with the same functions into blocks of its own
(`python -m training.mlperf.docs`).
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

from training import REPO_ROOT
from training.cli import ArgumentParser, fail
from training.platforms import PLATFORMS

from .guards import GUARDS
from .recipes import RECIPES, TE_NVIDIA, TE_ROCM, platforms_supporting, recipe_args
from .settings import Settings, fmt_value
from .toggles import LAUNCHER, REGISTRY, Form

PAGE = REPO_ROOT / "docs" / "toggles.md"
README = PAGE   # the name the recipe layers' generators and older callers use
GROUP_TITLES = {
    "performance": "Performance toggles (default on; `=0` disables)",
    "model": "Model", "precision": "Precision", "backend": "Backend", "parallel": "Parallelism",
    "optimizer": "Optimizer state",
    "training": "Training loop", "data": "Data", "output": "Run folder, logging, checkpoints",
    "profile": "Profiling", "resilience": "Preemption, restarts, hangs",
    "cluster": "Cluster (torchrun)", "launcher": "Launcher",
    "mlperf": "MLPerf Llama 3.1 8B (examples/mlperf/llama31_8b)",
    "moe": "Mixture of experts (examples/moe; MoE presets only)",
}


def _flags(toggle) -> str:
    if toggle.flag and toggle.built:
        return f"`{toggle.flag}` …"
    if toggle.emitted_by:
        return f"(built by {toggle.emitted_by})"
    if toggle.emit:
        return f"(built: {(toggle.emit.__doc__ or '').strip().splitlines()[0]})"
    if toggle.kind == "bool":
        on = " ".join(toggle.on) or "(Megatron default)"
        off = " ".join(toggle.off) or "(nothing)"
        return f"1: `{on}` / 0: `{off}`" if toggle.bucket != LAUNCHER else ""
    return f"`{toggle.flag} VALUE`" if toggle.flag else ""


def toggles_table(toggles=REGISTRY) -> str:
    lines = []
    group = None
    for toggle in toggles:
        if toggle.group != group:
            group = toggle.group
            lines += ["", f"**{GROUP_TITLES.get(group, group)}**", "",
                      "| toggle | default | values | flag | bucket | what it does |",
                      "|---|---|---|---|---|---|"]
        values = "/".join(toggle.choices) if toggle.choices else {
            "bool": "0/1", "int": "integer", "float": "number", "str": "text",
            "path": "path", "choice": ""}[toggle.kind]
        if isinstance(toggle.check, Form):
            values = toggle.check.text
        elif toggle.check is not None:
            values = f"{values} {toggle.check.text}"
        lines.append(f"| `{toggle.name}` | {fmt_value(toggle.default)} | {values} | "
                     f"{_flags(toggle)} | {toggle.bucket} | {toggle.description} |")
    return "\n".join(lines).strip()


def guards_table(guards=None) -> str:
    lines = ["| guard | rule |", "|---|---|"]
    for fn in GUARDS if guards is None else guards:
        doc = (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else ""
        lines.append(f"| `{fn.__name__}` | {doc} |")
    return "\n".join(lines)


def recipes_table() -> str:
    """PRECISION recipes: the Megatron flags, the platforms that run each, and the rule's source."""
    lines = ["| `PRECISION` (run-folder tag) | Megatron flags (defaults) | platforms | "
             "NVIDIA: rule; TE function | AMD: rule; ROCm TE function |", "|---|---|---|---|---|"]
    for recipe in RECIPES.values():
        settings = Settings()
        for name, value in (("FP8_FORMAT", recipe.fp8_format),
                            ("FP4_SELECTIVE_BF16", recipe.selective_bf16),
                            ("FP4_BF16_LAYERS_START", 1), ("FP4_BF16_LAYERS_END", 1)):
            settings.put(name, value, "recipe")
        flags = " ".join(recipe_args(recipe, settings))
        where = ", ".join(platforms_supporting(recipe)) if recipe.kind != "bf16" else \
            ", ".join(PLATFORMS)
        lines.append(f"| `{recipe.name}` | `{flags}` | {where or 'none'} | {recipe.nvidia} | "
                     f"{recipe.amd} |")
    lines += ["", f"Functions of {TE_NVIDIA} and of {TE_ROCM}."]
    return "\n".join(lines)


BLOCKS = {"toggles": toggles_table, "guards": guards_table, "recipes": recipes_table}


def render(text: str, blocks=None) -> str:
    for name, make in (BLOCKS if blocks is None else blocks).items():
        pattern = re.compile(rf"(<!-- {name}:begin -->\n)(?:.*?\n)?(<!-- {name}:end -->)", re.S)
        if not pattern.search(text):
            raise SystemExit(f"the page has no <!-- {name}:begin --> ... <!-- {name}:end --> block")
        text = pattern.sub(lambda m: m.group(1) + make() + "\n" + m.group(2), text)
    return text


def main(argv: list[str] | None = None, blocks=None,
         prog: str = "python -m training.launch.docs") -> int:
    parser = ArgumentParser(prog=prog)
    parser.add_argument("--check", action="store_true", help="exit 1 if the page is stale")
    parser.add_argument("--readme", "--page", type=Path, default=PAGE,
                        help="the page with the blocks (default: docs/toggles.md)")
    args = parser.parse_args(argv)
    try:
        current = args.readme.read_text()
    except OSError as err:
        return fail(f"{args.readme}: cannot read it ({err.strerror or err}); --page names the "
                    "page to regenerate")
    fresh = render(current, blocks)
    if args.check:
        if fresh != current:
            print(f"{args.readme.name} is out of date: run `{prog}`", file=sys.stderr)
            return 1
        return 0
    args.readme.write_text(fresh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
