"""The one-line verdict of a trace report, from the temporal breakdown.

Rules (checked on the percentages of the analysed span):
1. exposed communication >= EXPOSED_COMM_BOUND_PCT  -> "communication-bound"
2. idle >= IDLE_BOUND_PCT                            -> "idle/launch-bound" (host overhead: the
   device waits for the host to enqueue work, or for another rank)
   When both hold, the larger share leads and the other is named in the line.
3. otherwise                                          -> "compute-bound", naming the compute
   group with the most kernel time.
"""

from __future__ import annotations

from typing import Final

from training.profiling import kernel_groups as kg

EXPOSED_COMM_BOUND_PCT: Final = 20.0
IDLE_BOUND_PCT: Final = 20.0

COMMUNICATION_BOUND: Final = "communication-bound"
IDLE_BOUND: Final = "idle/launch-bound"
COMPUTE_BOUND: Final = "compute-bound"

RULES: Final = (
    f"{COMMUNICATION_BOUND} when exposed communication >= {EXPOSED_COMM_BOUND_PCT:g}% of the span; "
    f"{IDLE_BOUND} (host overhead) when idle >= {IDLE_BOUND_PCT:g}%; when both hold the larger leads; "
    f"otherwise {COMPUTE_BOUND}, naming the compute group with the most kernel time"
)

_COMPUTE_GROUPS: Final = (kg.GEMM, kg.ATTENTION, kg.NORM_ELEMENTWISE, kg.OTHER)


def verdict(
    compute_pct: float, exposed_comm_pct: float, idle_pct: float, group_pct: dict[str, float]
) -> dict[str, str]:
    """{"kind": ..., "line": ...} for one rank or the whole run.

    ``group_pct`` maps kernel groups to their share of kernel time (percent).
    """
    comm_hit = exposed_comm_pct >= EXPOSED_COMM_BOUND_PCT
    idle_hit = idle_pct >= IDLE_BOUND_PCT
    comm_text = f"{exposed_comm_pct:.0f}% exposed communication"
    idle_text = f"{idle_pct:.0f}% idle"
    if comm_hit and (not idle_hit or exposed_comm_pct >= idle_pct):
        line = f"{COMMUNICATION_BOUND}: {comm_text}" + (f" (also {idle_text})" if idle_hit else "")
        return {"kind": COMMUNICATION_BOUND, "line": line}
    if idle_hit:
        line = f"{IDLE_BOUND} (host overhead): {idle_text}" + (f" (also {comm_text})" if comm_hit else "")
        return {"kind": IDLE_BOUND, "line": line}
    line = f"{COMPUTE_BOUND}: {compute_pct:.0f}% compute"
    compute_groups = {g: group_pct.get(g, 0.0) for g in _COMPUTE_GROUPS if group_pct.get(g, 0.0) > 0}
    if compute_groups:
        top = max(compute_groups, key=compute_groups.__getitem__)
        line += f", top group {top} ({compute_groups[top]:.0f}% of kernel time)"
    return {"kind": COMPUTE_BOUND, "line": line}
