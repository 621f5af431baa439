"""docs/levers.json: the measured effect of each lever, read, checked, matched and quoted.

The file is produced by `python -m training.bench levers` from docs/benchmarks/*.json. Its
schema (version 1):

  {"schema": 1, "generated": "<iso time>", "sources": ["docs/benchmarks/<file>.json", ...],
   "levers": [{"id": "GRAD_REDUCE_IN_BF16", "kind": "toggle|backend|kernels|recompute|mbs|seq|
               flce|dist_opt|overlap|precision|optimizer|peer|checkpoint",
               "set": "GRAD_REDUCE_IN_BF16=1", "baseline": "GRAD_REDUCE_IN_BF16=0",
               "effect": {"tokens_per_s_ratio": 1.031, "ratio_spread": 0.012,
                          "verdict": "faster|slower|within noise|not measured|refused",
                          "peak_memory_gib": {"baseline": 60.1, "with": 58.0}},
               "shape": {"model": ..., "num_layers": ..., "seq_length": ..., "mbs": ...,
                         "global_batch": ..., "gpus": ..., "tp": ..., "pp": ..., "dp": ...,
                         "precision": ..., "backend": ...},
               "hardware": "NVIDIA H200", "source": "docs/benchmarks/<file>.json",
               "repeats": 3, "notes": "..."}]}

The advisor never types a number: a quote is built from one entry's fields, with the entry's
shape and source, and says where the entry's shape differs from the run's.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training.platforms import platform_for_device_name
from training.reading import read_json

from .inputs import BadInput

SCHEMA = 1
DEFAULT_PATH = Path("docs/levers.json")
KINDS = ("toggle", "backend", "kernels", "recompute", "mbs", "seq", "flce", "dist_opt",
         "overlap", "precision", "optimizer", "peer", "checkpoint")
VERDICTS = ("faster", "slower", "within noise", "not measured", "refused",
            "set out of memory", "baseline out of memory")
SHAPE_KEYS = ("model", "num_layers", "seq_length", "mbs", "global_batch", "gpus", "tp", "pp",
              "dp", "precision", "backend")


def _norm(value: Any) -> str:
    text = str(value).strip()
    return {"true": "1", "false": "0", "True": "1", "False": "0"}.get(text, text)


def parse_assignments(text: str) -> dict[str, str]:
    """'A=1 B=x' -> {'A': '1', 'B': 'x'} (a lever may set several toggles)."""
    out: dict[str, str] = {}
    for word in str(text or "").replace(",", " ").split():
        if "=" in word:
            key, value = word.split("=", 1)
            out[key.strip()] = _norm(value)
    return out


DEFAULT_WORD = "<default>"


def value_matches(toggle: str, entry_value: str, wanted: str) -> bool:
    """An entry's value against the run's: equal, or the entry says `<default>` (the launcher's
    default) and the registry default is that value, or is resolved per platform (`auto`)."""
    if entry_value == wanted:
        return True
    if entry_value != DEFAULT_WORD:
        return False
    from training.launch.toggles import BY_NAME

    toggle_def = BY_NAME.get(toggle)
    if toggle_def is None:
        return False
    return toggle_def.default == "auto" or _norm(toggle_def.default) == wanted


@dataclass
class LeverEntry:
    index: int
    id: str
    kind: str
    set: str
    baseline: str
    effect: dict[str, Any]
    shape: dict[str, Any]
    hardware: str
    source: str
    repeats: int | None
    notes: str

    @property
    def assignments(self) -> dict[str, str]:
        return parse_assignments(self.set)

    @property
    def baseline_assignments(self) -> dict[str, str]:
        return parse_assignments(self.baseline)

    @property
    def verdict(self) -> str:
        return self.effect.get("verdict", "not measured")

    @property
    def ratio(self) -> float | None:
        value = self.effect.get("tokens_per_s_ratio")
        return float(value) if isinstance(value, (int, float)) else None

    @property
    def peak(self) -> dict[str, float] | None:
        peak = self.effect.get("peak_memory_gib")
        if isinstance(peak, dict) and all(isinstance(peak.get(k), (int, float))
                                          for k in ("baseline", "with")):
            return peak
        return None

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "set": self.set, "baseline": self.baseline,
                "effect": self.effect, "shape": self.shape, "hardware": self.hardware,
                "source": self.source, "repeats": self.repeats, "notes": self.notes}


REVERSED_VERDICT = {"faster": "slower", "slower": "faster",
                    "set out of memory": "baseline out of memory",
                    "baseline out of memory": "set out of memory"}


@dataclass
class Match:
    entry: LeverEntry
    exact: bool                      # the entry sets exactly what the lever sets
    differs: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # key -> (entry, run)
    others: int = 0                  # further entries for the same lever
    reverse: bool = False            # the entry measured the way back (set <-> baseline)

    @property
    def verdict(self) -> str:
        """The entry's verdict read in the lever's direction."""
        verdict = self.entry.verdict
        return REVERSED_VERDICT.get(verdict, verdict) if self.reverse else verdict

    def quote(self) -> str:
        text = quote(self.entry, self.differs, self.exact or self.reverse)
        if self.reverse:
            text += ("; measured the other way round (read the ratio from the baseline's "
                     "side: undoing this setting)")
        return text

    def to_dict(self) -> dict[str, Any]:
        return {"entry": self.entry.to_dict(), "exact": self.exact, "reverse": self.reverse,
                "verdict_for_this_lever": self.verdict,
                "shape_differs": {k: {"measured": a, "this_run": b}
                                  for k, (a, b) in self.differs.items()},
                "other_entries": self.others, "quote": self.quote()}


@dataclass
class LeverBook:
    path: Path | None
    generated: str | None
    sources: list[str]
    entries: list[LeverEntry]
    note: str = ""

    @property
    def loaded(self) -> bool:
        return self.path is not None

    def describe(self) -> dict[str, Any]:
        return {"path": str(self.path) if self.path else None, "generated": self.generated,
                "sources": self.sources, "entries": len(self.entries), "note": self.note}

    def find(self, sets: dict[str, str], shape: dict[str, Any], platform: str | None,
             baseline: dict[str, str] | None = None, measured: bool = False,
             without: tuple[str, ...] = ()) -> Match | None:
        """The entry closest to this run for a lever that sets `sets`.

        Exact: every assignment matches. Otherwise an entry that sets the same toggles to
        other values (e.g. MBS=4 when MBS=2 is asked) is a fallback, marked as such. Among
        candidates the closest shape wins (same hardware, then most shape fields equal).
        measured: only entries with a tokens/s ratio. without: toggles an entry must not set
        (fp8 with the native experts is no reading of a row that puts them on TE's)."""
        want = {k: _norm(v) for k, v in sets.items()}
        candidates = []
        entries = [e for e in self.entries if (e.ratio is not None or not measured)
                   and not set(without) & set(e.assignments)]
        for entry in entries:
            if entry.kind == "peer":        # another framework, not a lever of ours
                continue
            got = entry.assignments
            # an entry speaks for the toggles it changes: PRECISION=fp8 MBS=2 against
            # PRECISION=bf16 MBS=2 is no MBS measurement
            varied = {k for k, v in got.items() if entry.baseline_assignments.get(k) != v}
            if not want or not set(want) <= varied:
                continue
            exact = all(value_matches(k, got[k], v) for k, v in want.items())
            if baseline:
                base = entry.baseline_assignments
                # the same setting compared against another baseline (MBS=2 vs 1 when the
                # run goes from 4 to 2) is not the comparison asked for
                if any(k in base and not value_matches(k, base[k], _norm(v))
                       for k, v in baseline.items()):
                    exact = False
            score = 100 if exact else 0
            if baseline:
                score += 5 * sum(1 for k, v in baseline.items()
                                 if k in entry.baseline_assignments
                                 and value_matches(k, entry.baseline_assignments[k], _norm(v)))
            hw = platform_for_device_name(entry.hardware or "")
            if platform and hw is not None and hw.name == platform:
                score += 10
            differs = {}
            for key in SHAPE_KEYS:
                if key not in entry.shape:
                    continue
                mine = shape.get(key)
                if _norm(entry.shape[key]) == _norm(mine):
                    score += 1
                else:
                    differs[key] = (entry.shape[key], mine)
            candidates.append((score, -entry.index, entry, exact, differs, False))
        if baseline:
            # the same comparison measured the other way round (RECOMPUTE=full vs none, when
            # the lever is RECOMPUTE=none from full)
            back = {k: _norm(v) for k, v in baseline.items()}
            for entry in entries:
                if entry.kind == "peer":
                    continue
                got, base = entry.assignments, entry.baseline_assignments
                if (set(back) <= set(got) and set(want) <= set(base)
                        and all(value_matches(k, got[k], v) for k, v in back.items())
                        and all(value_matches(k, base[k], v) for k, v in want.items())):
                    score = 90 + self._shape_score(entry, shape, platform)
                    candidates.append((score, -entry.index, entry, False,
                                       self._differs(entry, shape), True))
        if not candidates:
            return None
        candidates.sort(key=lambda item: (item[0], item[1]), reverse=True)
        score, _, entry, exact, differs, reverse = candidates[0]
        return Match(entry, exact, differs, others=len(candidates) - 1, reverse=reverse)

    @staticmethod
    def _differs(entry: LeverEntry, shape: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
        return {key: (entry.shape[key], shape.get(key)) for key in SHAPE_KEYS
                if key in entry.shape and _norm(entry.shape[key]) != _norm(shape.get(key))}

    @staticmethod
    def _shape_score(entry: LeverEntry, shape: dict[str, Any], platform: str | None) -> int:
        hw = platform_for_device_name(entry.hardware or "")
        score = 10 if platform and hw is not None and hw.name == platform else 0
        return score + sum(1 for key in SHAPE_KEYS if key in entry.shape
                           and _norm(entry.shape[key]) == _norm(shape.get(key)))


def _require(cond: bool, path: Path, message: str) -> None:
    if not cond:
        raise BadInput(f"{path}: {message} (schema: training/optimize/levers.py)")


def load(path: str | Path) -> LeverBook:
    path = Path(path)
    if not path.is_file():
        raise BadInput(f"{path}: no such levers file (produce it with `python -m training.bench "
                       "levers`, or pass --levers PATH)")
    data = read_json(path, "levers file")
    _require(isinstance(data, dict), path, "not a JSON object")
    _require(data.get("schema") == SCHEMA, path,
             f"schema {data.get('schema')!r} is not {SCHEMA}")
    levers = data.get("levers")
    _require(isinstance(levers, list), path, "'levers' is not a list")
    entries = []
    for index, raw in enumerate(levers):
        where = f"lever #{index}"
        _require(isinstance(raw, dict), path, f"{where} is not an object")
        for key in ("id", "set"):
            _require(isinstance(raw.get(key), str) and raw[key].strip(), path,
                     f"{where} has no '{key}'")
        where = f"lever #{index} ({raw['id']})"
        _require(raw.get("kind") in KINDS, path,
                 f"{where}: kind {raw.get('kind')!r} is not one of {', '.join(KINDS)}")
        # a peer compares against another framework: its 'set' may be words, not toggles
        _require(raw["kind"] == "peer" or parse_assignments(raw["set"]) != {}, path,
                 f"{where}: 'set' {raw['set']!r} is not TOGGLE=VALUE words")
        effect = raw.get("effect")
        _require(isinstance(effect, dict), path, f"{where} has no 'effect' object")
        _require(effect.get("verdict") in VERDICTS, path,
                 f"{where}: verdict {effect.get('verdict')!r} is not one of {', '.join(VERDICTS)}")
        ratio = effect.get("tokens_per_s_ratio")
        _require(ratio is None or isinstance(ratio, (int, float)), path,
                 f"{where}: tokens_per_s_ratio is not a number")
        # a measured figure must say where it comes from
        measured = ratio is not None or effect["verdict"] not in ("not measured", "refused")
        _require(not measured or (isinstance(raw.get("source"), str) and raw["source"].strip()),
                 path, f"{where} has a measurement but no 'source'")
        shape = raw.get("shape") or {}
        _require(isinstance(shape, dict), path, f"{where}: 'shape' is not an object")
        entries.append(LeverEntry(
            index=index, id=raw["id"], kind=raw["kind"], set=raw["set"],
            baseline=str(raw.get("baseline") or ""), effect=effect, shape=shape,
            hardware=str(raw.get("hardware") or ""), source=str(raw.get("source") or ""),
            repeats=raw.get("repeats") if isinstance(raw.get("repeats"), int) else None,
            notes=str(raw.get("notes") or "")))
    sources = data.get("sources") if isinstance(data.get("sources"), list) else []
    return LeverBook(path=path, generated=data.get("generated"), sources=sources,
                     entries=entries)


def empty(note: str) -> LeverBook:
    return LeverBook(path=None, generated=None, sources=[], entries=[], note=note)


def load_default(explicit: str | Path | None, repo_root: Path) -> LeverBook:
    """--levers PATH when given, else docs/levers.json when it exists, else no measurements."""
    if explicit:
        return load(explicit)
    default = repo_root / DEFAULT_PATH
    if default.is_file():
        return load(default)
    return empty(f"{DEFAULT_PATH} does not exist yet (produce it with `python -m training.bench "
                 "levers`): no lever is measured, every recommendation is on mechanism only")


# -- quoting ----------------------------------------------------------------------------------

def shape_text(shape: dict[str, Any]) -> str:
    parts = []
    if shape.get("model"):
        layers = f" {shape['num_layers']}L" if shape.get("num_layers") else ""
        parts.append(f"{shape['model']}{layers}")
    for key, label in (("seq_length", "seq"), ("mbs", "mbs"), ("global_batch", "gb")):
        if shape.get(key) is not None:
            parts.append(f"{label} {shape[key]}")
    if shape.get("gpus") is not None:
        parts.append(f"{shape['gpus']} GPU" + ("s" if shape["gpus"] != 1 else ""))
    layout = "".join(f"{k}{shape[k]}" for k in ("tp", "pp", "dp") if shape.get(k) is not None)
    if layout:
        parts.append(layout)
    for key in ("backend", "precision"):
        if shape.get(key):
            parts.append(str(shape[key]))
    return " ".join(parts) if parts else "shape not recorded"


def effect_text(entry: LeverEntry) -> str:
    bits = []
    if entry.ratio is not None:
        spread = entry.effect.get("ratio_spread")
        spread_text = (f" ±{100 * spread:.1f}%" if isinstance(spread, (int, float)) else "")
        bits.append(f"x{entry.ratio:.3f} tokens/s{spread_text}")
    bits.append(entry.verdict)
    if entry.peak:
        bits.append(f"peak {entry.peak['baseline']:.1f} -> {entry.peak['with']:.1f} GiB")
    return ", ".join(bits)


def quote(entry: LeverEntry, differs: dict[str, tuple[Any, Any]] | None = None,
          exact: bool = True) -> str:
    base = f" vs {entry.baseline}" if entry.baseline else ""
    if entry.verdict == "not measured" and entry.ratio is None:
        where = f"; source {entry.source}" if entry.source else ""
        why = f": {entry.notes}" if entry.notes else ""
        return f"{entry.set}{base}: not measured{why}{where}"
    repeats = (f", {entry.repeats} repeat{'s' if entry.repeats != 1 else ''}"
               if entry.repeats else "")
    hw = f" on {entry.hardware}" if entry.hardware else ""
    text = (f"{entry.set}{base}: {effect_text(entry)} (measured at {shape_text(entry.shape)}"
            f"{hw}{repeats}; source {entry.source})")
    if not exact:
        text += " [measured as a different comparison of the same toggle]"
    if differs:
        text += "; shape differs from this run in " + ", ".join(
            f"{k} {a} vs {b}" for k, (a, b) in differs.items())
    if entry.notes:
        text += f"; note: {entry.notes}"
    return text
