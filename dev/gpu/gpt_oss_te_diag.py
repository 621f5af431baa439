"""Which part of gpt-oss's attention differs on the TE backend (session 17: tiny-te parity failed,
max abs err 1.11 against HF's own bf16 error 1.7e-3). The tiny preset on TE against a random HF
GptOssForCausalLM with the same weights, as tests/gpu/test_gpt_oss_gpu.py builds them; then the
same comparison with the sinks pushed to -30 in both (no sink), with the window lifted in both,
and with both. Prints the TE attention modules' window and softmax type.
    python3 dev/gpu/gpt_oss_te_diag.py      (GPU machine, TE on the path)
    python dev/gpu/gpt_oss_te_diag.py native cpu 64    (the plumbing, on the CPU in fp32)
A fourth word picks TE's attention backend (Megatron's --attention-backend: auto, fused, flash,
unfused), one process each (megatron-core pins NVTE_*_ATTN in the environment at the first
model it builds):
    for b in auto fused unfused; do python3 dev/gpu/gpt_oss_te_diag.py transformer_engine cuda 1024 $b; done
Session 18 ran that loop: the error stayed at 1.16 with the sinks and the window both lifted, under
every backend. So each run now first prints where the two models part, layer by layer
(tests/moe/gpt_oss_model.layer_errors): the attention's output, the MLP's input norm, the
router's probabilities and the MLP's output against HF's on the same tokens (`layers` prints
only that). Session 18 found layer 0's attention matching and its MLP not.
    python3 dev/gpu/gpt_oss_te_diag.py transformer_engine cuda 1024 auto layers"""
import sys

import torch

from tests.moe.gpt_oss_model import gpt_oss_parity, layer_errors
from training.moe.gpt_oss import TINY_GPT_OSS


def lift(gpt, hf, sinks: bool, window: bool):
    with torch.no_grad():
        for layer in gpt.decoder.layers:
            core = layer.self_attention.core_attention
            if sinks and getattr(core, "softmax_offset", None) is not None:
                core.softmax_offset.fill_(-30.0)
            if window:
                if hasattr(core, "window"):      # the native flex attention's
                    core.window = None
                for m in core.modules():         # TE's DotProductAttention and its backends
                    if hasattr(m, "window_size"):
                        m.window_size = (-1, 0)
        for name, p in hf.named_parameters():
            if sinks and name.endswith("sinks"):
                p.fill_(-30.0)
        if window:
            hf.config.sliding_window = 10 ** 6


def main(backend="transformer_engine", device="cuda", seq=1024, attention="auto", only=""):
    from tests.moe.model import compare_logits

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    build = dict(batch=1, seq=seq, backend=backend, extra=("--attention-backend", attention))
    print(f"backend {backend}, attention backend {attention}, {device}, seq {seq}")
    result, gpt, hf = gpt_oss_parity(TINY_GPT_OSS, 2, device, dtype, **build)
    print("baseline:", {k: result[k] for k in result if "err" in k or "loss" in k})
    for row in layer_errors(gpt, hf, TINY_GPT_OSS.vocab_size, seq, device):
        print("layer", row)
    if only == "layers":
        return
    for i, layer in enumerate(gpt.decoder.layers):
        core = layer.self_attention.core_attention
        print(i, type(core).__name__, {k: getattr(m, k) for m in core.modules()
                                       for k in ("window_size", "softmax_type", "attn_mask_type")
                                       if hasattr(m, k)})
    for sinks, window in ((True, False), (False, True), (True, True)):
        _, gpt, hf = gpt_oss_parity(TINY_GPT_OSS, 2, device, dtype, **build)
        lift(gpt, hf, sinks, window)
        r = compare_logits(hf, gpt, TINY_GPT_OSS.vocab_size, 1, seq, device)
        print(f"sinks lifted={sinks} window lifted={window}:",
              {k: r[k] for k in r if "err" in k or "loss" in k})


if __name__ == "__main__":
    main(*sys.argv[1:3], *map(int, sys.argv[3:4]), *sys.argv[4:6])
