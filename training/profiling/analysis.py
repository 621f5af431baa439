"""Turn an HTA ``TraceAnalysis`` into the report's numbers (a JSON-ready dict).

Two timelines, chosen by ``device``:

- ``gpu`` (default): the device events of each rank (kernels, memcpy, memset on GPU streams).
  Idle/compute/non-compute come from HTA's ``get_temporal_breakdown``, the overlap from
  ``get_comm_comp_overlap``, per-kernel times from ``get_gpu_kernel_breakdown``; HTA sorts
  kernels into COMPUTATION / COMMUNICATION (``nccl*Kernel``) / MEMORY (Memcpy/Memset).
  A trace without GPU events stops with a message naming ``--device cpu``.
- ``cpu`` (explicit): for CPU-only runs (gloo). HTA's device analyses select events by GPU
  stream and do not run on such traces (get_temporal_breakdown raises IndexError,
  get_comm_comp_overlap returns NaN), so the same definitions are applied here
  (training/profiling/timeline.py) to HTA's dataframe: torch operators (cat ``cpu_op``) are
  the compute timeline, collectives (``gloo:*`` ranges on gloo's threads, ``c10d::*`` ops)
  the communication timeline, and time in neither is idle (Python / dispatcher overhead).
  The "kernel" tables list operators by self time.

Per-range times (training/profiling/ranges.py), from the ``user_annotation`` events of HTA's
dataframe: host time (the range's wall time on its CPU thread) and, on GPU traces, the time of
the kernels *launched* while the range was open, on any thread of the process (found through
HTA's ``index_correlation`` launch<->kernel link). HTA's own ``get_gpu_user_annotation_breakdown``
is not used for the GPU side: kineto projects a range onto the GPU only for kernels launched
by the thread that opened it, and autograd launches backward kernels from its own thread, so
``train/backward`` shows ~0 GPU time there (seen on an H200 trace).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
from hta.utils.utils import KernelType, get_kernel_type, shorten_name

from training.profiling import kernel_groups as kg
from training.profiling import ranges as rg
from training.profiling.loading import DEVICES, TraceReportError, quiet_hta
from training.profiling.timeline import Breakdown, breakdown, self_times, union_length
from training.profiling.verdict import verdict

_HUGE = 10**9  # "no limit" for HTA's top-k aggregation


def _sym(ta) -> list[str]:
    return ta.t.symbol_table.get_sym_table()


def _sym_id(ta, name: str) -> int | None:
    return ta.t.symbol_table.get_sym_id_map().get(name)


def _names(ta, df: pd.DataFrame) -> pd.Series:
    table = _sym(ta)
    return df["name"].map(lambda i: table[i])


# ---------------------------------------------------------------- steps


def profiler_steps(ta) -> dict[str, Any]:
    """What HTA kept: the ProfilerStep ranges of each rank after its last-step filter."""
    table = _sym(ta)
    all_steps = sorted(
        {int(s.split("#", 1)[1]) for s in table if s.startswith("ProfilerStep#") and s.split("#", 1)[1].isdigit()}
    )
    ids = {_sym_id(ta, f"ProfilerStep#{n}"): n for n in all_steps}
    per_rank: dict[int, dict[str, Any]] = {}
    for rank, df in ta.t.traces.items():
        steps = df[df["name"].isin(list(ids)) & df["stream"].eq(-1)]
        kept = sorted(ids[i] for i in steps["name"])
        per_rank[rank] = {
            "analysed": kept,
            "total_us": float(steps["dur"].sum()),
            "mean_step_us": float(steps["dur"].mean()) if len(steps) else None,
        }
    dropped = [n for n in all_steps if all(n not in r["analysed"] for r in per_rank.values())]
    return {"profiled": all_steps, "dropped": dropped, "per_rank": per_rank}


# ---------------------------------------------------------------- GPU timeline


def _gpu_breakdowns(ta) -> dict[int, Breakdown]:
    no_gpu = [r for r, df in ta.t.traces.items() if not df["stream"].ne(-1).any()]
    if no_gpu:
        which = "the traces have" if len(no_gpu) == len(ta.t.traces) else f"rank(s) {no_gpu} have"
        raise TraceReportError(
            f"{which} no GPU events (no kernels on a GPU stream): a CPU-only capture? Rerun with --device cpu "
            "to analyse the CPU timeline (torch ops as compute, gloo collectives as communication)"
        )
    with quiet_hta():
        temporal = ta.get_temporal_breakdown(visualize=False).set_index("rank")
        overlap = ta.get_comm_comp_overlap(visualize=False).set_index("rank")
    table = _sym(ta)
    out: dict[int, Breakdown] = {}
    for rank, df in ta.t.traces.items():
        gpu = df[df["stream"].ne(-1)]
        comm = gpu[gpu["name"].map(lambda i: get_kernel_type(table[i]) == KernelType.COMMUNICATION.name)]
        comm_total = union_length(comm)
        ratio = float(overlap.loc[rank, "comp_comm_overlap_pctg"]) / 100.0 if comm_total > 0 else 0.0
        if math.isnan(ratio):  # HTA gives NaN only when a rank has no communication kernel
            raise RuntimeError(f"rank {rank}: HTA overlap is NaN with {comm_total} us of communication")
        row = temporal.loc[rank]
        span = float(row["kernel_time(us)"])
        exposed = comm_total * (1.0 - ratio)
        non_compute = float(row["non_compute_time(us)"])
        other = non_compute - exposed
        # HTA rounds the overlap to 0.01%; absorb only that rounding.
        if -1e-4 * comm_total - 1.0 <= other < 0:
            other = 0.0
        if other < 0:
            raise RuntimeError(f"rank {rank}: exposed communication {exposed} exceeds HTA non-compute {non_compute}")
        out[rank] = Breakdown(
            span_us=span,
            compute_us=float(row["compute_time(us)"]),
            exposed_comm_us=exposed,
            other_us=other,
            idle_us=float(row["idle_time(us)"]),
            comm_total_us=comm_total,
            comm_overlapped_us=comm_total * ratio,
        )
    return out


def _gpu_kernels(ta) -> pd.DataFrame:
    """rank, name, time_us, count for every GPU kernel/memcpy/memset (HTA's kernel breakdown)."""
    with quiet_hta():
        _, kernels = ta.get_gpu_kernel_breakdown(
            visualize=False, duration_ratio=1.0, num_kernels=_HUGE, include_memory_kernels=True
        )
    table = _sym(ta)
    counts = pd.concat(
        [
            df.loc[df["stream"].ne(-1), "name"].map(lambda i: table[i]).value_counts().rename("count").reset_index()
            .assign(rank=rank)
            for rank, df in ta.t.traces.items()
        ],
        ignore_index=True,
    )
    out = pd.DataFrame(
        {
            "rank": kernels["rank"].astype(int),
            "name": kernels["name"].astype(str),
            "time_us": kernels["sum (us)"].astype(float),
        }
    )
    return out.merge(counts, on=["rank", "name"], how="left", validate="one_to_one")


# ---------------------------------------------------------------- CPU timeline


def _cpu_events(ta, rank: int) -> pd.DataFrame:
    df = ta.t.traces[rank]
    df = df[df["dur"].ge(0) & df["stream"].eq(-1)]
    names = _names(ta, df)
    group = names.map(kg.classify)
    cpu_op = _sym_id(ta, "cpu_op")
    is_comm = group.eq(kg.COMMUNICATION)
    is_op = df["cat"].eq(cpu_op) if cpu_op is not None else pd.Series(False, index=df.index)
    ev = df[is_comm | is_op].copy()
    ev["s_name"] = names[ev.index]
    ev["group"] = group[ev.index]
    ev["kind"] = ev["group"].map(lambda g: "comm" if g == kg.COMMUNICATION else "compute")
    return ev


def _cpu_breakdowns(ta) -> tuple[dict[int, Breakdown], pd.DataFrame]:
    out: dict[int, Breakdown] = {}
    rows = []
    for rank in ta.t.traces:
        ev = _cpu_events(ta, rank)
        if ev.empty:
            raise TraceReportError(f"rank {rank}: the trace has no torch operator events to analyse")
        out[rank] = breakdown(ev)
        ev = ev.assign(self_us=self_times(ev))
        agg = ev.groupby("s_name").agg(time_us=("self_us", "sum"), count=("self_us", "size")).reset_index()
        rows.append(agg.rename(columns={"s_name": "name"}).assign(rank=rank))
    return out, pd.concat(rows, ignore_index=True)


# ---------------------------------------------------------------- ranges


def _range_times(ta, device: str) -> pd.DataFrame:
    """rank, name, count, host_us, kernel_us (None on the CPU timeline) of each training range."""
    ua_id = _sym_id(ta, "user_annotation")
    range_ids = {i: n for n in rg.ALL_RANGES if (i := _sym_id(ta, n)) is not None}
    kernel_cats = [i for c in ("kernel", "gpu_memcpy", "gpu_memset") if (i := _sym_id(ta, c)) is not None]
    rows = []
    for rank, df in ta.t.traces.items():
        occ = df[df["cat"].eq(ua_id) & df["name"].isin(list(range_ids))] if ua_id is not None else df.iloc[0:0]
        if occ.empty:
            continue
        linked = device == "gpu" and "index_correlation" in df.columns  # HTA adds it when kernels have correlation ids
        if linked:
            k = df[df["cat"].isin(kernel_cats) & df["stream"].ge(0) & df["index_correlation"].gt(0)]
            launch = df["ts"].reindex(k["index_correlation"].to_numpy()).to_numpy()
            keep = ~np.isnan(launch)
            order = np.argsort(launch[keep], kind="stable")
            launch_ts = launch[keep][order]
            cum = np.concatenate([[0.0], np.cumsum(k["dur"].to_numpy()[keep][order].astype(float))])
        for name_id, group in occ.groupby("name"):
            kernel_us = None
            if linked:
                lo = np.searchsorted(launch_ts, group["ts"].to_numpy(), side="left")
                hi = np.searchsorted(launch_ts, (group["ts"] + group["dur"]).to_numpy(), side="left")
                kernel_us = float((cum[hi] - cum[lo]).sum())
            rows.append(
                {
                    "rank": rank,
                    "name": range_ids[name_id],
                    "count": len(group),
                    "host_us": float(group["dur"].sum()),
                    "kernel_us": kernel_us,
                }
            )
    return pd.DataFrame(rows, columns=["rank", "name", "count", "host_us", "kernel_us"])


# ---------------------------------------------------------------- assembly


def _group_table(kernels: pd.DataFrame) -> dict[str, dict[str, float]]:
    total = float(kernels["time_us"].sum())
    out = {}
    for g in kg.GROUPS:
        sel = kernels[kernels["group"].eq(g)]
        t = float(sel["time_us"].sum())
        out[g] = {"time_us": t, "pct": 100.0 * t / total if total > 0 else 0.0, "count": int(sel["count"].sum())}
    return out


def _top(kernels: pd.DataFrame, n: int) -> list[dict[str, Any]]:
    total = float(kernels["time_us"].sum())
    agg = kernels.groupby("name", as_index=False).agg(time_us=("time_us", "sum"), count=("count", "sum"))
    agg = agg.sort_values(["time_us", "name"], ascending=[False, True]).head(n)
    return [
        {
            "name": r.name,
            "short_name": shorten_name(r.name),
            "group": kg.classify(r.name),
            "time_us": float(r.time_us),
            "count": int(r.count),
            "mean_us": float(r.time_us) / r.count if r.count else None,
            "pct": 100.0 * float(r.time_us) / total if total > 0 else 0.0,
        }
        for r in agg.itertuples(index=False)
    ]


def _ranges_table(ranges: pd.DataFrame, step_total_us: float | None) -> dict[str, dict]:
    out = {}
    for name in rg.ALL_RANGES:
        r = ranges[ranges["name"].eq(name)]
        if r.empty:
            continue
        host_us = float(r["host_us"].sum())
        kernel = r["kernel_us"].dropna()
        out[name] = {
            "count": int(r["count"].sum()),
            "host_us": host_us,
            "kernel_us": float(kernel.sum()) if len(kernel) else None,
            "pct_of_steps": 100.0 * host_us / step_total_us if step_total_us else None,
        }
    return out


def _section(b: Breakdown, kernels: pd.DataFrame, ranges: pd.DataFrame, steps: dict, top_n: int):
    groups = _group_table(kernels)
    d = b.as_dict()
    return {
        "steps": steps,
        "breakdown": d,
        "kernel_groups": groups,
        "top_kernels": _top(kernels, top_n),
        "ranges": _ranges_table(ranges, steps.get("total_us")),
        "verdict": verdict(
            d["compute_pct"], d["exposed_comm_pct"], d["idle_pct"], {g: v["pct"] for g, v in groups.items()}
        ),
    }


def analyse(ta, device: str, top_n: int) -> dict[str, Any]:
    """The report dict (without source/metadata, which trace_report adds)."""
    if device not in DEVICES:
        raise TraceReportError(f"--device must be one of {', '.join(DEVICES)}, not {device!r}")
    steps = profiler_steps(ta)
    if device == "gpu":
        parts = _gpu_breakdowns(ta)
        kernels = _gpu_kernels(ta)
    else:
        parts, kernels = _cpu_breakdowns(ta)
    kernels = kernels.assign(group=kernels["name"].map(kg.classify))
    ranges = _range_times(ta, device)

    ranks = []
    for rank in sorted(parts):
        s = steps["per_rank"][rank]
        sec = _section(
            parts[rank],
            kernels[kernels["rank"].eq(rank)],
            ranges[ranges["rank"].eq(rank)],
            s,
            top_n,
        )
        ranks.append({"rank": rank, **sec})
    means = [s["mean_step_us"] for s in steps["per_rank"].values() if s["mean_step_us"] is not None]
    overall_steps = {
        "analysed": sorted({n for s in steps["per_rank"].values() for n in s["analysed"]}),
        "total_us": sum(s["total_us"] for s in steps["per_rank"].values()),
        "mean_step_us": sum(means) / len(means) if means else None,
    }
    overall = _section(Breakdown.combine(list(parts.values())), kernels, ranges, overall_steps, top_n)
    return {
        "device": device,
        "ranks": ranks,
        "overall": overall,
        "profiled_steps": steps["profiled"],
        "dropped_steps": steps["dropped"],
    }
