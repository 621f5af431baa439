"""Our gpt-oss GPTModel, built from a preset's own Megatron flags, and a random Hugging Face
GptOssForCausalLM of the same shape with every part made to matter (shared by the CPU parity,
checkpoint and GPU tests)."""
from __future__ import annotations

import torch

from training.moe.gpt_oss import hf_config

from tests.moe.model import build_moe_gpt, compare_logits

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
