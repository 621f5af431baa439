"""The exit statuses of a supervised run (training.resilience.supervise), for a scheduler.

  0    done: the run trained to its last iteration
  2    a user error (bad input, a refused flag): never restarted
  75   PREEMPTED: a signal (SIGTERM, Slurm's warning signal) arrived, the workers saved a
       checkpoint at the next step boundary and stopped; requeue the job and it resumes
       (sysexits' EX_TEMPFAIL: "try again later"). launchers/slurm/train.sbatch requeues on it
  124  HUNG: no rank made progress for HANG_TIMEOUT seconds (the status of coreutils' timeout);
       the stacks are in the run folder's stacks/
  143  STOPPED: a signal stopped the run with nothing saved (no SAVE), 128 + SIGTERM
  else the failed attempt's own status (torchrun's 1 for a crashed worker), once RESTARTS are
       spent or the same iteration failed twice
"""
from __future__ import annotations

DONE = 0
USER_ERROR = 2
PREEMPTED = 75
HUNG = 124
STOPPED = 143
