"""The untimed index step (training.mlperf.index): it caches the training split's indices the
run will ask for (same arguments, provider and sample counts), so the run only loads them; a
run with another seed needs its own."""
from __future__ import annotations

import json

import pytest

from training.mlperf import index
from training.mlperf.launch import resolve_mlperf

pytestmark = [pytest.mark.filterwarnings("ignore:Could not determine rank")]

SMALL = {"MLPERF_DIVISION": "open", "MODEL_SIZE": "tiny", "SEQ_LENGTH": "64", "BS": "8",
         "MBS": "8", "GPUS_PER_NODE": "1", "TOTAL_ITERS": "40", "MLPERF_EVAL_EVERY": "80",
         "MLPERF_EVAL_SAMPLES": "16", "WARMUP_ITERS": "2", "MLPERF_TARGET_LOSS": "5"}


def _words(launch):
    words = []
    for bucket in ("GPT_ARGS", "TRAIN_ARGS", "DATA_ARGS", "OUTPUT_ARGS", "EXTRA_ARGS"):
        words += launch.buckets[bucket]
    return words + launch.user_args


def _train_indices(cache):
    return sorted(p.name for p in cache.glob("*-GPTDataset-train-document_index.npy"))


@pytest.mark.slow
def test_the_index_step_caches_what_the_run_loads(mlperf_data, mlperf_env, tmp_path, capsys):
    from megatron.training import global_vars

    cache = tmp_path / "cache"
    env = {**mlperf_env, **SMALL, "VALID_DATA_PATH": mlperf_data["SMALL_VALID"]}
    launch, _, config = resolve_mlperf(env, ["--data-cache-path", str(cache), "--seed", "5"])
    run_env = {"MLPERF_RUN": json.dumps(config)}
    try:
        done = index.build(_words(launch), 1, run_env)
        assert done["seed"] == 5 and done["num_samples"][0] == 40 * 8
        built = _train_indices(cache)
        assert len(built) == 1
        stamp = (cache / built[0]).stat().st_mtime_ns

        # the run (rank 0 builds first) with the same words: a cache hit, nothing rebuilt
        global_vars.unset_global_variables()
        capsys.readouterr()
        index.build(_words(launch), 1, run_env)
        assert _train_indices(cache) == built
        assert (cache / built[0]).stat().st_mtime_ns == stamp

        # another seed is another index: the step must run with the run's own seed
        global_vars.unset_global_variables()
        relaunch, _, _ = resolve_mlperf(env, ["--data-cache-path", str(cache), "--seed", "6"])
        index.build(_words(relaunch), 1, run_env)
        assert len(_train_indices(cache)) == 2
    finally:
        global_vars.unset_global_variables()


def test_without_mlperf_run_or_world_size_it_says_what_to_do(capsys):
    assert index.main(["--seed", "3"]) == 2
    assert "--world-size N" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="MLPERF_RUN is not set"):
        index.build([], 1, {})
