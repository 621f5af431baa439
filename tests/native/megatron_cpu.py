"""Megatron's DDP and distributed optimizer on the CPU, in one gloo process, for tests.

megatron-core writes for CUDA in a few places that do not matter at one CPU rank: tensors
made with device='cuda', `.cuda()`, `param.type()` compared with 'torch.cuda.*Tensor' names,
`torch.cuda.current_device()`, `torch.cuda.synchronize()`. `on_cpu()` answers those for
the CPU (a torch function mode and two attributes, undone on exit); the rest of Megatron's
code (bucketing, sharding, the precision-aware path, checkpoint formats) runs as it is.
"""
from __future__ import annotations

import contextlib

import torch
from torch.overrides import TorchFunctionMode


class _CudaNamesOnCpu(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        device = kwargs.get("device")
        if device is not None and str(device).startswith("cuda"):
            kwargs["device"] = "cpu"
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            name = func(*args)
            return name if ".cuda." in name else name.replace("torch.", "torch.cuda.", 1)
        return func(*args, **kwargs)


@contextlib.contextmanager
def on_cpu():
    from tests.model.parity import init_single_rank

    saved = torch.cuda.current_device, torch.cuda.synchronize
    init_single_rank("cpu")  # gloo, Megatron's model-parallel state; current_device -> cpu
    torch.cuda.synchronize = lambda *a, **k: None
    try:
        with _CudaNamesOnCpu():
            yield
    finally:
        torch.cuda.current_device, torch.cuda.synchronize = saved


def tiny_model():
    """A Megatron module with a matrix, a norm-like vector (no weight decay) and another
    matrix, and its sharded state dict for Megatron's dist_checkpointing."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensor
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.module import MegatronModule

    class Tiny(MegatronModule):
        def __init__(self, config):
            super().__init__(config)
            self.a = torch.nn.Linear(16, 48, bias=False)
            self.norm = torch.nn.Parameter(torch.ones(48))
            self.b = torch.nn.Linear(48, 8, bias=False)

        def forward(self, x):
            return self.b(self.a(x) * self.norm)

        def sharded_state_dict(self, prefix="", sharded_offsets=(), metadata=None):
            return {f"{prefix}{k}": ShardedTensor.from_rank_offsets(f"{prefix}{k}", v,
                                                                    replica_id=0)
                    for k, v in self.state_dict(keep_vars=True).items()}

    config = TransformerConfig(num_layers=1, hidden_size=16, num_attention_heads=1, bf16=True,
                               params_dtype=torch.bfloat16, use_cpu_initialization=True)
    return Tiny(config).to(torch.bfloat16), config
