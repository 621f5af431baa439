"""docs/levers.json, docs/levers.md and docs/benchmarks.md, generated from the benchmark JSONs.

Every lever the harness knows gets a row: measured (effect, spread, verdict, the shape and
hardware it was measured at, the JSON it comes from), refused by a guard on that hardware,
or 'not measured'. Nothing is typed: a number here is a number in a JSON's points. Where the
same lever was measured at the same shape and hardware in several JSONs, the newest wins.

levers.json (read by the advisor; keys agreed, extra keys allowed):
  {"schema": 1, "generated", "sources": [...], "levers": [{"id", "kind", "set", "baseline",
   "effect": {"tokens_per_s_ratio", "ratio_spread", "verdict", "peak_memory_gib":
   {"baseline", "with"}}, "shape": {...}, "hardware", "source", "repeats", "notes", ...}]}
"""
from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path

from training import REPO_ROOT
from training.launch.presets import FAMILIES, PRESETS
from training.launch.settings import fmt_value
from training.launch.toggles import BY_NAME, REGISTRY
from training.reading import RecordError

from . import analysis
from .catalog import KINDS, PEER_KEYS, PEER_SIDES, all_levers
from .record import BENCH_DIR
from .shape import BenchShape
from .stats import VERDICT_RULE
from .suites import saved_result
from .table import fmt_mem, fmt_ratio, table

BENCH_KINDS = ("peers", "toggles", "levers")


def load(bench_dir: Path = BENCH_DIR) -> list[tuple[Path, dict]]:
    """Benchmark JSONs of the kinds this module reads, top level of bench_dir only."""
    out = []
    for path in sorted(Path(bench_dir).glob("*.json")):
        try:
            data = saved_result(path)
        except RecordError:
            continue
        if isinstance(data, dict) and data.get("kind") in BENCH_KINDS:
            out.append((path, data))
    return out


def _rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def lever_shape(data: dict) -> dict:
    """The levers.json shape of a benchmark JSON's baseline."""
    s = data.get("shape") or {}
    model = s.get("model")
    if model not in PRESETS:  # older JSONs carry the MODEL_SIZE value ("8B")
        model = FAMILIES[s.get("family", "llama3")][0].get(model, model)
    resolved = data.get("default_resolved") or {}
    ours = next((p for p in data.get("points", []) if p.get("side") == "ours"
                 and p.get("layout")), {})
    layout = ours.get("layout") or {}
    gpus = s.get("gpus", 1)
    return {"model": model, "num_layers": s.get("num_layers"), "seq_length": s.get("seq_length"),
            "mbs": s.get("mbs"), "global_batch": s.get("global_batch"), "gpus": gpus,
            "tp": s.get("tp", layout.get("tp", 1)), "pp": s.get("pp", layout.get("pp", 1)),
            "dp": s.get("dp", layout.get("dp", gpus)),
            "precision": resolved.get("PRECISION") or ours.get("precision") or "bf16",
            "backend": resolved.get("TRANSFORMER_IMPL") or ours.get("backend")}


def _today(text: str) -> str:
    """A catalogue set/baseline with `<default>` as today's registry default, where that is a
    fixed value (TRANSFORMER_IMPL=auto, say, resolves per node: left as it is)."""
    if "<default>" not in text:
        return text
    toggle = BY_NAME.get(text.split("=", 1)[0])
    if toggle is None or toggle.default in (None, "auto"):
        return text
    return text.replace("<default>", fmt_value(toggle.default))


def older_defaults(data: dict) -> list[str]:
    """Where the baseline run of a benchmark JSON had a performance-group toggle at another
    value than today's launcher default (a default changed since, or the toggle is newer than
    the JSON), one line each: its figures describe that older default. A guard's correction
    and a family layer's own default (the MoE launch's lean step) are that run's default, not
    an older one."""
    ours = [p for p in data.get("points", []) if p.get("side") == "ours"]
    base = next((p for p in ours if p.get("config") == "default"), ours[0] if ours else None)
    if not base or not base.get("toggles_resolved"):
        return []
    resolved = base["toggles_resolved"]
    rows = [*(base.get("corrections") or []), *(base.get("layer_values") or [])]
    corrected = {c.get("toggle") for c in rows if isinstance(c, dict)}
    lines = []
    for toggle in REGISTRY:
        if toggle.group != "performance" or toggle.name in corrected:
            continue
        now = fmt_value(toggle.default)
        then = resolved.get(toggle.name)
        if then is None:
            lines.append(f"measured before {toggle.name} existed (default now {now})")
        elif then != now:
            lines.append(f"measured at {toggle.name}={then}, the default then (now {now})")
    return lines


def flops_note(row: dict) -> list[str]:
    """The model TFLOP/s ratio, where it differs from the tokens/s ratio by more than 0.5%
    (the two sides do different FLOPs per token, e.g. another sequence length)."""
    tokens, tflops = row.get("tokens_per_s_ratio"), row.get("tflops_ratio")
    if tokens is None or tflops is None or abs(tflops / tokens - 1) <= 0.005:
        return []
    return [f"model TFLOP/s ratio {tflops:.3f}x"]


# a baseline lever's settings that change the shape a row was measured at (analysis `at`)
_SHAPE_OF = {"MBS": "mbs", "SEQ_LENGTH": "seq_length", "BS": "global_batch"}


def _at(shape: dict, at: dict) -> dict:
    """The shape of a row measured at another lever's setting (its `at`, e.g. MBS=2)."""
    return {**shape, **{_SHAPE_OF[k]: int(v) for k, v in at.items() if k in _SHAPE_OF}}


def lever_entry(row: dict, data: dict, source: str) -> dict:
    older = older_defaults(data)
    notes = flops_note(row) + [n for n in row.get("notes", []) if n] + older
    entry = {
        "id": row["id"], "kind": row["kind"], "set": row["set"], "baseline": row["baseline"],
        "effect": {"tokens_per_s_ratio": row.get("tokens_per_s_ratio"),
                   "ratio_spread": row.get("ratio_spread"), "verdict": row["verdict"],
                   "peak_memory_gib": row.get("peak_memory_gib")
                   or {"baseline": None, "with": None}},
        "shape": _at(lever_shape(data), row.get("at") or {}),
        "hardware": (data.get("gpu") or {}).get("name"),
        "source": source, "repeats": row.get("repeats", 0), "notes": "; ".join(notes),
        "key": row["key"], "needs_dp_gt_1": row.get("needs_dp_gt_1", False),
        "tflops_ratio": row.get("tflops_ratio"), "created": data.get("created"),
        "older_defaults": older,
    }
    if row.get("optimizer_state"):
        entry["optimizer_state"] = row["optimizer_state"]
    return entry


def catalogue() -> list[tuple[str, str, str, str, str]]:
    """(key, id, kind, set, baseline) of every lever the harness knows, in table order."""
    out = [(lv.key, lv.id, lv.kind, lv.set.replace("{default}", "<default>"),
            lv.baseline.replace("{default}", "<default>")) for lv in all_levers(BenchShape())]
    for key in PEER_KEYS:
        side = key.split(":", 1)[1]
        out.append((key, key, "peer", "ours (launcher default)", PEER_SIDES[side]))
    return out


def build(bench_dir: Path = BENCH_DIR) -> dict:
    """The levers.json document."""
    entries: dict[tuple, dict] = {}
    sources = []
    for path, data in load(bench_dir):
        source = _rel(path)
        sources.append(source)
        for row in analysis.results(data):
            entry = lever_entry(row, data, source)
            sig = (entry["key"], json.dumps(entry["shape"], sort_keys=True), entry["hardware"])
            old = entries.get(sig)
            if old is None or (entry["created"] or "") >= (old["created"] or ""):
                entries[sig] = entry
    order = {key: i for i, (key, *_rest) in enumerate(catalogue())}
    # a row measured under an older key sits where today's key with the same comparison does
    order_by_pair = {(_today(set_), _today(base)): i
                     for i, (_key, _id, _kind, set_, base) in enumerate(catalogue())}

    def position(e: dict) -> int:
        return order.get(e["key"], order_by_pair.get((e["set"], e["baseline"]), len(order)))

    levers = sorted(entries.values(), key=lambda e: (position(e), e["shape"]["gpus"] or 0,
                                                      e["source"]))
    measured = {e["key"] for e in levers}
    measured_as = {(e["set"], e["baseline"]) for e in levers}
    for key, lid, kind, set_, base in catalogue():
        if (_today(set_), _today(base)) in measured_as:
            continue  # the same comparison, measured under another key (a default changed)
        if key not in measured:
            levers.append({"id": lid, "kind": kind, "set": set_, "baseline": base,
                           "effect": {"tokens_per_s_ratio": None, "ratio_spread": None,
                                      "verdict": "not measured",
                                      "peak_memory_gib": {"baseline": None, "with": None}},
                           "shape": None, "hardware": None, "source": None, "repeats": 0,
                           "notes": "no benchmark JSON measures it yet", "key": key,
                           "needs_dp_gt_1": False, "tflops_ratio": None, "created": None})
    levers.sort(key=position)
    for e in levers:
        assert e["kind"] in KINDS, e
    return {"schema": 1, "generated": _dt.datetime.now().isoformat(timespec="seconds"),
            "sources": sources, "verdict_rule": VERDICT_RULE, "levers": levers}


def shape_text(shape: dict | None, backend: bool = True) -> str:
    """One line for a levers.json shape; backend=False leaves out the baseline's backend (a
    peer row is not on it)."""
    if not shape:
        return "-"
    return (f"{shape['model']} {shape['num_layers']}L seq{shape['seq_length']} "
            f"mbs{shape['mbs']} gb{shape['global_batch']}, {shape['gpus']} GPU "
            f"(TP{shape['tp']} PP{shape['pp']} DP{shape['dp']}), {shape['precision']}"
            + (f", {shape['backend']}" if backend else ""))


def markdown(doc: dict) -> str:
    lines = ["# Levers: measured effects", "",
             "Generated by `python -m training.bench levers` from the benchmark JSONs in "
             "docs/benchmarks/ (do not edit by hand; the same rows are in docs/levers.json, "
             "which the advisor reads). One row per lever and measured shape; levers no JSON "
             "measures yet say so.", "",
             "Effect: tokens/s/GPU of `set` over `vs`, measured in the same invocation "
             "(ratio of means ± half the range of the paired per-repeat ratios). Peak "
             "memory: `vs` → `set`.", "",
             f"Verdict rule: {doc['verdict_rule']}", "",
             "| lever | set | vs | effect | verdict | peak memory GiB | shape | hardware | "
             "repeats | source | notes |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for e in doc["levers"]:
        eff = e["effect"]
        row = {"tokens_per_s_ratio": eff["tokens_per_s_ratio"],
               "ratio_spread": eff["ratio_spread"]}
        mem = eff.get("peak_memory_gib") or {}
        shown = {"baseline": mem.get("baseline"), "with": mem.get("with")}
        verdict = eff["verdict"] + (" (needs DP>1)" if e.get("needs_dp_gt_1")
                                    and (e.get("shape") or {}).get("dp") == 1 else "")
        notes = " ".join(str(e.get("notes") or "").split()).replace("|", "/")
        if len(notes) > 240:
            notes = notes[:239] + "…"
        lines.append(
            f"| {e['key']} | `{e['set']}` | `{e['baseline']}` | {fmt_ratio(row)} | {verdict} | "
            f"{fmt_mem(shown)} | {shape_text(e.get('shape'))} | {e.get('hardware') or '-'} | "
            f"{e.get('repeats', 0)} | {('`' + e['source'] + '`') if e.get('source') else '-'} | "
            f"{notes} |")
    lines += ["", f"Sources: {', '.join('`' + s + '`' for s in doc['sources']) or 'none'}.", ""]
    return "\n".join(lines)


def benchmarks_markdown(bench_dir: Path = BENCH_DIR) -> str:
    """docs/benchmarks.md: every benchmark JSON's table."""
    lines = ["# Benchmarks", "",
             "Generated by `python -m training.bench levers` from docs/benchmarks/*.json "
             "(do not edit by hand). Each section is one invocation of `python -m "
             "training.bench`; its JSON holds the command, git sha, GPU, driver, package "
             "versions and every per-step sample.", "",
             "How a figure is made: each run is the real launcher (or a peer's own script) in "
             "a fresh process; tokens/s/GPU is the harmonic mean over the steady-state steps "
             "after the warm-up (total tokens over total time); every configuration of one "
             "invocation runs once per repeat in a rotated order, and a lever's effect is the "
             "ratio of means against the default run of the same invocation, with the range "
             "of the paired per-repeat ratios as its spread. A lever a guard refuses or "
             "corrects on that machine is recorded with the guard's message instead of a "
             "number; a peer that cannot run there, with the reason.", "",
             "Run them: `python -m training.bench all --gpus 1` (or `--gpus 2`) measures the "
             "next parts not yet in docs/benchmarks/ that fit `--budget-s` (one ~9-minute "
             "command per session); `--plan` lists the runs and their estimated wall time; "
             "`toggles` and `peers` run one suite with any selection (`--only`, `--levers`, "
             "`--keys`, `--sides`); `all --te` the Transformer Engine parts (peers-te, "
             "te-recipes, te-toggles-a/-b) where TE imports; `all --resume` extends a part's "
             "earlier JSON by whole repeats (a 1-repeat part to its 2 repeats in a later "
             "call: each repeat's sides run in one call, and the JSON's `resumed` says which "
             "repeats came from where).", ""]
    for path, data in load(bench_dir):
        lines += [f"## {data.get('name', path.stem)} ({data.get('kind')})", "",
                  f"Command: `{data.get('command')}`", "", table(data), ""]
    return "\n".join(lines)


def write_docs(bench_dir: Path = BENCH_DIR, docs_dir: Path = REPO_ROOT / "docs") -> dict:
    doc = build(bench_dir)
    docs_dir.mkdir(parents=True, exist_ok=True)
    (docs_dir / "levers.json").write_text(json.dumps(doc, indent=1) + "\n")
    (docs_dir / "levers.md").write_text(markdown(doc))
    (docs_dir / "benchmarks.md").write_text(benchmarks_markdown(bench_dir))
    return doc
