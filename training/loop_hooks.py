"""Measurements inside Megatron's training loop, without a loop of our own.

Megatron's `train()` calls the module-level functions `train_step` and `training_log` each
iteration; `install()` wraps them:
  train_step    timed with a device synchronisation on both sides: the step time is the
                forward, backward, gradient reduce and optimizer step of one global batch,
                data loading included, logging/eval/checkpointing excluded
  training_log  after Megatron's own logging, one line per iteration to <run>/metrics.jsonl
                (loss, grad norm, lr, step time, tokens/s/GPU, model TFLOP/s/GPU, MFU,
                peak memory) and the same scalars to TensorBoard
  evaluate      the validation loss, with its iteration, to metrics.jsonl
  optimizer.step, optimizer.zero_grad  (install_memory_phases) torch's peak-memory counter
                read and reset around them: each iteration's peak splits into forward/backward,
                optimizer step, and what runs between steps (PhasePeaks)
`finish()` (after pretrain returns) computes the steady-state summary, takes the peak memory
over all ranks, prints the summary and stores it in manifest.json.

Loop listeners (`install(..., listeners=[...])`, e.g. training.mlperf.events.MLPerfRun) are told
when training starts and ends (Megatron's `train`) and around each evaluation, with the eval
loss on every rank; one that returns True from on_eval_end stops training after that
iteration (`stop_after_this_evaluation`).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from training.metrics import MetricsWriter, Shape, StepRecord, flops_per_token, peak_tflops, \
    steady_state


class PhasePeaks:
    """Peak allocated memory per phase of an iteration. torch has one peak counter: it is read
    and reset at the phase boundaries, and the run's peak over all phases is kept here (torch's
    counter then covers only the phase under way). The phases:
      forward_backward  from the optimizer's zero_grad (start of Megatron's train_step) to the
                        optimizer step: forward and backward passes, gradient reduce
      optimizer_step    Megatron's optimizer.step(): gradients to fp32, clipping, Adam, the copy
                        back to the bf16 weights
      between_steps     from the step's end to the next zero_grad: logging, evaluation,
                        checkpointing, with the step's fp32 gradients still held (the
                        distributed optimizer frees them at zero_grad); before the first
                        iteration, the model and optimizer set-up
    `cuda` is torch.cuda (a stand-in in tests)."""

    PHASES = ("forward_backward", "optimizer_step", "between_steps")

    def __init__(self, cuda=None):
        self.cuda = cuda if cuda is not None else torch.cuda
        self.last: dict[str, float | None] = dict.fromkeys(self.PHASES)    # bytes, latest
        self.run: dict[str, float] = dict.fromkeys(self.PHASES, 0.0)       # bytes, whole run
        self.reserved = 0.0
        self.installed = False   # wrap() ran: the phases are measured

    def close(self, phase: str) -> None:
        allocated = float(self.cuda.max_memory_allocated())
        self.last[phase] = allocated
        self.run[phase] = max(self.run[phase], allocated)
        self.reserved = max(self.reserved, float(self.cuda.max_memory_reserved()))
        self.cuda.reset_peak_memory_stats()

    def wrap(self, optimizer) -> None:
        """Close the phases around optimizer.zero_grad() and optimizer.step()."""
        zero_grad, step = optimizer.zero_grad, optimizer.step

        def phased_zero_grad(*a, **kw):
            try:
                return zero_grad(*a, **kw)
            finally:
                self.close("between_steps")

        def phased_step(*a, **kw):
            self.close("forward_backward")
            try:
                return step(*a, **kw)
            finally:
                self.close("optimizer_step")

        optimizer.zero_grad, optimizer.step = phased_zero_grad, phased_step
        self.installed = True

    def peak_allocated(self) -> float:
        """Bytes: the run's peak so far (every phase, the one under way included)."""
        return max(*self.run.values(), float(self.cuda.max_memory_allocated()))

    def peak_reserved(self) -> float:
        return max(self.reserved, float(self.cuda.max_memory_reserved()))


@dataclass
class RunState:
    run_dir: Path | None
    warmup_iters: int
    tokens_per_step: int
    world_size: int
    flops_token: float
    peak: float | None
    device_name: str
    writer: MetricsWriter
    is_logging_rank: bool
    records: list[StepRecord] = field(default_factory=list)
    last_step_time: float | None = None
    eval_iteration: int | None = None
    profile_window: tuple[int, int] = (0, -1)
    nan_check_step: bool = False
    first_step_start: float | None = None  # epoch seconds: where start-up ends
    memory: PhasePeaks = field(default_factory=PhasePeaks)


_state: RunState | None = None


def install(args, precision: str, listeners=()) -> RunState:
    """Wrap Megatron's train_step and training_log (and, with listeners, train and the
    evaluation). Call after initialize (args known)."""
    global _state
    from megatron.training import training

    shape = Shape.from_megatron_args(args)
    device_name = torch.cuda.get_device_name()
    rank = torch.distributed.get_rank()
    logging_rank = rank == torch.distributed.get_world_size() - 1  # last PP stage holds the loss
    run_dir = Path(args.run_dir) if args.run_dir else None
    _state = RunState(
        run_dir=run_dir, warmup_iters=args.metrics_warmup_iters,
        tokens_per_step=args.global_batch_size * args.seq_length,
        world_size=args.world_size, flops_token=flops_per_token(shape),
        peak=peak_tflops(device_name, precision), device_name=device_name,
        writer=MetricsWriter(run_dir / "metrics.jsonl" if (run_dir and logging_rank) else None),
        is_logging_rank=logging_rank,
        profile_window=((args.profile_step_start, args.profile_step_end + 1)
                        if args.profile else (0, -1)),
        nan_check_step=args.nan_check == "step")

    original_step, original_log = training.train_step, training.training_log

    def timed_train_step(*a, **kw):
        torch.cuda.synchronize()
        if _state.first_step_start is None:
            _state.first_step_start = time.time()
        start = time.perf_counter()
        out = original_step(*a, **kw)
        torch.cuda.synchronize()
        _state.last_step_time = time.perf_counter() - start
        return out

    def logged_training_log(loss_dict, total_loss_dict, learning_rate, iteration, loss_scale,
                            report_memory_flag, skipped_iter, grad_norm, *a, **kw):
        result = original_log(loss_dict, total_loss_dict, learning_rate, iteration, loss_scale,
                              report_memory_flag, skipped_iter, grad_norm, *a, **kw)
        _on_iteration(iteration, loss_dict, learning_rate, grad_norm, skipped_iter)
        if _state.nan_check_step:
            check_finite(iteration, loss_dict.get("lm loss"), grad_norm)
        return result

    original_eval_print, original_eval = training.evaluate_and_print_results, training.evaluate

    def eval_and_print(prefix, forward_step_func, data_iterator, model, iteration, *a, **kw):
        _state.eval_iteration = iteration
        return original_eval_print(prefix, forward_step_func, data_iterator, model, iteration,
                                   *a, **kw)

    def recorded_evaluate(*a, **kw):
        result = original_eval(*a, **kw)
        losses = result[0] or {}
        if "lm loss" in losses:
            record_eval(_state.eval_iteration, float(losses["lm loss"]))
        return result

    training.train_step = timed_train_step
    training.training_log = logged_training_log
    training.evaluate_and_print_results = eval_and_print
    training.evaluate = recorded_evaluate
    if listeners:
        wrap_loop(training, args, list(listeners))
    return _state


def wrap_loop(training, args, listeners: list) -> None:
    """Tell the listeners about Megatron's train() and each evaluation; stop when one asks.

    A listener has on_train_start(args), on_eval_start(args, iteration),
    on_eval_end(args, iteration, loss) -> bool (True: stop), on_train_end(args). `training` is
    megatron.training.training (or a stand-in with the same functions, in tests)."""
    original_train = training.train
    original_eval_print = training.evaluate_and_print_results
    original_eval = training.evaluate
    last = {"loss": None}

    def evaluate_keeping_loss(*a, **kw):
        result = original_eval(*a, **kw)
        losses = result[0] or {}
        last["loss"] = float(losses["lm loss"]) if "lm loss" in losses else None
        return result

    def listened_eval_print(prefix, forward_step_func, data_iterator, model, iteration, *a, **kw):
        for listener in listeners:
            listener.on_eval_start(args, iteration)
        last["loss"] = None
        result = original_eval_print(prefix, forward_step_func, data_iterator, model, iteration,
                                     *a, **kw)
        loss = _loss_on_every_rank(last["loss"])
        stop = [listener.on_eval_end(args, iteration, loss) for listener in listeners]
        if any(stop):
            stop_after_this_evaluation(args, iteration)
        return result

    def listened_train(*a, **kw):
        for listener in listeners:
            listener.on_train_start(args)
        try:
            return original_train(*a, **kw)
        finally:  # also on SIGTERM's sys.exit: the run ends, unfinished (status aborted)
            for listener in listeners:
                listener.on_train_end(args)

    training.evaluate = evaluate_keeping_loss
    training.evaluate_and_print_results = listened_eval_print
    training.train = listened_train


def stop_after_this_evaluation(args, iteration: int) -> None:
    """End Megatron's loop after this iteration as if --train-iters were reached.

    train() checks `while iteration < args.train_iters` before each iteration, after this
    iteration's evaluation, checkpoint and exit checks, so the loop ends normally: pretrain()
    then saves a final checkpoint when --save is set (unless this iteration was just saved),
    and finish() reports as usual. The validation Megatron runs after the loop is skipped:
    this evaluation just measured the same weights. (--exit-interval would also stop, but
    through sys.exit inside train(): no return to pretrain_gpt, no summary.)"""
    args.train_iters = iteration
    args.do_valid = False


def _loss_on_every_rank(loss: float | None) -> float | None:
    """The eval loss lives on the last pipeline stage (the last rank holds it in every
    layout): broadcast it, so every rank takes the same stop decision."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return loss
    world = torch.distributed.get_world_size()
    if world == 1:
        return loss
    value = torch.tensor([float("nan") if loss is None else loss], dtype=torch.float64,
                         device="cuda")
    torch.distributed.broadcast(value, src=world - 1)
    return value.item()


class NonFiniteError(RuntimeError):
    """NAN_CHECK=step: this iteration's loss or global gradient norm is NaN or Inf."""


def check_finite(iteration: int, loss, grad_norm) -> None:
    """NAN_CHECK=step: stop at the first iteration whose loss or global gradient norm is not
    finite. Runs inside training_log, before Megatron's evaluation and checkpoint of the same
    iteration, so the weights it updated are never saved. The gradient norm is global (reduced
    over every rank), so every rank stops at the same iteration."""
    bad = [f"{name} is {value}" for name, value in (("loss", loss), ("gradient norm", grad_norm))
           if value is not None and not math.isfinite(float(value))]
    if bad:
        raise NonFiniteError(
            f"iteration {iteration}: {' and '.join(bad)}. The run stops here (NAN_CHECK=step); "
            "the last checkpoint holds finite weights. To find the first gradient bucket "
            "that went non-finite, rerun with NAN_CHECK=bucket.")


def _on_iteration(iteration: int, loss_dict: dict, lr, grad_norm, skipped: int) -> None:
    s = _state
    if s.last_step_time is None:
        return
    step = StepRecord(iteration, s.last_step_time, s.tokens_per_step)
    profiled = s.profile_window[0] <= iteration <= s.profile_window[1]
    if not profiled:  # profiler overhead stays out of the steady-state figures
        s.records.append(step)
    s.last_step_time = None
    per_gpu = step.tokens / step.step_time_s / s.world_size
    tflops = s.flops_token * per_gpu / 1e12
    loss = loss_dict.get("lm loss")
    record = {
        "iteration": iteration,
        "loss": float(loss) if loss is not None else None,
        "grad_norm": float(grad_norm) if grad_norm is not None else None,
        "lr": float(lr) if lr is not None else None,
        "skipped": int(skipped),
        "step_time_s": step.step_time_s,
        "tokens_per_s_per_gpu": per_gpu,
        "model_tflops_per_gpu": tflops,
        "mfu": tflops / s.peak if s.peak else None,
        "mem_allocated_gib": torch.cuda.memory_allocated() / 2**30,
        "mem_peak_allocated_gib": s.memory.peak_allocated() / 2**30,
        "mem_peak_reserved_gib": s.memory.peak_reserved() / 2**30,
        "warmup": iteration <= s.warmup_iters,
        "profiled": profiled,
        "time": time.time(),
    }
    if s.memory.installed:       # this iteration's forward/backward and step
        for phase, key in (("forward_backward", "mem_peak_fwd_bwd_gib"),
                           ("optimizer_step", "mem_peak_step_gib")):
            value = s.memory.last[phase]
            record[key] = value / 2**30 if value is not None else None
    if s.is_logging_rank:
        s.writer.write(record)
        _tensorboard(record, iteration)


def record_eval(iteration: int, loss: float) -> None:
    """Evaluation loss (called by forward-step's eval hook) into metrics.jsonl."""
    if _state is not None and _state.is_logging_rank:
        _state.writer.write({"iteration": iteration, "eval_loss": loss, "time": time.time()})


def _tensorboard(record: dict, iteration: int) -> None:
    from megatron.training.global_vars import get_tensorboard_writer

    writer = get_tensorboard_writer()
    if writer is None:
        return
    for key in ("tokens_per_s_per_gpu", "model_tflops_per_gpu", "mfu", "step_time_s",
                "mem_peak_allocated_gib"):
        if record.get(key) is not None:
            writer.add_scalar(f"throughput/{key}", record[key], iteration)


def first_step_start() -> float | None:
    """Epoch seconds at which the first training step began (None before any step)."""
    return _state.first_step_start if _state is not None else None


def finish() -> dict | None:
    """Steady-state summary; collective (every rank calls it). Returns it on the logging rank."""
    s = _state
    if s is None:
        return None
    summary = steady_state(s.records, s.warmup_iters, s.world_size, s.flops_token, s.peak)
    if s.memory.installed:
        s.memory.close("between_steps")     # after the last step: validation, final save
    peaks = torch.tensor([s.memory.peak_allocated(), s.memory.peak_reserved(),
                          *s.memory.run.values()], dtype=torch.float64, device="cuda")
    torch.distributed.all_reduce(peaks, op=torch.distributed.ReduceOp.MAX)
    if s.memory.installed:
        summary["peak_allocated_gib_by_phase"] = {
            phase: value / 2**30 for phase, value in zip(PhasePeaks.PHASES, peaks[2:].tolist())}
    summary.update({
        "device": s.device_name,
        "world_size": s.world_size,
        "tokens_per_step": s.tokens_per_step,
        "flops_per_token": s.flops_token,
        "warmup_iters": s.warmup_iters,
        "peak_allocated_gib_max_over_ranks": peaks[0].item() / 2**30,
        "peak_reserved_gib_max_over_ranks": peaks[1].item() / 2**30,
    })
    return summary if s.is_logging_rank else None


def install_memory_phases(optimizer) -> None:
    """Split the peak memory at Megatron's zero_grad and optimizer step (PhasePeaks)."""
    if _state is None or optimizer is None:
        return
    _state.memory.wrap(optimizer)


def install_ranges(optimizer) -> None:
    """With PROFILE=torch: named ranges around the phases Megatron runs (backward, grad reduce,
    param gather, optimizer step), so the trace report can attribute time to them."""
    from megatron.core.distributed import param_and_grad_buffer
    from megatron.core.pipeline_parallel import schedules

    from training.profiling.ranges import (RANGE_BACKWARD, RANGE_GRAD_REDUCE, RANGE_OPTIMIZER,
                                           RANGE_PARAM_GATHER, train_range)

    def wrap(owner, name: str, range_name: str) -> None:
        original = getattr(owner, name)

        def ranged(*a, **kw):
            with train_range(range_name):
                return original(*a, **kw)

        setattr(owner, name, ranged)

    wrap(schedules, "backward_step", RANGE_BACKWARD)
    bucket_group = param_and_grad_buffer._ParamAndGradBucketGroup
    for name in ("start_grad_sync", "finish_grad_sync"):
        wrap(bucket_group, name, RANGE_GRAD_REDUCE)
    for name in ("start_param_sync", "finish_param_sync"):
        wrap(bucket_group, name, RANGE_PARAM_GATHER)
    if optimizer is not None:
        wrap(optimizer, "step", RANGE_OPTIMIZER)
