"""Our MoE GPTModel, built from a preset's own Megatron flags, and the Hugging Face Qwen3-MoE
with the same shape (shared by the CPU and GPU MoE tests).

The model's TransformerConfig comes from megatron-core's parser and validate_args applied to
the preset's flags (the words the launcher emits), so what is tested is what a run builds."""
from __future__ import annotations

import contextlib
import os
from unittest import mock

import torch

from tests.model.parity import init_single_rank


def megatron_moe_args(preset, num_layers: int, seq: int, *, dtype=torch.float32,
                      grouped: bool = True, dispatcher: str = "alltoall", extra=(),
                      backend: str = "native", cpu_init: bool = True):
    from megatron.training import arguments

    from tests.launch.helpers import megatron_parser

    words = preset.gpt_args(num_layers, seq) + (
        ["--no-fused-single-qkv-rope"] if preset.qk_layernorm else []) + [
        "--seq-length", str(seq), "--micro-batch-size", "1", "--global-batch-size", "1",
        "--train-iters", "1", "--lr", "1e-3", "--tokenizer-type", "NullTokenizer",
        "--vocab-size", str(preset.vocab_size), "--mock-data",
        "--transformer-impl", "transformer_engine" if backend == "transformer_engine" else "local",
        "--no-rope-fusion", "--no-persist-layer-norm", "--no-masked-softmax-fusion",
        "--no-gradient-accumulation-fusion",
        "--moe-token-dispatcher-type", dispatcher, "--moe-router-dtype", "fp32",
        "--moe-aux-loss-coeff", str(preset.aux_loss_coeff), *extra]
    if cpu_init:
        words.append("--use-cpu-initialization")
    if grouped:
        words.append("--moe-grouped-gemm")
    if dtype == torch.bfloat16:
        words.append("--bf16")
    with mock.patch.dict(os.environ, {"WORLD_SIZE": "1", "RANK": "0"}), \
            mock.patch.object(torch.cuda, "get_device_capability", return_value=(9, 0)):
        args = megatron_parser().parse_args(words)
        args.rank, args.world_size = 0, 1
        arguments.validate_args(args)
    return args


def build_moe_gpt(preset, num_layers: int, backend: str, kernels: str, device: str,
                  dtype=torch.float32, seq: int = 64, grouped: bool = True,
                  dispatcher: str = "alltoall", extra=(), experts: str = "native"):
    """GPTModel with MoE layers on `backend`, as pretrain_gpt builds it; `experts`: the
    MOE_EXPERT_IMPL on the TE backend (native: the native grouped experts beside TE's
    layers)."""
    from megatron.training.argument_utils import core_transformer_config_from_args

    from training import specs
    from training.pretrain_gpt import build_gpt_model

    from training.run import Run

    init_single_rank(device)
    args = megatron_moe_args(preset, num_layers, seq, dtype=dtype, grouped=grouped,
                             dispatcher=dispatcher, extra=extra, backend=backend,
                             cpu_init=device == "cpu")   # on a GPU: initialised there
    args.transformer_backend, args.native_kernels = backend, kernels
    args.moe_expert_impl = experts if backend == "transformer_engine" else "native"
    args.padded_vocab_size = preset.vocab_size
    config = core_transformer_config_from_args(args)
    if backend == "native":   # the native group of the patch table, as pretrain_gpt applies it
        specs.install_native(Run(args=args))
    elif backend == "transformer_engine":
        specs.install_transformer_engine(Run(args=args))
    torch.manual_seed(0)
    with cpu_dispatcher_streams() if device == "cpu" else contextlib.nullcontext():
        gpt = build_gpt_model(args, config)
    return gpt.to(device=device, dtype=dtype), config


class _FakeEvent:
    def synchronize(self):
        pass


class _FakeStream:
    def wait_stream(self, other):
        pass

    def record_event(self):
        return _FakeEvent()


@contextlib.contextmanager
def cpu_dispatcher_streams():
    """Megatron's all-to-all dispatcher copies its token counts to the host on a side CUDA
    stream; on the CPU that stream is a no-op stand-in (the copies are plain .cpu() calls)."""
    from megatron.core.transformer.moe import token_dispatcher

    fake = _FakeStream()
    with mock.patch.object(token_dispatcher.MoEAlltoAllTokenDispatcher, "cuda_dtoh_stream",
                           fake), \
            mock.patch.object(torch.cuda, "current_stream", lambda *a, **k: fake), \
            mock.patch.object(torch.cuda, "stream", lambda s: contextlib.nullcontext()):
        yield


def hf_qwen3_moe(preset, num_layers: int, device: str, dtype=torch.float32):
    """A random Hugging Face Qwen3MoeForCausalLM of the preset's shape, as the bench's HF peer
    builds it (RoPE frequencies kept in fp32 when the weights are cast: see
    tests/model/parity.py)."""
    from training.bench.hf_peer import hf_model_config

    model_class, config = hf_model_config(preset, num_layers, preset.seq_length)
    assert model_class.__name__ == "Qwen3MoeForCausalLM"
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):                 # router weights ~ N(0, 0.02): no ties
        model = model_class(config)
    inv_freq = {n: b.clone() for n, b in model.named_buffers() if "inv_freq" in n}
    model = model.to(dtype=dtype)
    for name, buf in inv_freq.items():
        setattr(model.get_submodule(name.rsplit(".", 1)[0]), name.rsplit(".", 1)[1], buf)
    return model.eval()


@torch.no_grad()
def compare_logits(hf_model, gpt, vocab: int, batch: int, seq: int, device: str) -> dict:
    """tests/model/parity.compare on random tokens; for a bf16 HF model also HF's own bf16
    rounding error (its fp32 forward of the same weights), the yardstick of
    check_bf16_parity."""
    from tests.model.parity import compare, fp32_logits, random_tokens

    tokens = random_tokens(vocab, batch, seq, device)
    bf16 = next(hf_model.parameters()).dtype == torch.bfloat16
    with cpu_dispatcher_streams() if device == "cpu" else contextlib.nullcontext():
        reference = fp32_logits(hf_model, tokens) if bf16 else None
        return compare(hf_model, gpt, tokens, reference)


def moe_parity(preset, layers: int, backend: str, kernels: str, device: str,
               dtype=torch.float32, batch: int = 2, seq: int = 64, prepare=None, **build):
    """Our MoE model and a random HF Qwen3-MoE with the same weights, compared (compare_logits).
    `prepare(gpt)` runs on our model before the weights are copied (tests pick an experts
    implementation there)."""
    from training.moe.hf_qwen3_moe import copy_hf_qwen3_moe_weights

    gpt, _ = build_moe_gpt(preset, layers, backend, kernels, device, dtype, seq=seq, **build)
    if prepare is not None:
        prepare(gpt)
    hf_model = hf_qwen3_moe(preset, layers, device, dtype)
    copy_hf_qwen3_moe_weights(hf_model, gpt)
    gpt.eval()
    return compare_logits(hf_model, gpt, preset.vocab_size, batch, seq, device)
