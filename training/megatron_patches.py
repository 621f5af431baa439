"""Every change this project makes to megatron-core's modules at run time, in one table.

Each Patch names its target ("module:attribute", or "module:Class.attribute"), our replacement
("module:name" of a factory called with Megatron's original and the run, training.run.Run; or
of an object put in as it is; or a constant), why, when it applies, and the target's signature
the replacement was written against (parameters and defaults, annotations left out: see
plain_signature). tests/test_megatron_patches.py checks every target against the pinned
megatron-core, so an upgrade that moves or changes one fails on the CPU; at run time a
changed signature is printed as a warning (a platform's image may run another Megatron).

apply(run) puts the entries whose `when` holds in place (and takes out those of the
selection whose `when` does not, left by an earlier run in the same process). It is
idempotent: the target's owner (module or class) keeps a marker, MARKER, mapping the attribute
to what was applied (patch, key, original, replacement); an entry already in place with the
same key is left alone, one with another key (another run, other kernels) is rebuilt over the
original it replaced, never stacked. What it changed is printed once, on rank 0. restore()
puts the originals back. in_place(name) names what a target holds (ours, or what Megatron
imported), for the manifest.

The TE backend takes one entry group of the native kernels: the fused wgrad of its output
layer (native_wgrad, where apex's kernel is absent); everything else is TE's.

Native backend policy, with Transformer Engine or apex importable: the kernels that compute
the model (fused QKV RoPE, SwiGLU; the norm is the spec's) are ours on every image, so a
native run computes the same functions everywhere (parity-tested against HF); the
optimizer-side kernels (FusedAdam, the multi-tensor l2 norm and scale, the fused wgrad GEMM)
are TE's/apex's where Megatron imported them (the vendors' kernels; TE's FusedAdam also holds
the precision-aware optimizer state) and ours only where Megatron fell back to torch.
"""
from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Hashable

MARKER = "__megatron_patches__"
_ABSENT = object()   # an attribute that does not exist before the patch creates it


@dataclass(frozen=True)
class Applied:
    """What apply() did to one attribute (kept in the owner's MARKER dict)."""

    name: str
    key: Hashable
    original: Any            # _ABSENT when the attribute did not exist
    replacement: Any


def _always(run) -> bool:
    return True


def _anything(original) -> bool:
    return True


def _no_key(run) -> Hashable:
    return None


def _this_run(run) -> Hashable:
    return id(run)


def _native(run) -> bool:
    return run.args.transformer_backend == "native"


def _profiling(run) -> bool:
    return bool(run.args.profile and run.args.use_pytorch_profiler)


@dataclass(frozen=True)
class Patch:
    name: str
    target: str                    # "module:attribute" or "module:Class.attribute"
    replacement: str | None        # "module:name": a factory (original, run, *args), or as_is
    why: str
    signature: str | None          # plain_signature of the target when written; None: a value
    what: str = ""                 # how the manifest names our replacement
    group: str = "run"             # run | profile | native
    when: Callable[[Any], bool] = _always
    over: Callable[[Any], bool] = _anything   # replace only an original for which this holds
    key: Callable[[Any], Hashable] = _no_key
    as_is: bool = False            # replacement names the object itself, not a factory
    constant: Any = None           # replacement None: this value
    args: tuple = ()
    absent_ok: bool = False        # the attribute may be missing before (the patch creates it)

    @property
    def module(self) -> str:
        return self.target.split(":", 1)[0]

    @property
    def path(self) -> list[str]:
        return self.target.split(":", 1)[1].split(".")

    def build(self, original, run):
        if self.replacement is None:
            return self.constant
        obj = resolve(self.replacement)
        return obj if self.as_is else obj(original, run, *self.args)


def resolve(reference: str):
    """The object named "module:attr[.attr...]"."""
    module, _, path = reference.partition(":")
    obj = importlib.import_module(module)
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def plain_signature(obj) -> str:
    """A callable's parameters and defaults, annotations left out (they render differently
    across Python versions; the names, order, kinds and defaults are what a wrapper relies on)."""
    sig = inspect.signature(obj)
    params = [p.replace(annotation=inspect.Parameter.empty) for p in sig.parameters.values()]
    return str(sig.replace(parameters=params, return_annotation=inspect.Signature.empty))


# -- the fallbacks Megatron builds without TE or apex (the native optimizer-side entries
#    replace only these) -----------------------------------------------------------------

def _torch_adamw(original) -> bool:
    import torch

    return original is torch.optim.AdamW


def _torch_optimizer_flag(original) -> bool:
    return original is True


def _local_l2_norm(original) -> bool:
    from megatron.core import utils

    return original is utils.local_multi_tensor_l2_norm


def _local_scale(original) -> bool:
    from megatron.core import utils

    return original is utils.local_multi_tensor_scale


def _no_wgrad_kernel(original) -> bool:
    return original is _ABSENT or original is None


def _no_wgrad_flag(original) -> bool:
    return original is False


def _qkv_rope(run) -> bool:
    return _native(run) and bool(run.args.fused_single_qkv_rope)


def _liger_swiglu(run) -> bool:
    return _native(run) and run.args.native_kernels == "liger"


def _wgrad(run) -> bool:
    """Megatron's own linears take the fused wgrad: every linear of the native backend, and
    under the TE spec its output layer (Megatron's ColumnParallelLinear, which asks for apex's
    kernel even there; TE's linears use TE's own)."""
    return (run.args.transformer_backend in ("native", "transformer_engine")
            and bool(run.args.gradient_accumulation_fusion))


def _clamped_geglu(run) -> bool:
    """gpt-oss's experts: the clamped quick-GeGLU (any backend: the grouped MLP calls it)."""
    return (_moe(run) and bool(getattr(run.args, "quick_geglu", False))
            and getattr(run.args, "activation_func_clamp_value", None) is not None)


def _kernels(run) -> Hashable:
    return run.args.native_kernels


def _adam_key(run) -> Hashable:
    return (getattr(run.args, "master_weights", "fp32"), run.args.native_kernels)


def _native_without_te_adam(run) -> bool:
    """Megatron's Adam is the native builder (it fell back to torch's: no TE or apex)."""
    from megatron.core import optimizer

    return _native(run) and bool(getattr(optimizer.Adam, "native", False))


def _te_fused_adam(original) -> bool:
    """Megatron's Adam is Transformer Engine's FusedAdam (TE imports)."""
    return str(getattr(original, "__module__", "")).startswith("transformer_engine.")


def _native_adam_over_te(run) -> bool:
    return getattr(run.args, "adam_impl", "auto") == "native"


def _moe(run) -> bool:
    return bool(getattr(run.args, "num_experts", None))


def _native_moe(run) -> bool:
    """The MoE layers run the native backend's MoE pieces: on the native backend, or on TE's
    with --moe-expert-impl native."""
    return _moe(run) and (_native(run) or (
        run.args.transformer_backend == "transformer_engine"
        and getattr(run.args, "moe_expert_impl", "native") == "native"))


def _native_moe_permute(run) -> bool:
    return _native_moe(run) and bool(run.args.native_moe_permute)


def _moe_device_counts(run) -> bool:
    return _native_moe(run) and bool(getattr(run.args, "moe_device_counts", False))


def _kernels_and_topk(run) -> Hashable:
    return run.args.native_kernels, run.args.moe_router_topk


def _swiglu_impl(run) -> Hashable:
    from training.native import IMPLEMENTATION

    return IMPLEMENTATION["swiglu"]


def _ranged(range_name: str) -> tuple:
    return (range_name,)


TRAINING = "megatron.training.training"
BUCKET_GROUP = "megatron.core.distributed.param_and_grad_buffer:_ParamAndGradBucketGroup"
DIST_OPT = "megatron.core.optimizer.distrib_optimizer:DistributedOptimizer"
SIG_SETUP = ("(model_type, model_provider_func=None, checkpointing_context=None, *, "
             "cfg_container=None, pg_collection=None)")
SIG_TRAIN_STEP = ("(forward_step_func, data_iterator, model, optimizer, opt_param_scheduler, "
                  "config, forward_backward_func, iteration=None, pg_collection=None, "
                  "p2p_communicator=None)")
SIG_TRAINING_LOG = ("(loss_dict, total_loss_dict, learning_rate, iteration, loss_scale, "
                    "report_memory_flag, skipped_iter, grad_norm, params_norm, "
                    "num_zeros_in_grad, max_attention_logit, pg_collection=None, "
                    "is_first_iteration=False, seqlen_squared_sum_in_batch=None, "
                    "total_real_tokens_in_batch=None)")
SIG_EVAL_PRINT = ("(prefix, forward_step_func, data_iterator, model, iteration, "
                  "process_non_loss_data_func, config, verbose=False, "
                  "write_to_tensorboard=True, non_loss_data_func=None, pg_collection=None, "
                  "p2p_communicator=None)")
SIG_EVALUATE = ("(forward_step_func, data_iterator, model, process_non_loss_data_func, config, "
                "verbose=False, non_loss_data_func=None, eval_iters=None, pg_collection=None, "
                "p2p_communicator=None)")
SIG_TRAIN = ("(forward_step_func, model, optimizer, opt_param_scheduler, train_data_iterator, "
             "valid_data_iterator, process_non_loss_data_func, config, checkpointing_context, "
             "non_loss_data_func, inference_model=None, p2p_communicator=None, "
             "pg_collection=None)")
SIG_DATA_ITERATORS = "(build_train_valid_test_datasets_provider)"
SIG_SET_RANDOM_SEED = ("(seed_, data_parallel_random_init=False, te_rng_tracker=False, "
                       "inference_rng_tracker=False, use_cudagraphable_rng=False, "
                       "pp_group=None, dp_group=None, tp_group=None, ep_group=None, "
                       "etp_group=None)")
SIG_DECIDE_EXIT = ("(model, optimizer, opt_param_scheduler, iteration, "
                   "num_floating_point_operations_so_far, checkpointing_context, "
                   "train_data_iterator)")
SIG_SAVE_AND_TIME = ("(iteration, model, optimizer, opt_param_scheduler, "
                     "num_floating_point_operations_so_far, checkpointing_context, "
                     "non_persistent_ckpt=False, train_data_iterator=None)")
SIG_MOE_AGGREGATE = "(self, loss_scale, num_moe_layers, metric_names, percentiles=None)"
SIG_PERMUTE = ("(tokens, routing_map, probs=None, num_out_tokens=None, fused=False, "
               "drop_and_pad=False, tokens_per_expert=None, align_size=0)")
SIG_UNPERMUTE = ("(permuted_tokens, sorted_indices, restore_shape, probs=None, "
                 "routing_map=None, fused=False, drop_and_pad=False, pad_offsets=None)")
SIG_SORT_CHUNKS = "(input, split_sizes, sorted_idxs, probs=None, fused=False)"
SIG_DEVICE_COUNTS = "(self, point, tokens_per_expert=None)"
SIG_MULTI_TENSOR_L2 = "(chunk_size, noop_flag, tensor_lists, per_tensor, *args)"
SIG_MULTI_TENSOR_SCALE = "(chunk_size, noop_flag, tensor_lists, scale)"

PATCHES: tuple[Patch, ...] = (
    # -- every run ------------------------------------------------------------------------
    Patch("dataset_helpers", "megatron.core.datasets.utils:compile_helpers",
          "training.megatron_patches:prebuilt_dataset_helpers",
          "initialize runs `make -C megatron/core/datasets` to build the C++ dataset helpers; "
          "the PyPI wheel ships them prebuilt (helpers_cpp) and no Makefile, so a stock run "
          "exits with 'Failed to compile the C++ dataset helper functions'. The prebuilt "
          "module is imported (raising if really missing) and the compile step skipped.",
          "()", what="skipped: the wheel's prebuilt helpers_cpp"),
    Patch("measured_setup", f"{TRAINING}:setup_model_and_optimizer",
          "training.loop_hooks:measured_setup",
          "the run's measurements start once torch.distributed is up and before the model is "
          "built; the optimizer Megatron builds gets the peak-memory phase split (and, with "
          "PROFILE=torch, a range around its step)", SIG_SETUP, key=_this_run),
    Patch("timed_step", f"{TRAINING}:train_step", "training.loop_hooks:timed_train_step",
          "step time with a device synchronisation on both sides: tokens/s, TFLOP/s, MFU",
          SIG_TRAIN_STEP, key=_this_run),
    Patch("metrics_log", f"{TRAINING}:training_log", "training.loop_hooks:logged_training_log",
          "metrics.jsonl and TensorBoard after Megatron's log line; NAN_CHECK=step's stop",
          SIG_TRAINING_LOG, key=_this_run),
    Patch("eval_listeners", f"{TRAINING}:evaluate_and_print_results",
          "training.loop_hooks:listened_evaluate_and_print",
          "the evaluation's iteration for its record; loop listeners (MLPerf) told around "
          "each evaluation, and their stop at a target", SIG_EVAL_PRINT, key=_this_run),
    Patch("eval_loss", f"{TRAINING}:evaluate", "training.loop_hooks:recorded_evaluate",
          "the evaluation's loss to metrics.jsonl and to the loop listeners", SIG_EVALUATE,
          key=_this_run),
    Patch("data_listeners", f"{TRAINING}:build_train_valid_test_data_iterators",
          "training.loop_hooks:listened_data_iterators",
          "loop listeners told before Megatron builds its datasets and loaders, the first "
          "reading of the data in pretrain() (MLPerf's run_start: the clock starts before any "
          "data is touched)", SIG_DATA_ITERATORS, when=lambda run: bool(run.listeners),
          key=_this_run),
    Patch("mlperf_seed", "megatron.training.initialize:_set_random_seed",
          "training.mlperf.events:seed_from_rank_zero",
          "an MLPerf run's seed is drawn per run by each node's launcher: every rank takes rank "
          "0's before Megatron seeds its generators (and before any dataset reads args.seed)",
          SIG_SET_RANDOM_SEED, when=lambda run: run.mlperf is not None, key=_this_run),
    Patch("train_listeners", f"{TRAINING}:train", "training.loop_hooks:listened_train",
          "loop listeners told when training starts and ends (MLPerf's run_start/run_stop); "
          "the heartbeats' first and last beat",
          SIG_TRAIN, when=lambda run: bool(run.listeners) or run.heartbeat is not None,
          key=_this_run),
    Patch("preemption_record", f"{TRAINING}:checkpoint_and_decide_exit",
          "training.resilience.preemption:recorded_exit",
          "Megatron's exit at a signal (--exit-signal-handler) and a finished run both end "
          "with status 0: the signal's exit writes preemption.json (the saved iteration) and "
          "says so, for the supervisor's requeue status", SIG_DECIDE_EXIT,
          when=lambda run: bool(run.args.exit_signal_handler), key=_this_run),
    Patch("heartbeat_save", f"{TRAINING}:save_checkpoint_and_time",
          "training.loop_hooks:beating_save",
          "HANG_TIMEOUT/RESTARTS: a beat before each save (a save is where a rank spends "
          "longest between iterations; the hang diagnosis says the rank was saving)",
          SIG_SAVE_AND_TIME, when=lambda run: run.heartbeat is not None, key=_this_run),
    Patch("moe_router_losses",
          "megatron.core.transformer.moe.moe_logging:MoEMetricsTracker._aggregate",
          "training.router_stats:capturing_aggregate",
          "MoE models: the aux losses Megatron's tracker reduces for its log line, kept for "
          "metrics.jsonl (training.router_stats)", SIG_MOE_AGGREGATE, when=_moe,
          key=_this_run),
    Patch("atomic_marker", "megatron.training.checkpointing:maybe_msc",
          "training.checkpoint_marker:atomic_marker_storage",
          "Megatron writes latest_checkpointed_iteration.txt with a plain write-mode open: a kill "
          "between its truncation and its write left an empty marker, on which the next load "
          "exits. Written to a temp file, fsynced and renamed instead (after a save is "
          "finalized, an async save's too), so the marker always names a complete checkpoint",
          None, what="atomic: temp file, fsync, rename (training.checkpoint_marker)"),
    Patch("torch_adam_state_dict", f"{DIST_OPT}.state_dict",
          "training.native.optimizer:state_filled_before_state_dict",
          "a resume reads every parameter's Adam step before any step ran: a torch "
          "Adam/AdamW is given the state of its first step first", "(self)"),
    Patch("torch_adam_load_copy", f"{DIST_OPT}._set_main_param_and_optimizer_states",
          "training.native.optimizer:copy_leaving_step",
          "the per-parameter copy of a loaded checkpoint overwrote torch Adam's restored step "
          "(bias correction restarted after every resume) or raised KeyError: 'step'",
          "(self, model_param, tensors)"),
    # -- PROFILE=torch: named ranges the trace report attributes time to -------------------
    *(Patch(name, target, "training.loop_hooks:ranged",
            f"PROFILE=torch: the trace's {range_name} range", signature, group="profile",
            when=_profiling, args=_ranged(range_name))
      for name, target, range_name, signature in (
          ("range_backward", "megatron.core.pipeline_parallel.schedules:backward_step",
           "train/backward", "(input_tensor, output_tensor, output_tensor_grad, config)"),
          ("range_grad_sync_start", f"{BUCKET_GROUP}.start_grad_sync", "train/grad_reduce",
           "(self, force_all_reduce=False)"),
          ("range_grad_sync_finish", f"{BUCKET_GROUP}.finish_grad_sync", "train/grad_reduce",
           "(self, force_all_reduce=False)"),
          ("range_param_sync_start", f"{BUCKET_GROUP}.start_param_sync", "train/param_gather",
           "(self, force_sync=False)"),
          ("range_param_sync_finish", f"{BUCKET_GROUP}.finish_param_sync",
           "train/param_gather", "(self, skip_next_bucket_dispatch=False)"))),
    # -- the native backend ----------------------------------------------------------------
    Patch("native_qkv_rope", "megatron.core.transformer.attention:apply_fused_qkv_rotary_pos_emb",
          "training.native.rope:qkv_rope_replacement",
          "fused_single_qkv_rope calls TE's function of this name; without TE Megatron has "
          "none (and with TE the native backend keeps its own kernel)", None,
          group="native", when=_qkv_rope, key=_kernels,
          absent_ok=True),
    Patch("native_qkv_rope_available", "megatron.core.transformer.attention:HAVE_FUSED_QKV_ROPE",
          None, "Megatron's attention takes the fused path only where this is True", None,
          group="native", when=_qkv_rope, constant=True),
    Patch("native_document_rope", "megatron.core.transformer.attention:apply_rotary_pos_emb",
          "training.native.document_rope:document_rope_replacement",
          "documents kept apart (the packed THD layout): without TE's fused kernel Megatron "
          "rotates the query and key one document at a time (a dozen kernels per document each "
          "way) after reading the documents' lengths on the host (.tolist(), .item()) in every "
          "layer; one gather of the rotary table by each token's position in its document "
          "instead (~0.88x of the unpacked run at Llama3-8B seq 8192 with Megatron's loop, "
          "issue 51)",
          "(t, freqs, config, cu_seqlens=None, mscale=1.0, cp_group=None, "
          "mla_rotary_interleaved=False)",
          what="RoPE over packed documents as one gather by position in document",
          group="native", when=_native),
    Patch("native_swiglu", "megatron.core.transformer.mlp:bias_swiglu_impl",
          "training.native.swiglu:swiglu_replacement",
          "one Triton pass each way for the bias-free SwiGLU (NATIVE_KERNELS=liger)",
          "(input, bias, fp8_input_store=False, cpu_offload_input=False)",
          group="native", when=_liger_swiglu, key=_swiglu_impl),
    Patch("native_adam", "megatron.core.optimizer:Adam", "training.native.optimizer:native_adam",
          "without TE or apex Megatron builds torch's foreach AdamW: torch's fused one instead; "
          "under --use-precision-aware-optimizer (the optimizer-state toggles) the native "
          "MixedPrecisionAdamW, which takes the keywords Megatron gives TE's FusedAdam there",
          None, group="native", when=_native, over=_torch_adamw, key=_adam_key),
    Patch("native_adam_over_te", "megatron.core.optimizer:Adam",
          "training.native.optimizer:native_adam_over_te",
          "ADAM_IMPL=native: where TE imports, Megatron builds TE's FusedAdam; under the "
          "precision-aware optimizer the native MixedPrecisionAdamW instead (the recorded "
          "traces put TE's step at over twice ours at the Qwen3 MoE shape, docs/moe.md)",
          None, group="native", when=_native_adam_over_te, over=_te_fused_adam, key=_adam_key),
    Patch("native_precision_aware", "megatron.core.optimizer.optimizer_config:"
          "OptimizerConfig.__post_init__", "training.native.optimizer:precision_aware_without_te",
          "Megatron checks for TE's FusedAdam under --use-precision-aware-optimizer; where its "
          "Adam is the native one (no TE or apex), that check is skipped as Megatron skips it "
          "for its CPU offload, and its other checks run", "(self)", group="native",
          when=_native_without_te_adam),
    Patch("native_adam_kwargs", "megatron.core.optimizer:USING_PYTORCH_OPTIMIZER", None,
          "Megatron passes FusedAdam's keywords (adam_w_mode) when this is False; "
          "FusedTorchAdamW takes them", None, group="native", when=_native,
          over=_torch_optimizer_flag, constant=False),
    Patch("native_l2_norm", "megatron.core.optimizer.clip_grads:l2_norm_impl",
          "training.native.multi_tensor:foreach_l2_norm",
          "Megatron's local l2 norm syncs the host once per parameter", SIG_MULTI_TENSOR_L2,
          what="torch foreach l2 norm (gradient clipping)", group="native", when=_native,
          over=_local_l2_norm, as_is=True),
    *(Patch(name, f"{module}:multi_tensor_scale_impl", "training.native.multi_tensor:foreach_scale",
            why, SIG_MULTI_TENSOR_SCALE, what=what, group="native", when=_native,
            over=_local_scale, as_is=True)
      for name, module, why, what in (
          ("native_clip_scale", "megatron.core.optimizer.clip_grads",
           "Megatron's local scale copies each gradient it clips",
           "torch foreach in-place scale (gradient clipping)"),
          ("native_copy_scale", "megatron.core.optimizer.optimizer",
           "the same scale for the optimizer's param copies",
           "torch foreach scale (param copies)"))),
    *(Patch(name, f"megatron.core.transformer.moe.token_dispatcher:{attribute}",
            f"training.native.moe_permute:{factory}",
            f"MoE: the dispatchers' {attribute} as gathers; Megatron's torch {attribute} "
            "accumulates with atomics (scatter_add_ / index_add_) and its fused one is TE's",
            signature, what=f"atomic-free {attribute} (gather-sum)", group="native",
            when=_native_moe_permute, key=_kernels_and_topk)
      for name, attribute, factory, signature in (
          ("native_moe_permute", "permute", "permute_replacement", SIG_PERMUTE),
          ("native_moe_unpermute", "unpermute", "unpermute_replacement", SIG_UNPERMUTE))),
    Patch("native_moe_sort_chunks", "megatron.core.transformer.moe.token_dispatcher:"
          "sort_chunks_by_idxs", "training.native.moe_permute:sort_chunks_replacement",
          "MoE: the all-to-all dispatcher's sort by local expert splits the tokens into one "
          "view per (rank, local expert) and concatenates them (128 views and a copy each way "
          "per layer at Qwen3-30B-A3B, more in the backward; its fused one is TE's): one row "
          "gather instead, none where the order is the identity (EP x TP = 1)",
          SIG_SORT_CHUNKS, what="sort by local expert as one row gather (identity: none)",
          group="native", when=_native_moe_permute),
    Patch("native_moe_device_counts", "megatron.core.transformer.moe.token_dispatcher:"
          "MoEAlltoAllTokenDispatcher._maybe_dtoh_and_synchronize",
          "training.native.moe_permute:device_counts_replacement",
          "MoE at EP = TP = 1 (MOE_DEVICE_COUNTS=1): the all-to-all dispatcher copies the tokens "
          "per expert to the host and waits for the GPU once per layer and micro-batch, only "
          "for the grouped experts' split sizes; the native grouped experts take them on the "
          "GPU instead", SIG_DEVICE_COUNTS,
          what="tokens per expert kept on the GPU (no host synchronisation per MoE layer)",
          group="native", when=_moe_device_counts),
    Patch("native_clamped_geglu",
          "megatron.core.transformer.moe.experts:weighted_bias_quick_geglu_impl",
          "training.native.clamped_geglu:clamped_geglu_replacement",
          "MoE with the clamped quick-GeGLU (gpt-oss): Megatron clamps fc1's output outside its "
          "compiled activation (chunk, two clamps, a cat: passes and copies each way, ~0.15 s of "
          "a 3.06 s gpt-oss-20b 8-layer step on an H200); one Triton pass each way instead",
          "(input, bias, weights, fp8_input_store=False, linear_offset=0.0, clamp_value=None)",
          what="clamped quick-GeGLU x routing probability, one Triton pass each way",
          group="native", when=_clamped_geglu),
    Patch("native_wgrad", "megatron.core.tensor_parallel.layers:fused_weight_gradient_mlp_cuda",
          "training.native.wgrad:TorchWgradAccum",
          "gradient-accumulation fusion calls apex's extension; without it, a cuBLAS GEMM "
          "accumulating into main_grad (the native backend's linears, and the TE spec's output "
          "layer)", None,
          what="cuBLAS GEMM accumulating into main_grad (torch.addmm, beta=1)", group="native",
          when=_wgrad, over=_no_wgrad_kernel, as_is=True, absent_ok=True),
    Patch("native_wgrad_available", "megatron.core.tensor_parallel.layers:"
          "_grad_accum_fusion_available", None,
          "Megatron's linears refuse gradient-accumulation fusion while this is False", None,
          group="native", when=_wgrad, over=_no_wgrad_flag, constant=True),
)

BY_NAME: dict[str, Patch] = {p.name: p for p in PATCHES}


def prebuilt_dataset_helpers(original, run):
    from megatron.core.datasets import helpers_cpp  # noqa: F401 - raises if really missing

    def compile_helpers():
        return None

    return compile_helpers


def owner_of(patch: Patch, owners: dict | None = None):
    """(the object holding the target attribute, the attribute's name)."""
    module = (owners or {}).get(patch.module) or importlib.import_module(patch.module)
    owner = module
    for part in patch.path[:-1]:
        owner = getattr(owner, part)
    return owner, patch.path[-1]


def _records(owner) -> dict[str, Applied]:
    records = vars(owner).get(MARKER)
    if records is None:
        records = {}
        setattr(owner, MARKER, records)
    return records


def _selected(names=None, groups=None):
    return [p for p in PATCHES if (names is None or p.name in names)
            and (groups is None or p.group in groups)]


def apply(run, names=None, groups=None, owners: dict | None = None) -> list[str]:
    """Put in place the entries (all, or those named / of the groups) whose `when` holds for
    the run. `owners`: stand-ins for target modules, by module name (tests). Returns the names
    applied now; prints them once, on the run's rank 0."""
    applied, changed = [], []
    for patch in _selected(names, groups):
        if not patch.when(run):      # not for this run: an earlier run's replacement goes
            restore(names=(patch.name,), owners=owners)
            continue
        owner, attribute = owner_of(patch, owners)
        records = _records(owner)
        current = getattr(owner, attribute, _ABSENT)
        record = records.get(attribute)
        key = patch.key(run)
        if record is not None and record.replacement is current:
            if record.name == patch.name and record.key == key:
                continue                                   # in place already
            original = record.original                     # rebuild over the original
        else:
            original = current
        if original is _ABSENT and not patch.absent_ok:
            raise AttributeError(f"megatron patch {patch.name}: {patch.target} does not exist")
        if not patch.over(original):
            continue                                       # a vendor's kernel stays
        if (patch.signature and owners is None and callable(original)
                and plain_signature(original) != patch.signature):
            changed.append(f"{patch.target} {plain_signature(original)}")
        replacement = patch.build(None if original is _ABSENT else original, run)
        setattr(owner, attribute, replacement)
        records[attribute] = Applied(patch.name, key, original, replacement)
        applied.append(patch.name)
    run.patched.extend(applied)
    if getattr(run, "rank", 0) == 0:
        if applied:
            print(f"megatron patches applied: {', '.join(applied)}", flush=True)
        for text in changed:
            print(f"WARNING: megatron patch target changed since it was written: {text}",
                  flush=True)
    return applied


def restore(names=None, groups=None, owners: dict | None = None) -> list[str]:
    """Put Megatron's originals back where our replacements are still in place."""
    restored = []
    for patch in _selected(names, groups):
        owner, attribute = owner_of(patch, owners)
        records = vars(owner).get(MARKER) or {}
        record = records.get(attribute)
        if record is None or record.name != patch.name:
            continue
        if getattr(owner, attribute, _ABSENT) is record.replacement:
            if record.original is _ABSENT:
                delattr(owner, attribute)
            else:
                setattr(owner, attribute, record.original)
            restored.append(patch.name)
        del records[attribute]
    return restored


def describe(obj) -> str:
    """A qualified name for what a target holds."""
    if obj is _ABSENT or obj is None:
        return "absent"
    if inspect.ismodule(obj):
        return obj.__name__
    name = getattr(obj, "__qualname__", None)
    return f"{obj.__module__}.{name}" if name else repr(obj)


def in_place(name: str) -> str:
    """What the target of patch `name` holds now: ours (the entry's description and the
    object's name), or what Megatron has there."""
    patch = BY_NAME[name]
    owner, attribute = owner_of(patch)
    current = getattr(owner, attribute, _ABSENT)
    record = (vars(owner).get(MARKER) or {}).get(attribute)
    if record is not None and record.name == name and record.replacement is current:
        text = getattr(current, "description", None) or patch.what or name
        return f"{text} ({describe(current)})"
    return f"{describe(current)} (Megatron's)"



def missing_targets() -> list[str]:
    """The table's targets the Megatron on the path lacks (an entry that may create its
    attribute needs only the owner): what a platform image's Megatron must have before a run
    (`python -m training.megatron_patches check`; the ROCm image's build runs it)."""
    missing = []
    for patch in PATCHES:
        try:
            owner, attribute = owner_of(patch)
        except (ImportError, AttributeError) as err:
            missing.append(f"{patch.target} ({patch.name}: {err})")
            continue
        if not patch.absent_ok and not hasattr(owner, attribute):
            missing.append(f"{patch.target} ({patch.name})")
    return missing


def main(argv: list[str] | None = None) -> int:
    """`python -m training.megatron_patches check`: exit 1, naming them, when a target of the
    table is missing from the Megatron on the path."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if args != ["check"]:
        print("usage: python -m training.megatron_patches check", file=sys.stderr)
        return 2
    missing = missing_targets()
    for text in missing:
        print(f"error: the Megatron on the path lacks the patch target {text}", file=sys.stderr)
    if not missing:
        print(f"every target of the Megatron patch table is present ({len(PATCHES)} entries)")
    return 1 if missing else 0


if __name__ == "__main__":
    from training import quiet

    quiet.install("megatron_patches")   # third-party notices at import: a count, not the console
    raise SystemExit(main())
