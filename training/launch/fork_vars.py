"""Every variable of ROCm/Megatron-LM's examples/llama/train_llama3.sh and train_llama2.sh (and
the variables its README and AMD's docs give those scripts), and what each is here.

People come to this launcher typing the fork's commands from memory and from AMD's docs; none
of its variables may be silently ignored. Each one below is, here,

  toggle   the registry's toggle of the same name, with the same meaning
  alias    the registry knows it as the fork's spelling of one of our toggles
           (training/launch/toggles.py: Toggle.aliases); the table shows it under the toggle
  env      an environment variable of the run: it reaches torchrun as the fork exports it
           (the table and manifest.json list it with source env)
  derive   sets a toggle of ours when the user left that unset (WANDB_API_KEY: W&B logging)
  accept   the values that describe what this launcher does are accepted and shown; any other
           value is refused with what to use instead
  refuse   refused, with what to use instead

Listed from the files and commits in SOURCES (read with the project's search tools; no code
copied). The test tests/launch/test_fork_vars.py is generated from this list, and
docs/coming_from_rocm_megatron.md is rendered from it (python -m training.launch.fork_docs).
"""
from __future__ import annotations

from dataclasses import dataclass, field

# name -> (repository, path, commit): the files the list was read from.
SOURCES: dict[str, tuple[str, str, str]] = {
    "train_llama3.sh": ("ROCm/Megatron-LM", "examples/llama/train_llama3.sh",
                        "32d5d428a90abab0583999bdbc85bd653332ce26"),
    "train_llama2.sh": ("ROCm/Megatron-LM", "examples/llama/train_llama2.sh",
                        "bb3bcb6512c1cf225c3f00050bbd03fdd027811e"),
    "README.md": ("ROCm/Megatron-LM", "examples/llama/README.md",
                  "10b9213c1deb36ebaecc4d7cc89a035feedb8849"),
    "readme.md": ("ROCm/Megatron-LM", "examples/llama/readme.md",
                  "04a35a9aef2365b294ca3e45ffd6b7107950f979"),
    "megatron-lm.rst": ("ROCm/ROCm",
                        "docs/how-to/rocm-for-ai/training/benchmark-docker/megatron-lm.rst",
                        "0eb1b4ee59c283714bbec56553c2e7c912abb325"),
}
SCRIPTS = {"llama3": "train_llama3.sh", "llama2": "train_llama2.sh"}
KINDS = ("toggle", "alias", "env", "derive", "accept", "refuse")


@dataclass(frozen=True)
class ForkVar:
    name: str
    meaning: str                                 # what the fork's script does with it
    kind: str                                    # one of KINDS
    defaults: dict[str, str] = field(default_factory=dict)  # family -> the script's default
    sources: tuple[str, ...] = ("train_llama3.sh", "train_llama2.sh")
    target: str | None = None                    # toggle/alias/derive: our toggle
    accept: tuple[str, ...] = ()                 # accept: the values that agree with us
    here: str = ""                               # what it is here; accept/refuse: what to use
    shape: bool = False                          # a default the launch line compares (model...)

    def __post_init__(self):
        if self.kind == "toggle" and self.target is None:      # our toggle of the same name
            object.__setattr__(self, "target", self.name)
        if self.kind == "env" and not self.here:
            object.__setattr__(self, "here", ENV_UNSET)


# what an environment variable the launcher does not set is, here
ENV_UNSET = "not set by the launcher; yours reaches the run"


_BOTH = ("train_llama3.sh", "train_llama2.sh")
_L3 = ("train_llama3.sh",)
_DOCS = ("README.md", "readme.md", "megatron-lm.rst")


def _same(value: str) -> dict[str, str]:
    return {"llama3": value, "llama2": value}


FORK_VARS: tuple[ForkVar, ...] = (
    # -- the environment the fork exports (its default unless you set one) ----------------------
    ForkVar("GPU_MAX_HW_QUEUES", "HIP hardware queues (exported)", "env", _same("2"),
            here="set to 2 on AMD GPUs by the launcher's presets; yours is kept"),
    ForkVar("TORCH_NCCL_HIGH_PRIORITY", "NCCL/RCCL streams at high priority (exported)", "env",
            _same("1"), here="set to 1 by the launcher's presets; yours is kept"),
    ForkVar("NCCL_CHECKS_DISABLE", "turns NCCL's argument checks off (exported)", "env",
            _same("1")),
    ForkVar("NCCL_IB_HCA", "RDMA interfaces NCCL uses (exported; default: the first 8 of "
            "`rdma link`)", "env", _same("(from rdma link)"),
            sources=(*_BOTH, "README.md", "megatron-lm.rst"),
            here="not derived by the launcher; yours reaches the run"),
    ForkVar("NCCL_IB_GID_INDEX", "RoCE GID index (exported)", "env", _same("3")),
    ForkVar("NCCL_CROSS_NIC", "NCCL rings across NICs (exported)", "env", _same("0")),
    ForkVar("CUDA_DEVICE_MAX_CONNECTIONS", "one hardware queue (exported; unset under FSDP)",
            "env", _same("1"), sources=(*_BOTH, "README.md"),
            here="set to 1 by the launcher's presets, left unset under FSDP; yours is kept (FSDP "
                 "with 1 is refused)"),
    ForkVar("NCCL_PROTO", "NCCL protocol (exported)", "env", _same("Simple")),
    ForkVar("RCCL_MSCCL_ENABLE", "RCCL's MSCCL algorithms (exported)", "env", _same("0")),
    ForkVar("TOKENIZERS_PARALLELISM", "tokenizer threads (exported)", "env", _same("false"),
            here="set to false by the launcher's presets; yours is kept"),
    ForkVar("HSA_NO_SCRATCH_RECLAIM", "keep kernel scratch memory (exported)", "env",
            _same("1"), here="set to 1 on AMD GPUs by the launcher's presets; yours is kept"),
    ForkVar("NCCL_SOCKET_IFNAME", "NCCL's socket interface (exported when NNODES > 1)", "env",
            _same("ens51np0 (NNODES > 1)"), sources=(*_BOTH, *_DOCS)),
    ForkVar("GLOO_SOCKET_IFNAME", "Gloo's socket interface (exported when NNODES > 1)", "env",
            _same("ens51np0 (NNODES > 1)"), sources=(*_BOTH, *_DOCS)),
    ForkVar("HF_TOKEN", "Hugging Face token for a gated tokenizer (read by the hub client)",
            "env", sources=("README.md", "megatron-lm.rst"),
            here="read by huggingface_hub when TOKENIZER_MODEL is a hub id; masked in tables"),

    # -- model, parallelism, batch -------------------------------------------------------------
    ForkVar("MODEL_SIZE", "model: 8 or 70 (train_llama3.sh), 7, 13 or 70 (train_llama2.sh)",
            "toggle", _same("70"), sources=(*_BOTH, *_DOCS),
            here="the preset; 8, 70, 7, 13 are read as 8B, 70B, 7B, 13B", shape=True),
    ForkVar("TP", "tensor-parallel size", "toggle", _same("8"), sources=(*_BOTH, *_DOCS),
            shape=True),
    ForkVar("PP", "pipeline-parallel size", "toggle", _same("1")),
    ForkVar("CP", "context-parallel size", "toggle", _same("1")),
    ForkVar("MBS", "micro-batch size", "toggle", _same("1"), sources=(*_BOTH, *_DOCS), shape=True),
    ForkVar("BS", "global batch size", "toggle", _same("8"), sources=(*_BOTH, *_DOCS), shape=True),
    ForkVar("SEQ_LENGTH", "sequence length", "toggle", {"llama3": "2048", "llama2": "4096"},
            sources=(*_BOTH, *_DOCS), shape=True),
    ForkVar("TOTAL_ITERS", "training iterations", "toggle", _same("12"),
            sources=(*_BOTH, *_DOCS), shape=True),
    ForkVar("SEQ_PARALLEL", "sequence parallel (1: --sequence-parallel)", "alias", _same("1"),
            target="SEQUENCE_PARALLEL"),
    ForkVar("FSDP", "torch FSDP2 (TP > 1 reset to 1, fusion and distributed optimizer off)",
            "toggle", _same("0"), sources=(*_BOTH, *_DOCS),
            here="FSDP2; TP > 1 with it is refused (the fork resets TP to 1), the fusion and the "
                 "distributed optimizer are turned off with a reason"),
    ForkVar("MEGATRON_FSDP", "Megatron-FSDP (--use-megatron-fsdp, fsdp_dtensor checkpoints)",
            "accept", _same("0"), sources=(*_BOTH, "README.md"), accept=("0",),
            here="Megatron-FSDP is not run by this launcher: use FSDP=1 (torch FSDP2)"),
    ForkVar("ENABLE_HSDP", "hybrid sharding over Megatron-FSDP", "accept", {"llama3": "0"},
            sources=_L3, accept=("0",),
            here="Megatron-FSDP's HSDP is not run by this launcher: use FSDP=1 (torch FSDP2)"),
    ForkVar("HSDP_NUM_REPLICAS", "HSDP's outer data-parallel replicas", "refuse",
            {"llama3": "2"}, sources=_L3,
            here="sizes Megatron-FSDP's HSDP (ENABLE_HSDP=1), which this launcher does not run: "
                 "unset it (FSDP=1 is torch FSDP2)"),
    ForkVar("CONTI_PARAMS", "1: --use-contiguous-parameters-in-local-ddp", "accept", _same("0"),
            accept=("0",),
            here="megatron-core 0.19.2 has no such flag (its DDP buffers are contiguous): unset "
                 "CONTI_PARAMS"),
    ForkVar("MCORE", "1: --use-mcore-models", "accept", _same("1"), accept=("1",),
            here="megatron-core models are the only ones: MCORE=0 (the legacy model) cannot "
                 "run; unset MCORE"),
    ForkVar("RECOMPUTE", "1: full activation recompute of every layer", "toggle", _same("0"),
            sources=(*_BOTH, *_DOCS),
            here="none/selective/full; the fork's 0 and 1 are read as none and full"),

    # -- precision -------------------------------------------------------------------------------
    ForkVar("TE_FP8", "1: an fp8 recipe (Transformer Engine)", "toggle", _same("0"),
            sources=(*_BOTH, *_DOCS)),
    ForkVar("TE_FP8_RECIPE", "delayed, tensorwise or mxfp8", "toggle", _same("delayed"),
            sources=(*_BOTH, "README.md"),
            here="with TE_FP8=1 (alone it is refused: the fork ignores it then)"),
    ForkVar("TE_FP4", "1: an fp4 recipe", "toggle", {"llama3": "0"}, sources=_L3),
    ForkVar("TE_FP4_RECIPE", "nvfp4 or mxfp4", "toggle", {"llama3": "nvfp4"}, sources=_L3,
            here="with TE_FP4=1"),
    ForkVar("FP4_SELECTIVE_BF16", "keep the first/last layers in bf16 under fp4 (default: 0 for "
            "mxfp4, 1 for nvfp4)", "toggle", {"llama3": "1 (mxfp4: 0)"}, sources=_L3),
    ForkVar("FP4_BF16_START", "bf16 layers at the start", "alias", {"llama3": "2"},
            sources=_L3, target="FP4_BF16_LAYERS_START"),
    ForkVar("FP4_BF16_END", "bf16 layers at the end", "alias", {"llama3": "8"}, sources=_L3,
            target="FP4_BF16_LAYERS_END"),
    ForkVar("FP4_PARAM_GATHER", "1: --fp4-param-gather", "toggle", {"llama3": "0"},
            sources=_L3),
    ForkVar("FP8_PARAM_GATHER", "1: --fp8-param-gather (mxfp8 without FSDP: also "
            "--reuse-grad-buf-for-mxfp8-param-ag)", "toggle", _same("0"),
            sources=(*_BOTH, "README.md")),
    ForkVar("FP8_TRANSPOSE_CACHE", "1: keep the fp8 weight transpose caches (Megatron-FSDP)",
            "accept", _same("0"), accept=("0",),
            here="the cache flags belong to Megatron-FSDP (MEGATRON_FSDP), which this launcher "
                 "does not run; --keep-fp8-weight-transpose-cache-te is not a megatron-core "
                 "0.19.2 flag: unset FP8_TRANSPOSE_CACHE"),

    # -- fusions and kernels ---------------------------------------------------------------------
    ForkVar("GRADIENT_ACCUMULATION_FUSION", "fused wgrad accumulation", "toggle", _same("1")),
    ForkVar("DDP_AVERAGE_IN_COLLECTIVE", "average in the DP collective", "toggle", _same("1")),
    ForkVar("CROSS_ENTROPY_LOSS_FUSION", "fused cross-entropy", "toggle", _same("1")),
    ForkVar("CROSS_ENTROPY_FUSION_IMPL", "native or te", "toggle", _same("te"),
            here="default native: te is refused on megatron-core 0.19.2 (its validate_args "
                 "asserts)"),
    ForkVar("FUSED_SINGLE_QKV_ROPE", "RoPE on the packed QKV in one kernel", "toggle",
            _same("1")),
    ForkVar("GRAD_REDUCE_IN_BF16", "bf16 gradient buffer and reduce", "toggle", _same("1")),
    ForkVar("ROPE_FUSION", "0: --no-rope-fusion", "toggle", _same("1"),
            here="on with Transformer Engine (its kernel); 1 on another backend is refused"),
    ForkVar("USE_FLASH_ATTN", "1: --use-flash-attn; 0 (train_llama3.sh): --attention-backend "
            "fused", "alias", {"llama3": "0", "llama2": "1"}, sources=(*_BOTH, *_DOCS),
            target="ATTENTION_BACKEND",
            here="1 -> ATTENTION_BACKEND=flash, 0 -> fused (Transformer Engine's attention; "
                 "another backend refuses it)"),
    ForkVar("GEMM_TUNING", "1: TE_HIPBLASLT_TUNING_RUN_COUNT=10, TE_HIPBLASLT_TUNING_ALGO_COUNT"
            "=50", "toggle", _same("1"), sources=(*_BOTH, *_DOCS),
            here="the same variables on AMD GPUs with Transformer Engine; off by default here"),
    ForkVar("NO_TORCH_COMPILE", "1: no torch.compile (older scripts; AMD's documented "
            "commands set it)", "accept", sources=("megatron-lm.rst",), accept=("1",),
            here="this launcher never wraps the model in torch.compile: NO_TORCH_COMPILE=1 is "
                 "what runs; 0 cannot be honoured, unset it"),

    # -- optimizer and schedule -----------------------------------------------------------------
    ForkVar("OPTIMIZER", "adam or sgd", "accept", _same("adam"), accept=("adam",),
            here="this launcher trains with AdamW (distributed optimizer, the native backend's "
                 "fused AdamW); for Megatron's SGD pass --optimizer sgd after the script name"),

    # -- data and tokenizer ------------------------------------------------------------------------
    ForkVar("DATA_PATH", "dataset prefix (unset: mock data)", "toggle",
            sources=(*_BOTH, *_DOCS),
            here="a prefix or blend, checked before torchrun; unset: mock data"),
    ForkVar("MOCK_DATA", "1: mock data, 0: DATA_PATH (AMD's docs)", "accept",
            sources=("megatron-lm.rst",), accept=("0", "1"),
            here="agrees with DATA_PATH: MOCK_DATA=1 with DATA_PATH unset, MOCK_DATA=0 with it "
                 "set; anything else is refused"),
    ForkVar("TOKENIZER_TYPE", "Megatron tokenizer type (Llama2Tokenizer downloads "
            "tokenizer.model)", "accept", _same("HuggingFaceTokenizer"),
            sources=(*_BOTH, "README.md"), accept=("HuggingFaceTokenizer",),
            here="Hugging Face tokenizers only: set TOKENIZER_MODEL to a folder, tokenizer.json "
                 "or hub id (e.g. NousResearch/Llama-2-7b-chat-hf) and unset TOKENIZER_TYPE"),
    ForkVar("TOKENIZER_MODEL", "Hugging Face hub id or folder", "toggle",
            {"llama3": "NousResearch/Meta-Llama-3-8B", "llama2": "NousResearch/Llama-2-7b-chat-hf"},
            sources=(*_BOTH, *_DOCS),
            here="a folder, tokenizer.json or hub id (from the hub's cache, or downloaded where "
                 "the hub is reachable); unset: the dataset's tokenizer, mock data: none"),
    ForkVar("DATA_CACHE_PATH", "--data-cache-path when NNODES > 1", "toggle",
            _same("/root/cache"), sources=(*_BOTH, *_DOCS),
            here="--data-cache-path whenever set"),

    # -- output, checkpoints, logging --------------------------------------------------------------
    ForkVar("EXP_NAME", "names the log file (LOG_DIR/output_EXP_NAME.log)", "toggle",
            _same("perf"),
            here="names the run folder under EXPERIMENT_DIR (the log is train.log in it)"),
    ForkVar("LOG_DIR", "the run's folder (default: experiment/<shape>/<precision>/<time>)",
            "toggle", _same("experiment/..."),
            here="the run folder, named whole; one that holds a run is refused"),
    ForkVar("TEE_OUTPUT", "1: output to the console and the log; 0: the log only", "toggle",
            _same("1"), sources=(*_BOTH, *_DOCS)),
    ForkVar("NO_TRAINING", "1: skip training, only summarise an existing log", "accept",
            _same("0"), accept=("0",),
            here="DRY_RUN=1 resolves a launch without training; a finished run's summary is in "
                 "its manifest.json and at the end of its train.log"),
    ForkVar("ENABLE_PROFILING", "1: --profile --use-pytorch-profiler", "alias", _same("0"),
            sources=(*_BOTH, *_DOCS), target="PROFILE"),
    ForkVar("LOG_INTERVAL", "iterations between log lines", "toggle", _same("1")),
    ForkVar("EVAL_INTERVAL", "iterations between evaluations (with SAVE_CKPT_PATH; otherwise "
            "320000)", "toggle", _same("5000")),
    ForkVar("EVAL_ITERS", "batches per evaluation", "toggle", _same("-1"),
            here="0 or more (0: no evaluation); the fork's -1 is refused"),
    ForkVar("SAVE_INTERVAL", "iterations between checkpoints (with SAVE_CKPT_PATH)", "toggle",
            _same("5000"), here="unset with SAVE: the fork's default (source derived)"),
    ForkVar("CKPT_FORMAT", "--ckpt-format (with SAVE_CKPT_PATH)", "toggle", _same("torch"),
            here="--ckpt-format whenever set (Megatron's default: torch_dist)"),
    ForkVar("SAVE_CKPT_PATH", "checkpoint folder to save to", "alias", target="SAVE"),
    ForkVar("LOAD_CKPT_PATH", "load weights only (--no-load-optim --no-load-rng "
            "--use-checkpoint-args --exit-on-missing-checkpoint)", "refuse",
            here="LOAD=<folder> resumes a run of this launcher (weights, optimizer and RNG; a "
                 "missing checkpoint is refused), and --no-load-optim --no-load-rng after the "
                 "script name keep its weights only; PRETRAINED_CHECKPOINT=<folder> starts from "
                 "a Hugging Face model imported with python -m training.checkpoint import"),
    ForkVar("WANDB_API_KEY", "set: log to Weights & Biases (project LLama)", "derive",
            target="WANDB_PROJECT",
            here="WANDB_PROJECT=LLama unless you set it (needs wandb); masked in tables"),

    # -- cluster --------------------------------------------------------------------------------
    ForkVar("MASTER_ADDR", "rendezvous host", "toggle", _same("localhost"),
            sources=(*_BOTH, *_DOCS)),
    ForkVar("MASTER_PORT", "rendezvous port", "toggle", {"llama3": "6000", "llama2": "6020"}),
    ForkVar("NNODES", "nodes", "toggle", _same("1"), sources=(*_BOTH, *_DOCS)),
    ForkVar("NODE_RANK", "this node's rank", "toggle", _same("0"), sources=(*_BOTH, *_DOCS)),
)

# The commands the fork's README and AMD's docs give, verbatim (a line break inside one is the
# documents' own: pasted into bash, its first line only sets shell variables), with what each
# does here (tests/launch/test_fork_commands.py runs them with DRY_RUN=1 on an 8-GPU MI355X
# description and checks it): "runs", or the guard that refuses it, or "bad input".
DOCUMENTED_COMMANDS: tuple[tuple[str, str, str], ...] = (
    ("README.md", "TEE_OUTPUT=1 MBS=2 BS=64 TP=8 TE_FP8=0 SEQ_LENGTH=4096 bash "
                  "examples/llama/train_llama2.sh", "runs"),
    ("README.md", "TEE_OUTPUT=1 MBS=2 BS=128 TP=1 TE_FP8=1 SEQ_LENGTH=8192 MODEL_SIZE=8  bash "
                  "examples/llama/train_llama3.sh", "runs"),
    ("README.md", "TEE_OUTPUT=1 MBS=2 BS=16 TP=1 TE_FP8=0 FSDP=1 RECOMPUTE=1 SEQ_LENGTH=8192 "
                  "MODEL_SIZE=8 bash examples/llama/train_llama3.sh", "runs"),
    ("README.md", "TE_FP8=1 MEGATRON_FSDP=1 FP8_PARAM_GATHER=1 bash "
                  "examples/llama/train_llama3.sh", "fork_variables"),
    ("README.md", "TE_FP8=1 MEGATRON_FSDP=1 FP8_PARAM_GATHER=0 bash "
                  "examples/llama/train_llama3.sh", "fork_variables"),
    ("README.md", "TEE_OUTPUT=1 MBS=2 BS=256 TP=1 TE_FP8=1 SEQ_LENGTH=8192 MODEL_SIZE=8 "
                  "MASTER_ADDR=IP_NODE0 NNODES=2 NODE_RANK=0 bash examples/llama/train_llama3.sh",
     "runs"),
    ("README.md", "TEE_OUTPUT=1 MBS=2 BS=256 TP=1 TE_FP8=1 SEQ_LENGTH=8192 MODEL_SIZE=8 "
                  "MASTER_ADDR=IP_NODE0 NNODES=2 NODE_RANK=1 bash examples/llama/train_llama3.sh",
     "runs"),
    ("readme.md", "./examples/llama/train_llama2.sh", "runs"),
    ("readme.md", "MBS=2 BS=16 TP=1 TE_FP8=0 FSDP=1 RECOMPUTE=1 SEQ_LENGTH=8192 "
                  "./examples/llama/train_llama3.sh", "runs"),
    ("readme.md", "MASTER_ADDR=address NNODES=N NODE_RANK=0 ./examples/llama/train_llama2.sh",
     "bad input"),
    ("readme.md", "MASTER_ADDR=address NNODES=N NODE_RANK=i ./examples/llama/train_llama2.sh",
     "bad input"),
    ("readme.md", "DATA_PATH=bookcorpus/data_text_document "
                  "TOKENIZER_MODEL=NousResearch/Llama-2-7b-chat-hf "
                  "./examples/llama/train_llama2.sh",
     "data_path"),
    ("megatron-lm.rst", "TEE_OUTPUT=1 MBS=2 BS=128 TP=1 TE_FP8=1 SEQ_LENGTH=8192 MODEL_SIZE=8 "
                        "TOTAL_ITERS=50 bash examples/llama/train_llama3.sh", "runs"),
    ("megatron-lm.rst", "TEE_OUTPUT=1 MBS=2 BS=128 TP=1 TE_FP8=0 SEQ_LENGTH=8192 MODEL_SIZE=8 "
                        "TOTAL_ITERS=50 bash examples/llama/train_llama3.sh", "runs"),
    ("megatron-lm.rst", "TEE_OUTPUT=1 MBS=4 BS=256 TP=1 TE_FP8=1 SEQ_LENGTH=4096 MODEL_SIZE=7 "
                        "TOTAL_ITERS=50 bash examples/llama/train_llama2.sh", "runs"),
    ("megatron-lm.rst", "TEE_OUTPUT=1 MBS=4 BS=256 TP=1 TE_FP8=0 SEQ_LENGTH=4096 MODEL_SIZE=7 "
                        "TOTAL_ITERS=50 bash examples/llama/train_llama2.sh", "runs"),
    ("megatron-lm.rst", "TEE_OUTPUT=1 MBS=3 BS=24 TP=1 TE_FP8=0 FSDP=1 RECOMPUTE=1 "
                        "SEQ_LENGTH=8192 MODEL_SIZE=70 TOTAL_ITERS=50 bash "
                        "examples/llama/train_llama3.sh", "runs"),
    ("megatron-lm.rst", "TEE_OUTPUT=1 MBS=3 BS=56 TP=1 TE_FP8=0 FSDP=1 RECOMPUTE=1 "
                        "SEQ_LENGTH=4096 MODEL_SIZE=70 TOTAL_ITERS=50 bash "
                        "examples/llama/train_llama2.sh", "parallel_sizes"),
    ("megatron-lm.rst", "TEE_OUTPUT=1 MBS=2 BS=256 TP=1 TE_FP8=1 SEQ_LENGTH=8192 MODEL_SIZE=8 "
                        "MASTER_ADDR=IP_NODE0 NNODES=2 NODE_RANK=0 bash "
                        "examples/llama/train_llama3.sh", "runs"),
    ("megatron-lm.rst", "TEE_OUTPUT=1 MBS=2 BS=256 TP=1 TE_FP8=1 SEQ_LENGTH=8192 MODEL_SIZE=8 "
                        "MASTER_ADDR=IP_NODE0 NNODES=2 NODE_RANK=1 bash "
                        "examples/llama/train_llama3.sh", "runs"),
    ("megatron-lm.rst", "TEE_OUTPUT=1 MBS=5 BS=120 TP=8 TE_FP8=0 NO_TORCH_COMPILE=1\n"
                        "SEQ_LENGTH=4096 bash examples/llama/train_llama2.sh", "runs"),
    ("megatron-lm.rst", "TEE_OUTPUT=1 MBS=4 BS=64 TP=8 TE_FP8=0 NO_TORCH_COMPILE=1\n"
                        "SEQ_LENGTH=4096 bash examples/llama/train_llama2.sh", "runs"),
    ("issue 20", "TEE_OUTPUT=1 MBS=5 BS=120 TP=8 TE_FP8=0 SEQ_LENGTH=4096 bash "
                 "examples/llama/train_llama3.sh", "runs"),
)

BY_NAME: dict[str, ForkVar] = {v.name: v for v in FORK_VARS}
# variables that are no toggle or alias of ours: the launcher reads them itself
OWN: dict[str, ForkVar] = {v.name: v for v in FORK_VARS if v.kind in ("accept", "refuse",
                                                                     "derive")}
SHAPE = tuple(v for v in FORK_VARS if v.shape)
# what marks a launch typed from the fork's scripts or docs (the launch then says in one line
# where the fork's defaults differ): its own variables and aliases, its precision switches,
# and the AMD-only exports its scripts set; not the names both launchers share (TP, BS, ...)
SIGNATURE = frozenset([*OWN, *(v.name for v in FORK_VARS if v.kind == "alias"),
                       "TE_FP8", "TE_FP8_RECIPE", "TE_FP4", "TE_FP4_RECIPE", "TEE_OUTPUT",
                       "GPU_MAX_HW_QUEUES", "TORCH_NCCL_HIGH_PRIORITY", "NCCL_CHECKS_DISABLE",
                       "RCCL_MSCCL_ENABLE", "HSA_NO_SCRATCH_RECLAIM"])
