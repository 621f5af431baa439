"""The flow: bottleneck -> shape -> recommendations (measured, in order) -> report dict.

1. Bottleneck. Memory-bound when the run's train.log has an out-of-memory, when the estimate
   (or the measured peak) is above 90% of the GPU's memory, or when the user asks for a
   longer sequence or bigger batch (--want-*: the asked shape is estimated). Otherwise
   throughput-bound, split by the trace report's verdict (compute-, communication- or
   idle-bound); without a trace the split is unknown and the first advice is to measure it.
2. Shape: dense or MoE, short or long sequence, fixed- or variable-length data, layout.
3. Levers. Memory: the free levers first, then those that cost speed only while the estimate
   still does not fit, each estimated cumulatively. Throughput: the levers of the split whose
   measurement (docs/levers.json, closest shape) says faster, or that are not measured yet
   (then on mechanism only, flagged). Levers measured slower, within noise, refused, out of
   memory or only at batch 1 go to the dead ends with their quote.
"""
from __future__ import annotations

import datetime as _dt
import math
import shlex
from dataclasses import dataclass, field
from typing import Any

from training.launch.toggles import BY_NAME, PERF_TOGGLES

from . import memory as mem
from . import recipes as recipes_mod
from . import rules
from training.run_description import RunDescription, divisors

from .config import device_gib, from_manifest, platform_of, script, shape_key
from .inputs import BadInput, RunInputs
from .levers import LeverBook, Match
from .memory import Estimate, estimate

REPORT_SCHEMA = 1
DEFAULT_SOURCES = ("default", "platform", "derived", "preset", "recipe")
USER_SOURCES = ("env", "cli")
# Toggles the suggested command leaves out: they name the run folder, not the run.
NOT_IN_COMMAND = ("EXPERIMENT_DIR", "EXP_NAME", "RUN_ID", "DRY_RUN")


@dataclass
class Context:
    """What the rules may look at."""

    config: RunDescription
    estimate: Estimate
    bottleneck: str = "throughput-bound"
    split: str = rules.UNKNOWN
    trace: dict | None = None
    asked: dict[str, Any] = field(default_factory=dict)
    observed: str | None = None   # memory pressure the run itself showed (OOM, peak > 90%)

    def fits(self, config: RunDescription) -> bool:
        return bool(estimate(config).fits)

    def trace_pct(self, key: str) -> float | None:
        if not self.trace:
            return None
        value = (self.trace.get("overall", {}).get("breakdown") or {}).get(key)
        return float(value) if isinstance(value, (int, float)) else None

    def data_range_pct(self) -> float | None:
        if not self.trace:
            return None
        data = (self.trace.get("overall", {}).get("ranges") or {}).get("train/data") or {}
        value = data.get("pct_of_steps")
        return float(value) if isinstance(value, (int, float)) else None


# -- the asked shape ---------------------------------------------------------------------------

# --want-<option> -> the toggle it asks for (and what the bottleneck calls it)
WANTS = (("seq_length", "SEQ_LENGTH", "seq"), ("mbs", "MBS", "mbs"),
         ("global_batch", "BS", "global batch"))


def asked_config(config: RunDescription, want: dict[str, int | None]) -> RunDescription | None:
    changes = {}
    for option, toggle, _label in WANTS:
        if want.get(option):
            value = int(want[option])
            if value < 1:
                raise BadInput(f"--want-{option.replace('_', '-')} {value}: must be at least 1")
            changes[toggle] = value
    if not changes:
        return None
    new = config.with_values(**changes)
    lay = new.layout
    step = lay.mbs * lay.dp
    if lay.global_batch % step:
        raise BadInput(f"the asked shape has global batch {lay.global_batch}, not a multiple of "
                       f"MBS*DP = {lay.mbs}*{lay.dp} = {step}: ask --want-global-batch "
                       f"{max(step, lay.global_batch // step * step)} or another --want-mbs")
    return new


# -- 1. bottleneck ------------------------------------------------------------------------------

def _pct(value: float | None) -> str:
    return f"{100 * value:.0f}%" if value is not None else "?"


def bottleneck(inputs: RunInputs, config: RunDescription, est: Estimate,
               asked: RunDescription | None, asked_est: Estimate | None,
               platform_source: str = "") -> dict[str, Any]:
    evidence: list[str] = []
    memory_reasons: list[str] = []
    device = device_gib(config)
    limit = mem.MEMORY_BOUND_FRACTION * device if device else None

    observed = None
    if inputs.oom_lines:
        memory_reasons.append(f"out of memory in {inputs.log_path.name}: {inputs.oom_lines[0]}")
        observed = "ran out of memory"
    if asked is not None and asked_est is not None:
        what = ", ".join(f"{label} {config[toggle]} -> {asked[toggle]}"
                         for _option, toggle, label in WANTS if config[toggle] != asked[toggle])
        fits = ("fits" if asked_est.fits else "does not fit") if device else "unknown fit"
        memory_reasons.append(f"asked for a bigger shape ({what}): estimate "
                              f"{asked_est.peak_gib:.1f} GiB of {device or '?'} GiB "
                              f"({_pct(asked_est.fraction)}): {fits}")
    measured, where = inputs.measured_peak_gib()
    # a measured peak outranks the estimate; the estimate decides only without one
    if limit is not None and measured is None and est.peak_gib > limit:
        memory_reasons.append(f"estimated peak {est.peak_gib:.1f} GiB is above 90% of the "
                              f"{device:.0f} GiB of {config.platform}")
    if measured is not None:
        line = f"measured peak {measured:.1f} GiB ({where})"
        if device:
            line += f", {_pct(measured / device)} of {device:.0f} GiB"
        if limit is not None and measured > limit:
            memory_reasons.append(line + ": above 90%")
            observed = observed or f"peaked at {measured:.1f} GiB (above 90%)"
        else:
            evidence.append(line)
    if device is None:
        evidence.append(f"GPU memory unknown: {platform_source}")
    elif not memory_reasons:
        evidence.append(f"estimated peak {est.peak_gib:.1f} GiB, {_pct(est.fraction)} of "
                        f"{device:.0f} GiB ({config.platform}): fits under 90%")

    split, split_line = rules.UNKNOWN, None
    trace = inputs.trace_report
    if trace:
        verdict = (trace.get("overall") or {}).get("verdict") or {}
        kind = verdict.get("kind")
        if kind in (rules.COMPUTE, rules.COMM, rules.IDLE):
            split = kind
        elif isinstance(kind, str) and kind.startswith("idle"):
            split = rules.IDLE
        split_line = (f"trace report ({inputs.trace_report_path.name}): "
                      f"{verdict.get('line') or kind}")
        bd = (trace.get("overall") or {}).get("breakdown") or {}
        parts = [f"{name} {bd[key]:.1f}%" for name, key in
                 (("compute", "compute_pct"), ("exposed comm", "exposed_comm_pct"),
                  ("idle", "idle_pct"), ("other", "other_pct"))
                 if isinstance(bd.get(key), (int, float))]
        if parts:
            split_line += " [" + ", ".join(parts) + "]"
    summary = inputs.summary
    if summary.get("tokens_per_s_per_gpu"):
        mfu = summary.get("mfu")
        evidence.append(f"measured {summary['tokens_per_s_per_gpu']:.0f} tokens/s/GPU"
                        + (f", MFU {100 * mfu:.1f}%" if isinstance(mfu, (int, float)) else "")
                        + " (manifest.json run.summary)")
    kind = "memory-bound" if memory_reasons else "throughput-bound"
    return {"kind": kind, "split": None if memory_reasons else split, "observed": observed,
            "memory_reasons": memory_reasons, "split_evidence": split_line,
            "evidence": evidence,
            "measure_first": (None if memory_reasons or trace else
                              "no trace report: profile to split compute / communication / "
                              "idle: PROFILE=torch PROFILE_STEP_START=5 PROFILE_STEP_END=8, then "
                              "python -m training.profiling.trace_report RUN")}


# -- 2. shape -----------------------------------------------------------------------------------

def shape(config: RunDescription, platform_source: str = "") -> dict[str, Any]:
    c, m, lay = config, config.model, config.layout
    layers = (f"{m.num_layers} of {m.preset_layers} layers" if m.num_layers != m.preset_layers
              else f"{m.num_layers} layers")
    long_seq = m.seq_length >= rules.LONG_SEQUENCE
    if c.get("DATA_PATH"):
        data = ("fixed-length: Megatron's GPT dataset packs documents end to end into "
                f"{m.seq_length}-token samples (no padding: packing is built in; padding-free / "
                "variable-length levers do not apply)")
    else:
        data = "fixed-length: mock data (every sample is seq_length tokens)"
    optimizer = (", FSDP" if c["FSDP"] else
                 ", distributed optimizer" if c["DISTRIBUTED_OPTIMIZER"] else "")
    layout = (f"{lay.world_size} GPU{'s' if lay.world_size != 1 else ''} ({lay.nnodes} node x "
              f"{lay.gpus_per_node}): TP {lay.tp} x PP {lay.pp} x CP {lay.cp} x DP {lay.dp}"
              f"{', sequence parallel' if c['SEQUENCE_PARALLEL'] else ''}{optimizer}; "
              f"MBS {lay.mbs}, global batch {lay.global_batch} "
              f"({lay.microbatches} micro-batch{'es' if lay.microbatches != 1 else ''} per step)")
    return {"model": f"{m.name}, {layers}", "architecture": "MoE" if m.moe else "dense",
            "sequence": f"{m.seq_length} tokens: {'long' if long_seq else 'short'} "
                        f"(long from {rules.LONG_SEQUENCE})",
            "long_sequence": long_seq, "data": data, "layout": layout,
            "precision": c.precision,
            "backend": c.backend + (f" ({c.kernels} kernels)" if c.backend == "native" else ""),
            "recompute": c["RECOMPUTE"], "platform": c.platform,
            "platform_source": platform_source,
            "tp": lay.tp, "pp": lay.pp, "cp": lay.cp, "dp": lay.dp, "mbs": lay.mbs,
            "seq": m.seq_length, "global_batch": lay.global_batch, "world": lay.world_size}


# -- already on ----------------------------------------------------------------------------------

def defaults(inputs: RunInputs, book: LeverBook | None = None,
             config: RunDescription | None = None) -> tuple[list[dict], list[dict]]:
    """(already on, turned off) from the manifest's toggle rows; the launcher's environment.
    A default that the levers file measured *slower* than its off setting, at the shape
    closest to this run, says so instead of 'no action' (CROSS_ENTROPY_LOSS_FUSION on an H200
    at the 8-layer shape measured 0.985x at Liger's own CE chunking, before CE_CHUNK_MEM=8)."""
    rows = {r.get("toggle"): r for r in inputs.manifest.get("toggles", []) if isinstance(r, dict)}
    names = [t.name for t in PERF_TOGGLES] + list(rules.CONFIRM_TOGGLES)
    on, off = [], []
    for name in names:
        row = rows.get(name)
        if row is None:
            continue
        if name == "NATIVE_KERNELS" and inputs.manifest.get("backend") != "native":
            continue                    # only the native backend uses them
        value, source = str(row.get("value")), row.get("source")
        good = rules.CONFIRM_TOGGLES.get(name, ("1",))
        what = BY_NAME[name].description if name in BY_NAME else ""
        item = {"toggle": name, "value": value, "source": source,
                "reason": row.get("reason") or "", "what": what}
        if value in good:
            item["status"] = ("on by default: no action" if source in DEFAULT_SOURCES else
                              f"on (set by {source})")
            slower = _measured_slower(book, config, name, value)
            if slower is not None:
                item["status"] = (f"on, but measured slower than {name}=0: {slower.quote()}. "
                                  f"Try {name}=0 where its memory fits")
                item["measured"] = slower.to_dict()
            on.append(item)
        elif source == "guard":
            item["status"] = f"off: turned off by a guard: {row.get('reason')}"
            off.append(item)
        elif source in USER_SOURCES:
            item["status"] = f"off: you set {name}={value} ({source})"
            off.append(item)
        elif name in ("SEQUENCE_PARALLEL",):
            continue                    # off at TP=1 is right, not news
        else:
            item["status"] = f"{value} ({source}{': ' + row['reason'] if row.get('reason') else ''})"
            off.append(item)
    for name, entry in (inputs.manifest.get("environment") or {}).items():
        if isinstance(entry, dict):
            on.append({"toggle": name, "value": entry.get("value"), "source": entry.get("source"),
                       "reason": entry.get("reason") or "", "what": "environment",
                       "status": "set by the launcher: no action"})
    return on, off


def _measured_slower(book: LeverBook | None, config: RunDescription | None, name: str,
                     value: str) -> Match | None:
    if book is None or config is None or name not in {t.name for t in PERF_TOGGLES}:
        return None
    match = _match(book, {name: value}, config, {name: "0"})
    return match if match is not None and match.exact and match.verdict == "slower" else None


# -- 3. levers ---------------------------------------------------------------------------------

def _match(book: LeverBook, sets: dict[str, str], config: RunDescription,
           baseline: dict[str, str], measured: bool = False) -> Match | None:
    return book.find(sets, shape_key(config), config.platform, baseline, measured)


def _batch_one(match: Match | None) -> bool:
    if match is None:
        return False
    shape = match.entry.shape
    gb = shape.get("global_batch")
    return (isinstance(gb, int) and gb <= 1) or (gb is None and shape.get("mbs") == 1)


def _recommendation(candidate_id: str, title: str, why: str, mechanism: str,
                    sets: dict[str, str], match: Match | None, flow: str,
                    est_before: Estimate | None = None, est_after: Estimate | None = None,
                    costs_throughput: bool = False) -> dict[str, Any]:
    if (match is not None and not (match.exact or match.reverse)
            and match.entry.verdict == "not measured"):
        match = None                   # another comparison, and unmeasured: nothing to quote
    if match is None:
        status = "not measured yet"
        measured = None
    elif match.entry.verdict == "not measured":
        status = "not measured yet"
        measured = match.to_dict()
    else:
        status = "measured"
        measured = match.to_dict()
    rec = {"id": candidate_id, "title": title, "set": " ".join(f"{k}={v}" for k, v in sets.items()),
           "sets": sets, "why": why, "mechanism": mechanism, "flow": flow, "status": status,
           "measured": measured,
           "measured_text": (match.quote() if match else
                             "not measured yet: recommended on mechanism only"),
           "costs_throughput": costs_throughput}
    if match is not None and status == "not measured yet":
        rec["measured_text"] = ("not measured yet (levers.json lists it unmeasured): "
                                "recommended on mechanism only; " + match.quote())
    if est_after is not None:
        rec["estimate"] = {"peak_gib": est_after.peak_gib,
                           "delta_gib": (est_after.peak_gib - est_before.peak_gib
                                         if est_before else None),
                           "fraction_of_device": est_after.fraction, "fits": est_after.fits,
                           "label": "estimate (training/optimize/memory.py), not a measurement"}
    return rec


def layout_search(config: RunDescription,
                  more_gpus: bool) -> tuple[dict[str, str], RunDescription] | None:
    """The smallest model-parallel layout that fits: at this GPU count, or on more GPUs."""
    c, lay = config, config.layout
    if more_gpus:
        worlds = [w for w in (8, 16, 32, 64, 128, 256, 512, 1024) if w > lay.world_size]
    else:
        worlds = [lay.world_size]
    tps = divisors(math.gcd(c.model.num_attention_heads, c.model.num_query_groups))
    for world in worlds:
        gpn = lay.gpus_per_node if not more_gpus else min(world, rules.GPUS_PER_NODE_ASSUMED)
        nnodes = world // gpn
        options = []
        for tp in tps:
            if tp > gpn:
                continue
            for cp in (1, 2, 4, 8):
                if cp > 1 and (c.backend != "transformer_engine" or c.model.seq_length % (2 * cp)):
                    continue
                for pp in divisors(c.model.num_layers):
                    mp = tp * cp * pp
                    if world % mp:
                        continue
                    if not more_gpus and (tp, cp, pp) == (lay.tp, lay.cp, lay.pp):
                        continue
                    new = c.with_values(TP=tp, CP=cp, PP=pp, NNODES=nnodes, GPUS_PER_NODE=gpn)
                    if new.layout.global_batch % (new.layout.mbs * new.layout.dp):
                        continue
                    est = estimate(new)
                    if est.fits:
                        options.append(((mp, pp, cp, tp), new))
        if options:
            options.sort(key=lambda item: item[0])
            new = options[0][1]
            sets = {name: str(new[name]) for name in ("TP", "PP", "CP") if new[name] != c[name]}
            if new.layout.world_size != lay.world_size:
                sets["NNODES"] = str(new["NNODES"])
                sets["GPUS_PER_NODE"] = str(new["GPUS_PER_NODE"])
            return sets, new
    return None


def memory_flow(config: RunDescription, ctx: Context, book: LeverBook) -> dict[str, Any]:
    recs: list[dict] = []
    current, est = config, estimate(config)
    start = est
    device = device_gib(config)

    def steps():
        for cand in rules.MEMORY_LEVERS:
            yield cand
            if cand.id == rules.LAYOUT_AFTER:
                yield "layout"
        yield "more_gpus"

    for cand in steps():
        if cand in ("layout", "more_gpus"):
            if device is None or est.fits:
                continue
            found = layout_search(current, more_gpus=(cand == "more_gpus"))
            if found is None:
                continue
            sets, new = found
            new_est = estimate(new)
            title = ("more GPUs, model-parallel layout" if cand == "more_gpus"
                     else "model-parallel layout")
            gpus = current.layout.world_size
            why = (f"at {gpus} GPU{'s' if gpus != 1 else ''} the estimate "
                   f"is {est.peak_gib:.1f} GiB" + (": no layout fits" if cand == "more_gpus"
                                                   else ""))
            mechanism = ("TP shards weights and activations inside a node; PP splits the "
                         "layers (the first stage holds up to PP micro-batches); CP shards the "
                         "sequence (Transformer Engine only)")
            baseline = {"TP": str(current.layout.tp), "PP": str(current.layout.pp)}
            match = _match(book, {k: v for k, v in sets.items() if k in ("TP", "PP", "CP")},
                           current, baseline)
            recs.append(_recommendation(cand, title, why, mechanism, sets, match, "memory",
                                        est, new_est, costs_throughput=True))
            current, est = new, new_est
            continue
        why = cand.applies(current, ctx)
        if not why:
            continue
        gated = cand.costs_throughput or cand.only_to_fit
        if gated and (est.fits or device is None):
            continue
        sets, new = cand.change(current)
        new_est = estimate(new)
        saving = est.peak_gib - new_est.peak_gib
        if saving <= 0.05 or (gated and saving < rules.MATERIAL_SAVING * est.peak_gib):
            continue
        if cand.must_fit and not new_est.fits:
            continue
        match = _match(book, sets, current, cand.baseline(current))
        recs.append(_recommendation(cand.id, cand.title, why, cand.mechanism, sets, match,
                                    "memory", est, new_est, cand.costs_throughput))
        current, est = new, new_est
    if device is None:
        verdict = "GPU memory unknown (pass --platform): levers ranked by the estimate only"
    elif start.fits and ctx.observed:
        verdict = (f"the run {ctx.observed} although the estimate fits ({start.peak_gib:.1f} "
                   f"GiB, {_pct(start.fraction)} of {device:.0f} GiB): the formula misses what "
                   "ran out (a spike it does not model, or allocator fragmentation: compare "
                   "metrics.jsonl mem_peak_reserved_gib). Free levers below; measure the peak "
                   "before pulling levers that cost speed")
    elif start.fits:
        verdict = (f"fits as it is: estimate {start.peak_gib:.1f} GiB, {_pct(start.fraction)} "
                   f"of {device:.0f} GiB")
    elif est.fits:
        verdict = (f"fits with the levers below: estimate {start.peak_gib:.1f} -> "
                   f"{est.peak_gib:.1f} GiB ({_pct(est.fraction)} of {device:.0f} GiB)")
    else:
        verdict = (f"does not fit with any lever here: estimate {start.peak_gib:.1f} -> "
                   f"{est.peak_gib:.1f} GiB of {device:.0f} GiB")
    return {"recommendations": recs, "verdict": verdict, "final_config": current,
            "final_estimate": est}


def _toggle_help(name: str) -> str:
    """A toggle's help: the core registry's, or the MoE layer's (training/moe/layer.py)."""
    if name in BY_NAME:
        return BY_NAME[name].description
    from training.moe.layer import TOGGLES as MOE_TOGGLES

    return next((t.description for t in MOE_TOGGLES if t.name == name), "")


def _user_off_candidates(inputs: RunInputs) -> list[tuple[str, str]]:
    rows = {r.get("toggle"): r for r in inputs.manifest.get("toggles", []) if isinstance(r, dict)}
    names = [t.name for t in PERF_TOGGLES] + list(rules.ON_TOGGLES_FOR_SPEED)
    if (inputs.manifest.get("model") or {}).get("num_experts"):
        names += list(rules.MOE_ON_TOGGLES)
    out = []
    for name in names:
        row = rows.get(name)
        if row and str(row.get("value")) == "0" and row.get("source") in USER_SOURCES:
            out.append((name, _toggle_help(name)))
    return out


def throughput_flow(config: RunDescription, ctx: Context, book: LeverBook,
                    inputs: RunInputs, convergence=recipes_mod.CONVERGENCE) -> dict[str, Any]:
    split = ctx.split
    recs: list[dict] = []
    unproductive: list[dict] = []
    considered: list[str] = []

    def consider(cid, title, why, mechanism, sets, new, baseline, measured=False):
        match = _match(book, sets, config, baseline, measured)
        new_est = estimate(new) if new is not config else None
        rec = _recommendation(cid, title, why, mechanism, sets, match, split,
                              ctx.estimate if new_est else None, new_est)
        verdict = match.verdict if match else None
        if match is not None and verdict in ("slower", "within noise", "refused"):
            rec["dead_end"] = f"measured {verdict} at the closest shape"
            unproductive.append(rec)
        elif match is not None and verdict == "set out of memory":
            rec["dead_end"] = "measured: it ran out of GPU memory at the closest shape"
            unproductive.append(rec)
        elif match is not None and verdict == "faster" and _batch_one(match):
            rec["dead_end"] = ("measured only at batch 1, where a tokens/s ratio is noise and "
                               "fixed per-step costs: re-measure at global batch >= 4")
            unproductive.append(rec)
        else:
            recs.append(rec)
        return rec

    for name, help_text in _user_off_candidates(inputs):
        if name in rules.ON_TOGGLES_FOR_SPEED and config.layout.dp * config.layout.cp == 1:
            considered.append(f"{name}=0: at DP x CP = 1 there is no optimizer state to shard "
                              "and no gradient reduce or param gather to overlap, so it stays")
            continue
        new = config.with_values(**{name: True})
        consider(f"on:{name}", f"{name} back on (a default-on toggle)",
                 f"you set {name}=0", help_text, {name: "1"}, new, {name: "0"})
    guarded = [r.get("toggle") for r in inputs.manifest.get("toggles", [])
               if isinstance(r, dict) and r.get("source") == "guard"
               and "local backend" in str(r.get("reason"))]
    for cand in rules.THROUGHPUT_LEVERS:
        if split not in cand.flows:
            continue
        why = cand.applies(config, ctx)
        if not why:
            continue
        if cand.id == "backend_native_speed" and guarded:
            why += ("; it also brings back what guards turned off for the local backend: "
                    + ", ".join(guarded))
        sets, new = cand.change(config)
        consider(cand.id, cand.title, why, cand.mechanism, sets, new, cand.baseline(config))
    _precision_recipe(config, book, consider, considered, convergence)
    bigger = config.with_values(MBS=config.layout.mbs * 2)
    if (device_gib(config) and config.layout.global_batch % (bigger.layout.mbs
                                                             * bigger.layout.dp) == 0
            and not any(r["id"] == "mbs_up" for r in recs + unproductive)):
        est = estimate(bigger)
        if not est.fits:
            considered.append(f"MBS={bigger.layout.mbs}: estimate {est.peak_gib:.1f} GiB, "
                              f"{_pct(est.fraction)} of {device_gib(config):.0f} GiB: above "
                              "90%, so the micro-batch stays")
    return {"recommendations": recs, "unproductive": unproductive, "considered": considered}


def _moe_shape(shape: dict) -> bool:
    """Whether a lever row was measured on an MoE model (its preset has experts)."""
    import training.moe.presets  # noqa: F401 - registers the MoE presets the rows may name
    from training.launch.presets import PRESETS

    preset = PRESETS.get(shape.get("model"))
    return bool(getattr(preset, "num_experts", None))


def _precision_recipe(config: RunDescription, book: LeverBook, consider, considered: list[str],
                      convergence) -> None:
    """The recipe of this GPU measured fastest against bf16, with its convergence A/B."""
    names = recipes_mod.platform_recipes(config)
    if not names:
        return
    measured, elsewhere = [], []
    for name in names:
        match = _match(book, {"PRECISION": name}, config, {"PRECISION": "bf16"}, measured=True)
        if match is not None and (match.exact or match.reverse):
            if _moe_shape(match.entry.shape) != config.model.moe:
                elsewhere.append(name)   # a dense figure says nothing of MoE, and back
                continue
            measured.append((match.entry.ratio if not match.reverse else 1 / match.entry.ratio,
                             name))
    if elsewhere:
        considered.append(f"PRECISION={'/'.join(elsewhere)}: measured on "
                          f"{'dense' if config.model.moe else 'MoE'} models only, which says "
                          f"nothing of this {'MoE' if config.model.moe else 'dense'} model's "
                          "GEMMs: not recommended from that figure")
    if not measured and not elsewhere:
        considered.append(f"PRECISION: {config.platform} runs {', '.join(names)}; none is "
                          "measured against bf16 in the levers file, so none is recommended "
                          f"({recipes_mod.convergence_text(names[0], convergence)})")
        return
    measured.sort(reverse=True)
    # The fastest recipe whose convergence A/B is not worse than bf16's beyond noise (one
    # without an A/B stays eligible: its quote says the A/B is not measured).
    worse = [(ratio, name, ab) for ratio, name in measured
             if (ab := recipes_mod.recipe_ab(name, convergence)) is not None and ab.worse]
    eligible = [(ratio, name) for ratio, name in measured
                if name not in {n for _r, n, _a in worse}]
    for ratio, bad, ab in worse:
        considered.append(
            f"PRECISION={bad}: measured x{ratio:.3f} tokens/s against bf16, but its convergence "
            + ("A/B diverged" if ab.gap == float("inf") else
               f"A/B ends {ab.gap:+.3f} in best eval loss above bf16's, beyond the noise of "
               f"{ab.noise:.3f}")
            + f" ({recipes_mod.convergence_text(bad, convergence)})"
            + ("" if eligible else ": no recipe is recommended"))
    if not eligible:
        return
    _ratio, name = eligible[0]
    why = f"{config.platform} runs {', '.join(names)}; {name} is measured fastest of them"
    if worse and worse[0][0] > _ratio:
        why = (f"{config.platform} runs {', '.join(names)}; {name} is measured fastest of those "
               f"whose convergence A/B is not worse than bf16 beyond noise "
               f"({', '.join(n for _r, n, _a in worse)} learned slower)")
    rec = consider("precision_recipe", f"{name} precision recipe", why,
             "Transformer Engine computes the GEMMs in 8-bit floats with per-tensor or "
             "per-block scales (twice the tensor-core rate of bf16) and keeps bf16 master "
             "weights; it changes numerics, hence the convergence A/B",
             {"PRECISION": name}, config.with_values(PRECISION=name), {"PRECISION": "bf16"},
             measured=True)
    text = recipes_mod.convergence_text(name, convergence)
    rec["convergence"] = text
    rec["measured_text"] += f"; {text}"
    if config.backend != "transformer_engine":
        rec["sets"] = {"TRANSFORMER_IMPL": "transformer_engine", **rec["sets"]}
        rec["set"] = " ".join(f"{k}={v}" for k, v in rec["sets"].items())


def dead_ends(config: RunDescription, ctx: Context, book: LeverBook,
              unproductive: list[dict], recommended: frozenset[str] = frozenset()
              ) -> list[dict]:
    out = []
    for rec in unproductive:
        out.append({"id": rec["id"], "title": rec["title"] + f" ({rec['set']})",
                    "why": rec["dead_end"], "measured": rec["measured"],
                    "text": rec["measured_text"]})
    for dead in rules.DEAD_ENDS:
        if not dead.when(config, ctx) or dead.superseded_by in recommended:
            continue
        match = (book.find(dead.cite, shape_key(config), config.platform)
                 if dead.cite else None)
        if match is not None and (not match.exact or match.verdict == "not measured"):
            match = None                   # cite only a measured entry of exactly that setting
        text = dead.caution(config, ctx)
        out.append({"id": dead.id, "title": dead.title, "why": text,
                    "measured": match.to_dict() if match else None,
                    "text": ("measured: " + match.quote()) if match else
                            "caution (no measurement in the levers file)"})
    return out


def command(manifest: dict, config: RunDescription, recs: list[dict],
            asked: RunDescription | None = None,
            base: RunDescription | None = None) -> str | None:
    if not recs:
        return None
    rows = manifest.get("toggles", [])
    words: dict[str, str] = {}
    for row in rows:
        if (isinstance(row, dict) and row.get("source") in USER_SOURCES
                and row.get("toggle") not in NOT_IN_COMMAND):
            words[row["toggle"]] = str(row.get("value"))
    if asked is not None and base is not None:
        for _option, name, _label in WANTS:
            if asked[name] != base[name]:
                words[name] = str(asked[name])
    for rec in recs:
        words.update(rec["sets"])
    return ("DRY_RUN=1 bash " + script(config) + " " +
            " ".join(f"{k}={shlex.quote(v)}" for k, v in words.items())).strip()


# -- the report -----------------------------------------------------------------------------------

def calibration(inputs: RunInputs, est: Estimate) -> dict[str, Any] | None:
    measured, where = inputs.measured_peak_gib()
    if measured is None:
        return None
    return {"measured_peak_gib": measured, "measured_from": where,
            "estimated_peak_gib": est.peak_gib,
            "error_pct": mem.error_pct(est.peak_gib, measured),
            "phases": mem.phase_errors(est, inputs.measured_phase_peaks_gib())}


def advise(inputs: RunInputs, book: LeverBook, platform: str | None = None,
           want: dict[str, int | None] | None = None,
           convergence=recipes_mod.CONVERGENCE) -> dict[str, Any]:
    config = from_manifest(inputs.manifest, platform)
    _platform, platform_source = platform_of(inputs.manifest, platform)
    est = estimate(config)
    asked = asked_config(config, want or {})
    asked_est = estimate(asked) if asked else None
    neck = bottleneck(inputs, config, est, asked, asked_est, platform_source)
    target = asked or config
    target_est = asked_est or est
    ctx = Context(config=target, estimate=target_est, bottleneck=neck["kind"],
                  split=neck["split"] or rules.UNKNOWN, trace=inputs.trace_report,
                  asked={k: v for k, v in (want or {}).items() if v},
                  observed=None if asked else neck["observed"])
    on, off = defaults(inputs, book, target)

    if neck["kind"] == "memory-bound":
        flow = memory_flow(target, ctx, book)
        recs, unproductive, considered = flow["recommendations"], [], []
        flow_verdict = flow["verdict"]
        final = flow["final_estimate"]
    else:
        flow = throughput_flow(target, ctx, book, inputs, convergence)
        recs, unproductive = flow["recommendations"], flow["unproductive"]
        considered = flow["considered"]
        flow_verdict = (f"{len(recs)} lever{'s' if len(recs) != 1 else ''} to try" if recs
                        else "every lever that applies to this shape is already on")
        final = None
    for number, rec in enumerate(recs, 1):
        rec["order"] = number

    report = {
        "schema": REPORT_SCHEMA,
        "tool": "python -m training.optimize",
        "created": _dt.datetime.now().isoformat(timespec="seconds"),
        "run": str(inputs.run_dir),
        "manifest": str(inputs.manifest_path),
        "dry_run": inputs.dry_run,
        "inputs": {"metrics": str(inputs.metrics_path) if inputs.metrics_path else None,
                   "trace_report": (str(inputs.trace_report_path)
                                    if inputs.trace_report_path else None),
                   "train_log": str(inputs.log_path) if inputs.log_path else None},
        "levers_file": book.describe(),
        "bottleneck": neck,
        "shape": shape(target, platform_source),
        "asked": ({option: asked[toggle] for option, toggle, _label in WANTS}
                  if asked else None),
        "memory": {"estimate": est.to_dict(),
                   "asked_estimate": asked_est.to_dict() if asked_est else None,
                   "after_levers": final.to_dict() if final is not None else None,
                   "calibration": calibration(inputs, est)},
        "verdict": flow_verdict,
        "recommendations": recs,
        "considered": considered,
        "already_on": on,
        "turned_off": off,
        "dead_ends": dead_ends(target, ctx, book, unproductive,
                               frozenset(r["id"] for r in recs + unproductive)),
        "command": command(inputs.manifest, target, recs, asked, config),
    }
    return report
