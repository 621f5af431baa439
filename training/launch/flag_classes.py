"""Every flag of megatron-core's parser (megatron_flags.json), in one class each, with why.

A flag after the script name (or in EXTRA_MEGATRON_ARGS) either changes nothing we would have
to honour, or it is honoured by the backend that runs, or it is refused before torchrun with
what to do instead. Nothing is passed through unexamined; no class means "ignored".

  setting      the launcher builds it from a setting (the registry: a toggle's `flag`, `on`,
               `off` or `owns`, training/launch/userflags.py). Not listed below: derived from
               the registry, so a new toggle's flags are classified by being defined. Passed
               after the script name it is that setting's value (accepted when it agrees with
               the setting, refused when it contradicts it or would not reach Megatron) or,
               where the launcher builds it from other settings, refused naming the setting.
  contradicts  another spelling of what a launcher setting decides (--fp16 and PRECISION,
               --train-samples and TOTAL_ITERS, an architecture flag and MODEL_SIZE): refused,
               naming the setting to use (the guard flags_against_settings).
  honoured     read by Megatron's own code outside the slots a backend replaces (the training
               loop, schedule, optimizer, data, checkpoints, parallel layout): every backend
               runs it the same.
  neutral      changes nothing that is trained (logging, profiling, timers, timeouts,
               fault-tolerance plumbing): passed as given.
  backends     a Megatron feature that exists on some backends only (Transformer Engine's
               communication overlap, its fused modules): honoured there, refused on the
               others before torchrun (the guard flags_the_backend_cannot_honour).
  semantic     changes what a slot we replace computes (attention, norms, linears, experts,
               loss): each backend's verdict is stated, honoured or refused with what to do
               (a test checks the native backend's "honoured" on the CPU where it can).
  documents    document masking: honoured through the DOCUMENT_MASK setting (issue 51, the
               attention side); this table only names them.
  workload     a flag of another Megatron workload (inference, RL, BERT/T5, vision, retrieval,
               distillation, SFT, Mamba): pretrain_gpt never reads it, refused.

A test keeps this complete: every flag of megatron_flags.json is in exactly one class.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable

NATIVE, TE, LOCAL = "native", "transformer_engine", "local"
BACKENDS = (NATIVE, TE, LOCAL)

CLASSES = {
    "setting": "set by the launcher from a setting: the setting's value, or refused naming it",
    "contradicts": "another spelling of a launcher setting: refused, naming the setting",
    "honoured": "Megatron's own code outside the replaced slots: every backend runs it",
    "neutral": "changes nothing that is trained (logging, profiling, timeouts): passed",
    "backends": "a feature of some backends: honoured there, refused on the others",
    "semantic": "changes what a replaced slot computes: each backend honours it or refuses it",
    "documents": "document masking: honoured through the DOCUMENT_MASK setting",
    "workload": "another Megatron workload's flag, which pretrain_gpt never reads: refused",
}

# A backend's verdict on a flag: None = honoured; a text = why not and what to do instead.
Verdict = "str | None"


@dataclass(frozen=True)
class Entry:
    cls: str
    reason: str
    flags: tuple[str, ...]
    setting: str | None = None                  # contradicts: the setting to use instead
    verdicts: dict[str, str | None] = field(default_factory=dict)   # backends, semantic
    experts: bool = False                       # means something only in a model with experts
    # semantic: a finer verdict from the flag's values and the launch (None: honoured)
    check: Callable[[str, list[str], object], str | None] | None = None


def _f(names: str) -> tuple[str, ...]:
    return tuple("--" + n for n in names.split())


TE_ONLY = "needs TRANSFORMER_IMPL=transformer_engine (it is built on Transformer Engine's modules)"


def _te_only(reason: str, names: str, experts: bool = False) -> Entry:
    return Entry("backends", reason, _f(names), verdicts={TE: None, NATIVE: TE_ONLY,
                                                          LOCAL: TE_ONLY}, experts=experts)


def _contra(setting: str, reason: str, names: str) -> Entry:
    return Entry("contradicts", reason, _f(names), setting=setting)


def _semantic(reason: str, names: str, native: str | None = None, te: str | None = None,
              local: str | None = None, experts: bool = False, check=None) -> Entry:
    return Entry("semantic", reason, _f(names), verdicts={NATIVE: native, TE: te, LOCAL: local},
                 experts=experts, check=check)


def _flex_dropout(backend: str, values: list[str], ctx) -> str | None:
    """The native backend's flex attention (sinks or a window: gpt-oss) has no dropout."""
    preset = getattr(ctx, "preset", None)
    flex = bool(getattr(preset, "attention_sinks", False) or getattr(preset, "sliding_window",
                                                                     None))
    try:
        p = float(values[0]) if values else 0.0
    except ValueError:
        return None          # Megatron's parser says what is wrong with the number
    if backend == NATIVE and flex and p:
        return ("the native backend's flex attention (attention sinks, sliding window) runs "
                "no attention dropout: use --attention-dropout 0, or "
                "TRANSFORMER_IMPL=transformer_engine")
    return None


NATIVE_UNVERIFIED = ("the native backend's modules do not implement it: use "
                     "TRANSFORMER_IMPL=transformer_engine or local")

TABLE: tuple[Entry, ...] = (
    # -- another spelling of a launcher setting -------------------------------------------------
    _contra("PRECISION", "the precision recipe is PRECISION's (bf16, fp8..., fp4...; fp16 is not "
            "one): its flags and knobs are built from it",
            "fp16 fp8-quantizer-factory fp8-margin fp8-interval no-fp8-wgrad disable-fp8-wgrad "
            "fp8-output-proj fp4-quantizer-factory te-precision-config-file loss-scale "
            "initial-loss-scale min-loss-scale loss-scale-window hysteresis "
            "fp16-lm-cross-entropy"),
    _contra("GRAD_REDUCE_IN_BF16", "the gradient reduce dtype is GRAD_REDUCE_IN_BF16's",
            "accumulate-allreduce-grads-in-fp32"),
    _contra("TP", "the tensor-parallel layout is TP's (the launcher derives DP, the run folder "
            "and the memory estimate from it)",
            "model-parallel-size tensor-parallel-num-weight-shards "
            "expert-tensor-parallel-num-weight-shards"),
    _contra("CP", "the context-parallel layout is CP's",
            "hierarchical-context-parallel-sizes hybrid-context-parallel max-seqlen-per-dp-cp-rank"),
    _contra("PP", "the pipeline layout is PP's (the launcher has no uneven or custom layout)",
            "decoder-first-pipeline-num-layers decoder-last-pipeline-num-layers "
            "pipeline-model-parallel-layout"),
    _contra("FSDP", "data-parallel sharding is FSDP's (torch FSDP2) and DISTRIBUTED_OPTIMIZER's",
            "use-megatron-fsdp data-parallel-sharding-strategy outer-dp-sharding-strategy "
            "megatron-fsdp-main-params-dtype megatron-fsdp-main-grads-dtype "
            "megatron-fsdp-grad-comm-dtype megatron-fsdp-enable-fine-grained-param-gather "
            "megatron-fsdp-max-pool-double-buffer fsdp-db-use-persist-buf-on-alloc-fail "
            "fsdp-double-buffer fsdp-manual-registration enable-full-sharding-in-hsdp "
            "num-distributed-optimizer-instances suggested-communication-unit-size"),
    _contra("MBS", "the micro-batch is MBS's", "batch-size"),
    _contra("BS", "the global batch is BS's, constant over the run (tokens per step, the "
            "schedule and the run folder's name follow it)",
            "rampup-batch-size step-batch-size-schedule decrease-batch-size-if-needed"),
    _contra("TOTAL_ITERS", "the run's length is TOTAL_ITERS (iterations)", "train-samples"),
    _contra("WARMUP_ITERS", "the warm-up is WARMUP_ITERS (iterations)",
            "warmup lr-warmup-fraction lr-warmup-samples"),
    _contra("LR_DECAY_ITERS", "the decay's length is LR_DECAY_ITERS (iterations)",
            "lr-decay-samples"),
    _contra("WEIGHT_DECAY", "weight decay is WEIGHT_DECAY, constant",
            "start-weight-decay end-weight-decay weight-decay-incr-style"),
    _contra("SEQ_LENGTH", "the sequence length is SEQ_LENGTH's",
            "encoder-seq-length decoder-seq-length"),
    _contra("NUM_LAYERS", "the layer count is NUM_LAYERS (or the model's)",
            "encoder-num-layers decoder-num-layers"),
    _contra("RECOMPUTE", "activation recompute is RECOMPUTE's (none, selective, full)",
            "checkpoint-activations recompute-activations recompute-modules"),
    _contra("CUDA_GRAPH", "CUDA graphs are CUDA_GRAPH's (full_iteration; Megatron's per-layer "
            "graphs are not among its choices)",
            "enable-cuda-graph external-cuda-graph cuda-graph-scope cuda-graph-modules"),
    _contra("ATTENTION_BACKEND", "the attention kernels are ATTENTION_BACKEND's",
            "use-flash-attn"),
    _contra("TRANSFORMER_IMPL", "the layer spec is TRANSFORMER_IMPL's (native, "
            "transformer_engine, local): another spec would run unchecked modules",
            "spec use-mcore-models"),
    _contra("DATA_PATH", "the data is DATA_PATH's and VALID_DATA_PATH's (checked against "
            "their records before torchrun)",
            "test-data-path data-args-path per-split-data-args-path per-dataset-sequences-path "
            "phase-transition-iterations"),
    _contra("TOKENIZER_MODEL", "the tokenizer is TOKENIZER_MODEL's (or the dataset's record)",
            "vocab-file merge-file vocab-extra-ids tokenizer-metadata tokenizer-special-tokens "
            "tiktoken-pattern tiktoken-num-special-tokens tokenizer-sentencepiece-legacy "
            "no-tokenizer-sentencepiece-ignore-extra-whitespaces "
            "disable-tokenizer-sentencepiece-ignore-extra-whitespaces tokenizer-hf-no-use-fast "
            "tokenizer-hf-no-include-special-tokens trust-remote-code null-tokenizer-eod-id "
            "null-tokenizer-pad-id padded-vocab-size no-pad-vocab-size disable-pad-vocab-size"),
    _contra("SAVE", "checkpoints are written where SAVE says, by SAVE_INTERVAL (its guard "
            "checks the folder)",
            "non-persistent-save-interval non-persistent-ckpt-type non-persistent-global-ckpt-dir "
            "non-persistent-local-ckpt-dir non-persistent-local-ckpt-algo use-dist-ckpt "
            "dist-ckpt-format"),
    _contra("MOE_TOKEN_DISPATCHER", "the token dispatcher is MOE_TOKEN_DISPATCHER's",
            "moe-enable-deepep"),
    _contra("MODEL_SIZE", "an architecture no preset and no MODEL_CONFIG describes here: the "
            "model's shape comes from MODEL_SIZE or MODEL_CONFIG (the FLOPs, the memory "
            "estimate and checkpoint conversion read it from there)",
            "openai-gelu squared-relu onnx-safe rotary-percent rotary-interleaved "
            "rotary-seq-len-interpolation-factor no-rope-freq use-rotary-position-embeddings "
            "no-position-embedding relative-attention-num-buckets "
            "relative-attention-max-distance rope-type mrope-section apply-layernorm-1p "
            "apply-residual-connection-post-layernorm qk-l2-norm attention-output-gate "
            "multi-latent-attention q-lora-rank kv-lora-rank qk-head-dim qk-pos-emb-head-dim "
            "v-head-dim mscale mscale-all-dim cache-mla-latents mla-down-proj-fusion "
            "experimental-attention-variant dsa-indexer-n-heads dsa-indexer-head-dim "
            "dsa-indexer-topk dsa-indexer-topk-freq dsa-indexer-skip-topk-offset "
            "dsa-indexer-loss-coeff dsa-indexer-use-sparse-loss dsa-kernel-backend "
            "dsa-indexer-rope-interleaved no-dsa-indexer-rotate-activation "
            "disable-dsa-indexer-rotate-activation no-dsa-indexer-scoring-relu "
            "disable-dsa-indexer-scoring-relu dsa-indexer-k-norm-epsilon dsa-indexer-k-norm-fp32 "
            "linear-conv-kernel-dim linear-key-head-dim linear-value-head-dim "
            "linear-num-key-heads linear-num-value-heads linear-attention-freq "
            "mtp-num-layers mtp-loss-scaling-factor mtp-use-repeated-layer mtp-detach-heads "
            "mtp-hybrid-override-pattern mtp-standalone heterogeneous-layers-config-path "
            "heterogeneous-layers-config-encoded-json moe-layer-freq moe-shared-expert-gate "
            "moe-router-score-function moe-router-pre-softmax moe-router-topk-scaling-factor "
            "moe-router-num-groups moe-router-group-topk moe-router-enable-expert-bias "
            "moe-latent-size moe-mlp-glu-interleave-size moe-shared-expert-glu-interleave-size "
            "use-mup mup-width-mult mup-base-hidden-size mup-embedding-mult mup-output-mult "
            "mup-base-head-dim mup-attn-scale-power hybrid-layer-pattern hybrid-override-pattern "
            "is-hybrid-model yaml-cfg"),

    # -- semantic: what a replaced slot computes, per backend ----------------------------------
    _semantic("attention dropout: the core-attention slot (SDPA's dropout_p on the native "
              "backend)", "attention-dropout", check=_flex_dropout),
    _semantic("hidden dropout: Megatron's bias-dropout-add after attention and MLP, which every "
              "backend's layer runs", "hidden-dropout"),
    _semantic("the initialisation's standard deviation: every backend's linears and the native "
              "grouped experts take Megatron's init method",
              "init-method-std embedding-init-method-std init-method-xavier-uniform"),
    _semantic("the attention softmax in fp32: Megatron's unfused softmax (local) honours it; "
              "Transformer Engine's and SDPA's fused kernels keep the softmax in fp32 always",
              "attention-softmax-in-fp32"),
    _semantic("1/layer scaling of QK^T in the local softmax, undone inside it (fp16 overflow "
              "protection): the result is the same; TE and SDPA need none in bf16",
              "apply-query-key-layer-scaling"),
    _semantic("residual stream in fp32: Megatron's TransformerLayer casts for the TE and local "
              "norms; the native RMSNorm returns its input's dtype",
              "fp32-residual-connection", native=NATIVE_UNVERIFIED),
    _semantic("QK clipping (Muon): reads the maximum attention logit that TE's and Megatron's "
              "attention record; SDPA does not expose it",
              "qk-clip qk-clip-alpha qk-clip-threshold log-max-attention-logit",
              native=NATIVE_UNVERIFIED),
    _semantic("the loss over the tokens of the global batch instead of per micro-batch: "
              "pretrain_gpt's loss function (after every backend's output layer)",
              "calculate-per-token-loss"),
    _semantic("the MoE loss terms and router noise: Megatron's router, which every backend "
              "keeps", "moe-z-loss-coeff moe-input-jitter-eps moe-router-bias-update-rate "
              "moe-router-quantile-balancing-ema moe-router-force-load-balancing "
              "moe-router-force-biased moe-expert-rank-capacity-factor "
              "moe-router-padding-for-quantization moe-router-padding-for-fp8 "
              "moe-apply-probs-on-input moe-enable-routing-replay", experts=True),
    _semantic("squared-ReLU experts through a fused weighted kernel: Megatron's MLP (TE, local); "
              "the native grouped experts run their own activation",
              "use-fused-weighted-squared-relu", native=NATIVE_UNVERIFIED, experts=True),

    # -- some backends ---------------------------------------------------------------------------
    _te_only("tensor-parallel communication overlap: Transformer Engine's userbuffers",
             "tp-comm-overlap no-tp-comm-bulk-wgrad disable-tp-comm-bulk-wgrad "
             "no-tp-comm-bulk-dgrad disable-tp-comm-bulk-dgrad no-tp-comm-overlap-ag "
             "disable-tp-comm-overlap-ag no-tp-comm-overlap-rs disable-tp-comm-overlap-rs "
             "tp-comm-overlap-rs-dgrad no-tp-comm-split-ag disable-tp-comm-split-ag "
             "no-tp-comm-split-rs disable-tp-comm-split-rs tp-comm-bootstrap-backend "
             "tp-comm-overlap-cfg"),
    _te_only("Transformer Engine's fused modules and kernels",
             "fused-residual-rmsnorm use-transformer-engine-op-fuser use-te-activation-func "
             "flash-attention-version batch-invariant-mode te-rng-tracker "
             "use-grouped-gemm-for-dense-mlp"),
    _te_only("delayed weight gradients and the expert-parallel overlap: TE's linears split "
             "their backward", "delay-wgrad-compute overlap-moe-expert-parallel-comm "
             "overlap-dispatch-backward-with-experts-wgrad ep-overlap-early-attn-memory-release "
             "high-priority-a2a-comm-stream", experts=False),
    _te_only("Transformer Engine's grouped linear for experts", "use-grouped-gemm-for-shared-expert "
             "moe-single-grouped-weight moe-single-grouped-bias moe-router-fusion moe-paged-stash "
             "moe-paged-stash-page-size moe-paged-stash-buffer-size-factor-cuda "
             "moe-paged-stash-buffer-size-factor-cpu", experts=True),
    _te_only("activation offloading to the CPU: hooks in Transformer Engine's modules",
             "cpu-offloading-num-layers cpu-offloading-retain-pinned-cpu-buffers "
             "fine-grained-activation-offloading offload-modules min-offloaded-tensor-size "
             "delay-offload-until-cuda-graph delta-offload-bytes-across-pp-ranks "
             "activation-offload-fraction fine-grained-offloading-max-inflight-offloads"),
    Entry("backends", "Megatron's kitchen attention extension, which none of the launcher's "
          "layer specs builds", _f("use-kitchen-attention kitchen-attention-backend"),
          verdicts={b: "no backend of the launcher builds the kitchen attention: use "
                       "ATTENTION_BACKEND to choose attention kernels" for b in BACKENDS}),

    # -- document masking (the attention side: issue 51) ---------------------------------------
    Entry("documents", "document masking: attention and positions stop at each document's end; "
          "honoured through the DOCUMENT_MASK setting",
          _f("reset-attention-mask reset-position-ids "
             "dataloader-inter-document-masking")),

    # -- honoured: Megatron's code outside the replaced slots ----------------------------------
    Entry("honoured", "the pipeline and data-parallel schedule and communication",
          _f("pipeline-model-parallel-comm-backend use-ring-exchange-p2p "
             "defer-embedding-wgrad-compute wgrad-deferral-limit "
             "overlap-p2p-communication-warmup-flush "
             "microbatch-group-size-per-virtual-pipeline-stage "
             "account-for-embedding-in-pipeline-split account-for-loss-in-pipeline-split "
             "num-layers-per-virtual-pipeline-stage num-virtual-stages-per-pipeline-rank "
             "no-overlap-p2p-communication ddp-num-buckets ddp-bucket-size "
             "ddp-pad-buckets-for-high-nccl-busbw ddp-reduce-scatter-with-fp32-accumulation "
             "ddp-param-name-patterns-for-fp32-local-accumulation "
             "overlap-param-gather-with-optimizer-step no-align-param-gather "
             "no-align-grad-reduce disable-align-grad-reduce no-use-layer-wise-param-layout "
             "use-nccl-ub disable-symmetric-registration create-all-gather-group "
             "no-gradient-reduce-div-fusion keep-fp8-transpose-cache "
             "torch-fsdp2-no-reshard-after-forward cp-comm-type use-tp-pp-dp-mapping "
             "nccl-communicator-config-path disable-gloo-process-groups use-sharp "
             "sharp-enabled-group high-priority-stream-groups moe-shared-expert-overlap "
             "moe-flex-dispatcher-backend moe-permute-fusion-into-hybridep "
             "moe-hybridep-pad-uneven-dispatch-inputs moe-flex-dispatcher-num-sms "
             "moe-deepep-num-sms moe-hybridep-num-sms moe-hybridep-num-blocks-permute "
             "moe-hybridep-num-blocks-unpermute moe-hybridep-num-sms-preprocessing "
             "moe-ncclep-static-shape moe-ncclep-zero-copy")),
    Entry("honoured", "initialisation and memory: where and how Megatron builds the weights",
          _f("no-initialization use-cpu-initialization init-model-with-meta-device "
             "data-parallel-random-init no-clone-scatter-output-in-embedding "
             "disable-clone-scatter-output-in-embedding empty-unused-memory-level "
             "distribute-saved-activations moe-layer-recompute mlp-chunks-for-training "
             "make-vocab-size-divisible-by disable-bf16-reduced-precision-matmul "
             "disable-jit-fuser no-bias-gelu-fusion no-bias-swiglu-fusion")),
    Entry("honoured", "the optimizer and learning-rate schedule (Megatron builds them; the "
          "native AdamW takes Adam's place with the same update)",
          _f("optimizer sgd-momentum muon-momentum muon-no-split-qkv muon-nesterov "
             "muon-scale-mode muon-fp32-matmul-prec muon-coefficient-type muon-num-ns-steps "
             "muon-tp-mode muon-extra-scale-factor muon-scalar-optimizer lion-beta1 lion-beta2 "
             "no-weight-decay-cond-type apply-wd-to-qk-layernorm lr-wsd-decay-style "
             "lr-wsd-decay-iters lr-wsd-decay-samples lr-warmup-init decoupled-lr "
             "decoupled-min-lr freeze-all-layers optimizer-cuda-graph "
             "use-torch-optimizer-for-cpu-offload no-pin-cpu-grads no-pin-cpu-params "
             "dump-param-to-param-group-map moe-use-upcycling moe-upcycling-granularity")),
    Entry("honoured", "the training loop: when to stop, skip, sync, evaluate",
          _f("exit-interval exit-duration-in-mins exit-signal exit-signal-handler-for-dataloader "
             "exit-signal-handler-for-training no-manual-gc-eval disable-manual-gc-eval "
             "iterations-to-skip train-sync-interval check-for-large-grads "
             "check-weight-hash-across-dp-replicas-interval start-eval-at-iter "
             "eval-global-batch-size eval-micro-batch-size skip-train full-validation "
             "multiple-validation-sets validation-set-names rerun-mode check-for-spiky-loss "
             "error-injection-rate error-injection-type")),
    Entry("honoured", "the data loader over the launcher's datasets",
          _f("dataloader-type dataloader-fast-cache-load dataloader-defer-npy-index-mmap "
             "no-mmap-bin-files num-dataset-builder-threads object-storage-cache-path "
             "mid-level-dataset-surplus allow-ambiguous-pad-tokens enable-msc disable-msc")),
    Entry("honoured", "checkpoint I/O: how Megatron saves and loads (SAVE and LOAD say where)",
          _f("persistent-save-interval save-retain-interval load-main-params-from-ckpt finetune "
             "use-checkpoint-args use-mp-args-from-checkpoint-args "
             "no-use-tokenizer-model-from-checkpoint-args "
             "disable-use-tokenizer-model-from-checkpoint-args exit-on-missing-checkpoint "
             "auto-detect-ckpt-format ckpt-convert-format ckpt-convert-save "
             "ckpt-convert-update-legacy-dist-opt-format no-ckpt-fully-parallel-save "
             "async-ckpt-cpu-priority "
             "async-ckpt-io-priority async-ckpt-use-cpu-shm ckpt-fully-parallel-load "
             "ckpt-fully-parallel-load-exchange-algo ckpt-fully-parallel-save-process-group "
             "ckpt-fully-parallel-load-process-group ckpt-assume-constant-structure "
             "no-ckpt-load-validate-sharding-integrity "
             "disable-ckpt-load-validate-sharding-integrity no-strict-fsdp-dtensor-load "
             "disable-strict-fsdp-dtensor-load dist-ckpt-strictness dist-ckpt-save-pre-mcore-014 "
             "dist-ckpt-optim-fully-reshardable distrib-optim-fully-reshardable-mem-efficient "
             "replication replication-jump replication-factor verify-integrity "
             "no-stream-ckpt-dequant disable-stream-ckpt-dequant no-save-optim no-save-rng "
             "no-load-optim no-load-rng override-ckpt-iteration dist-ckpt-workers "
             "ckpt-fully-parallel-save adlr-autoresume adlr-autoresume-interval")),

    # -- neutral ---------------------------------------------------------------------------------
    Entry("neutral", "logging, timers and traces", _f(
        "log-params-norm log-progress timing-log-level timing-log-option tensorboard-log-interval "
        "tensorboard-queue-size log-timers-to-tensorboard no-log-loss-scale-to-tensorboard "
        "disable-log-loss-scale-to-tensorboard log-validation-ppl-to-tensorboard "
        "log-memory-interval log-device-memory-used log-num-zeros-in-grad "
        "no-barrier-with-level-1-timing log-world-size-to-tensorboard wandb-entity "
        "logging-level log-energy moe-routing-trace-path moe-routing-trace-max-training-iters "
        "moe-routing-trace-capture-logits moe-routing-trace-capture-hidden-states "
        "moe-routing-trace-dump-weights moe-per-layer-logging config-logger-dir "
        "save-params-interval save-activations-interval save-tokens-per-expert-interval "
        "save-wgrads-interval save-dgrads-interval result-rejected-tracker-filename "
        "no-one-logger one-logger-project one-logger-run-name one-logger-async "
        "app-tag-run-name app-tag-run-version log-straggler straggler-ctrlr-port "
        "straggler-minmax-count disable-straggler-on-startup run-workload-inspector-server "
        "gpu-sniff-test-interval test-mode help")),
    Entry("neutral", "profiling inside the launcher's PROFILE window", _f(
        "pytorch-profiler-collect-shapes pytorch-profiler-collect-callstack "
        "pytorch-profiler-collect-chakra record-memory-history memory-snapshot-path "
        "record-shapes nvtx-ranges")),
    Entry("neutral", "process groups, timeouts and fault tolerance: how the job survives, not "
          "what it trains", _f(
              "distributed-timeout-minutes local-rank lazy-mpu-init fake-process-group "
              "distributed-timeout-seconds-after-init flight-recorder-dump-path "
              "flight-recorder-trace-buffer-size no-flight-recorder-dump-on-timeout "
              "disable-flight-recorder-dump-on-timeout flight-recorder-include-stack-trace "
              "no-flight-recorder-include-only-active disable-flight-recorder-include-only-active "
              "no-flight-recorder-extra-dump-on-exec disable-flight-recorder-extra-dump-on-exec "
              "inprocess-restart inprocess-max-iterations inprocess-monitor-thread-interval "
              "inprocess-monitor-process-interval inprocess-progress-watchdog-interval "
              "inprocess-heartbeat-interval inprocess-soft-timeout inprocess-hard-timeout "
              "inprocess-heartbeat-timeout inprocess-barrier-timeout inprocess-completion-timeout "
              "inprocess-last-call-wait inprocess-termination-grace-time inprocess-granularity "
              "inprocess-active-world-size inprocess-empty-cuda-cache enable-ft-package "
              "calc-ft-timeouts ft-num-warmup-iters fault-injector-ranks fault-injector-num-ranks "
              "fault-injector-fault-types fault-injector-fault-probabilities "
              "fault-injector-fault-delay fault-injector-delay-start-iteration "
              "fault-injector-mtti-seconds fault-injector-offset-seconds fault-injector-seed "
              "enable-experimental")),

    # -- another workload ------------------------------------------------------------------------
    Entry("workload", "inference and text generation", _f(
        "inference-batch-times-seqlen-threshold max-tokens-to-oom use-legacy-static-engine "
        "inference-max-requests inference-max-seq-length inference-dynamic-batching "
        "inference-dynamic-batching-buffer-size-gb inference-dynamic-batching-paused-buffer-size-gb "
        "inference-dynamic-batching-mamba-memory-ratio inference-dynamic-batching-block-size "
        "inference-dynamic-batching-max-requests inference-dynamic-batching-max-tokens "
        "inference-dynamic-batching-num-cuda-graphs "
        "inference-dynamic-batching-track-paused-request-events "
        "inference-dynamic-batching-track-generated-token-events decode-only-cuda-graphs "
        "inference-cuda-graph-all-prefills inference-cuda-graph-max-tokens "
        "inference-dynamic-batching-unified-memory-level enable-chunked-prefill "
        "num-speculative-tokens inference-dynamic-batching-prefix-caching "
        "no-inference-dynamic-batching-prefix-caching "
        "inference-dynamic-batching-prefix-caching-eviction-policy "
        "inference-dynamic-batching-prefix-caching-coordinator-policy "
        "inference-dynamic-batching-prefix-caching-routing-alpha "
        "inference-dynamic-batching-prefix-caching-mamba-gb "
        "inference-dynamic-batching-cuda-graph-mixed-prefill-count "
        "inference-dynamic-batching-cuda-graph-sizing-distribution "
        "inference-dynamic-batching-sampling-backend use-same-sampling-seed-across-dp-ranks "
        "inference-dynamic-batching-async-sched-mode inference-dynamic-batching-logprobs-mode "
        "inference-logging-step-interval inference-text-gen-server-logging "
        "no-inference-text-gen-server-logging inference-wandb-logging "
        "no-inference-wandb-logging inference-coordinator-port mamba-inference-conv-states-dtype "
        "mamba-inference-ssm-states-dtype inference-use-synchronous-zmq-collectives "
        "no-inference-use-synchronous-zmq-collectives inference-disable-ep-consensus "
        "no-inference-disable-ep-consensus inference-shards inference-cuda-graph-scope "
        "flash-decode symmetric-ar-type nccl-all-reduce-for-prefill "
        "inference-fuse-tp-communication inference-disable-triton-nvls-kernels "
        "inference-grouped-gemm-backend inference-moe-disable-fused-quant-kernels "
        "inference-moe-token-dispatcher-type mlp-chunks-for-prefill "
        "moe-pad-experts-for-cuda-graph-inference inference-rng-tracker")),
    Entry("workload", "reinforcement learning (GRPO)", _f(
        "perform-rl-step rl-prompts-per-eval grpo-prompts-per-step grpo-group-size "
        "rl-generation-lag rl-submission-granularity rl-consumption-granularity grpo-iterations "
        "grpo-clamp-eps-lower grpo-clamp-eps-upper grpo-kl-beta grpo-entropy-term-weight "
        "grpo-filter-groups-with-same-reward langrl-env-config rl-default-temperature "
        "rl-default-top-p rl-default-top-k rl-offload-optimizer-during-inference "
        "rl-kv-cache-management-mode rl-persist-cuda-graphs no-rl-persist-cuda-graphs "
        "rl-partial-rollouts no-rl-partial-rollouts rl-inference-logprobs-is-correction "
        "no-rl-inference-logprobs-is-correction rl-importance-sampling-truncation-coef "
        "rl-use-sequence-packing no-rl-use-sequence-packing "
        "rl-sequence-packing-max-sequences-per-bin rl-sequence-packing-algo "
        "rl-training-cuda-graphs no-rl-training-cuda-graphs "
        "rl-inference-tensor-model-parallel-size rl-inference-pipeline-model-parallel-size "
        "rl-inference-expert-model-parallel-size rl-inference-expert-tensor-model-parallel-size "
        "rl-inference-model-unified-memory-level rl-offload-inference-model-weights-when-idle "
        "no-rl-offload-inference-model-weights-when-idle refit-method "
        "rl-verify-model-weights-swap no-rl-verify-model-weights-swap rl-skip-bos-token "
        "no-rl-skip-bos-token rl-profile rl-profile-dir rl-inference-parsers")),
    Entry("workload", "BERT, T5, retrieval (ICT, biencoder) and their data", _f(
        "bert-no-binary-head output-bert-embeddings bert-embedder-type ict-head-size "
        "biencoder-projection-dim biencoder-shared-query-context-model ict-load bert-load "
        "titles-data-path query-in-block-prob use-one-sent-docs evidence-data-path "
        "retriever-report-topk-accuracies retriever-score-scaling block-data-path "
        "embedding-path indexer-batch-size indexer-log-interval sample-rate mask-prob "
        "short-seq-prob fim-data fim-rate fim-spm-rate fim-split-sample fim-fragment-rate "
        "fim-no-prefix fim-prefix-token fim-middle-token fim-suffix-token fim-pad-token "
        "fim-eod-token")),
    Entry("workload", "vision models", _f(
        "num-classes img-h img-w num-channels patch-dim classes-fraction data-per-class-fraction "
        "no-data-sharding head-lr-mult vision-pretraining vision-pretraining-type "
        "vision-backbone-type swin-backbone-type mask-type mask-factor iter-per-epoch "
        "dino-local-img-size dino-local-crops-number dino-head-hidden-size dino-bottleneck-size "
        "dino-freeze-last-layer dino-norm-last-layer dino-warmup-teacher-temp "
        "dino-teacher-temp dino-warmup-teacher-temp-epochs")),
    Entry("workload", "logit distillation, SFT and chat data", _f(
        "logits-save-top-k logits-save-top-p logits-save-top-p-min-k logits-save-dir "
        "logits-save-dtype logits-load-dir logits-load-decode-threads logits-load-prefetch-factor "
        "logits-load-msc-prefetch-depth logits-load-kd-loss-alpha logits-load-ignore-errors "
        "sft sft-tokenizer-prompt-format chat-template")),
    Entry("workload", "Mamba and hybrid models (pretrain_mamba)", _f(
        "mamba-state-dim mamba-head-dim mamba-num-groups mamba-num-heads "
        "disable-mamba-mem-eff-path mamba-training-ssm-states-dtype")),
)

WORKLOAD_WHAT = ("pretrain_gpt (GPT pretraining) never reads it, so it would change nothing: "
                 "drop it")


@functools.cache
def by_flag() -> dict[str, Entry]:
    """flag -> its entry (a flag in two entries is a bug: ValueError)."""
    out: dict[str, Entry] = {}
    for entry in TABLE:
        for flag in entry.flags:
            if flag in out:
                raise ValueError(f"{flag} is classified twice ({out[flag].cls}, {entry.cls})")
            out[flag] = entry
    return out


def classify(flag: str, owners: dict) -> str | None:
    """The class of `flag` in a launch whose registry gives `owners` (userflags.flag_owners);
    None: not a flag of the recorded parser's table (megatron_flags refuses or warns)."""
    owner = owners.get(flag)
    if owner is not None and owner.how != "given":
        return "setting"
    entry = by_flag().get(flag)
    if entry is not None:
        return entry.cls
    return "setting" if owner is not None else None


def verdict(entry: Entry, backend: str, values: list[str], ctx) -> str | None:
    """Why BACKEND cannot honour the flag of ENTRY (None: it does)."""
    why = entry.verdicts.get(backend)
    if why is None and entry.check is not None:
        why = entry.check(backend, values, ctx)
    return why


def given_flags(words: list[str]) -> list[tuple[str, list[str]]]:
    """(flag, its values) for each --flag in WORDS."""
    out: list[tuple[str, list[str]]] = []
    for word in words:
        if word.startswith("--") and word != "--":
            flag, eq, inline = word.partition("=")
            out.append((flag, [inline] if eq else []))
        elif out:
            out[-1][1].append(word)
    return out
