"""MLPerf runs synthesized on the CPU: the recipe's launch, Megatron's args parsed and validated
by megatron-core, the real listener (training.mlperf.events) driven through the patch table's
loop entries by the stand-in loop (fake_megatron.py). Only the eval losses and the datasets'
counts are made up (a dataset stand-in of the given documents and tokens)."""
from __future__ import annotations

import json

import numpy

from training import megatron_patches
from training.mlperf import events, summary
from training.mlperf.launch import resolve_mlperf
from training.run import Run

from .fake_megatron import FakeMegatron

# The patch table's entries a loop listener goes through (Megatron's data, train, evaluations).
LISTENER_PATCHES = ("data_listeners", "train_listeners", "eval_listeners", "eval_loss")
KIND = {"INTERVAL_START": "S", "INTERVAL_END": "E", "POINT_IN_TIME": "P"}


def keys(log):
    return [(KIND[e["event_type"]], e["key"]) for e in summary.read_events(log)]


class CountedDataset:
    """What events.dataset_counts reads of a GPTDataset: its documents of an indexed dataset."""

    def __init__(self, documents: int, tokens: int):
        lengths = numpy.full(documents, tokens // documents, dtype=numpy.int32)
        lengths[: tokens % documents] += 1
        self.dataset = type("Indexed", (), {"sequence_lengths": lengths})()
        self.indices = numpy.arange(documents)


def losses_reaching(target: float, at: int) -> list[float]:
    """Eval losses above `target` until the `at`-th evaluation, which reaches it."""
    return [target + 0.05 * (at - k) for k in range(1, at)] + [target - 0.01]


def run_fake(env, losses, save=None, words=(), datasets=None, rules=None, **toggles):
    """Resolve the recipe (llama31_8b's, or `rules`'), parse its Megatron args, and run the
    stand-in loop with mllog. `datasets`: (train, valid) stand-ins whose counts the run logs
    when it reads the data."""
    from tests.launch.helpers import megatron_args

    launch, _, config = resolve_mlperf(dict(env, **{k: str(v) for k, v in toggles.items()}),
                                       list(words), rules)
    args = megatron_args(launch)
    args.consumed_train_samples, args.do_valid = 0, True
    args.save, args.save_interval = save, (10**6 if save else None)
    run_dir = launch.log_dir
    # this machine's tests never drop its page cache: a harmless hook, whatever was planned
    if config.get("cache_clear") != "hook":
        config = {**config, "cache_clear": "hook", "cache_clear_cmd": "true"}
    run = events.start(args, {events.RUN_ENV: json.dumps(config), "RANK": "0"})
    log = run_dir / "mlperf.log"

    def read_data():
        logged = [k for _, k in keys(log)]
        if datasets is not None:
            run.on_datasets(*datasets)
        return logged

    fake = FakeMegatron(args, losses, on_data=read_data)
    megatron_patches.apply(Run(args=args, mlperf=run), names=LISTENER_PATCHES,
                           owners={"megatron.training.training": fake.module})
    last = fake.pretrain()
    run.log.close()
    return run, fake, last, log
