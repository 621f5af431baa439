"""GPT pretraining under torchrun: megatron.training's pretrain with this project's providers.

Run by examples/*/train_*.sh (torchrun ... training/pretrain_gpt.py <Megatron args>), or by a
plain torchrun, which gets the launcher's defaults (training.arguments.as_the_launcher).
Megatron owns the loop (distributed optimizer, overlap, checkpointing, evaluation, signal
handling); this file provides the model (backend spec from training.specs), the datasets, the
forward step, and the run folder's metrics and manifest section. What we change inside
Megatron is one table (training.megatron_patches), bound to one object holding the run's
state (training.run.Run). It re-decides nothing the launcher resolved: a backend or kernel
that cannot be built here is an error, not a fallback.
"""
from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import time
from functools import partial
from pathlib import Path

_WORKER_START = time.time()  # before torch and Megatron import: the start-up timeline's origin

if __package__ in (None, ""):  # run as a script by torchrun: make `training` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
if __name__ == "__main__":   # third-party notices at start: into the run folder, a count
    from training import quiet   # (training/quiet.py), before torch and Megatron import

    quiet.install("pretrain_gpt", report_at_exit=False)

import torch  # noqa: E402

_TORCH_IMPORTED = time.time()  # torch alone vs Megatron and ours (the start-up timeline)


def model_provider(pre_process=True, post_process=True, config=None, pg_collection=None,
                   vp_stage=None):
    from megatron.training import get_args
    from megatron.training.argument_utils import core_transformer_config_from_args

    args = get_args()
    config = config or core_transformer_config_from_args(args)
    return build_gpt_model(args, config, pre_process, post_process, pg_collection, vp_stage)


def build_gpt_model(args, config, pre_process=True, post_process=True, pg_collection=None,
                    vp_stage=None):
    """GPTModel with the backend's spec, from Megatron args and a TransformerConfig."""
    from megatron.core.models.gpt import GPTModel

    from training import specs

    decoder_spec = specs.decoder_spec(args.transformer_backend, config, vp_stage=vp_stage,
                                      kernels=args.native_kernels,
                                      experts=getattr(args, "moe_expert_impl", "native"))
    kwargs = {"vp_stage": vp_stage} if vp_stage is not None else {}
    return GPTModel(
        config=config,
        transformer_layer_spec=decoder_spec,
        vocab_size=args.padded_vocab_size,
        max_sequence_length=args.max_position_embeddings,
        pre_process=pre_process,
        post_process=post_process,
        fp16_lm_cross_entropy=args.fp16_lm_cross_entropy,
        parallel_output=True,
        share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
        position_embedding_type=args.position_embedding_type,
        rotary_percent=args.rotary_percent,
        rotary_base=args.rotary_base,
        rope_scaling=args.use_rope_scaling,
        rope_scaling_factor=args.rope_scaling_factor,
        pg_collection=pg_collection,
        **kwargs,
    )


def datasets_provider(run, train_val_test_num_samples, vp_stage=None):
    from megatron.core.datasets.blended_megatron_dataset_builder import \
        BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig, MockGPTDataset
    from megatron.training import get_args, get_tokenizer
    from megatron.training.utils import get_blend_and_blend_per_split

    args = get_args()
    blend, blend_per_split = get_blend_and_blend_per_split(args)
    config = GPTDatasetConfig(
        random_seed=args.seed,
        sequence_length=args.seq_length,
        blend=blend,
        blend_per_split=blend_per_split,
        split=args.split,
        path_to_cache=args.data_cache_path,
        tokenizer=get_tokenizer(),
        reset_position_ids=args.reset_position_ids,
        reset_attention_mask=args.reset_attention_mask,
        eod_mask_loss=args.eod_mask_loss,
        create_attention_mask=args.create_attention_mask_in_dataloader,
    )
    dataset_class = MockGPTDataset if args.mock_data else GPTDataset
    if run.mlperf is not None:  # every evaluation reads the same first sequences, in file order
        from training.mlperf.valid_data import in_order_validation

        dataset_class = in_order_validation(dataset_class,
                                            args.eval_iters * args.eval_global_batch_size)
    datasets = BlendedMegatronDatasetBuilder(dataset_class, train_val_test_num_samples,
                                             lambda: True, config).build()
    if run.mlperf is not None:  # mlperf.log: the documents and tokens the run reads
        run.mlperf.on_datasets(datasets[0], datasets[1])
    return datasets




def loss_func(loss_mask: torch.Tensor, output_tensor: torch.Tensor):
    """Sum of token losses, the token count, and the report Megatron averages per token."""
    if output_tensor.dim() == 0:  # fused linear cross-entropy: already summed over the mask
        loss = output_tensor.float()
    else:
        loss = (output_tensor.float().reshape(-1) * loss_mask.reshape(-1).float()).sum()
    num_tokens = loss_mask.sum().to(torch.int)
    report = torch.cat([loss.detach().view(1), num_tokens.detach().view(1).float()])
    return loss, num_tokens, {"lm loss": report}


def forward_step(run, data_iterator, model, return_schedule_plan: bool = False):
    from megatron.core import parallel_state
    from megatron.training import get_timers

    from training.profiling.ranges import RANGE_DATA, RANGE_FORWARD, train_range

    timers = get_timers()
    timers("batch-generator", log_level=2).start()
    with train_range(RANGE_DATA):
        batch = next(data_iterator)
        packed = None
        if run.args.reset_attention_mask:   # DOCUMENT_MASK=1: the packed (THD) layout
            from training.documents import pack_batch, params_to

            # on the loader's host tensors: finding the documents reads no GPU value
            batch, packed = pack_batch(batch, _eod_token())
            packed = params_to(packed, "cuda")
        batch = {k: (v.cuda(non_blocking=True) if torch.is_tensor(v) else v)
                 for k, v in batch.items()}
        if parallel_state.get_context_parallel_world_size() > 1:
            from megatron.core.utils import get_batch_on_this_cp_rank

            batch.setdefault("cu_seqlens", None)
            batch = get_batch_on_this_cp_rank(batch, is_hybrid_cp=False,
                                              cp_group=parallel_state.get_context_parallel_group())
    timers("batch-generator").stop()
    with train_range(RANGE_FORWARD):
        output = model(batch["tokens"], batch["position_ids"], batch.get("attention_mask"),
                       labels=batch["labels"], loss_mask=batch["loss_mask"],
                       output_processor=run.output_processor, packed_seq_params=packed)
    return output, partial(loss_func, batch["loss_mask"])


def _eod_token() -> int:
    """The tokenizer's end-of-document id (where Megatron's dataset resets its documents)."""
    from megatron.training import get_tokenizer

    return get_tokenizer().eod


# The stack seen by the run (torch, CUDA/ROCm, NCCL/RCCL, driver, TE, apex, Liger, Megatron):
# printed at start on rank 0 (the set-up patch), stored in manifest.json's run section.
from training.versions import collect_versions as run_versions  # noqa: E402


def main() -> None:
    # A run that hangs tells where: `kill -USR1 <pid>` (or `pkill -USR1 -f pretrain_gpt.py`)
    # prints every thread's Python stack to the log and the run goes on.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    from megatron.core.enums import ModelType
    from megatron.training import pretrain
    from megatron.training.argument_utils import pretrain_cfg_container_from_args
    from megatron.training.arguments import parse_and_validate_args

    from training import loop_hooks, megatron_patches, specs
    from training.arguments import add_training_args
    from training.mlperf import events as mlperf_events
    from training.profiling import ranges
    from training.run import Run

    imports_done = time.time()
    rank = int(os.environ.get("RANK", "0"))
    sys.argv[1:] = argv_as_the_launcher(sys.argv[1:], rank)
    args = parse_and_validate_args(extra_args_provider=add_training_args)
    _quiet_log(args.run_dir, rank)
    run = Run(args=args, precision=_precision_of(args), rank=rank)
    run.heartbeat = _heartbeat(args, rank)
    try:  # MLPERF_RUN set: the page cache dropped on each node, mllog's init_start on rank 0
        run.mlperf = mlperf_events.start(args)
    except mlperf_events.CacheNotCleared as err:
        print(f"pretrain_gpt.py: {err}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None

    megatron_patches.apply(run, groups=("run", "profile"))
    if args.transformer_backend == "native":
        run.native = specs.install_native(run)
    elif args.transformer_backend == "transformer_engine":
        run.transformer_engine = specs.install_transformer_engine(run)
    setup = run.native or run.transformer_engine
    if setup is not None:   # both take the fused linear cross-entropy where it runs
        run.output_processor = _output_processor(args)
        setup.parts["cross_entropy"] = _cross_entropy_part(args, run.output_processor)
        if rank == 0:
            print(f"{args.transformer_backend} backend:", json.dumps(setup.parts, indent=1),
                  flush=True)
    ranges.enable_ranges(bool(args.profile and args.use_pytorch_profiler))

    cfg = pretrain_cfg_container_from_args(args)
    datasets = partial(datasets_provider, run)
    # Every rank builds its own data iterators (tensor-parallel ranks read the same samples),
    # so no broadcast of batches within the TP group is needed.
    datasets.is_distributed = True
    pretrain(cfg, datasets, ModelType.encoder_or_decoder, partial(forward_step, run),
             model_provider=model_provider)

    training_done = time.time()
    summary = loop_hooks.finish(run.loop)
    if summary is not None:
        timeline = {"worker_start": _WORKER_START, "torch_imported": _TORCH_IMPORTED,
                    "imports_done": imports_done,
                    "first_step_start": run.loop.first_step_start,
                    "training_done": training_done}
        _report(args, summary, run, timeline)
    if run.mlperf is not None:
        run.mlperf.log.close()
    if run.heartbeat is not None:
        run.heartbeat.close()
    # Megatron leaves the process groups to the interpreter's exit, where torch warns
    # ("destroy_process_group() was not called before program exit, which can leak
    # resources", in every run's log on the H200s): end them here.
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def _heartbeat(args, rank: int):
    """This rank's heartbeats (training.resilience.heartbeat) when something reads them: the
    supervisor (it names the run folder in the environment) or HANG_TIMEOUT's stack dump."""
    from training.resilience.heartbeat import HeartbeatWriter
    from training.resilience.supervise import RUN_DIR_ENV

    if not args.run_dir or not (args.hang_timeout > 0 or os.environ.get(RUN_DIR_ENV)):
        return None
    return HeartbeatWriter(args.run_dir, rank, int(os.environ.get("WORLD_SIZE", "1")),
                           args.hang_timeout)


def _quiet_log(run_dir: str | None, rank: int) -> None:
    """The run folder's third_party.log (rank 0; third_party.rank<N>.log for the others) takes
    the known third-party notices; the count is printed at the first step (loop_hooks)."""
    from training import quiet

    active = quiet.active()
    if active is not None and run_dir:
        name = quiet.LOG_NAME if rank == 0 else quiet.LOG_NAME.replace(".log", f".rank{rank}.log")
        active.set_log(Path(run_dir) / name)


def _fused_linear_ce(args) -> tuple[str | None, str]:
    from training.launch.toggles import fused_linear_ce

    return fused_linear_ce(args.transformer_backend, args.cross_entropy_loss_fusion,
                           args.tensor_model_parallel_size, args.context_parallel_size,
                           args.native_kernels)


def _output_processor(args):
    """The fused linear cross-entropy (GPTModel's output processor) where
    toggles.fused_linear_ce runs one, or None: Megatron's own cross-entropy."""
    kernels, _ = _fused_linear_ce(args)
    if kernels is None:
        return None
    from training.native.cross_entropy import make_output_processor

    return make_output_processor(kernels, args.ce_chunk_mem)


def _cross_entropy_part(args, processor) -> str:
    if processor is not None:
        return processor.description
    _, why = _fused_linear_ce(args)
    if args.cross_entropy_loss_fusion:
        return f"Megatron's fused cross-entropy, logits materialised ({why})"
    return "Megatron's unfused cross-entropy (logits materialised)"


def argv_as_the_launcher(argv: list[str], rank: int) -> list[str]:
    """A plain `torchrun training/pretrain_gpt.py` gets what the launcher derives
    (training.arguments.as_the_launcher); shown on rank 0. A contradiction exits 2."""
    from training.arguments import ArgumentConflict, as_the_launcher

    try:
        argv, notes = as_the_launcher(argv)
    except ArgumentConflict as err:
        print(f"pretrain_gpt.py: {err}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    if notes and rank == 0:
        print("pretrain_gpt.py, as the launcher derives them:\n  " + "\n  ".join(notes),
              flush=True)
    return argv


def _precision_of(args) -> str:
    from training.launch.recipes import precision_of

    return precision_of(args.fp8_recipe if getattr(args, "fp8", None) else None,
                        args.fp4_recipe if getattr(args, "fp4", None) else None)


def _report(args, summary: dict, state, timeline: dict) -> None:
    from training.fork_summary import fork_summary_lines
    from training.launch.runfolder import update_manifest

    if summary.get("measured"):
        mfu = f"{summary['mfu']:.1%}" if summary["mfu"] is not None else "peak unknown"
        print(f"[summary] tokens/s/GPU {summary['tokens_per_s_per_gpu']:,.0f} | model TFLOP/s/GPU "
              f"{summary['model_tflops_per_gpu']:.1f} | MFU {mfu} | peak memory "
              f"{summary['peak_allocated_gib_max_over_ranks']:.1f} GiB allocated, "
              f"{summary['peak_reserved_gib_max_over_ranks']:.1f} GiB reserved | "
              f"{summary['steps']} steady-state steps after {summary['warmup_iters']} warm-up",
              flush=True)
    else:
        print(f"[summary] throughput not measured: {summary['reason']}", flush=True)
    device = (torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
              if torch.cuda.is_available() else None)
    for line in fork_summary_lines(summary, device):   # the ROCm fork's closing lines
        print(line, flush=True)
    if args.run_dir:
        run = Path(args.run_dir)
        native, te = state.native, state.transformer_engine
        update_manifest(run, "run", {"versions": run_versions(), "summary": summary,
                                     "native": native.parts if native else None,
                                     "transformer_engine": te.parts if te else None,
                                     "timeline": timeline})
        _collect_profile(run)


def _collect_profile(run: Path) -> None:
    """Megatron writes torch-profiler traces to <tensorboard>/../torch_profile; the run folder
    keeps them under profile/."""
    source = run / "torch_profile"
    if source.is_dir():
        target = run / "profile"
        target.mkdir(exist_ok=True)
        for trace in source.iterdir():
            trace.replace(target / trace.name)
        source.rmdir()


def exit_on_error(run) -> None:
    """Run `run`; on an exception, print it and end the process at once. Left to the
    interpreter's shutdown, a worker whose forward raised stayed alive (seen on an H200 with
    the local backend: the traceback printed, then no exit for minutes), so torchrun never
    saw the failure and the job hung instead of failing. SystemExit (Megatron's exit on a
    signal or at --exit-interval) keeps the normal shutdown."""
    import traceback

    try:
        run()
    except Exception:  # SystemExit and KeyboardInterrupt are not Exceptions: they pass
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


if __name__ == "__main__":
    try:
        exit_on_error(main)
    except SystemExit as stop:   # a user error's 2, for the supervisor (torchrun says 1)
        from training.resilience.supervise import record_worker_exit

        record_worker_exit(stop.code)
        raise
