"""The seed of an MLPerf run: drawn per run from the system's entropy source, never fixed.

MLPerf's rules want each run's seed drawn from a clock or an entropy source, and mlperf-logging's
seed checker refuses a submission in which two runs log the same seed on the same line. The
recipe draws one per launch (os.urandom through `secrets`), shows it in the startup table with
its source and stores it in manifest.json; every rank uses node 0's (the patch table's
mlperf_seed entry); mlperf.log logs it. Below 2^30, so that Megatron's per-rank offsets
(+100 x pipeline rank, +10 x data-parallel rank) keep it a valid numpy seed.
"""
from __future__ import annotations

import secrets

LIMIT = 2**30


def draw() -> int:
    """A seed in [1, 2^30), from os.urandom."""
    return 1 + secrets.randbelow(LIMIT - 1)
