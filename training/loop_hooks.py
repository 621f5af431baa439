"""Measurements inside Megatron's training loop, without a loop of our own.

Megatron's `train()` calls module-level functions of megatron.training.training each
iteration; the replacements below take their place through the patch table
(training.megatron_patches), bound to the run (training.run.Run):
  setup_model_and_optimizer  starts the run's measurements (RunState), then splits the peak
                memory at the optimizer's zero_grad and step (PhasePeaks)
  train_step    timed with a device synchronisation on both sides: the step time is the
                forward, backward, gradient reduce and optimizer step of one global batch,
                data loading included, logging/eval/checkpointing excluded
  training_log  after Megatron's own logging, one line per iteration to <run>/metrics.jsonl
                (loss, grad norm, lr, step time, tokens/s/GPU, model TFLOP/s/GPU, MFU,
                peak memory) and the same scalars to TensorBoard; NAN_CHECK=step's stop;
                the iteration's heartbeat
  evaluate, evaluate_and_print_results  the validation loss, with its iteration, to
                metrics.jsonl and to the loop listeners
  build_train_valid_test_data_iterators  the loop listeners told before any data is read
  train         the loop listeners told when training starts and ends; the heartbeats' first
                and last beat (training.resilience.heartbeat: HANG_TIMEOUT, RESTARTS)
  save_checkpoint_and_time  a heartbeat before each save
  (MoE models)  the routers' load balance and Megatron's aux losses per iteration in
                metrics.jsonl (training.router_stats; the aux losses through the table's
                moe_router_losses entry)
`finish()` (after pretrain returns) computes the steady-state summary, takes the peak memory
over all ranks, prints the summary and stores it in manifest.json.

Loop listeners (Run.listeners, e.g. training.mlperf.events.MLPerfRun) are told before Megatron
builds its data iterators (on_run_start), when training starts and ends and around each evaluation, with the eval loss on every rank; one that returns
True from on_eval_end stops training after that iteration (`stop_after_this_evaluation`).
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from training.metrics import MetricsWriter, StepRecord, flops_per_token, peak_tflops, steady_state
from training.router_stats import RouterStats, megatron_groups
from training.run_description import Model


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
    """The loop's measurements of one run (training.run.Run.loop), from Megatron's set-up on."""

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
    profile_window: tuple[int, int] = (0, -1)
    nan_check_step: bool = False
    first_step_start: float | None = None  # epoch seconds: where start-up ends
    memory: PhasePeaks = field(default_factory=PhasePeaks)
    router: object | None = None  # training.router_stats.RouterStats of an MoE model

    @classmethod
    def start(cls, args, precision: str) -> "RunState":
        """After Megatron's initialize (torch.distributed up, args known)."""
        shape = Model.from_megatron_args(args)
        device_name = torch.cuda.get_device_name()
        rank = torch.distributed.get_rank()
        logging_rank = rank == torch.distributed.get_world_size() - 1  # last PP stage: the loss
        run_dir = Path(args.run_dir) if args.run_dir else None
        return cls(
            run_dir=run_dir, warmup_iters=args.metrics_warmup_iters,
            tokens_per_step=args.global_batch_size * args.seq_length,
            world_size=args.world_size, flops_token=flops_per_token(shape),
            peak=peak_tflops(device_name, precision), device_name=device_name,
            writer=MetricsWriter(run_dir / "metrics.jsonl" if (run_dir and logging_rank)
                                 else None),
            is_logging_rank=logging_rank,
            profile_window=((args.profile_step_start, args.profile_step_end + 1)
                            if args.profile else (0, -1)),
            nan_check_step=args.nan_check == "step",
            router=RouterStats() if getattr(args, "num_experts", None) else None)


# -- replacements of Megatron's loop functions (the entries of training.megatron_patches):
#    each takes Megatron's original and the run, and returns the function put in its place --

def measured_setup(original, run):
    """setup_model_and_optimizer: start the run's measurements (torch.distributed is up, the
    model not yet built), print the stack's versions, then after the set-up split the peak
    memory at the optimizer's zero_grad and step, and with PROFILE=torch range its step."""
    from training.profiling import ranges
    from training.versions import collect_versions

    def setup_model_and_optimizer(*a, **kw):
        run.loop = RunState.start(run.args, run.precision)
        if torch.distributed.get_rank() == 0:
            print("run versions:", json.dumps(collect_versions()), flush=True)
        model, optimizer, scheduler = original(*a, **kw)
        if run.loop.router is not None:       # MoE: count each router's tokens per expert
            run.loop.router.attach(model)
        if optimizer is not None:
            run.loop.memory.wrap(optimizer)
            if ranges.ranges_enabled():
                range_optimizer_step(optimizer)
        return model, optimizer, scheduler

    return setup_model_and_optimizer


def _quiet_count(rank: int) -> None:
    """Rank 0 says, once, how many known third-party lines went to the run folder
    (training/quiet.py) before this first step."""
    from training import quiet

    active = quiet.active()
    if active is not None and rank == 0:
        active.report()


def timed_train_step(original, run):
    """train_step, timed with a device synchronisation on both sides."""

    def train_step(*a, **kw):
        state = run.loop
        torch.cuda.synchronize()
        if state.first_step_start is None:
            state.first_step_start = time.time()
            _quiet_count(run.rank)
        start = time.perf_counter()
        out = original(*a, **kw)
        torch.cuda.synchronize()
        state.last_step_time = time.perf_counter() - start
        return out

    return train_step


def logged_training_log(original, run):
    """training_log: after Megatron's logging, our line of metrics.jsonl and TensorBoard's
    scalars; with NAN_CHECK=step, the stop at a non-finite loss or gradient norm."""

    def training_log(loss_dict, total_loss_dict, learning_rate, iteration, loss_scale,
                     report_memory_flag, skipped_iter, grad_norm, *a, **kw):
        result = original(loss_dict, total_loss_dict, learning_rate, iteration, loss_scale,
                          report_memory_flag, skipped_iter, grad_norm, *a, **kw)
        _on_iteration(run.loop, iteration, loss_dict, learning_rate, grad_norm, skipped_iter)
        if run.heartbeat is not None:
            run.heartbeat.beat("step", iteration)
        if run.loop.nan_check_step:
            check_finite(iteration, loss_dict.get("lm loss"), grad_norm)
        return result

    return training_log


def listened_evaluate_and_print(original, run):
    """evaluate_and_print_results: the evaluation's iteration for the eval-loss record, the
    listeners told around it (with the loss on every rank), and a listener's stop."""

    def evaluate_and_print_results(prefix, forward_step_func, data_iterator, model, iteration,
                                   *a, **kw):
        run.eval_iteration, run.eval_loss = iteration, None
        if run.heartbeat is not None:
            run.heartbeat.beat("eval", iteration)
        for listener in run.listeners:
            listener.on_eval_start(run.args, iteration)
        result = original(prefix, forward_step_func, data_iterator, model, iteration, *a, **kw)
        if run.listeners:
            loss = _loss_on_every_rank(run.eval_loss)
            stop = [listener.on_eval_end(run.args, iteration, loss)
                    for listener in run.listeners]
            if any(stop):
                stop_after_this_evaluation(run.args, iteration)
        return result

    return evaluate_and_print_results


def recorded_evaluate(original, run):
    """evaluate: its loss kept for the listeners and written to metrics.jsonl."""

    def evaluate(*a, **kw):
        result = original(*a, **kw)
        losses = result[0] or {}
        run.eval_loss = float(losses["lm loss"]) if "lm loss" in losses else None
        if run.eval_loss is not None and run.loop is not None:
            record_eval(run.loop, run.eval_iteration, run.eval_loss)
        return result

    return evaluate


def listened_data_iterators(original, run):
    """build_train_valid_test_data_iterators: the listeners told before Megatron builds its
    datasets and loaders, the first thing in pretrain() that reads the data (MLPerf's
    run_start). Every rank meets at a barrier after them, so no rank reads before rank 0 has
    logged."""

    def build_train_valid_test_data_iterators(*a, **kw):
        if run.listeners and not run.data_announced:
            for listener in run.listeners:
                listener.on_run_start(run.args)
            run.data_announced = True
            if torch.distributed.is_available() and torch.distributed.is_initialized():
                torch.distributed.barrier()
        return original(*a, **kw)

    return build_train_valid_test_data_iterators


def listened_train(original, run):
    """train: the listeners told when training starts and ends (also on SIGTERM's exit: the
    run ends unfinished, status aborted)."""

    def train(*a, **kw):
        if run.heartbeat is not None:
            run.heartbeat.beat("start", run.args.iteration or None)
        for listener in run.listeners:
            listener.on_train_start(run.args)
        try:
            return original(*a, **kw)
        finally:
            for listener in run.listeners:
                listener.on_train_end(run.args)
            if run.heartbeat is not None:
                run.heartbeat.beat("end", run.args.iteration or None)

    return train


def beating_save(original, run):
    """save_checkpoint_and_time: a heartbeat (phase save) before each save."""

    def save_checkpoint_and_time(iteration, *a, **kw):
        run.heartbeat.beat("save", iteration)
        return original(iteration, *a, **kw)

    return save_checkpoint_and_time


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


def _on_iteration(s: RunState, iteration: int, loss_dict: dict, lr, grad_norm,
                  skipped: int) -> None:
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
    if s.router is not None:     # collective: every rank takes part
        record.update(s.router.summary(*megatron_groups()))
    if s.memory.installed:       # this iteration's forward/backward and step
        for phase, key in (("forward_backward", "mem_peak_fwd_bwd_gib"),
                           ("optimizer_step", "mem_peak_step_gib")):
            value = s.memory.last[phase]
            record[key] = value / 2**30 if value is not None else None
    if s.is_logging_rank:
        s.writer.write(record)
        _tensorboard(record, iteration)


def record_eval(s: RunState, iteration: int | None, loss: float) -> None:
    """An evaluation's loss into metrics.jsonl."""
    if s.is_logging_rank:
        s.writer.write({"iteration": iteration, "eval_loss": loss, "time": time.time()})


def _tensorboard(record: dict, iteration: int) -> None:
    from megatron.training.global_vars import get_tensorboard_writer

    writer = get_tensorboard_writer()
    if writer is None:
        return
    for key in ("tokens_per_s_per_gpu", "model_tflops_per_gpu", "mfu", "step_time_s",
                "mem_peak_allocated_gib", "moe_load_imbalance"):
        if record.get(key) is not None:
            writer.add_scalar(f"throughput/{key}", record[key], iteration)


def finish(s: RunState | None) -> dict | None:
    """Steady-state summary; collective (every rank calls it). Returns it on the logging rank."""
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


def range_optimizer_step(optimizer) -> None:
    """PROFILE=torch: a named range around the optimizer step (the object Megatron built)."""
    from training.profiling.ranges import RANGE_OPTIMIZER

    optimizer.step = ranged(optimizer.step, None, RANGE_OPTIMIZER)


def ranged(original, run, range_name: str):
    """`original` inside a named range of the trace (PROFILE=torch): the replacement of the
    Megatron functions the profile entries of training.megatron_patches name."""
    from training.profiling.ranges import train_range

    def in_range(*a, **kw):
        with train_range(range_name):
            return original(*a, **kw)

    return in_range
