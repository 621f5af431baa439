"""Resolved settings: every value with where it came from and why.

Sources, in the order they can override each other:
  default   the registry's default
  preset    the model preset (MODEL_SIZE)
  checkpoint  the model's shape read from a checkpoint's config (MODEL_CONFIG)
  recipe    the precision recipe (PRECISION), or a recipe layer (training/launch/layers.py:
            MLPerf's llama31_8b recipe, ...)
  platform  what this node or the named PLATFORM implies
  env       an environment variable the user set
  cli       a KEY=VALUE word after the script name
  derived   computed from other settings (e.g. sequence parallel from TP)
  guard     changed by a named guard, with its reason

A user's explicit value (env/cli) is never changed silently: only a guard may change it, and
the change is recorded with the guard's name and reason, shown in the DRY_RUN/startup table.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

USER_SOURCES = ("env", "cli")
KEPT_SOURCES = (*USER_SOURCES, "recipe")   # put() does not replace these


class LaunchError(Exception):
    """A problem the user must fix; printed as one message, exit code 2, no traceback."""

    exit_code = 2


class BadInput(LaunchError):
    """A value that cannot be parsed or is not one of the accepted values."""


class Refusal(LaunchError):
    """A guard refused the combination. The message says what to do instead."""

    def __init__(self, guard: str, message: str):
        super().__init__(f"[{guard}] {message}")
        self.guard = guard


@dataclass
class Setting:
    name: str
    value: Any
    source: str
    reason: str = ""
    requested: Any = None  # what the user asked for, when a guard changed it

    @property
    def explicit(self) -> bool:
        return self.source in USER_SOURCES or self.requested is not None


@dataclass
class Notice:
    level: str      # "warning" | "correction" | "info"
    guard: str
    message: str


@dataclass
class Settings:
    values: dict[str, Setting] = field(default_factory=dict)
    notices: list[Notice] = field(default_factory=list)

    def __getitem__(self, name: str) -> Any:
        return self.values[name].value

    def get(self, name: str, default: Any = None) -> Any:
        setting = self.values.get(name)
        return default if setting is None else setting.value

    def setting(self, name: str) -> Setting:
        return self.values[name]

    def as_values(self) -> dict[str, Any]:
        """name -> value (what a run description is derived from)."""
        return {name: setting.value for name, setting in self.values.items()}

    def is_explicit(self, name: str) -> bool:
        setting = self.values.get(name)
        return setting is not None and setting.source in USER_SOURCES

    def put(self, name: str, value: Any, source: str, reason: str = "") -> None:
        """Set a value from a non-user source; a user's explicit value is kept, and so is a
        recipe's (a recipe layer's value, or the precision recipe's default)."""
        current = self.values.get(name)
        if current is not None and current.source in KEPT_SOURCES:
            return
        self.values[name] = Setting(name, value, source, reason)

    def correct(self, name: str, value: Any, guard: str, reason: str) -> None:
        """A guard changes a value. Loud when it overrides an explicit user value."""
        current = self.values.get(name)
        if current is not None and current.value == value:
            return
        was_explicit = current is not None and current.source in USER_SOURCES
        requested = current.value if current is not None else None
        self.values[name] = Setting(name, value, "guard", f"{guard}: {reason}",
                                    requested=requested if was_explicit else None)
        level = "correction"
        prefix = (f"{name}={_fmt(requested)} was set explicitly but is overridden to {_fmt(value)}: "
                  if was_explicit else f"{name} -> {_fmt(value)}: ")
        self.notices.append(Notice(level, guard, prefix + reason))

    def warn(self, guard: str, message: str) -> None:
        self.notices.append(Notice("warning", guard, message))

    def info(self, guard: str, message: str) -> None:
        self.notices.append(Notice("info", guard, message))


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def fmt_value(value: Any) -> str:
    """How a value is shown in tables and the manifest's text form."""
    if value is None:
        return "-"
    return _fmt(value)
