"""A training start on the GPU prints no third-party warning line before the first iteration:
they are in the run folder's third_party.log, with one line that counts them (training/quiet.py)."""
from __future__ import annotations

import re

import pytest

from tests.gpu.test_train_gpu import _train

pytestmark = pytest.mark.gpu

THIRD_PARTY = re.compile(r"\b\w*Warning\b|warnings\.warn\(|^WARNING:|^W\d{4} |one_logger|"
                         r"Apex is not installed|IS DEPRECATED")
# Megatron's listing of its arguments (`  enable_one_logger ...... True`): the run's
# configuration, not a notice (seen on the H200: the one_logger pattern matched these)
ARGUMENT_LISTING = re.compile(r"^  \w+ \.{3,} ")


def test_the_start_is_quiet_and_the_notices_are_in_the_run_folder(tmp_path):
    run = _train(tmp_path, "quiet", TOTAL_ITERS="3")
    log = (run / "train.log").read_text()
    first = re.search(r"^ *\[.*\] iteration +1/|^ iteration +1/", log, re.M)
    assert first is not None, log[-3000:]
    before = log[:first.start()]
    noisy = [line for line in before.splitlines() if THIRD_PARTY.search(line)
             and not ARGUMENT_LISTING.match(line)
             and not line.startswith(("[quiet] ", "WARNING [", "INFO [", "CORRECTION ["))]
    assert not noisy, "\n".join(noisy[:20])
    assert "[quiet] " in log and (run / "third_party.log").exists()
    assert (run / "third_party.log").read_text().strip()
