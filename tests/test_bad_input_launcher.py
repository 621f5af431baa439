"""The launcher on bad input: exit 2, one line on stderr that says what is wrong, and no
traceback (the bar: zero). Issue 20's list of inputs checked end to end, and the ROCm fork's
variables it cannot honour.

The other command-line tools' catalogue is tests/test_bad_input_catalogue.py; both use the Case
type and runners of tests/bad_input.py (`python -m training.launch`'s main(argv) in this
process, a bash entry point as a subprocess), and a launch's refusal also leaves stdout empty:
the bash script evals it.
"""
from __future__ import annotations

import pytest

from tests.bad_input import Case, check_case, run, write

LAUNCH = "training.launch.__main__"
TRAIN3 = "examples/llama/train_llama3.sh"
TRAIN2 = "examples/llama/train_llama2.sh"
MOE = "examples/moe/train_qwen3_moe.sh"


def _l3(*words: str) -> list[str]:
    return ["--family", "llama3", *words]


DRY = {"DRY_RUN": "1", "EXPERIMENT_DIR": "{tmp}/exp", "HF_HUB_OFFLINE": "1"}
RUN = "{tmp}/exp/llama3-8B_n1x1_tp1pp1cp1_mbs1gbs128_seq8192/bf16/r1"

CASES: list[Case] = [
    Case("launch: no --family", LAUNCH, [], "--family"),
    # -- values: range and form (the registry) --------------------------------------------------
    *[Case(f"launch: {w}", LAUNCH, _l3(w), w.split("=")[0], env=DRY) for w in (
        "TP=abc", "TP=0", "TP=100000", "MBS=-1", "BS=1000000000000", "SEQ_LENGTH=0",
        "NUM_LAYERS=0", "TOTAL_ITERS=-1", "WARMUP_ITERS=-1", "EVAL_INTERVAL=0", "LOG_INTERVAL=0",
        "EVAL_ITERS=-1", "LR=nan", "LR=0", "LR=-3e-4", "MIN_LR=-1", "MIN_LR=inf",
        "ADAM_BETA1=1.5", "ADAM_BETA2=1", "ADAM_EPS=-1e-8", "WEIGHT_DECAY=-0.1", "CLIP_GRAD=-1", "CLIP_GRAD=inf",
        "MASTER_PORT=0", "MASTER_PORT=70000", "MASTER_ADDR=", "MASTER_ADDR=node 0",
        "SPLIT=abc", "SPLIT=0,1,0", "SEED=-1", "OPTIMIZER_OFFLOAD_FRACTION=2", "TE_FP8=2", "PRECISION=fp6", "PLATFORM=tpu",
        "MODEL_SIZE=8x7B")],
    Case("launch: a stray word", LAUNCH, _l3("oops"), "unexpected word", env=DRY),
    # -- Megatron flags the launcher builds --------------------------------------------------------
    Case("launch: --tensor-model-parallel-size against TP", LAUNCH,
         _l3("TP=2", "GPUS_PER_NODE=4", "--tensor-model-parallel-size", "4"), "contradicts TP=2",
         env=DRY),
    Case("launch: --hidden-size", LAUNCH, _l3("--hidden-size", "5120"), "set MODEL_SIZE=", env=DRY),
    Case("launch: --recompute-granularity", LAUNCH, _l3("--recompute-granularity", "full"),
         "set RECOMPUTE=", env=DRY),
    Case("launch: --run-dir", LAUNCH, _l3("--run-dir", "/tmp/x"), "the run folder", env=DRY),
    Case("launch: --micro-batch-size four", LAUNCH, _l3("--micro-batch-size", "four"),
         "--micro-batch-size four after the script name", env=DRY),
    Case("launch: --micro-batch-size 7 fails the batch rule", LAUNCH,
         _l3("GPUS_PER_NODE=4", "--micro-batch-size", "7"), "BS=128 is not a multiple", env=DRY),
    # -- run folder, checkpoints, the script's own variables -------------------------------------
    Case("launch: RUN_ID=../../x", LAUNCH, _l3("RUN_ID=../../x"), "single folder name", env=DRY),
    Case("launch: EXP_NAME=a/b", LAUNCH, _l3("EXP_NAME=a/b"), "single folder name", env=DRY),
    Case("launch: a run folder that holds a run", LAUNCH, _l3("RUN_ID=r1"), "already holds a run",
         setup=write(RUN.replace("{tmp}/", "") + "/train.log", "a run\n"), env=DRY),
    Case("launch: EXPERIMENT_DIR is a file", LAUNCH, _l3(), "is a file, not a folder",
         setup=write("afile", ""), env={**DRY, "EXPERIMENT_DIR": "{tmp}/afile"}),
    Case("launch: SAVE under a file", LAUNCH, _l3("SAVE={tmp}/afile/ckpt"), "SAVE=",
         setup=write("afile", ""), env=DRY),
    Case("launch: LOAD is a file", LAUNCH, _l3("LOAD={tmp}/afile"), "LOAD=",
         setup=write("afile", ""), env=DRY),
    Case("launch: LOAD without a checkpoint", LAUNCH, _l3("LOAD={tmp}"), "holds no complete checkpoint",
         env=DRY),
    Case("launch: LOG_FILE as a word", LAUNCH, _l3("LOG_FILE=/tmp/x.log"), "LOG_FILE", env=DRY),
    Case("launch: LOG_DIR with RUN_ID", LAUNCH, _l3("LOG_DIR={tmp}/l", "RUN_ID=r"), "LOG_DIR=",
         env=DRY),
    Case("launch: EXTRA_MEGATRON_ARGS with an open quote", LAUNCH, _l3(),
         "EXTRA_MEGATRON_ARGS cannot be split", env={**DRY, "EXTRA_MEGATRON_ARGS": "--x 'a"}),
    Case("launch: DATA_PATH with a missing dataset", LAUNCH, _l3("DATA_PATH={tmp}/none"),
         "not found", env=DRY),
    Case("launch: TOKENIZER_MODEL hub id offline, no cache", LAUNCH,
         _l3("TOKENIZER_MODEL=acme/not-cached"), "HF_HUB_OFFLINE=1",
         env={**DRY, "HF_HUB_CACHE": "{tmp}/hub"}),
    Case("launch: TOKENIZER_MODEL folder without tokenizer.json", LAUNCH,
         _l3("TOKENIZER_MODEL={tmp}/tok"), "no tokenizer.json", setup=write("tok/x", ""),
         env=DRY),
    # -- the ROCm fork's variables it cannot honour ---------------------------------------------
    Case("launch: MODEL_SIZE=7 on llama3", LAUNCH, _l3("MODEL_SIZE=7"), "not a llama3 preset",
         env=DRY),
    *[Case(f"launch: {w}", LAUNCH, _l3(w), w.split("=")[0], env=DRY) for w in (
        "MEGATRON_FSDP=1", "ENABLE_HSDP=1", "HSDP_NUM_REPLICAS=2", "CONTI_PARAMS=1", "MCORE=0",
        "OPTIMIZER=sgd", "NO_TRAINING=1", "NO_TORCH_COMPILE=0", "FP8_TRANSPOSE_CACHE=1",
        "TOKENIZER_TYPE=Llama2Tokenizer", "LOAD_CKPT_PATH=/ckpt", "MOCK_DATA=0",
        "ENABLE_PROFILING=2", "USE_FLASH_ATTN=yes", "RECOMPUTE=2", "SEQ_PARALLEL=2",
        "CROSS_ENTROPY_FUSION_IMPL=te", "TE_FP8_RECIPE=delayed")],
    Case("launch: USE_FLASH_ATTN=1 on the native backend", LAUNCH,
         _l3("USE_FLASH_ATTN=1", "TRANSFORMER_IMPL=native"), "ATTENTION_BACKEND=flash", env=DRY),
    Case("launch: CKPT_FORMAT=torch with FSDP", LAUNCH,
         _l3("FSDP=1", "CKPT_FORMAT=torch", "PLATFORM=h200", "GPUS_PER_NODE=8"), "CKPT_FORMAT",
         env=DRY),
    # -- a recipe layer's variables where the layer does not run -------------------------------
    Case("launch: MLPERF_DIVISION=open", LAUNCH, _l3("MLPERF_DIVISION=open"),
         "run_llama31_8b.sh", env=DRY),
    Case("train_llama3.sh: MLPERF_TARGET_LOSS in the environment", TRAIN3, [],
         "MLPERF_TARGET_LOSS", env={**DRY, "MLPERF_TARGET_LOSS": "3.3"}),
    Case("train_llama3.sh: EP=8", TRAIN3, ["EP=8"], "train_qwen3_moe.sh", env=DRY),
    Case("train_qwen3_moe.sh: EP=0", MOE, ["EP=0"], "EP=0 must be at least 1", env=DRY),
    Case("train_qwen3_moe.sh: --num-experts", MOE, ["--num-experts", "4"], "set MODEL_SIZE=",
         env=DRY),
    Case("train_qwen3_moe.sh: MLPERF_DIVISION=open", MOE, ["MLPERF_DIVISION=open"],
         "run_llama31_8b.sh", env=DRY),
    Case("train_gpt_oss.sh: MOE_GROUPED_GEMM=0", "examples/moe/train_gpt_oss.sh",
         ["MOE_GROUPED_GEMM=0"], "MOE_GROUPED_GEMM=1", env=DRY),
    Case("run_gpt_oss_20b.sh: MOE_AUX_LOSS_COEFF=0.01", "examples/mlperf/gpt_oss_20b/run_gpt_oss_20b.sh",
         ["MOE_AUX_LOSS_COEFF=0.01", "MLPERF_CACHE_CLEAR_CMD=true"], "MOE_AUX_LOSS_COEFF=0.01 (rule: 0)",
         env=DRY),
    Case("launch: two spellings of one knob", LAUNCH,
         _l3("SEQ_PARALLEL=1", "SEQUENCE_PARALLEL=0"), "two values", env=DRY),
    # -- the bash entry points, as a user types them --------------------------------------------
    Case("train_llama3.sh: TP=0", TRAIN3, ["TP=0"], "TP=", env=DRY),
    Case("train_llama3.sh: SEQ_LENGTH=0", TRAIN3, ["SEQ_LENGTH=0"], "SEQ_LENGTH='0' is out of range", env=DRY),
    Case("train_llama2.sh: TP=abc", TRAIN2, ["TP=abc"], "TP", env=DRY),
    Case("train_llama3.sh: EXPERIMENT_DIR is a file", TRAIN3, [], "is a file",
         setup=write("afile", ""), env={**DRY, "EXPERIMENT_DIR": "{tmp}/afile"}),
    Case("train_llama3.sh: EXTRA_MEGATRON_ARGS with an open quote", TRAIN3, [],
         "EXTRA_MEGATRON_ARGS", env={**DRY, "EXTRA_MEGATRON_ARGS": "--ckpt-step '10"}),
    Case("train_llama3.sh: RUN_ID=../../x", TRAIN3, ["RUN_ID=../../x"], "single folder", env=DRY),
    Case("train_llama2.sh: MEGATRON_FSDP=1", TRAIN2, ["MEGATRON_FSDP=1"], "MEGATRON_FSDP",
         env=DRY),
    Case("train_llama2.sh: --hidden-size", TRAIN2, ["--hidden-size", "1"], "MODEL_SIZE", env=DRY),
    # -- the ROCm page's generator -------------------------------------------------------------
    Case("launch.fork_docs: unknown option", "training.launch.fork_docs", ["--frobnicate"],
         "--frobnicate"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_line_without_traceback(case, tmp_path, monkeypatch):
    check_case(case, tmp_path, monkeypatch, quiet_stdout=True)


def test_nothing_was_written_by_a_refused_launch(tmp_path, monkeypatch):
    """A refusal happens before the run folder or its manifest exist."""
    case = next(c for c in CASES if c.id == "launch: TP=0")
    code, *_ = run(case, tmp_path, monkeypatch)
    assert code == 2 and not (tmp_path / "exp").exists()


def test_the_catalogue_counts_every_fork_variable_it_refuses():
    """Each variable the fork list refuses, and each accepted one given another value, has a case."""
    from training.launch.fork_vars import FORK_VARS

    ids = " ".join(c.id for c in CASES)
    for var in FORK_VARS:
        if var.kind in ("refuse", "accept"):
            assert f"{var.name}=" in ids, var.name
    assert len({c.id for c in CASES}) == len(CASES)
