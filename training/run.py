"""One training run under torchrun: the state Megatron's callbacks and our patches share.

pretrain_gpt.py builds one Run from the parsed arguments; the patch table
(training.megatron_patches) binds its replacements to it, and the forward step and dataset
provider read it. Nothing of a run lives in module globals.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class Run:
    args: Any                                   # Megatron's parsed and validated arguments
    precision: str = "bf16"
    rank: int = 0
    mlperf: Any = None                          # training.mlperf.events.MLPerfRun, or None
    output_processor: Callable | None = None    # the fused linear cross-entropy, or None
    native: Any = None                          # training.specs.NativeSetup: what is in place
    transformer_engine: Any = None              # the same for the TE backend
    loop: Any = None                            # training.loop_hooks.RunState, from the set-up
    eval_iteration: int | None = None           # the evaluation under way (loop hooks)
    eval_loss: float | None = None              # its loss, on the rank that computed it
    data_announced: bool = False                # listeners told before the data is read
    patched: list[str] = field(default_factory=list)   # patch names applied, in order
    heartbeat: Any = None                       # training.resilience.heartbeat.HeartbeatWriter

    @property
    def listeners(self) -> list:
        """Loop listeners (training.loop_hooks): told about training and each evaluation."""
        return [self.mlperf] if self.mlperf is not None else []
