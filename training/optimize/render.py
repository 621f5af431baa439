"""The readable report, rendered from the report dict (the same one written as JSON)."""
from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table


def _gib(value: float | None) -> str:
    return "?" if value is None else f"{value:.1f}"


def _estimate_table(est: dict[str, Any], title: str) -> Table:
    table = Table(title=title, title_justify="left", show_lines=False, expand=False)
    table.add_column("term")
    table.add_column("GiB", justify="right")
    table.add_column("phase")
    table.add_column("formula", overflow="fold")
    for term in est["terms"]:
        note = "" if term["in_peak"] else " (not at the peak)"
        table.add_row(escape(term["label"]), f"{term['gib']:.2f}", term["phase"] + note,
                      escape(term["formula"]))
    return table


def render(report: dict[str, Any], console: Console | None = None) -> None:
    out = console or Console(width=120, highlight=False)
    p = out.print
    kind = "DRY_RUN manifest" if report["dry_run"] else "run folder"
    p(f"[bold]optimize[/bold] {escape(report['run'])} ({kind})")
    lf = report["levers_file"]
    if lf["path"]:
        p(f"levers: {escape(lf['path'])} ({lf['entries']} entries"
          f"{', generated ' + str(lf['generated']) if lf.get('generated') else ''})")
    else:
        p(f"levers: [yellow]{escape(lf['note'])}[/yellow]")

    neck = report["bottleneck"]
    split = f" ({neck['split']})" if neck.get("split") else ""
    p(f"\n[bold]1. Bottleneck: {neck['kind']}{split}[/bold]")
    for line in neck["memory_reasons"]:
        p(f"   - {escape(line)}")
    if neck.get("split_evidence"):
        p(f"   - {escape(neck['split_evidence'])}")
    for line in neck["evidence"]:
        p(f"   - {escape(line)}")
    if neck.get("measure_first"):
        p(f"   - [yellow]measure first[/yellow]: {escape(neck['measure_first'])}")

    shape = report["shape"]
    p("\n[bold]2. Shape[/bold]")
    for key in ("model", "architecture", "sequence", "data", "layout", "precision", "backend",
                "recompute"):
        p(f"   {key:<13}{escape(str(shape[key]))}")

    memory = report["memory"]
    est = memory["estimate"]
    asked = memory.get("asked_estimate")
    shown = asked or est
    a = report.get("asked")
    title = ("Memory estimate (per GPU) for the asked shape: seq "
             f"{a['seq_length']}, mbs {a['mbs']}, global batch {a['global_batch']}" if asked
             else "Memory estimate (per GPU, this run's shape)")
    p("")
    out.print(_estimate_table(shown, title))
    fraction = shown["fraction_of_device"]
    p(f"   peak {shown['peak_gib']:.1f} GiB at the {shown['peak_phase']} "
      f"(forward/backward {shown['fwd_bwd_gib']:.1f}, optimizer step {shown['step_gib']:.1f})"
      + (f" = {100 * fraction:.0f}% of {shown['device_gib']:.0f} GiB" if fraction else ""))
    if asked:
        p(f"   this run's own shape: estimate {est['peak_gib']:.1f} GiB")
    cal = memory.get("calibration")
    if cal:
        p(f"   this run's measured peak {cal['measured_peak_gib']:.1f} GiB "
          f"({escape(cal['measured_from'])}) vs estimate {cal['estimated_peak_gib']:.1f} GiB: "
          f"error {cal['error_pct']:+.1f}%")
        for label, e in (cal.get("phases") or {}).items():
            p(f"     {label}: measured {e['measured_gib']:.1f} GiB vs estimate "
              f"{e['estimated_gib']:.1f} GiB: error {e['error_pct']:+.1f}%")
    for note in shown["notes"]:
        p(f"   [yellow]note[/yellow]: {escape(note)}")

    p(f"\n[bold]3. Levers[/bold]: {escape(report['verdict'])}")
    for rec in report["recommendations"]:
        flag = "" if rec["status"] == "measured" else " [yellow](not measured yet)[/yellow]"
        p(f"   {rec['order']}. [bold cyan]{escape(rec['set'])}[/bold cyan]  "
          f"{escape(rec['title'])}{flag}")
        p(f"      why: {escape(rec['why'])}")
        p(f"      how: {escape(rec['mechanism'])}")
        p(f"      measured: {escape(rec['measured_text'])}")
        if rec.get("estimate"):
            e = rec["estimate"]
            delta = f" ({e['delta_gib']:+.1f})" if e.get("delta_gib") is not None else ""
            frac = (f", {100 * e['fraction_of_device']:.0f}% of the GPU"
                    if e.get("fraction_of_device") else "")
            p(f"      estimate: peak {e['peak_gib']:.1f} GiB{delta}{frac}"
              + (" [costs throughput]" if rec.get("costs_throughput") else ""))
    if not report["recommendations"]:
        p("   nothing to change.")
    for line in report.get("considered") or []:
        p(f"   considered: {escape(line)}")

    if report["already_on"]:
        p("")
        table = Table(title="Already on (no action)", title_justify="left")
        for col in ("toggle", "value", "source", "status"):
            table.add_column(col, overflow="fold")
        for item in report["already_on"]:
            table.add_row(item["toggle"], escape(str(item["value"])), str(item["source"]),
                          escape(item["status"]))
        out.print(table)
    if report["turned_off"]:
        p("\n[bold]Turned off[/bold]")
        for item in report["turned_off"]:
            p(f"   - {item['toggle']}={escape(str(item['value']))}: {escape(item['status'])}")

    if report["dead_ends"]:
        p("\n[bold]Dead ends for this shape (do not chase)[/bold]")
        for dead in report["dead_ends"]:
            p(f"   - [bold]{escape(dead['title'])}[/bold]: {escape(dead['why'])}")
            p(f"     {escape(dead['text'])}")
    if report.get("command"):
        p(f"\n[bold]Try[/bold] (check it first; DRY_RUN=1 prints the resolved launch):\n   "
          f"{escape(report['command'])}")
