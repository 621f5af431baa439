"""What a launch prints before torchrun: by default a one-screen summary, with VERBOSE=1 the
full table (every toggle, its value, where it came from, what it emits); the full table is
always written to the run folder's launch.txt.

The summary: the run in one line, what differs from the defaults with its source and reason
(every setting of the user's, every correction, what the platform or a recipe chose), the
notices (warnings, corrections, the pre-flight's verdict), and a pointer to the table. Lines
are wrapped at word boundaries for the terminal's width (COLUMNS when not a terminal).
"""
from __future__ import annotations

import os
import shlex
import sys
import textwrap
from pathlib import Path
from typing import TextIO

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from .environment import shown
from .manifest import fork_rows, model_rows, toggle_rows
from .resolve import Launch
from .settings import USER_SOURCES, fmt_value

_SOURCE_STYLE = {"default": "dim", "preset": "cyan", "checkpoint": "cyan", "recipe": "magenta",
                 "platform": "blue",
                 "env": "bold green", "cli": "bold green", "derived": "yellow",
                 "preflight": "yellow", "guard": "bold red"}
_NOTICE_STYLE = {"warning": "bold yellow", "correction": "bold red", "info": "cyan"}
TABLE_FILE = "launch.txt"
# the summary leaves out values that only follow from the model's preset (its name is on the
# run line) and the launcher's own bookkeeping derived from other values (RUN_ID, warmup)
_QUIET_SOURCES = ("default", "preset")


def _width(stream: TextIO, fallback: int) -> int | None:
    return None if stream.isatty() else int(os.environ.get("COLUMNS", str(fallback)))


def _console(stream: TextIO, fallback: int = 200) -> Console:
    return Console(file=stream, width=_width(stream, fallback), highlight=False, soft_wrap=False)


def toggle_table(launch: Launch) -> Table:
    """The full table: every toggle, the environment presets, pass-through variables, the ROCm
    fork's variables given and the extra Megatron flags."""
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
    return table


def _print_notices(console: Console, launch: Launch, width: int | None) -> None:
    for notice in launch.settings.notices:
        head = notice.level.upper()
        body = f"[{notice.guard}] {notice.message}"
        if width is None:
            console.print(f"[{_NOTICE_STYLE.get(notice.level, '')}]{head}[/] " + escape(body))
            continue
        text = Text(_fill(f"{head} {body}", width, "  "))
        text.stylize(_NOTICE_STYLE.get(notice.level, ""), 0, len(head))
        console.print(text, soft_wrap=True)


def _fill(text: str, width: int, indent: str) -> str:
    """Wrapped at spaces only (a path or a flag is never broken); lines of the text kept."""
    out = []
    for line in text.split("\n"):
        lead = line[:len(line) - len(line.lstrip())]
        out.append(textwrap.fill(line, width, subsequent_indent=lead + indent,
                                 break_long_words=False, break_on_hyphens=False)
                   if line.strip() else line)
    return "\n".join(out)


def run_line(launch: Launch) -> str:
    """The run in one line: model, precision, backend, GPUs, layout, batch, sequence, steps."""
    s, caps = launch.settings, launch.ctx.caps
    gpus = s["NNODES"] * s["GPUS_PER_NODE"]
    where = f"{gpus} GPU{'s' if gpus > 1 else ''}" + (
        f" ({s['NNODES']} nodes)" if s["NNODES"] > 1 else "") + (
        f" {caps.platform}" if caps.platform else "")
    return (f"{launch.ctx.preset.name} {launch.ctx.recipe.name} {s['TRANSFORMER_IMPL']}, "
            f"{where}, TP{s['TP']} PP{s['PP']} CP{s['CP']} DP{launch.run.layout.dp}, "
            f"mbs {s['MBS']} gbs {s['BS']} seq {s['SEQ_LENGTH']}, {s['TOTAL_ITERS']} iters")


def changed_rows(launch: Launch) -> list[tuple[str, str, str, str]]:
    """(name, value, source, why) of what differs from the defaults: the user's settings (all
    of them, never hidden), corrections (with what was asked), what the platform or a recipe
    chose, and a derived value that turns a default behaviour off or on."""
    defaults = {t.name: t.default for t in launch.toggles}
    rows = []
    for row in toggle_rows(launch):
        source, value = row["source"], row["value"]
        if row["requested"] is not None:
            rows.append((row["toggle"], f"{value} (asked {row['requested']})", source,
                         row["reason"]))
            continue
        if source in _QUIET_SOURCES:
            continue
        if source == "derived":
            default = defaults.get(row["toggle"])
            if default is None or fmt_value(default) == value:
                continue
        rows.append((row["toggle"], value, source, row["reason"]))
    for name, (value, source, reason) in launch.env.items():
        if source in USER_SOURCES:
            rows.append((name, shown(name, value), source, reason))
    for name, value in launch.passthrough_env.items():
        if name not in launch.ctx.fork_given:
            rows.append((name, shown(name, value), "cli", "not a toggle: passed through"))
    for name, row in fork_rows(launch).items():
        rows.append((name, row["value"], row["source"], f"{row['meaning']}; here: {row['here']}"))
    if launch.user_args:
        rows.append(("extra flags", shlex.join(launch.user_args), "cli",
                     "passed to Megatron as given"))
    return rows


def print_summary(launch: Launch, stream: TextIO) -> None:
    console = _console(stream, fallback=80)
    width = console.width
    console.print(Text(_fill(run_line(launch), width, "  "), style="bold"), soft_wrap=True)
    rows = changed_rows(launch)
    plain: dict[str, list[str]] = {}    # the user's settings without a reason, one line
    for name, value, source, reason in rows:
        if not reason:
            plain.setdefault(source, []).append(f"{name}={value}")
            continue
        line = f"  {name}={value}  {source}: {reason}"
        text = Text(_fill(line, width, "    "))
        text.stylize(_SOURCE_STYLE.get(source, ""), 2, 2 + len(name) + 1 + len(value))
        console.print(text, soft_wrap=True)
    for source, words in plain.items():
        text = Text(_fill(f"  {source}: {' '.join(words)}", width, "    "))
        text.stylize(_SOURCE_STYLE.get(source, ""), 2, 2 + len(source))
        console.print(text, soft_wrap=True)
    _print_notices(console, launch, width)
    shown_names = {name for name, *_ in rows}
    hidden = sum(1 for name in (*(t.name for t in launch.toggles), *launch.env)
                 if name not in shown_names)
    console.print(_fill(f"({hidden} more: defaults, preset, derived; VERBOSE=1 or {TABLE_FILE} "
                        "in the run folder)", width, ""), style="dim", soft_wrap=True)


def print_report(launch: Launch, stream: TextIO | None = None) -> None:
    """The summary, or with VERBOSE=1 the full table and the notices."""
    stream = stream or sys.stderr   # read at the call: a test may have replaced it
    if not launch.settings["VERBOSE"]:
        print_summary(launch, stream)
        return
    console = _console(stream)
    console.print(toggle_table(launch))
    _print_notices(console, launch, None)


def write_table(launch: Launch, path: Path | None = None) -> Path:
    """The full table and the notices as plain text, into the run folder (launch.txt)."""
    path = path or launch.log_dir / TABLE_FILE
    from training.safe_files import open_write

    path.parent.mkdir(parents=True, exist_ok=True)
    with open_write(path, TABLE_FILE) as handle:
        console = Console(file=handle, width=200, color_system=None, highlight=False,
                          soft_wrap=False)
        console.print(toggle_table(launch))
        _print_notices(console, launch, None)
    return path


def wrapped_command(words: list[str], width: int = 80, log_dir: str | None = None) -> str:
    """The torchrun line for reading, still one shell command: each flag with its values kept
    together, lines ended with a backslash, the training script on a line of its own. With
    `log_dir`, the run folder inside a word is written "$LOG_DIR" (the line printed above it
    sets it), so the folder's long path is printed once."""
    groups: list[str] = []
    for word in words:
        quoted = shlex.quote(word)
        rest = word[len(log_dir):] if log_dir and word.startswith(log_dir) else None
        if rest is not None and shlex.quote(rest or "x") == (rest or "x"):
            quoted = f'"$LOG_DIR{rest}"'
        if (groups and not word.startswith("-") and groups[-1].startswith("-")
                and not word.endswith(".py")):
            groups[-1] += " " + quoted
        else:
            groups.append(quoted)
    lines, line = [], ""
    for group in groups:
        script = group.endswith(".py")
        if line and (script or line.endswith(".py") or len(line) + 1 + len(group) > width - 2):
            lines.append(line)
            line = "    " + group
        else:
            line = f"{line} {group}" if line else group
    lines.append(line)
    return " \\\n".join(lines)
