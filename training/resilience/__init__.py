"""Runs that survive: preemption, restarts and hangs (issue 52).

  supervise    the process between the launcher's bash entry and torchrun: forwards a
               preemption signal to the workers (save at the next step, exit for a requeue),
               restarts a crashed run from its last complete checkpoint (RESTARTS, back-off,
               restarts.jsonl), and ends a run whose ranks stopped making progress
               (HANG_TIMEOUT) with every rank's stack and a one-line diagnosis
  heartbeat    the workers' side: one small file per rank, written at each iteration by the
               loop hooks, and the faulthandler dump armed with it; the watchdog's reading
               and diagnosis of them
  preemption   the workers' side of a signal: which iteration was saved, in the run folder
  exits        the exit statuses a scheduler sees
  torchrun     torchrun with a failed worker told in one line (the supervisor runs it)
  rehearsal    kill, restart, extend, compare: the GPU rehearsal's driver

The supervisor, heartbeats' reading and exits use the standard library only (they run above
torchrun; which checkpoint is the last complete one is training.checkpoint_scan's, the
launcher's rule, itself the standard library only); `heartbeat.HeartbeatWriter` and `preemption` run in the workers.
"""
