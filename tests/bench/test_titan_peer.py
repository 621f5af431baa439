"""The torchtitan peer against torchtitan 0.2.2 itself, on the CPU: its llama3 TrainSpec at our
shape, our CLI overrides through its ConfigManager, and its Trainer training the spec (devices
patched to the CPU, gloo, in a child process). Skipped with the reason when torchtitan is not
installed or is not a 0.2.x; a 0.2.x that does not import fails.

`make setup` installs it next to the repo's torch, without its resolver (the Makefile's
TORCHTITAN line: the pinned packages, never a torch wheel).
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import importlib.util
import inspect
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from training.bench import titan_peer
from training.launch.presets import FAMILIES, PRESETS

REPO = Path(__file__).resolve().parents[2]
INSTALL = "make setup installs it (the Makefile's TORCHTITAN line, pip --no-deps)"


def _installed_version() -> str | None:
    try:
        return importlib.metadata.version("torchtitan")
    except importlib.metadata.PackageNotFoundError:
        return None


VERSION = _installed_version()
pytestmark = [
    pytest.mark.skipif(VERSION is None, reason="torchtitan is not installed (the peer is "
                       f"written against torchtitan 0.2.2: {INSTALL})"),
    pytest.mark.skipif(VERSION is not None and not VERSION.startswith("0.2."),
                       reason=f"torchtitan {VERSION} is installed; the peer is written against "
                       f"0.2.2 (0.3.0 does not import with torch 2.11): {INSTALL}"),
]


def peer_args(**overrides) -> argparse.Namespace:
    """What titan_peer.main parses, at the bench's default shape."""
    values = dict(model="llama3-8B", num_layers=8, seq_length=8192, mbs=1, global_batch=8,
                  warmup=2, steps=5, compile=True)
    values.update(overrides)
    return argparse.Namespace(**values)


@pytest.fixture(scope="module")
def titan():
    """torchtitan's modules the peer uses, imported the way the peer imports them (with
    `datasets` stubbed when absent; the stub is taken out of sys.modules afterwards so that
    the other tests' optional-package checks do not see it)."""
    import torch

    stubbed = importlib.util.find_spec("datasets") is None
    titan_peer._stub_datasets()
    try:
        import torchtitan.models.llama3 as llama3
        import torchtitan.protocols.train_spec as train_spec
        import torchtitan.train as train
        from torchtitan.config import ConfigManager
    except Exception as err:  # noqa: BLE001 - name the failure in the test's message
        pytest.fail(f"torchtitan {VERSION} is installed but does not import with torch "
                    f"{torch.__version__}: {type(err).__name__}: {err} (its dependencies: "
                    f"{INSTALL})")
    finally:
        if stubbed:
            sys.modules.pop("datasets.distributed", None)
            sys.modules.pop("datasets", None)
    yield argparse.Namespace(llama3=llama3, train_spec=train_spec, Trainer=train.Trainer,
                             ConfigManager=ConfigManager)


@pytest.fixture
def registry(titan):
    """torchtitan refuses to register a name twice: take ours out before and after."""
    titan.train_spec._extra_train_specs.pop(titan_peer.SPEC_NAME, None)
    yield titan.train_spec
    titan.train_spec._extra_train_specs.pop(titan_peer.SPEC_NAME, None)


def register(preset_name: str, num_layers: int = 8, seq: int = 8192, mbs: int = 1):
    """register_spec exactly as titan_peer.main calls it."""
    p = PRESETS[preset_name]
    titan_peer.register_spec(num_layers, p.hidden_size, p.ffn_hidden_size,
                             p.num_attention_heads, p.num_query_groups, p.vocab_size, seq,
                             float(p.rotary_base), p.norm_epsilon, mbs,
                             rope_scaling=p.rope_scaling)


def test_trainer_api_is_the_one_the_peer_uses(titan):
    Trainer = titan.Trainer
    assert list(inspect.signature(Trainer.__init__).parameters) == ["self", "job_config"]
    assert list(inspect.signature(Trainer.train_step).parameters) == ["self", "data_iterator"]
    assert list(inspect.signature(Trainer.train).parameters) == ["self"]
    assert list(inspect.signature(Trainer.close).parameters) == ["self"]
    fields = {f.name: f for f in dataclasses.fields(titan.train_spec.TrainSpec)}
    for name in ("model_args", "build_dataloader_fn", "build_tokenizer_fn",
                 "build_validator_fn"):
        assert name in fields
    # The peer passes None for both: their types must allow it.
    assert "None" in str(fields["build_tokenizer_fn"].type)
    assert "None" in str(fields["build_validator_fn"].type)


@pytest.mark.slow
def test_the_probe_gets_past_the_imports(titan):
    """runners.availability runs probe() in a fresh interpreter: with torchtitan importable,
    the only reason left on a CPU machine is the missing GPU."""
    import torch

    from training.bench.runners import availability

    if torch.cuda.is_available():
        assert availability("torchtitan") is None
    else:
        assert availability("torchtitan") == "RuntimeError: not runnable here: no CUDA device"


def test_llama3_8B_spec_at_our_shape(titan, registry):
    import torch

    base = registry.get_train_spec("llama3")
    assert "8B" in base.model_args
    register("llama3-8B")
    spec = registry.get_train_spec(titan_peer.SPEC_NAME)
    assert list(spec.model_args) == ["bench"]
    assert spec.build_tokenizer_fn is None and spec.build_validator_fn is None
    assert spec.model_cls is base.model_cls and spec.parallelize_fn is base.parallelize_fn
    args = spec.model_args["bench"]
    assert (args.dim, args.n_layers, args.n_heads, args.n_kv_heads) == (4096, 8, 32, 8)
    assert (args.vocab_size, args.max_seq_len) == (128256, 8192)
    assert args.rope_theta == 500000.0 and args.norm_eps == 1e-5
    assert args.rope_scaling_args.scaling_factor == 1.0   # llama3-8B: plain RoPE
    assert args.attn_type == "sdpa"                        # no tokenizer needed

    with torch.device("meta"):
        model = spec.model_cls(args)
    assert len(model.layers) == 8
    block = model.layers["0"]
    assert tuple(block.feed_forward.w1.weight.shape) == (14336, 4096)
    assert tuple(block.feed_forward.w2.weight.shape) == (4096, 14336)
    assert tuple(block.attention.wq.weight.shape) == (4096, 4096)
    assert tuple(block.attention.wk.weight.shape) == (8 * 128, 4096)
    assert tuple(model.output.weight.shape) == (128256, 4096)
    h, f, kv, v, layers = 4096, 14336, 8 * 128, 128256, 8
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * f + 2 * h   # attention, MLP, two norms
    expected = layers * per_layer + 2 * v * h + h           # untied embedding and output
    assert sum(p.numel() for p in model.parameters()) == expected


@pytest.mark.parametrize("size", sorted(FAMILIES["llama3"][0]))
def test_every_llama3_preset_lands_on_its_mlp_width(titan, registry, size):
    import torch

    name = FAMILIES["llama3"][0][size]
    register(name, num_layers=1, seq=1024)
    args = registry.get_train_spec(titan_peer.SPEC_NAME).model_args["bench"]
    with torch.device("meta"):
        model = registry.get_train_spec(titan_peer.SPEC_NAME).model_cls(args)
    assert model.layers["0"].feed_forward.w1.out_features == PRESETS[name].ffn_hidden_size
    assert args.rope_scaling_args.scaling_factor == (8.0 if PRESETS[name].rope_scaling else 1.0)


def test_an_mlp_width_torchtitan_cannot_build_is_refused(titan, registry):
    # Narrower than 8 * dim / 3: torchtitan's rounding cannot land on it.
    with pytest.raises(RuntimeError, match="MLP would be 16384 wide, ours is 8192"):
        titan_peer.register_spec(8, 4096, 8192, 32, 8, 128256, 8192, 500000.0, 1e-5, 1)


@pytest.mark.parametrize("compile_", [True, False])
def test_job_args_parse_in_torchtitan(titan, tmp_path, compile_):
    config = titan.ConfigManager().parse_args(
        titan_peer.job_args(peer_args(compile=compile_), str(tmp_path / "dump")))
    assert config.model.name == titan_peer.SPEC_NAME and config.model.flavor == "bench"
    assert config.job.dump_folder == str(tmp_path / "dump")
    t = config.training
    assert (t.local_batch_size, t.global_batch_size, t.seq_len, t.steps) == (1, 8, 8192, 7)
    assert t.dtype == "float32" and t.mixed_precision_param == "bfloat16"  # fp32 params, bf16
    assert t.max_norm == 1.0
    assert config.optimizer.name == "AdamW" and config.optimizer.lr == 3e-4
    assert config.optimizer.implementation == "fused"
    assert config.lr_scheduler.warmup_steps == 1
    assert config.activation_checkpoint.mode == "none"
    assert config.metrics.log_freq == 1
    assert config.compile.enable is compile_
    assert set(config.compile.components) == {"model", "loss"}
    # One process: no parallelism, no checkpoint, no validation (so no validator is built).
    p = config.parallelism
    assert (p.tensor_parallel_degree, p.pipeline_parallel_degree,
            p.context_parallel_degree, p.data_parallel_replicate_degree) == (1, 1, 1, 1)
    assert not config.checkpoint.enable and not config.validation.enable


def test_a_flag_torchtitan_does_not_know_is_refused(titan, tmp_path):
    """So a flag renamed in another torchtitan fails the test above, not silently."""
    words = titan_peer.job_args(peer_args(), str(tmp_path)) + ["--training.no_such_flag", "1"]
    with pytest.raises(SystemExit):
        titan.ConfigManager().parse_args(words)


def test_the_loader_feeds_what_the_trainer_reads(titan, registry, tmp_path):
    import torch

    register("tiny", num_layers=2, seq=64, mbs=2)
    config = titan.ConfigManager().parse_args(titan_peer.job_args(
        peer_args(model="tiny", seq_length=64, mbs=2, global_batch=4), str(tmp_path)))
    spec = registry.get_train_spec(titan_peer.SPEC_NAME)
    # The keywords the Trainer passes (torchtitan/train.py, Trainer.__init__).
    loader = spec.build_dataloader_fn(dp_world_size=1, dp_rank=0, tokenizer=None,
                                      job_config=config)
    input_dict, labels = next(iter(loader))
    assert list(input_dict) == ["input"]
    tokens = input_dict["input"]
    assert tokens.shape == labels.shape == (2, 64) and tokens.dtype == torch.int64
    assert torch.equal(tokens[:, 1:], labels[:, :-1])   # labels are the next tokens
    assert 0 <= int(tokens.min()) and int(tokens.max()) < PRESETS["tiny"].vocab_size


def cpu_trainer_run(compile_: bool, dump: str) -> dict:
    """titan_peer.main's path with torchtitan's devices patched to the CPU (gloo), at the tiny
    preset: register_spec, job_args, ConfigManager, a Trainer subclass that overrides
    train_step, train(), close(). Runs in a child process (torchtitan disables Python's
    garbage collector and initialises a process group)."""
    import socket
    import types

    import torch

    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"),
                       ("LOCAL_WORLD_SIZE", "1"), ("MASTER_ADDR", "localhost"),
                       ("MASTER_PORT", str(port))):
        os.environ[key] = value
    titan_peer._stub_datasets()
    import torchtitan.components.metrics as metrics
    import torchtitan.distributed.parallel_dims as parallel_dims
    import torchtitan.distributed.utils as dist_utils
    import torchtitan.tools.utils as tools_utils
    from torchtitan.config import ConfigManager
    from torchtitan.train import Trainer

    # torchtitan picks "cuda" when no accelerator is found; the CPU stands in for it.
    cpu = types.SimpleNamespace(
        set_device=lambda _d: None, current_device=lambda: 0, synchronize=lambda *_a: None,
        get_device_name=lambda *_a: "cpu",
        get_device_properties=lambda *_a: types.SimpleNamespace(total_memory=2**34),
        reset_peak_memory_stats=lambda *_a: None, empty_cache=lambda: None,
        memory_stats=lambda *_a: {})
    for module in (tools_utils, metrics, dist_utils, parallel_dims):
        module.device_type = "cpu"
        if hasattr(module, "device_module"):
            module.device_module = cpu

    a = peer_args(model="tiny", num_layers=2, seq_length=64, mbs=2, global_batch=4,
                  warmup=1, steps=2, compile=compile_)
    register(a.model, a.num_layers, a.seq_length, a.mbs)
    config = ConfigManager().parse_args(titan_peer.job_args(a, dump))
    calls: list[int] = []
    losses: list[float] = []

    class TimedTrainer(Trainer):
        def train_step(self, data_iterator):
            super().train_step(data_iterator)
            calls.append(self.step)

        def forward_backward_step(self, **kwargs):
            loss = super().forward_backward_step(**kwargs)
            losses.append(loss.item())
            return loss

    trainer = TimedTrainer(config)
    try:
        trainer.train()
    finally:
        trainer.close()
        backend = torch.distributed.get_backend()
        torch.distributed.destroy_process_group()
    model = trainer.model_parts[0]
    optimizer = trainer.optimizers.optimizers[0]
    amp = trainer.maybe_enable_amp
    gas = trainer.gradient_accumulation_steps
    return {
        "backend": backend, "calls": calls, "steps": trainer.step, "gas": gas,
        "ntokens_seen": trainer.ntokens_seen,
        "step_losses": [sum(losses[i:i + gas]) for i in range(0, len(losses), gas)],
        "optimizer": type(optimizer).__name__, "fused": optimizer.defaults.get("fused"),
        "param_dtypes": sorted({str(p.dtype) for p in model.parameters()}),
        "amp": type(amp).__name__, "amp_dtype": str(getattr(amp, "fast_dtype", None)),
        "mlp_width": model.layers["0"].feed_forward.w1.out_features,   # compiled: forwarded
        "block_types": sorted({type(b).__name__ for b in model.layers.values()}),
        "loss_compiled": hasattr(trainer.loss_fn, "_torchdynamo_orig_callable"),
    }


def run_child(compile_: bool, tmp_path: Path, timeout: int) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + ([env["PYTHONPATH"]]
                                                        if env.get("PYTHONPATH") else []))
    proc = subprocess.run([sys.executable, __file__, "--cpu-run", str(int(compile_)),
                           str(tmp_path / "dump")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def check_run(run: dict) -> None:
    vocab = PRESETS["tiny"].vocab_size
    assert run["backend"] == "gloo"
    assert run["calls"] == [1, 2, 3] and run["steps"] == 3   # warmup + steps, our train_step
    assert run["gas"] == 2                                   # global 4 / micro-batch 2
    assert run["ntokens_seen"] == 3 * 4 * 64
    assert run["optimizer"] == "AdamW" and run["fused"] is True
    assert run["param_dtypes"] == ["torch.float32"]          # fp32 parameters ...
    assert run["amp"] == "autocast" and run["amp_dtype"] == "torch.bfloat16"  # ... bf16 AMP
    assert run["mlp_width"] == PRESETS["tiny"].ffn_hidden_size
    assert len(run["step_losses"]) == 3
    for loss in run["step_losses"]:   # the mean cross-entropy of random tokens, ~ln(vocab)
        assert math.isfinite(loss) and 0.8 * math.log(vocab) < loss < 1.5 * math.log(vocab)


@pytest.mark.slow
def test_the_trainer_trains_the_spec_on_cpu(titan, tmp_path):
    run = run_child(False, tmp_path, timeout=300)
    check_run(run)
    assert run["block_types"] == ["TransformerBlock"] and not run["loss_compiled"]


@pytest.mark.slow
def test_the_trainer_compiles_the_spec_on_cpu(titan, tmp_path):
    """--compile.enable: each block under torch.compile(fullgraph=True), and the loss (about
    30 s of inductor on a 2-core CPU)."""
    run = run_child(True, tmp_path, timeout=900)
    check_run(run)
    assert run["block_types"] == ["OptimizedModule"] and run["loss_compiled"]


if __name__ == "__main__":   # the child of run_child
    if sys.argv[1:2] == ["--cpu-run"]:
        print(json.dumps(cpu_trainer_run(bool(int(sys.argv[2])), sys.argv[3])))
