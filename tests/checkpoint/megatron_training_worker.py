"""megatron.training's own load_checkpoint and save_checkpoint on an import, with the launcher's
arguments, on the CPU (one gloo process).

    python tests/checkpoint/megatron_training_worker.py CKPT HF_DIR SAVE [--te-final-norm]
        [TOGGLE=VALUE ...]

Resolves a DRY_RUN launch with PRETRAINED_CHECKPOINT=CKPT (and the toggles given), parses it
with megatron-core's parser, builds the model with training/pretrain_gpt.py's model_provider,
loads through megatron.training.checkpointing.load_checkpoint exactly as pretrain does, and
prints one JSON line: the iteration and finetune flag Megatron set, and the logits' distance
to HF's LlamaForCausalLM on HF_DIR. With --te-final-norm the final norm carries Transformer
Engine's extra-state hooks (helpers.give_extra_state), as TE's spec's TENorm does, and the
line also holds what its set_extra_state was handed. Then saves with save_checkpoint to SAVE (as a run's SAVE,
with its arguments) for the export test.

CPU stand-ins, each for a CUDA-only call on this path: torch.cuda.current_device (Megatron's
RoPE buffer), read_metadata (it all-reduces the tracker's iteration in a CUDA tensor; here
the same file read without the reduce), get_rng_state (CUDA's generator; the save here keeps
no RNG state) and torch.cuda.synchronize (before the save's write).
"""
from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def main() -> None:
    ckpt, hf_dir, save = sys.argv[1:4]
    te_final_norm = "--te-final-norm" in sys.argv[4:]
    toggles = dict(word.split("=", 1) for word in sys.argv[4:] if word != "--te-final-norm")
    from tests.launch.helpers import launch, megatron_args

    env = {"EXPERIMENT_DIR": str(Path(save).parent / "experiment"), "PATH": os.environ["PATH"]}
    result = launch(env, PRETRAINED_CHECKPOINT=ckpt, SAVE=save, SAVE_INTERVAL=10,
                    TRANSFORMER_IMPL="native", NATIVE_KERNELS="torch",
                    GRADIENT_ACCUMULATION_FUSION=0, **toggles)
    args = megatron_args(result)
    args.use_cpu_initialization = True   # weights built on the CPU, not torch.cuda.current_device()
    args.no_save_optim, args.no_save_rng = True, True   # no optimizer here; RNG state is CUDA's

    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.training import checkpointing, global_vars

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    parallel_state.initialize_model_parallel()
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda *a, **k: None

    def read_metadata(tracker):
        text = Path(tracker).read_text().strip()
        return (0, True) if text == "release" else (int(text), False)

    checkpointing.read_metadata = read_metadata
    checkpointing.get_rng_state = lambda *a, **k: None   # CUDA's RNG; not saved (no_save_rng)
    global_vars.set_global_variables(args, build_tokenizer=True)

    from training import pretrain_gpt, specs
    from training.run import Run

    specs.install_native(Run(args=args))
    model = pretrain_gpt.model_provider()
    if te_final_norm:
        from tests.checkpoint.helpers import give_extra_state

        give_extra_state(model.decoder.final_layernorm)
    iteration, flops = checkpointing.load_checkpoint([model], None, None)
    extra = {"final_norm_extra_states": [repr(state) for state in getattr(
        model.decoder.final_layernorm, "extra_states_set", [])]} if te_final_norm else {}
    finetune = bool(args.finetune)
    checkpointing.save_checkpoint(1, [model], None, None, 0)

    from transformers import LlamaForCausalLM

    from tests.model.parity import compare, random_tokens

    hf = LlamaForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    vocab = hf.config.vocab_size
    ours = model.float().eval()
    # Megatron may pad the vocabulary: compare the real rows only
    ours_logits = _Truncated(ours, vocab)
    out = compare(hf, ours_logits, random_tokens(vocab, 2, 32, "cpu"))
    print(json.dumps({"iteration": iteration, "finetune": finetune,
                      "padded_vocab_size": args.padded_vocab_size, **extra, **out}))
    dist.destroy_process_group()


class _Truncated(torch.nn.Module):
    def __init__(self, model, vocab: int):
        super().__init__()
        self.model, self.vocab = model, vocab

    def forward(self, tokens, positions, mask):
        return self.model(tokens, positions, mask)[..., :self.vocab]


if __name__ == "__main__":
    main()
