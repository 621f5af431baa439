"""Record a closed-division mlperf.log on the CPU, through the project's own mllog path.

    python -m tests.mlperf.record_closed_log     # writes the two files below into tests/mlperf/data/

The closed recipe's launch (examples/mlperf/llama31_8b/config.yaml, 8 GPUs) is resolved and its
Megatron args parsed and validated by megatron-core; the real listener
(training.mlperf.events.MLPerfRun) then logs through training/loop_hooks.wrap_loop over the
stand-in Megatron loop of fake_megatron.py (test_mllog_run.run_fake). Only the eval losses are
made up (test_mllog_run.CLOSED_LOSSES: the 6th evaluation reaches the target). Written:

  cpu_closed_fake_megatron.mlperf.log           the log
  cpu_closed_fake_megatron_summary.json         training.mlperf.summary's account of it, with
                                                the target the run was given (the recipe's)

test_recorded_logs.py reads both, as it reads the H200 short run's log and summary.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
NAME = "cpu_closed_fake_megatron"


def main(out: Path = DATA) -> Path:
    from training.mlperf import summary

    from .datasets import make_datasets, make_large_valid
    from .test_mllog_run import CLOSED_LOSSES, run_fake

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        data = make_datasets(root)
        data["VALID_DATA_PATH"] = make_large_valid(root, data["TOKENIZER_MODEL"])
        env = {"EXPERIMENT_DIR": str(root / "experiment"), "PATH": os.environ.get("PATH", ""),
               "DRY_RUN": "1", **data}
        run, _, _, log = run_fake(env, CLOSED_LOSSES, save="/ckpt", GPUS_PER_NODE=8)
        recorded = out / f"{NAME}.mlperf.log"
        shutil.copy(log, recorded)
    result = summary.summarize(recorded, target=run.config.target_eval_loss)
    result["log"] = f"tests/mlperf/data/{recorded.name}"
    (out / f"{NAME}_summary.json").write_text(json.dumps(result, indent=2) + "\n")
    return recorded


if __name__ == "__main__":
    print(main(Path(sys.argv[1]) if len(sys.argv) > 1 else DATA))
