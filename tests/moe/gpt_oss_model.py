"""Our gpt-oss GPTModel, built from a preset's own Megatron flags, and a random Hugging Face
GptOssForCausalLM of the same shape with every part made to matter (shared by the CPU parity,
checkpoint and GPU tests)."""
from __future__ import annotations

import contextlib

import torch

from training.moe.gpt_oss import hf_config

from tests.model.parity import random_tokens
from tests.moe.model import build_moe_gpt, compare_logits, cpu_dispatcher_streams

# what a launch of a gpt-oss preset turns off (guard gpt_oss_kernels), and no compiled fusions
EXTRA = ("--no-fused-single-qkv-rope", "--no-bias-dropout-fusion", "--no-bias-swiglu-fusion")


def hf_gpt_oss(preset, num_layers: int, device: str = "cpu", dtype=torch.float32, seed: int = 0):
    """A random GptOssForCausalLM (eager attention: Hugging Face's own sinks and window). Its
    initialisation leaves the expert biases at zero and the sinks near zero; they are drawn here
    so that dropping either changes the logits."""
    from transformers import GptOssForCausalLM

    config = hf_config(preset, num_layers)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    with torch.device(device):
        model = GptOssForCausalLM(config)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("sinks", "_bias", "proj.bias")):
                param.copy_(torch.randn(param.shape, generator=gen) * (
                    1.0 if name.endswith("sinks") else 0.1))
    inv_freq = {n: b.clone() for n, b in model.named_buffers() if "inv_freq" in n}
    model = model.to(dtype=dtype)
    for name, buf in inv_freq.items():       # RoPE frequencies stay fp32 (tests/model/parity)
        setattr(model.get_submodule(name.rsplit(".", 1)[0]), name.rsplit(".", 1)[1], buf)
    return model.eval()


def build_gpt_oss(preset, num_layers: int, device: str = "cpu", dtype=torch.float32,
                  seq: int = 64, backend: str = "native", **build):
    gpt, config = build_moe_gpt(preset, num_layers, backend, "torch", device, dtype, seq=seq,
                                extra=EXTRA + tuple(build.pop("extra", ())), **build)
    return gpt.eval(), config


def gpt_oss_parity(preset, layers: int, device: str = "cpu", dtype=torch.float32, batch: int = 2,
                   seq: int = 64, prepare=None, **build):
    """Our model holding a random HF gpt-oss's weights, and compare_logits of the two."""
    from training.checkpoint.gpt_oss import copy_hf_gpt_oss_weights

    gpt, _ = build_gpt_oss(preset, layers, device, dtype, seq=seq, **build)
    hf_model = hf_gpt_oss(preset, layers, device, dtype)
    copy_hf_gpt_oss_weights(hf_model, gpt)
    if prepare is not None:
        prepare(gpt)
    return compare_logits(hf_model, gpt, preset.vocab_size, batch, seq, device), gpt, hf_model


def _with_bias(out):
    """A module's output: Megatron's (output, bias) with the bias added; HF's first element."""
    if isinstance(out, tuple):
        first, rest = out[0], out[1:]
        bias = rest[0] if rest and isinstance(rest[0], torch.Tensor) else None
        if bias is not None and bias.shape[-1] == first.shape[-1] and bias.dim() == 1:
            return first + bias
        return first
    return out


PARTS = (("attn", "self_attention", "self_attn"),
         ("norm", "pre_mlp_layernorm", "post_attention_layernorm"),
         ("router", "mlp.router", "mlp.router"),       # the routing probabilities [tokens, E]
         ("mlp", "mlp", "mlp"))


def layer_errors(gpt, hf, vocab: int, seq: int, device: str) -> list[dict]:
    """Each layer's attention output, the MLP's input norm, the router's probabilities (zero
    where an expert is not chosen) and the MLP's output, ours ([s, b, h]) against HF's
    ([b, s, h]), on one sequence of random tokens: the first whose error jumps is where the
    two models part."""
    tokens = random_tokens(vocab, 1, seq, device)
    seen: dict[tuple, torch.Tensor] = {}

    def keep(key, transpose):
        def hook(_module, _inputs, out):
            if key[:2] == ("hf", "router"):   # (logits, top-k scores, indices) -> [tokens, E]
                logits, scores, indices = out
                out = torch.zeros_like(logits).scatter(1, indices, scores)
            t = _with_bias(out).detach().float()
            seen[key] = t.transpose(0, 1) if transpose and t.dim() == 3 else t
        return hook

    handles = []
    for side, layers, transpose in (("ours", gpt.decoder.layers, True),
                                    ("hf", hf.model.layers, False)):
        for i, layer in enumerate(layers):
            for part, mine, theirs in PARTS:
                module = layer.get_submodule(mine if side == "ours" else theirs)
                handles.append(module.register_forward_hook(keep((side, part, i), transpose)))
    positions = torch.arange(seq, device=device).unsqueeze(0)
    streams = cpu_dispatcher_streams() if device == "cpu" else contextlib.nullcontext()
    with torch.no_grad(), streams:
        hf(input_ids=tokens)
        gpt(tokens, positions, None)
    for h in handles:
        h.remove()
    rows = []
    for i in range(len(gpt.decoder.layers)):
        for part, _, _ in PARTS:
            ours, theirs = seen[("ours", part, i)], seen[("hf", part, i)]
            ours = ours.reshape(theirs.shape)
            diff = (ours - theirs).abs()
            rows.append({"layer": i, "part": part, "max_abs_err": round(diff.max().item(), 4),
                         "mean_abs_err": round(diff.mean().item(), 5),
                         "mean_abs": round(theirs.abs().mean().item(), 5)})
    return rows
