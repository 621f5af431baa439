"""The untimed step before an MLPerf run: Megatron's dataset indices built and cached.

    python -m training.mlperf.index --world-size N <the run's Megatron words>

run_llama31_8b.sh runs it on node 0 before torchrun (the reference does the same: its
build_data_index step, one process, before each seed's run). GPTDataset builds a document,
sample and shuffle index for the training split's samples (TOTAL_ITERS x BS: 1.2M x BS at the
closed recipe's give-up cap) and caches them beside the data (or under --data-cache-path), named
by a hash of the dataset's configuration, the seed included: each run has its own seed, so each
run needs its own index. Built here, with the run's own arguments (the same argument parsing,
derivations, dataset provider and sample counts as training/pretrain_gpt.py), the run finds
them cached and only loads them after run_start; built by the run, they would fall inside the
timed run (after run_start, where the data is first read) and, on a cold cache, take minutes.
The validation split is the in-order one (training/mlperf/valid_data.py): not cached, cheap.
The page cache is dropped after this step (at the start of the run), so the run reads cold.
CPU only; no torch.distributed. Needs MLPERF_RUN (exported by training.mlperf.launch).
"""
from __future__ import annotations

import os
import sys
import time


NOT_A_RUN = "MLPERF_RUN is not set: run this from run_llama31_8b.sh (after training.mlperf.launch)"


def parse_run_args(words: list[str], world_size: int):
    """Megatron's args of the run: our derivations (as_the_launcher), megatron-core's parser
    and validate_args, as pretrain_gpt.py gets them on global rank 0."""
    from megatron.training.arguments import validate_args

    from training.arguments import as_the_launcher, megatron_parser

    words, _notes = as_the_launcher(list(words))
    args = megatron_parser().parse_args(words)
    args.rank, args.world_size = 0, world_size
    validate_args(args)
    return args


def build(words: list[str], world_size: int, environ=os.environ) -> dict:
    """Build (or find cached) the run's datasets as rank 0 of the run would; what was built."""
    from megatron.training import global_vars
    from megatron.training.training import get_train_valid_test_num_samples

    from training import megatron_patches
    from training.pretrain_gpt import datasets_provider
    from training.run import Run

    from . import events

    config = events.RunConfig.from_env(environ)
    if config is None:
        raise SystemExit(NOT_A_RUN)
    args = parse_run_args(words, world_size)
    global_vars.set_args(args)
    global_vars._build_tokenizer(args)
    run = Run(args=args, mlperf=events.MLPerfRun(config, events.MLLog(None)))
    megatron_patches.apply(run, names=("dataset_helpers",))
    samples = get_train_valid_test_num_samples()
    start = time.perf_counter()
    train, valid, test = datasets_provider(run, samples)
    return {"seed": args.seed, "num_samples": list(samples),
            "train_samples_indexed": len(train) if train is not None else 0,
            "cache": args.data_cache_path or "beside each dataset (cache/GPTDataset_indices)",
            "seconds": round(time.perf_counter() - start, 1)}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    if len(argv) < 2 or argv[0] != "--world-size" or not argv[1].isdigit() or int(argv[1]) < 1:
        print("usage: python -m training.mlperf.index --world-size N <the run's Megatron words>",
              file=sys.stderr)
        return 2
    from .events import RunConfig

    if RunConfig.from_env(os.environ) is None:
        print(f"error: {NOT_A_RUN}", file=sys.stderr)
        return 2
    done = build(argv[2:], int(argv[1]))
    print(f"MLPerf data index (untimed, seed {done['seed']}): train/valid/test samples "
          f"{done['num_samples']}, {done['train_samples_indexed']:,} training samples indexed, "
          f"cache {done['cache']}, {done['seconds']} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
