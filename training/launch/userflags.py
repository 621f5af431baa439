"""Megatron --flags after the script name (and in EXTRA_MEGATRON_ARGS) that the launcher builds.

A flag a toggle owns must not reach Megatron beside the toggle's own: Megatron would take the
last one, bypassing every guard, and the run folder would be named after the toggle's value.
So each is either
  mapped    the spelling of a toggle's value (`--tensor-model-parallel-size 4` is TP=4,
            `--sequence-parallel` is SEQUENCE_PARALLEL=1, `--no-gradient-accumulation-fusion`
            is GRADIENT_ACCUMULATION_FUSION=0): the toggle takes it (source cli), the guards
            run on it, the flag is built once, from the toggle;
  refused   a word the launcher builds from a toggle (`--hidden-size` from MODEL_SIZE,
            `--recompute-granularity` from RECOMPUTE) or writes itself (`--run-dir`): the
            refusal names what to set instead.
The preset's training defaults among its words (toggles.MODEL_DEFAULT_FLAGS: dropouts, init
std) pass as given and the preset leaves its own out. Every other flag passes to Megatron as
given. Which flags a toggle owns is the registry's: its `flag`, `on`/`off` and `owns` (a test
checks every word a launch emits has an owner).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .toggles import CLOSING_WORDS, MODEL_DEFAULT_FLAGS, Toggle

# Words the launcher writes into every launch, owned by no toggle.
LAUNCHER_WORDS = {
    **{flag: "the run folder (LOG_DIR, or EXPERIMENT_DIR/EXP_NAME/precision/RUN_ID)"
       for flag in ("--run-dir", "--tensorboard-dir")},
    **{flag: "the launcher's metrics (every run logs them)"
       for flag in ("--log-throughput", "--log-memory-to-tensorboard")},
    **{word: "the launcher (every launch carries it)"
       for _bucket, words in CLOSING_WORDS for word in words if word.startswith("--")},
}


@dataclass(frozen=True)
class Owner:
    toggle: str | None      # None: a word of the launcher itself
    how: str                # value | on | off | built | given (passes; the default steps aside)
    what: str = ""          # the launcher's own words: what sets them


@dataclass
class FlagMapping:
    values: list[tuple[str, str, str]] = field(default_factory=list)  # (toggle, raw, as typed)
    kept: list[str] = field(default_factory=list)                      # passed to Megatron
    problems: list[str] = field(default_factory=list)                  # refused (guard)


def flag_owners(toggles: tuple[Toggle, ...]) -> dict[str, Owner]:
    """Every flag the launcher builds -> who owns it (value/on/off flags win over `owns`)."""
    owners: dict[str, Owner] = {flag: Owner(None, "built", what)
                                for flag, what in LAUNCHER_WORDS.items()}
    owners.update({flag: Owner("MODEL_SIZE", "given") for flag in MODEL_DEFAULT_FLAGS})
    for toggle in toggles:
        for flag in toggle.owns:
            owners[flag] = Owner(toggle.name, "built")
    for toggle in toggles:
        if toggle.flag:
            owners[toggle.flag] = Owner(toggle.name, "built" if toggle.multi else "value")
        for flag in toggle.on:
            owners[flag] = Owner(toggle.name, "on")
        for flag in toggle.off:
            owners[flag] = Owner(toggle.name, "off")
    return owners


def _instead(owner: Owner, by_name: dict[str, Toggle]) -> str:
    if owner.toggle is None:
        return f"it is written by {owner.what}"
    toggle = by_name[owner.toggle]
    values = f" (one of {', '.join(toggle.choices)})" if toggle.choices else ""
    return f"the launcher builds it from {toggle.name}: set {toggle.name}=...{values} instead"


def map_flags(words: list[str], owners: dict[str, Owner],
              by_name: dict[str, Toggle]) -> FlagMapping:
    """Split `words` (--flags and their values) into toggle values, words kept for Megatron
    and refusals."""
    out = FlagMapping()
    i = 0
    while i < len(words):
        word = words[i]
        flag, eq, inline = word.partition("=")
        owner = owners.get(flag) if word.startswith("--") else None
        i += 1
        if owner is None or owner.how == "given":
            out.kept.append(word)
            continue
        if owner.how in ("on", "off"):
            if eq:
                out.problems.append(f"{word}: {flag} takes no value; it is "
                                    f"{owner.toggle}={'1' if owner.how == 'on' else '0'}.")
            else:
                out.values.append((owner.toggle, "1" if owner.how == "on" else "0", word))
            continue
        values = []
        if eq:
            values = [inline]
        while i < len(words) and not words[i].startswith("--"):
            values.append(words[i])
            i += 1
        typed = " ".join([flag, *values])
        if owner.how == "value" and len(values) == 1:
            out.values.append((owner.toggle, values[0], typed))
        elif owner.how == "value":
            out.problems.append(f"{typed}: {flag} takes one value; it is {owner.toggle}=VALUE.")
        else:
            out.problems.append(f"{typed}: {_instead(owner, by_name)}.")
    return out
