"""Render the report dict as markdown and as a PNG stacked-bar chart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from training.profiling import kernel_groups as kg

BREAKDOWN_PARTS = (
    ("compute", "compute"),
    ("exposed_comm", "exposed communication"),
    ("other", "other non-compute (memcpy/memset/sync)"),
    ("idle", "idle"),
)
BREAKDOWN_COLORS = {"compute": "#4C72B0", "exposed_comm": "#DD8452", "other": "#8172B3", "idle": "#C7C7C7"}
GROUP_COLORS = {
    kg.GEMM: "#4C72B0",
    kg.ATTENTION: "#55A868",
    kg.NORM_ELEMENTWISE: "#64B5CD",
    kg.COMMUNICATION: "#DD8452",
    kg.MEMCPY: "#8172B3",
    kg.OTHER: "#C7C7C7",
}


def _ms(us: float | None) -> str:
    return "-" if us is None else f"{us / 1000.0:.3f}"


def _pct(p: float | None) -> str:
    return "-" if p is None else f"{p:.1f}%"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def _sections(report: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(f"rank {r['rank']}", r) for r in report["ranks"]] + [("overall", report["overall"])]


def markdown(report: dict[str, Any]) -> str:
    dev = report["device"]
    lines = [
        "# Trace report",
        "",
        f"**Verdict (overall): {report['overall']['verdict']['line']}**",
        "",
        f"- Traces: `{report['source']['trace_dir']}` ({len(report['ranks'])} rank(s): "
        + ", ".join(f"{r} = `{Path(f).name}`" for r, f in report["source"]["trace_files"].items())
        + ")",
        f"- Read with Holistic Trace Analysis {report['hta_version']}; timeline: **{dev}** — {report['timeline']}",
        f"- Profiled steps: {report['profiled_steps'] or 'none (no ProfilerStep ranges)'}; "
        f"dropped by HTA: {report['dropped_steps'] or 'none'}",
    ]
    lines += [f"- Note: {n}" for n in report["notes"]]
    lines += ["", "## Verdict per rank", ""]
    lines += _table(["", "verdict"], [[name, s["verdict"]["line"]] for name, s in _sections(report)])

    lines += ["", "## Temporal breakdown", "", "Times in ms over the analysed span; percentages of the span.", ""]
    rows = []
    for name, s in _sections(report):
        b = s["breakdown"]
        rows.append(
            [name, _ms(b["span_us"])]
            + [f"{_ms(b[k + '_us'])} ({_pct(b[k + '_pct'])})" for k, _ in BREAKDOWN_PARTS]
            + [_ms(b["comm_total_us"]), _pct(b["comm_overlap_pct"]), _ms(s["steps"]["mean_step_us"])]
        )
    lines += _table(
        ["", "span", *[label for _, label in BREAKDOWN_PARTS], "communication total", "comm overlapped by compute",
         "mean step"],
        rows,
    )

    lines += ["", "## Kernel time by group", "", "Share of summed kernel time (kernels on all streams).", ""]
    rows = [
        [name] + [f"{_ms(s['kernel_groups'][g]['time_us'])} ({_pct(s['kernel_groups'][g]['pct'])})" for g in kg.GROUPS]
        for name, s in _sections(report)
    ]
    lines += _table(["", *kg.GROUPS], rows)

    what = "kernels" if dev == "gpu" else "operators (self time)"
    for name, s in _sections(report):
        lines += ["", f"## Top {what}: {name}", ""]
        lines += _table(
            ["#", "name", "group", "total ms", "count", "mean us", "% of kernel time"],
            [
                [str(i + 1), f"`{k['short_name'][:90]}`", k["group"], _ms(k["time_us"]), str(k["count"]),
                 "-" if k["mean_us"] is None else f"{k['mean_us']:.1f}", _pct(k["pct"])]
                for i, k in enumerate(s["top_kernels"])
            ],
        )

    lines += ["", "## Training ranges", ""]
    if not any(s["ranges"] for _, s in _sections(report)):
        lines.append("No training ranges (training/profiling/ranges.py) in the traces.")
    else:
        lines.append("Host time: the range's wall time on its CPU thread (% of the analysed steps' wall time). "
                     "Kernel time: summed duration of the GPU kernels launched while the range was open, "
                     "from any thread.")
        lines.append("")
        rows = []
        for name, s in _sections(report):
            for rname, r in s["ranges"].items():
                rows.append([name, f"`{rname}`", str(r["count"]), _ms(r["host_us"]), _pct(r["pct_of_steps"]),
                             _ms(r["kernel_us"])])
        lines += _table(["", "range", "count", "host ms", "host % of steps", "kernel ms"], rows)

    lines += ["", "## How to read this", ""]
    lines += [f"- **{k}**: {v}" for k, v in report["definitions"].items()]
    lines += [f"- **verdict rules**: {report['verdict_rules']}", ""]
    return "\n".join(lines)


def chart(report: dict[str, Any], path: Path) -> None:
    """Two stacked-bar panels per rank and overall: temporal breakdown, kernel time by group."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sections = _sections(report)
    labels = [name for name, _ in sections]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(max(10.0, 4.0 + 1.4 * len(labels)), 5.6))
    x = range(len(labels))
    bottom = [0.0] * len(labels)
    for key, label in BREAKDOWN_PARTS:
        vals = [s["breakdown"][key + "_pct"] for _, s in sections]
        ax1.bar(x, vals, bottom=bottom, label=label, color=BREAKDOWN_COLORS[key])
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax1.set_title(f"Temporal breakdown ({report['device']} timeline)")
    ax1.set_ylabel("% of analysed span")
    bottom = [0.0] * len(labels)
    for g in kg.GROUPS:
        vals = [s["kernel_groups"][g]["pct"] for _, s in sections]
        ax2.bar(x, vals, bottom=bottom, label=g, color=GROUP_COLORS[g])
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax2.set_title("Kernel time by group" if report["device"] == "gpu" else "Operator self time by group")
    ax2.set_ylabel("% of kernel time")
    for ax in (ax1, ax2):
        ax.set_xticks(list(x), labels, rotation=30 if len(labels) > 6 else 0)
        ax.set_ylim(0, 100)
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2, fontsize=8, frameon=False)
    fig.suptitle(report["overall"]["verdict"]["line"], fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
