"""The torchtitan peer: torchtitan's own Trainer and llama3 model at our shape, one process
(an MoE preset: its Qwen3 model with MoE, register_qwen3_moe_spec).

Written against torchtitan 0.2.2 (its Trainer, TrainSpec registry and ConfigManager). What
was checked on 2026-11-30 (CPU only, torch 2.11.0):
  - torchtitan 0.3.0 (the newest on PyPI) does not import with torch 2.11: its trainer needs
    `torch.distributed.fsdp.DataParallelMeshDims` (a newer torch) and the undeclared package
    spmd-types. probe() reports that as the side's 'not runnable' reason.
  - torchtitan 0.2.2 imports with torch 2.11, installed with --no-deps next to the repo's
    torch: torchtitan==0.2.2 torchdata==0.11.0 tyro==1.0.17 einops==0.8.2
    docstring-parser==0.18.0 shtab==1.13.0 typeguard==4.6.1 (it also imports tensorboard and
    tokenizers, which the repo's venv has; `datasets` is stubbed, see below).
  - tests/bench/test_titan_peer.py (run when torchtitan 0.2.x imports) against 0.2.2's
    source: get_train_spec("llama3") and its "8B" flavor with the fields replaced below; the
    spec built on the meta device at the 8-layer llama3-8B shape (MLP 14336, KV 8 x 128,
    parameter count); every llama3 preset's MLP width; every flag of job_args() parsed by its
    ConfigManager to the values meant (an unknown flag is refused, so a renamed one fails);
    Trainer(config), train(), close() and train_step(self, data_iterator); the loader called
    with dp_world_size=, dp_rank=, tokenizer=, job_config= and read as ({'input': tokens},
    labels); build_tokenizer_fn=None and build_validator_fn=None accepted (the attention is
    SDPA, validation is off). Its Trainer trained the tiny preset through this spec and these
    flags on the CPU (its devices patched to the CPU, gloo): 3 steps of 2 micro-batches, fused
    AdamW, fp32 parameters under bf16 autocast, loss ~ln(vocab); with --compile.enable too
    (each block under torch.compile(fullgraph=True) and the loss, inductor on the CPU).
  - Fixed then: the tiny preset's MLP (704 at dim 256) could not be built from the 8B
    flavor's multiplier and rounding; torchtitan's RoPE applied the Llama 3.1 scaling to every
    preset. Not checked without a GPU: NCCL, CUDA SDPA (torchtitan asks cuDNN first, then
    flash, with enable_gqa), inductor's CUDA code, memory at seq 8192, the timings.
On the H200 (the GPU image carries no torchtitan: its wheels travel with
shared/offline-wheels.sh and the pins above) both specs ran: the llama3 one at the dense bench
shape (sessions 3-4) and the Qwen3 MoE one at the MoE bench shape (session 12, its log shows
moe_enabled with 128 grouped_mm experts, top-8); docs/benchmarks/*peers-torchtitan_*.json.

Its best setup at one GPU, as torchtitan configures it: fp32 parameters under bf16 autocast
(torchtitan applies mixed precision through FSDP or AMP; at world size 1 it is AMP), fused
AdamW, no activation checkpointing, torch.compile of the blocks and the loss, the same
micro-batch and global batch (gradient accumulation). Random tokens, like the HF peer, so no
dataset or tokenizer download is needed (the `datasets` module it imports at load time is
stubbed when it is not installed; nothing of it is used).
"""
from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import sys
import time
import types

from training.cli import ArgumentParser

from .peer_common import (add_peer_arguments, check_profile_steps, start_profiler,
                          write_result)

SPEC_NAME = "llama3_bench"


def _stub_datasets() -> None:
    """torchtitan's text-dataset module imports `datasets` at load time; our loader feeds
    random tokens and never calls it."""
    try:
        import datasets  # noqa: F401
        return
    except ImportError:
        pass
    stub = types.ModuleType("datasets")
    stub.Dataset = type("Dataset", (), {})
    stub.IterableDataset = type("IterableDataset", (), {})

    def _unavailable(*_a, **_k):
        raise RuntimeError("datasets is not installed (stubbed for the torchtitan peer)")

    stub.load_dataset = _unavailable
    dist = types.ModuleType("datasets.distributed")
    dist.split_dataset_by_node = _unavailable
    stub.distributed = dist
    sys.modules["datasets"] = stub
    sys.modules["datasets.distributed"] = dist


def probe() -> None:
    """Raise (with the reason) unless this side can run here."""
    import torch

    try:
        version = importlib.metadata.version("torchtitan")
    except importlib.metadata.PackageNotFoundError:
        raise RuntimeError("not runnable here: torchtitan is not installed (PyPI's 0.3.0 "
                           "needs a newer torch than 2.11; 0.2.2 imports on 2.11)") from None
    _stub_datasets()
    try:
        import torchtitan.train  # noqa: F401
        from torchtitan.protocols.train_spec import get_train_spec  # noqa: F401
    except Exception as err:  # noqa: BLE001 - report any import failure as the reason
        raise RuntimeError(f"not runnable here: torchtitan {version} does not import with "
                           f"torch {torch.__version__}: {type(err).__name__}: {err}") from None
    if not torch.cuda.is_available():
        raise RuntimeError("not runnable here: no CUDA device")


class _RandomTokens:
    """An endless loader of ({'input': tokens}, labels) batches of random token ids."""

    def __init__(self, batch: int, seq: int, vocab: int, seed: int = 1234):
        import torch

        self.generator = torch.Generator().manual_seed(seed)
        self.batch, self.seq, self.vocab = batch, seq, vocab

    def __iter__(self):
        import torch

        while True:
            tokens = torch.randint(0, self.vocab, (self.batch, self.seq + 1),
                                   generator=self.generator)
            yield {"input": tokens[:, :-1]}, tokens[:, 1:]

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state_dict: dict) -> None:
        pass


def register_spec(num_layers: int, hidden: int, ffn: int, heads: int, kv_heads: int,
                  vocab: int, seq: int, rope_theta: float, norm_eps: float, mbs: int,
                  rope_scaling: bool = False) -> None:
    """A TrainSpec like torchtitan's llama3 one, with our shape as flavor 'bench' and the
    random-token loader."""
    from torchtitan.protocols.train_spec import get_train_spec, register_train_spec

    base = get_train_spec("llama3")
    flavor = base.model_args["8B"]
    # torchtitan sizes the MLP as int(8 * dim / 3), times ffn_dim_multiplier, rounded up to
    # multiple_of. The 8B flavor's 1.3 and 1024 land on 14336 only for dim 4096 (and on 28672
    # for 8192); no multiplier and multiple_of = our width land on any width >= 8 * dim / 3,
    # which every preset has (the tiny one's 704 at dim 256 included).
    # Its llama3 RoPE always applies the Llama 3.1 frequency scaling (factor 8); factor 1 is
    # the plain RoPE of the presets without rope_scaling. Throughput does not depend on it.
    args = dataclasses.replace(flavor, dim=hidden, n_layers=num_layers,
                               n_heads=heads, n_kv_heads=kv_heads, vocab_size=vocab,
                               multiple_of=ffn, ffn_dim_multiplier=None,
                               max_seq_len=seq, rope_theta=rope_theta, norm_eps=norm_eps,
                               rope_scaling_args=dataclasses.replace(
                                   flavor.rope_scaling_args,
                                   scaling_factor=8.0 if rope_scaling else 1.0))
    # Its formula (FeedForward in torchtitan/models/llama3/model/model.py), to check the width.
    hidden_dim = int(2 * (4 * hidden) / 3)
    if args.ffn_dim_multiplier is not None:
        hidden_dim = int(args.ffn_dim_multiplier * hidden_dim)
    hidden_dim = args.multiple_of * ((hidden_dim + args.multiple_of - 1) // args.multiple_of)
    if hidden_dim != ffn:
        raise RuntimeError(f"torchtitan's MLP would be {hidden_dim} wide, ours is {ffn}")

    # The Trainer calls it as build_dataloader_fn(dp_world_size=, dp_rank=, tokenizer=,
    # job_config=) and iterates what it returns: ({'input': tokens}, labels) on the CPU.
    def loader(dp_world_size, dp_rank, tokenizer, job_config, **_kw):
        return _RandomTokens(job_config.training.local_batch_size,
                             job_config.training.seq_len, vocab, seed=1234 + dp_rank)

    # No tokenizer: only the flex and varlen attentions need one (the 8B flavor is SDPA).
    # No validator: the Trainer only builds one with --validation.enable (off by default).
    spec = dataclasses.replace(base, model_args={"bench": args}, build_dataloader_fn=loader,
                               build_tokenizer_fn=None, build_validator_fn=None)
    register_train_spec(SPEC_NAME, spec)


def register_qwen3_moe_spec(preset, num_layers: int, seq: int) -> None:
    """torchtitan's Qwen3 TrainSpec (its MoE: grouped_mm experts, softmax top-k router with
    the top-k renormalised, its aux-loss-free load balancing) with our MoE preset's shape as
    flavor 'bench', and the random-token loader."""
    import torchtitan.models.qwen3  # noqa: F401 - registers the "qwen3" spec
    from torchtitan.protocols.train_spec import get_train_spec, register_train_spec

    if not preset.qk_layernorm or preset.shared_expert_ffn_hidden_size:
        raise RuntimeError(f"{preset.name} is not a Qwen3-MoE shape (q/k norms, no shared "
                           "expert): torchtitan 0.2.2 has no Mixtral model")
    base = get_train_spec("qwen3")
    flavor = base.model_args["30B-A3B"]
    args = dataclasses.replace(
        flavor, dim=preset.hidden_size, n_layers=num_layers,
        n_heads=preset.num_attention_heads, n_kv_heads=preset.num_query_groups,
        head_dim=preset.head_dim, vocab_size=preset.vocab_size,
        hidden_dim=preset.ffn_hidden_size, norm_eps=preset.norm_epsilon,
        rope_theta=float(preset.rotary_base), max_seq_len=seq, qk_norm=True,
        moe_enabled=True, moe_inter_dim=preset.moe_ffn_hidden_size,
        moe_args=dataclasses.replace(flavor.moe_args, num_experts=preset.num_experts,
                                     top_k=preset.router_topk, num_shared_experts=0))

    def loader(dp_world_size, dp_rank, tokenizer, job_config, **_kw):
        return _RandomTokens(job_config.training.local_batch_size,
                             job_config.training.seq_len, preset.vocab_size, seed=1234 + dp_rank)

    spec = dataclasses.replace(base, model_args={"bench": args}, build_dataloader_fn=loader,
                               build_tokenizer_fn=None, build_validator_fn=None)
    register_train_spec(SPEC_NAME, spec)


def job_args(a, dump_folder: str) -> list[str]:
    """torchtitan CLI overrides for our shape and its best one-GPU setup."""
    words = ["--model.name", SPEC_NAME, "--model.flavor", "bench",
             "--job.dump_folder", dump_folder,
             "--training.local_batch_size", str(a.mbs),
             "--training.global_batch_size", str(a.global_batch),
             "--training.seq_len", str(a.seq_length),
             "--training.steps", str(a.warmup + a.steps),
             "--training.mixed_precision_param", "bfloat16",
             "--training.max_norm", "1.0",
             "--optimizer.name", "AdamW", "--optimizer.lr", "3e-4",
             "--optimizer.implementation", "fused",
             "--lr_scheduler.warmup_steps", "1",
             "--activation_checkpoint.mode", "none",
             "--metrics.log_freq", "1"]
    if a.compile:
        words += ["--compile.enable"]   # its default components: the model and the loss
    return words


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser()
    add_peer_arguments(p, steps=5, warmup=2)
    p.add_argument("--no-compile", dest="compile", action="store_false")
    a = p.parse_args(argv)
    check_profile_steps(p, a)

    probe()
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"),
                       ("LOCAL_WORLD_SIZE", "1"), ("MASTER_ADDR", "localhost"),
                       ("MASTER_PORT", os.environ.get("MASTER_PORT", "29500"))):
        os.environ.setdefault(key, value)

    import torch
    from torchtitan.config import ConfigManager
    from torchtitan.tools.logging import init_logger
    from torchtitan.train import Trainer

    from .peer_common import preset_named

    init_logger()   # as torchtitan's own entry point does: its config, memory and loss lines
    preset = preset_named(a.model)
    if getattr(preset, "num_experts", None):
        register_qwen3_moe_spec(preset, a.num_layers, a.seq_length)
    else:
        register_spec(a.num_layers, preset.hidden_size, preset.ffn_hidden_size,
                      preset.num_attention_heads, preset.num_query_groups, preset.vocab_size,
                      a.seq_length, float(preset.rotary_base), preset.norm_epsilon, a.mbs,
                      rope_scaling=preset.rope_scaling)
    dump = os.path.join(os.path.dirname(os.path.abspath(a.json_out)), "torchtitan")
    config = ConfigManager().parse_args(job_args(a, dump))

    times: list[float] = []

    class TimedTrainer(Trainer):
        def train_step(self, data_iterator):
            torch.cuda.synchronize()
            start = time.perf_counter()
            super().train_step(data_iterator)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
            if profiler is not None:
                profiler.step()

    torch.cuda.reset_peak_memory_stats()
    trainer = TimedTrainer(config)
    profiler = None
    try:
        profiler = start_profiler(a.profile_dir, a.warmup + a.steps)
        trainer.train()
    finally:
        if profiler is not None:
            profiler.stop()
        trainer.close()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()

    write_result(a, times, None, "fp32 params + fp32 AdamW moments (fused), bf16 autocast",
                 torchtitan=importlib.metadata.version("torchtitan"), compile=a.compile)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
