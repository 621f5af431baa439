"""The ROCm fork's closing summary lines, after ours, from the steady-state summary (issue 20):
its users' scripts grep them."""
from __future__ import annotations

import re
import types

from training.fork_summary import GIB, fork_summary_lines
from training.metrics import StepRecord, steady_state

# The fork's scripts grep their log with these (train_llama3.sh, commit 32d5d428): the last
# four lines they print start with these words.
FORK_WORDS = ("throughput per GPU: ", "elapsed time per iteration: ", "tokens/GPU/s: ",
              "mem usages: ")


def _summary() -> dict:
    # 2 GPUs, 8192 tokens per step per run, steps of 0.5 s after a 2-iteration warm-up
    records = [StepRecord(i, 0.5 if i > 2 else 3.0, 8192) for i in range(1, 11)]
    summary = steady_state(records, 2, world_size=2, flops_token=6e9, peak=None)
    summary["peak_reserved_gib_max_over_ranks"] = 35.0
    return summary


def test_the_four_lines_in_the_forks_words_and_values():
    lines = fork_summary_lines(_summary(), device_memory_bytes=140 * GIB)
    assert [line[:len(w)] for line, w in zip(lines, FORK_WORDS)] == list(FORK_WORDS)
    values = [float(line.rsplit(": ", 1)[1]) for line in lines]
    tokens_per_gpu = 8192 / 0.5 / 2
    assert values == [tokens_per_gpu * 6e9 / 1e12, 500.0, tokens_per_gpu, 0.25]
    # the fork's own extraction of the number from such a line
    assert re.match(r"throughput per GPU: ([0-9.]+)$", lines[0])


def test_nothing_when_not_measured_and_no_memory_line_without_the_device():
    assert fork_summary_lines({"measured": False, "reason": "x"}, 1) == []
    assert len(fork_summary_lines(_summary(), None)) == 3


def test_the_run_prints_them_after_its_own_summary(capsys):
    from training.pretrain_gpt import _report

    _report(types.SimpleNamespace(run_dir=None), {**_summary(), "mfu": None, "warmup_iters": 2,
                                                  "peak_allocated_gib_max_over_ranks": 30.0},
            None, {})
    out = capsys.readouterr().out.splitlines()
    ours = next(i for i, line in enumerate(out) if line.startswith("[summary] tokens/s/GPU"))
    assert [line.split(": ")[0] + ": " for line in out[ours + 1:ours + 4]] == list(FORK_WORDS[:3])
