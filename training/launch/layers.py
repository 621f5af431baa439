"""Recipe layers: how a feature family plugs into a launch from above.

The core (training/launch/) knows no family; a family's own entry point passes its layer to
`resolve(family, environ, words, layers=[...])`. MLPerf's llama31_8b recipe is one
(training/mlperf/layer.py, run by examples/mlperf/llama31_8b/run_llama31_8b.sh); MoE presets
and checkpoint import are meant to be others. A layer brings:

  toggles   registry entries of its own (training.launch.toggles.Toggle), added after the
            core's for this launch only: parsed from env/words, shown in the table after the
            core's rows, their value flags built like the core's. The core's README table
            does not list them; the family documents them (its own README block).
  values    values(settings) -> [RecipeValue]: a value for knobs the user left unset, each
            with why. It sees the settings as the user gave them (defaults, env, KEY=VALUE
            words; settings.is_explicit(name) says which the user set) and may derive from
            them (MLPerf: EVAL_INTERVAL from the user's BS). resolve sets each with source
            "recipe" and the reason "<layer name>: <why>"; a user's value is never replaced,
            and the model preset and derivations never replace a layer's value.
  derived   derived(settings) -> [RecipeValue]: like values, for a default that depends on
            what the core derives (the backend, the GPU count, the precision recipe): applied
            the same way right after derivation, never over a user's or a layer's value.
  guards    rules like the core's (a function of training.launch.guards.LaunchContext that
            raises Refusal, corrects or warns), run with the core's guards after derivation:
            every refusal of the launch is reported together.

The order in resolve.prepare: registry defaults -> user values -> layers' values (in the order
given) -> model preset -> derivation -> layers' derived values -> guards (core, then each
layer's).

A layer's variables mean nothing to a launch without it: ENTRIES names each layer's variable
prefix and the entry point that applies them, so that such a variable given to another entry
point is refused (guard layer_variables) instead of silently ignored; one that describes the
machine (a site's page-cache hook) gets a notice. A test checks each
layer's toggles carry its prefix.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from .settings import KEPT_SOURCES, Setting, Settings
from .toggles import REGISTRY, Toggle, parse_value


@dataclass(frozen=True)
class RecipeValue:
    name: str       # a toggle of the core or of the layer
    value: Any
    why: str


@dataclass(frozen=True)
class RecipeLayer:
    name: str                                            # shown in each value's reason
    values: Callable[[Settings], list[RecipeValue]]
    toggles: tuple[Toggle, ...] = ()
    guards: tuple[Callable[[Any], None], ...] = ()
    derived: Callable[[Settings], list[RecipeValue]] = lambda settings: []


@dataclass(frozen=True)
class LayerEntry:
    prefix: str     # the layer's variables (its toggles, what it exports) start so
    what: str       # the layer, in words
    script: str     # the entry point(s) that apply it
    names: tuple[str, ...] = ()     # its variables without the prefix
    machine: tuple[str, ...] = ()   # its variables that describe the machine, not the run
                                    # (a site may export them for every job): a notice only

    def covers(self, name: str) -> bool:
        return name.startswith(self.prefix) or name in self.names


ENTRIES: tuple[LayerEntry, ...] = (
    LayerEntry("MLPERF_", "the MLPerf llama31_8b recipe",
               "examples/mlperf/llama31_8b/run_llama31_8b.sh",
               machine=("MLPERF_CACHE_CLEAR_CMD",)),
    LayerEntry("MOE_", "the mixture-of-experts family",
               "examples/moe/train_qwen3_moe.sh, train_mixtral.sh or train_gpt_oss.sh",
               names=("EP", "ETP")),
)


def entry_elsewhere(name: str, toggles: Sequence[Toggle]) -> LayerEntry | None:
    """The layer entry `name` belongs to when this launch does not run that layer (its
    variables would be ignored), else None."""
    for entry in ENTRIES:
        if entry.covers(name) and not any(entry.covers(t.name) for t in toggles):
            return entry
    return None


def registry_with(layers: Sequence[RecipeLayer]) -> tuple[Toggle, ...]:
    """The core registry, then each layer's own entries (a name defined twice is a bug)."""
    toggles = list(REGISTRY)
    names = {t.name for t in toggles}
    for layer in layers:
        for toggle in layer.toggles:
            if toggle.name in names:
                raise ValueError(f"recipe layer {layer.name!r} redefines toggle {toggle.name}")
            names.add(toggle.name)
            toggles.append(toggle)
    return tuple(toggles)


def coerce(toggle: Toggle, value: Any) -> Any:
    """A layer's value as the toggle's type (what the same value typed by a user becomes)."""
    if isinstance(value, bool):
        return parse_value(toggle, "1" if value else "0") if toggle.kind == "bool" \
            else parse_value(toggle, str(int(value)))
    if isinstance(value, float) and toggle.kind == "int" and value.is_integer():
        value = int(value)
    return parse_value(toggle, str(value)) if toggle.kind != "float" else float(value)


def apply_layers(layers: Sequence[RecipeLayer], settings: Settings,
                 toggles: tuple[Toggle, ...], stage: str = "values") -> list[RecipeValue]:
    """Each layer's values (stage "values") or derived values (stage "derived") over the
    defaults, never over a user's or a layer's; what was set."""
    by_name = {t.name: t for t in toggles}
    applied: list[RecipeValue] = []
    for layer in layers:
        for item in getattr(layer, stage)(settings):
            current = settings.values.get(item.name)
            if current is not None and current.source in KEPT_SOURCES:
                continue
            value = coerce(by_name[item.name], item.value)
            settings.values[item.name] = Setting(item.name, value, "recipe",
                                                 f"{layer.name}: {item.why}")
            applied.append(RecipeValue(item.name, value, item.why))
    return applied
