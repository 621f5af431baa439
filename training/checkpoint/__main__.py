"""python -m training.checkpoint {import,export} ...

    import HF_DIR OUT [--preset NAME]      Hugging Face Llama, Mistral, Qwen2/2.5, Qwen3, Qwen3-MoE,
                                           Mixtral or gpt-oss (bf16/fp32, or MXFP4 experts,
                                           dequantized) (folder or Hub id) -> Megatron
    export CKPT_DIR HF_DIR [--hf-config P]  Megatron checkpoint (any TP/PP) -> Hugging Face
                                           (gpt-oss: bf16/fp32 experts, not MXFP4)

Bad input (a missing folder, a family or field not converted, a preset that does not match, an output that exists,
too little disk) exits 2 with one line and writes nothing; an interrupted conversion leaves
nothing behind either.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from training.cli import ArgumentParser, positive_int


def _size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    try:
        size = int(float(text[:-1]) * units[text[-1]]) if text[-1:] in units else int(text)
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 2G, 500M)") from None
    if size < 1:
        raise argparse.ArgumentTypeError(f"must be a size of 1 byte or more, not {text!r} (e.g. 2G, 500M)")
    return size


def _parser() -> ArgumentParser:
    import training.moe.presets  # noqa: F401 - the MoE presets join the table (--preset, names)
    from training.launch.presets import PRESETS

    parser = ArgumentParser(prog="python -m training.checkpoint",
                                     description="Hugging Face decoder checkpoints in and out of "
                                                 "Megatron's distributed checkpoint format.")
    sub = parser.add_subparsers(dest="command", required=True)
    imp = sub.add_parser("import", help="Hugging Face safetensors + config -> a Megatron "
                                        "checkpoint (loads at any TP/PP/DP)")
    imp.add_argument("hf_dir", help="Hugging Face model folder, or a Hub repository id")
    imp.add_argument("out", type=Path, help="new checkpoint folder (must not exist)")
    imp.add_argument("--preset", choices=sorted(PRESETS),
                     help="model preset the config must match (default: any shape; a "
                          "preset's name where it is one)")
    imp.add_argument("--workers", type=positive_int, default=1,
                     help="writer threads (each holds one tensor; default 1)")
    exp = sub.add_parser("export", help="a Megatron checkpoint -> Hugging Face safetensors + "
                                        "config.json")
    exp.add_argument("ckpt_dir", type=Path, help="Megatron checkpoint folder (SAVE of a run, or "
                                                 "an import), or one of its iter_*/ folders")
    exp.add_argument("hf_dir", type=Path, help="new Hugging Face folder (must not exist)")
    exp.add_argument("--hf-config", type=Path, default=None,
                     help="config.json (or its folder, or an import) to write back; default: "
                          "the checkpoint's import record, or that of the checkpoint its run "
                          "started from")
    exp.add_argument("--max-shard-size", type=_size, default="2G",
                     help="largest safetensors file (default 2G)")
    for p in (imp, exp):
        p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def main(argv: list[str] | None = None) -> int:
    from .convert import ConversionError, export_checkpoint, import_checkpoint
    from .hf import HFError
    from .layout import ArchitectureError
    from .megatron import CheckpointFormatError
    from .record import RecordError
    from .staging import Interrupted, OutputError

    args = _parser().parse_args(argv)
    try:
        if args.command == "import":
            result = import_checkpoint(args.hf_dir, args.out, args.preset, workers=args.workers,
                                       progress=not args.no_progress)
            what = (f"{result.detail['name']} ({result.detail['family']}), "
                    f"{result.detail['num_layers']} layers")
            if result.detail.get("mxfp4"):
                what += f", {result.detail['mxfp4']} to {result.detail['dtype'][6:]}"
        else:
            result = export_checkpoint(args.ckpt_dir, args.hf_dir, args.hf_config,
                                       args.max_shard_size, progress=not args.no_progress)
            what = f"{result.detail['shards']} safetensors file(s)"
            if result.detail.get("note"):
                what += f"; {result.detail['note']}"
    except (ConversionError, HFError, ArchitectureError, CheckpointFormatError, RecordError,
            OutputError) as err:
        print(f"training.checkpoint {args.command}: {err}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, Interrupted) as err:
        how = err if isinstance(err, Interrupted) else "Ctrl-C"
        print(f"training.checkpoint {args.command}: interrupted ({how}); nothing was written",
              file=sys.stderr)
        return 130
    rate = result.nbytes / max(result.seconds, 1e-9) / 2**30
    print(f"{args.command}: {result.out} ({what}, {result.tensors} tensors, "
          f"{result.nbytes / 2**30:.2f} GiB in {result.seconds:.1f} s, {rate:.2f} GiB/s)")
    return 0


if __name__ == "__main__":
    from training import quiet

    quiet.install("checkpoint")   # third-party notices at import: a count, not the console
    sys.exit(main())
