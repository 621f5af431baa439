"""mllog events of an MLPerf run, and the stop at the target eval loss.

The run gets its MLPerf settings from MLPERF_RUN (JSON, exported by training.mlperf.launch) and
everything else from Megatron's own args, so mlperf.log states what the run really trained with.
Events (global rank 0 only, to <run>/mlperf.log and stdout):

  main() starts          cache_clear (what training.mlperf.cache did on this node), init_start
  before any data is     submission_*, the hyperparameters (the seed: node 0's, every rank's),
  read (Megatron builds  init_stop, run_start
  its data iterators)
  the datasets built     train/eval_dataset_documents and _tokens (what the run reads)
  training starts        block_start
  each evaluation        block_stop, eval_start, eval_accuracy (eval loss), eval_stop, and unless
                         the target is reached, block_start
  training ends          [block_stop], run_stop (status success | aborted), train_samples

samples_count in every event's metadata is Megatron's consumed_train_samples (sequences).
An evaluation with eval loss <= target ends the run: MLPerfRun.on_eval_end returns True and
training/loop_hooks.py stops Megatron's loop after that iteration (final checkpoint included).
Evaluations after run_stop (Megatron's post-training validation) are not logged.

The page cache is dropped (training.mlperf.cache) on each node's local rank 0 before
init_start, as the launch planned it; a closed run whose drop fails stops there. The seed every
rank uses is rank 0's (seed_from_rank_zero, the patch table's mlperf_seed entry): each node's
launcher draws its own, node 0's wins, before Megatron seeds its generators or builds a dataset.
"""
from __future__ import annotations

import logging
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training import REPO_ROOT
from training.reading import RecordError, parse_json

RUN_ENV = "MLPERF_RUN"


@dataclass(frozen=True)
class RunConfig:
    benchmark: str
    division: str
    target_eval_loss: float
    eval_every_samples: int
    eval_samples: int
    org: str | None = None
    platform: str | None = None
    precision: str = "bf16"
    ruleset: str = "6.1.0"
    config_filename: str = ""
    cache_clear: str = "none"           # the launch's plan: hook | drop_caches | none
    cache_clear_cmd: str | None = None  # MLPERF_CACHE_CLEAR_CMD (the hook)
    cache_clear_why: str = "the launch planned no cache drop"

    @classmethod
    def from_env(cls, environ=os.environ) -> "RunConfig | None":
        raw = environ.get(RUN_ENV)
        if not raw:
            return None
        data = parse_json(raw, RUN_ENV, "MLPerf run configuration")
        if not isinstance(data, dict):
            raise RecordError(f"{RUN_ENV}: not an MLPerf run configuration (a JSON object)")
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


class MLLog:
    """mllog's MLLogger on its own logging.Logger: a file (and stdout), or nothing at all."""

    def __init__(self, path: Path | None, echo: bool = True):
        self.path = path
        self._ml = None
        if path is None:
            return
        from mlperf_logging.mllog import mllog

        path.parent.mkdir(parents=True, exist_ok=True)
        logger = logging.getLogger(f"training.mlperf.{path}")
        logger.propagate = False
        logger.setLevel(logging.INFO)
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        logger.addHandler(logging.FileHandler(path))
        if echo:
            logger.addHandler(logging.StreamHandler(sys.stdout))
        self._logger = logger
        # stack offset 2: the call site recorded is the caller of event/start/end
        self._ml = mllog.MLLogger(logger=logger, default_stack_offset=2, root_dir=str(REPO_ROOT))

    @property
    def active(self) -> bool:
        return self._ml is not None

    def event(self, key: str, value: Any = None, metadata: dict | None = None) -> None:
        if self._ml is not None:
            self._ml.event(key=key, value=value, metadata=metadata)

    def start(self, key: str, value: Any = None, metadata: dict | None = None) -> None:
        if self._ml is not None:
            self._ml.start(key=key, value=value, metadata=metadata)

    def end(self, key: str, value: Any = None, metadata: dict | None = None) -> None:
        if self._ml is not None:
            self._ml.end(key=key, value=value, metadata=metadata)

    def close(self) -> None:
        if self._ml is not None:
            for handler in list(self._logger.handlers):
                handler.flush()
                handler.close()
                self._logger.removeHandler(handler)
            self._ml = None


def _lowest_precisions(args, config: RunConfig) -> dict[str, str]:
    """lowest_numerical_precision_in_{linear,attn,comm} (ruleset 6.1: mandatory)."""
    if getattr(args, "fp4", None):
        linear = getattr(args, "fp4_recipe", None) or config.precision
    elif getattr(args, "fp8", None):
        linear = "fp8"
    else:
        linear = "bfloat16" if args.bf16 else ("fp16" if getattr(args, "fp16", False) else "fp32")
    half = "bfloat16" if args.bf16 else ("fp16" if getattr(args, "fp16", False) else "fp32")
    attn = "fp8" if getattr(args, "fp8_dot_product_attention", False) else half
    dp = args.data_parallel_size
    communicates_params = (args.use_distributed_optimizer and dp > 1) or \
        args.tensor_model_parallel_size > 1 or args.pipeline_model_parallel_size > 1 or \
        args.context_parallel_size > 1
    if getattr(args, "fp8_param_gather", False):
        comm = "fp8"
    elif getattr(args, "grad_reduce_in_bf16", False) or communicates_params:
        comm = half
    else:
        comm = "fp32"
    return {"lowest_numerical_precision_in_linear": linear,
            "lowest_numerical_precision_in_attn": attn,
            "lowest_numerical_precision_in_comm": comm}


def hyperparameters(args, config: RunConfig) -> dict[str, Any]:
    """The logged hyperparameters, from Megatron's args (what the run really uses)."""
    from mlperf_logging.mllog import constants as c

    dp = args.data_parallel_size
    decay_iters = args.lr_decay_iters or args.train_iters
    schedule = {"cosine": "cosine with linear warmup"}.get(args.lr_decay_style,
                                                          f"{args.lr_decay_style} with linear warmup")
    values = {
        c.GLOBAL_BATCH_SIZE: args.global_batch_size,
        c.GRADIENT_ACCUMULATION_STEPS: args.global_batch_size // (args.micro_batch_size * dp),
        c.MAX_SEQUENCE_LENGTH: args.seq_length,
        c.EVAL_SAMPLES: config.eval_samples,
        c.SEED: args.seed,
        # Megatron's "adam" decouples weight decay: AdamW.
        c.OPT_NAME: "adamw" if args.optimizer == "adam" else args.optimizer,
        c.OPT_BASE_LR: args.lr,
        c.OPT_END_LR: args.min_lr,
        c.OPT_LR_WARMUP_STEPS: args.lr_warmup_iters,
        c.OPT_LR_DECAY_STEPS: decay_iters - args.lr_warmup_iters,
        c.OPT_LR_DECAY_SCHEDULE: schedule,
        c.OPT_ADAMW_BETA_1: args.adam_beta1,
        c.OPT_ADAMW_BETA_2: args.adam_beta2,
        c.OPT_ADAMW_EPSILON: args.adam_eps,
        c.OPT_ADAMW_WEIGHT_DECAY: args.weight_decay,
        c.OPT_GRADIENT_CLIP_NORM: args.clip_grad,
        # The schedule's length in steps (the reference's trainer.max_steps); TOTAL_ITERS, the
        # give-up cap, is logged as train_iters_cap.
        c.MAX_STEPS: decay_iters,
        "train_iters_cap": args.train_iters,
        c.TENSOR_PARALLELISM: args.tensor_model_parallel_size,
        c.PIPELINE_PARALLELISM: args.pipeline_model_parallel_size,
        c.CONTEXT_PARALLELISM: args.context_parallel_size,
        c.EXPERT_PARALLELISM: getattr(args, "expert_model_parallel_size", 1) or 1,
        c.MICRO_BATCH_SIZE: args.micro_batch_size,
        c.CONFIG_FILENAME: config.config_filename or "unspecified",
    }
    values.update(_lowest_precisions(args, config))
    return values


def default_platform(world_size: int) -> str:
    """'<nodes>x<GPUs per node>x<device>', e.g. 1x2xNVIDIA H200."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size) or world_size)
    try:
        import torch

        device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    except Exception:  # noqa: BLE001
        device = "unknown device"
    return f"{max(world_size // max(local, 1), 1)}x{local}x{device}"


@dataclass
class Result:
    status: str = "aborted"
    run_start_ms: int | None = None
    run_stop_ms: int | None = None
    train_samples: int | None = None
    samples_to_converge: int | None = None
    evals: list[tuple[int, float]] = field(default_factory=list)


class MLPerfRun:
    """Loop listener (training/loop_hooks.py) of an MLPerf run: mllog events, stop at target."""

    def __init__(self, config: RunConfig, log: MLLog):
        self.config = config
        self.log = log
        self.result = Result()
        self.running = False
        self.started = False       # run_start logged (once)
        self.block_open = False

    def _samples(self, args) -> dict[str, int]:
        from mlperf_logging.mllog import constants as c

        return {c.SAMPLES_COUNT: int(args.consumed_train_samples)}

    def init_start(self, cache) -> None:
        """cache_clear (training.mlperf.cache.CacheClear: what this node did), init_start."""
        from mlperf_logging.mllog import constants as c

        self.log.event(c.CACHE_CLEAR, value=bool(cache.done), metadata=cache.as_metadata())
        self.log.start(c.INIT_START)

    def on_run_start(self, args) -> None:
        """Before Megatron builds its datasets and loaders (nothing has read the data yet):
        the submission and the hyperparameters, init_stop, run_start: the clock starts."""
        from mlperf_logging.mllog import constants as c

        if self.started:
            return
        cfg = self.config
        self.log.event(c.SUBMISSION_BENCHMARK, value=cfg.benchmark)
        self.log.event(c.SUBMISSION_ORG, value=cfg.org or "unspecified")
        self.log.event(c.SUBMISSION_DIVISION, value=cfg.division)
        self.log.event(c.SUBMISSION_STATUS, value=c.ONPREM)
        self.log.event(c.SUBMISSION_PLATFORM,
                       value=cfg.platform or default_platform(args.world_size))
        for key, value in hyperparameters(args, cfg).items():
            self.log.event(key, value=value)
        self.log.end(c.INIT_STOP)
        self.log.start(c.RUN_START)
        self.result.run_start_ms = _now_ms()
        self.started = self.running = True

    def on_datasets(self, train, valid) -> None:
        """What the run reads: documents and tokens of its training and validation sets."""
        if not (self.log.active and self.running):
            return
        for name, dataset in (("train", train), ("eval", valid)):
            counted = dataset_counts(dataset)
            if counted is not None:
                self.log.event(f"{name}_dataset_documents", value=counted[0])
                self.log.event(f"{name}_dataset_tokens", value=counted[1])

    def on_train_start(self, args) -> None:
        from mlperf_logging.mllog import constants as c

        if not self.started:
            raise RuntimeError("MLPerf: training started without run_start: the patch table's "
                               "data_listeners entry did not run before Megatron read the data")
        self.log.start(c.BLOCK_START, metadata=self._samples(args))
        self.block_open = True

    def on_eval_start(self, args, iteration: int) -> None:
        from mlperf_logging.mllog import constants as c

        if not self.running:
            return
        if self.block_open:
            self.log.end(c.BLOCK_STOP, metadata=self._samples(args))
            self.block_open = False
        self.log.start(c.EVAL_START, metadata=self._samples(args))

    def on_eval_end(self, args, iteration: int, loss: float | None) -> bool:
        """Log the evaluation; True when it reached the target (the loop then stops)."""
        from mlperf_logging.mllog import constants as c

        if not self.running:
            return False
        value = float("nan") if loss is None else float(loss)
        samples = int(args.consumed_train_samples)
        self.log.event(c.EVAL_ACCURACY, value=value, metadata=self._samples(args))
        self.log.end(c.EVAL_STOP, metadata=self._samples(args))
        self.result.evals.append((samples, value))
        if math.isfinite(value) and value <= self.config.target_eval_loss:
            self.result.status = c.SUCCESS
            self.result.samples_to_converge = samples
            return True
        self.log.start(c.BLOCK_START, metadata=self._samples(args))
        self.block_open = True
        return False

    def on_train_end(self, args) -> None:
        from mlperf_logging.mllog import constants as c

        if not self.running:
            return
        if self.block_open:
            self.log.end(c.BLOCK_STOP, metadata=self._samples(args))
            self.block_open = False
        self.log.end(c.RUN_STOP, metadata={**self._samples(args), c.STATUS: self.result.status})
        self.log.event(c.TRAIN_SAMPLES, value=int(args.consumed_train_samples))
        self.result.run_stop_ms = _now_ms()
        self.result.train_samples = int(args.consumed_train_samples)
        self.running = False


def _now_ms() -> int:
    import time

    return int(time.time() * 1e3)


def dataset_counts(dataset) -> tuple[int, int] | None:
    """(documents, tokens) a Megatron dataset reads: a GPTDataset's documents of its indexed
    dataset, summed over a blend's parts; None for what has no indexed dataset (mock data)."""
    if dataset is None:
        return None
    parts = getattr(dataset, "datasets", None)
    if parts is not None:                          # BlendedDataset
        counted = [dataset_counts(part) for part in parts]
        if any(c is None for c in counted):
            return None
        return sum(c[0] for c in counted), sum(c[1] for c in counted)
    indexed, documents = getattr(dataset, "dataset", None), getattr(dataset, "indices", None)
    lengths = getattr(indexed, "sequence_lengths", None)
    if lengths is None or documents is None:
        return None
    import numpy

    return int(len(documents)), int(numpy.sum(lengths[documents], dtype=numpy.int64))


class CacheNotCleared(RuntimeError):
    """A closed-division run whose page cache could not be dropped: it stops before init_start."""


def start(args, environ=os.environ) -> MLPerfRun | None:
    """The MLPerf listener when MLPERF_RUN is set (None otherwise). Each node's local rank 0
    drops the page cache as the launch planned (training.mlperf.cache); global rank 0 logs
    cache_clear and init_start. Raises CacheNotCleared in the closed division when the drop
    did not happen on this node."""
    from . import cache

    config = RunConfig.from_env(environ)
    if config is None:
        return None
    rank = int(environ.get("RANK", "0"))
    local_rank = int(environ.get("LOCAL_RANK", rank))
    result = None
    if local_rank == 0:
        if config.cache_clear == "none":
            result = cache.CacheClear(False, "none", config.cache_clear_why)
        else:
            result = cache.clear(config.cache_clear_cmd)
        print(f"MLPerf cache_clear on this node: {'done' if result.done else 'NOT done'} "
              f"({result.method}: {result.detail})", flush=True)
        if not result.done and config.division == "closed":
            raise CacheNotCleared(
                f"MLPerf closed division: the page cache was not dropped on this node "
                f"({result.method}: {result.detail}); run as root where /proc/sys/vm/drop_caches "
                "is writable, or set MLPERF_CACHE_CLEAR_CMD (docs/mlperf.md, cache_clear)")
    path = Path(args.run_dir) / "mlperf.log" if (rank == 0 and args.run_dir) else None
    run = MLPerfRun(config, MLLog(path))
    if result is not None:
        run.init_start(result)
    return run


def seed_from_rank_zero(original, run):
    """megatron.training.initialize._set_random_seed: every rank takes rank 0's seed (each
    node's launcher drew its own; node 0's is the run's), sets it in args (the datasets and
    mlperf.log read args.seed), then Megatron seeds its generators with it."""
    import torch

    def set_random_seed(seed_, *a, **kw):
        seed = seed_
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            device = (torch.device("cuda", torch.cuda.current_device())
                      if torch.cuda.is_available() and
                      torch.distributed.get_backend() == "nccl" else torch.device("cpu"))
            value = torch.tensor([int(seed_)], dtype=torch.int64, device=device)
            torch.distributed.broadcast(value, src=0)
            seed = int(value.item())
        if seed != seed_:
            print(f"MLPerf seed: this node's {seed_} replaced by node 0's {seed}", flush=True)
        elif run.rank == 0:
            print(f"MLPerf seed: {seed} (node 0's; every rank uses it)", flush=True)
        run.args.seed = seed
        return original(seed, *a, **kw)

    return set_random_seed
