"""The grid's results: <out>/<name>.json (everything), <name>.md (the table), <name>.png."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from .verdict import Rules, windows


def _f(value: Any, spec: str = ".3f") -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return format(value, spec)


def main_effects(cells: list[dict[str, Any]], axes: dict[str, list[str]], key: str
                 ) -> dict[str, dict[str, float]]:
    """For each axis and value: the mean of numbers[key] over the cells with that value
    (cells without the number, e.g. diverged or failed, are left out)."""
    out: dict[str, dict[str, float]] = {}
    for axis, values in axes.items():
        means = {}
        for value in values:
            got = [c["numbers"].get(key) for c in cells
                   if c["values"][axis] == value and c["numbers"].get(key) is not None]
            if got:
                means[value] = sum(got) / len(got)
        out[axis] = means
    return out


def markdown(result: dict[str, Any]) -> str:
    rules = Rules(**result["rules"])
    lines = [f"# Convergence grid `{result['name']}`", ""]
    if result.get("description"):
        lines += [result["description"].strip(), ""]
    lines += [f"Fixed: {', '.join(f'`{k}={v}`' for k, v in result['fixed'].items())}"
              + (f"; Megatron flags `{' '.join(result['args'])}`" if result.get("args") else ""),
              "", f"Run: `{result['command']}` at git `{result.get('git_sha') or '-'}`"
              f" on {result.get('device') or '-'}.", "",
              "| cell | verdict | train loss start -> end | best eval loss | last eval loss "
              "| max / final grad norm | grad norm / sqrt(params) | tokens/s/GPU | reason |",
              "|---|---|---|---|---|---|---|---|---|"]
    for c in result["cells"]:
        n = c["numbers"]
        per_param = (n["grad_norm_end"] / math.sqrt(c["parameters"])
                     if n.get("grad_norm_end") is not None and c.get("parameters") else None)
        lines.append(
            f"| {c['label']} | **{c['verdict']}** | {_f(n.get('train_start'))} -> "
            f"{_f(n.get('train_end'))} | {_f(n.get('eval_best'))} | {_f(n.get('eval_last'))} | "
            f"{_f(n.get('grad_norm_max'), '.2f')} / {_f(n.get('grad_norm_end'), '.2f')} | "
            f"{_f(per_param, '.1e')} | {_f(c.get('tokens_per_s_per_gpu'), ',.0f')} | "
            f"{c['reason']} |")
    lines += ["", "Main effects (mean over the cells with each value; diverged/failed cells left "
              "out):", "", "| axis | value | mean best eval loss | mean final train loss |",
              "|---|---|---|---|"]
    for axis, means in result["main_effects"]["eval_best"].items():
        for value, mean in means.items():
            train = result["main_effects"]["train_end"].get(axis, {}).get(value)
            lines.append(f"| {axis} | {value} | {_f(mean, '.4f')} | {_f(train, '.4f')} |")
    lines += ["", "Verdict rules (thresholds from the grid's `verdict:` section):", ""]
    lines += [f"- {line}" for line in rules.describe()]
    lines += ["", "Curves: " + f"`{result['name']}.png`; every point: `{result['name']}.json`.", ""]
    return "\n".join(lines)


def plot(result: dict[str, Any], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    smooth = result["rules"]["smooth"]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    for i, c in enumerate(result["cells"]):
        # colour and dash both differ per cell: cells on top of each other stay visible
        style = {"color": f"C{i % 10}", "ls": ("-", "--", ":", "-.")[i % 4]}
        label = f"{c['label']} ({c['verdict']})"
        train = c["curves"]["train"]
        if train:
            xs = [it for it, _ in train][smooth - 1::smooth] or [train[-1][0]]
            ys = windows([v for _, v in train], smooth)
            axes[0].plot(xs[:len(ys)], ys[:len(xs)], label=label, **style)
        if c["curves"]["evals"]:
            axes[1].plot(*zip(*c["curves"]["evals"]), marker="o", ms=3, label=label, **style)
        if c["curves"]["grad_norm"]:
            axes[2].plot(*zip(*c["curves"]["grad_norm"]), lw=0.8, alpha=0.8, label=label,
                         **style)
    titles = (f"train loss ({smooth}-iteration means)", "eval loss", "grad norm")
    for ax, title in zip(axes, titles):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
    axes[2].set_yscale("log")
    axes[1].legend(fontsize=8)
    fig.suptitle(f"convergence grid {result['name']}", fontsize=11)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def write(result: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    name = result["name"]
    paths = {"json": out_dir / f"{name}.json", "md": out_dir / f"{name}.md",
             "png": out_dir / f"{name}.png"}
    from training.safe_files import write_text

    write_text(paths["json"], json.dumps(result, indent=1, default=str) + "\n", "convergence JSON")
    write_text(paths["md"], markdown(result), "convergence report")
    plot(result, paths["png"])
    return paths
