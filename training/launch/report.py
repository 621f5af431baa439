"""The DRY_RUN / startup table: every toggle, its value, where it came from, what it emits."""
from __future__ import annotations

import os
import sys
from typing import TextIO

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .environment import shown
from .manifest import fork_rows, model_rows, toggle_rows
from .resolve import Launch

_SOURCE_STYLE = {"default": "dim", "preset": "cyan", "checkpoint": "cyan", "recipe": "magenta", "platform": "blue",
                 "env": "bold green", "cli": "bold green", "derived": "yellow",
                 "guard": "bold red"}
_NOTICE_STYLE = {"warning": "bold yellow", "correction": "bold red", "info": "cyan"}


def _console(stream: TextIO) -> Console:
    width = None if stream.isatty() else int(os.environ.get("COLUMNS", "200"))
    return Console(file=stream, width=width, highlight=False, soft_wrap=False)


def print_report(launch: Launch, stream: TextIO | None = None) -> None:
    console = _console(stream or sys.stderr)   # read at the call: a test may have replaced it
    caps = launch.ctx.caps
    title = (f"{launch.family}: {launch.ctx.preset.name}, PRECISION={launch.ctx.recipe.name}, "
             f"backend={launch.settings['TRANSFORMER_IMPL']}, "
             f"{caps.platform or 'unknown GPU'} ({caps.source})")
    table = Table(title=title, show_lines=False, title_justify="left")
    for column in ("toggle", "value", "source", "flag", "bucket", "why"):
        table.add_column(column, overflow="fold")
    group = None
    for row in toggle_rows(launch):
        if row["group"] != group:
            group = row["group"]
            table.add_section()
        style = _SOURCE_STYLE.get(row["source"], "")
        flag = row["flag"] if len(row["flag"]) < 90 else row["flag"][:87] + "..."
        table.add_row(row["toggle"], f"[{style}]{row['value']}[/]", f"[{style}]{row['source']}[/]",
                      flag, row["bucket"], row["reason"])
        if row["toggle"] == "MODEL_CONFIG" and launch.ctx.model_config is not None:
            for field in model_rows(launch):   # the checkpoint's shape, field by field
                table.add_row(field["toggle"], f"[cyan]{field['value']}[/]", "[cyan]checkpoint[/]",
                              field["flag"], field["bucket"], field["reason"])
    table.add_section()
    for name, (value, source, reason) in launch.env.items():
        table.add_row(name, escape(shown(name, value)), source, "(environment)", "ENV", reason)
    for name, value in launch.passthrough_env.items():
        if name not in launch.ctx.fork_given:
            table.add_row(name, escape(shown(name, value)), "cli", "(environment)", "ENV",
                          "not a toggle: passed through")
    for name, row in fork_rows(launch).items():
        table.add_row(name, escape(row["value"]), row["source"], "(ROCm fork variable)", "FORK",
                      f"{row['meaning']}; here: {row['here']}")
    if launch.user_args:
        table.add_row("(extra flags)", "", "cli", " ".join(launch.user_args), "EXTRA_ARGS",
                      "passed to Megatron as given")
    console.print(table)
    for notice in launch.settings.notices:
        style = _NOTICE_STYLE.get(notice.level, "")
        # escape: "[guard_name]" would otherwise be read as rich markup and vanish
        console.print(f"[{style}]{notice.level.upper()}[/] "
                      + escape(f"[{notice.guard}] {notice.message}"))
