"""Interval arithmetic for the temporal breakdown, with HTA's definitions.

HTA (hta.analyzers.breakdown_analysis / communication_analysis) defines, per rank, over the
device events (kernels, memcpy, memset) of the analysed steps:

    span         end of the last event - start of the first event   ("kernel_time")
    idle         span - union(all events)
    compute      union(computation events)
    non-compute  span - idle - compute
    overlap      |union(comm) & union(compute)| / |union(comm)|      (get_comm_comp_overlap)

From these the report derives exposed communication = |union(comm) - union(compute)| and
"other" = non-compute - exposed communication (memcpy/memset/sync not hidden by compute or
communication). compute + exposed communication + other + idle = span.

On GPU traces the report takes idle/compute/non-compute/overlap from HTA's own analyses and
only uses ``union_length``/``intersection_length`` here for the communication total. HTA's
analyses select events by GPU stream, so they cannot run on a CPU-only trace; for
``--device cpu`` the report calls ``breakdown`` below on CPU operator intervals instead. A
test checks that ``breakdown`` reproduces HTA's numbers on a GPU trace, so both modes share
one definition.

Intervals are merged with HTA's ``merge_kernel_intervals``.
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass

import pandas as pd
from hta.utils.utils import merge_kernel_intervals


def merged(intervals: pd.DataFrame) -> pd.DataFrame:
    """Non-overlapping [ts, end) intervals covering ``intervals`` (columns ts, dur)."""
    if intervals.empty:
        return pd.DataFrame({"ts": pd.Series(dtype="int64"), "end": pd.Series(dtype="int64")})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # HTA 0.5.0 uses sort_values(inplace=True), deprecated in pandas 3.1
        return merge_kernel_intervals(intervals[["ts", "dur"]].copy()).reset_index(drop=True)


def union_length(intervals: pd.DataFrame) -> float:
    m = merged(intervals)
    return float((m["end"] - m["ts"]).sum())


def intersection_length(a: pd.DataFrame, b: pd.DataFrame) -> float:
    """|union(a) & union(b)| for two sets of intervals (columns ts, dur)."""
    ma, mb = merged(a), merged(b)
    if ma.empty or mb.empty:
        return 0.0
    total = 0.0
    i = j = 0
    a_ts, a_end = ma["ts"].to_numpy(), ma["end"].to_numpy()
    b_ts, b_end = mb["ts"].to_numpy(), mb["end"].to_numpy()
    while i < len(a_ts) and j < len(b_ts):
        lo, hi = max(a_ts[i], b_ts[j]), min(a_end[i], b_end[j])
        if hi > lo:
            total += float(hi - lo)
        if a_end[i] < b_end[j]:
            i += 1
        else:
            j += 1
    return total


@dataclass(frozen=True)
class Breakdown:
    """Times in microseconds over one rank's analysed span."""

    span_us: float
    compute_us: float
    exposed_comm_us: float
    other_us: float
    idle_us: float
    comm_total_us: float
    comm_overlapped_us: float

    def pct(self, value: float) -> float:
        return 100.0 * value / self.span_us if self.span_us > 0 else 0.0

    def as_dict(self) -> dict[str, float]:
        d = asdict(self)
        for key in ("compute", "exposed_comm", "other", "idle", "comm_total"):
            d[f"{key}_pct"] = self.pct(d[f"{key}_us"])
        d["comm_overlap_pct"] = (
            100.0 * self.comm_overlapped_us / self.comm_total_us if self.comm_total_us > 0 else None
        )
        return d

    @staticmethod
    def combine(parts: list["Breakdown"]) -> "Breakdown":
        """The overall breakdown: times summed over ranks (percentages then weigh ranks by span)."""
        return Breakdown(*(sum(getattr(p, f) for p in parts) for f in Breakdown.__dataclass_fields__))


def breakdown(events: pd.DataFrame) -> Breakdown:
    """HTA's temporal breakdown for events with columns ts, dur and kind in {compute, comm, other}."""
    if events.empty:
        raise ValueError("no events to break down")
    start = float(events["ts"].min())
    end = float((events["ts"] + events["dur"]).max())
    span = end - start
    busy = union_length(events)
    compute_ev = events[events["kind"].eq("compute")]
    comm_ev = events[events["kind"].eq("comm")]
    compute = union_length(compute_ev)
    comm_total = union_length(comm_ev)
    overlapped = intersection_length(comm_ev, compute_ev)
    exposed = comm_total - overlapped
    idle = span - busy
    other = span - idle - compute - exposed
    return Breakdown(
        span_us=span,
        compute_us=compute,
        exposed_comm_us=exposed,
        other_us=other,
        idle_us=idle,
        comm_total_us=comm_total,
        comm_overlapped_us=overlapped,
    )


def self_times(ops: pd.DataFrame) -> pd.Series:
    """Exclusive ("self") time of each event: its duration minus that of its direct children.

    ``ops`` has columns pid, tid, ts, dur; events on one thread nest (as torch.profiler writes
    them). Used for the CPU timeline's top-operator table, where parent ops (aten::linear)
    enclose the ops doing the work (aten::addmm). HTA's CallGraph computes the same stack but
    fails on current pandas/numpy (object arrays in np.unique), so the stack walk is here.
    """
    result = pd.Series(0.0, index=ops.index)
    for _, thread in ops.sort_values(["ts", "dur"], ascending=[True, False]).groupby(["pid", "tid"], sort=False):
        stack: list[tuple[object, float]] = []  # (index, end)
        child_sum: dict[object, float] = {}
        for idx, ts, dur in zip(thread.index, thread["ts"].to_numpy(), thread["dur"].to_numpy()):
            while stack and ts >= stack[-1][1]:
                stack.pop()
            if stack:
                parent = stack[-1][0]
                child_sum[parent] = child_sum.get(parent, 0.0) + float(dur)
            stack.append((idx, float(ts + dur)))
            child_sum.setdefault(idx, 0.0)
        for idx, dur in zip(thread.index, thread["dur"].to_numpy()):
            # HTA rounds ts and dur to whole microseconds, so children can exceed a parent by a rounding step.
            result[idx] = max(float(dur) - child_sum[idx], 0.0)
    return result
