"""Export a Megatron checkpoint and print the resident memory it added at its peak (JSON).

    python tests/checkpoint/export_memory_worker.py WARMUP_CKPT WARMUP_OUT CKPT OUT

The warm-up export (a tiny checkpoint) loads every library first; then the kernel's
high-water mark (VmHWM) restarts from the resident memory of that moment
(training.checkpoint.bench's reset, as its import measurement does), so the peak's growth
over it is what the export itself held at once.
"""
import json
import sys
from pathlib import Path

from training.checkpoint.bench import _reset_peak, _status_bytes
from training.checkpoint.convert import export_checkpoint

warm_ckpt, warm_out, ckpt, out = map(Path, sys.argv[1:5])
export_checkpoint(warm_ckpt, warm_out, progress=False)
if not _reset_peak():
    print(json.dumps({"skip": "no /proc/self/clear_refs here"}))
    sys.exit(0)
before = _status_bytes("VmRSS")
export_checkpoint(ckpt, out, progress=False)
print(json.dumps({"before": before, "after": _status_bytes("VmHWM")}))
