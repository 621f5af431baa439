"""The run side of an MLPerf run that a closed submission could stand on: the page cache dropped
(or the reason it was not, and a closed run stopped), every rank on node 0's seed, and the
documents and tokens the run reads, counted from Megatron's own datasets.

Nothing here drops this machine's page cache: the root path writes to a file of the test's."""
from __future__ import annotations

import json
import warnings
from argparse import Namespace

import pytest

from training.mlperf import cache, events, summary


def test_plan_names_the_hook_first_then_root_then_nothing(tmp_path):
    writable = tmp_path / "drop_caches"
    writable.write_text("")
    assert cache.plan("sudo -n /sbin/drop", writable, euid=1000).method == "hook"
    root = cache.plan(None, writable, euid=0)
    assert root.done and root.method == "drop_caches"
    user = cache.plan(None, writable, euid=1000)
    assert not user.done and "not root (euid 1000)" in user.detail
    ro = cache.plan(None, tmp_path / "absent" / "drop_caches", euid=0)
    assert not ro.done and "not writable" in ro.detail and "MLPERF_CACHE_CLEAR_CMD" in ro.detail
    assert not cache.plan("'unbalanced", writable, euid=0).done


def test_clear_as_root_writes_3_after_a_sync(tmp_path):
    target = tmp_path / "drop_caches"
    target.write_text("")
    done = cache.clear(None, target, euid=0)
    assert done.done and target.read_text() == "3\n"


def test_clear_by_hook_runs_it_and_reports_its_failure(tmp_path):
    marker = tmp_path / "ran"
    ok = cache.clear(f"sh -c 'echo dropped > {marker}'")
    assert ok.done and ok.method == "hook" and marker.read_text() == "dropped\n"
    failed = cache.clear("sh -c 'echo no permission >&2; exit 3'")
    assert not failed.done and "exited 3: no permission" in failed.detail
    missing = cache.clear(str(tmp_path / "no-such-command"))
    assert not missing.done and "failed" in missing.detail


def _args(run_dir):
    return Namespace(run_dir=str(run_dir))


def _config(**kw):
    base = {"benchmark": "llama31_8b", "division": "closed", "target_eval_loss": 3.3,
            "eval_every_samples": 12288, "eval_samples": 1024}
    return {events.RUN_ENV: json.dumps({**base, **kw})}


def test_the_run_logs_what_was_done_and_a_closed_run_stops_when_nothing_was(tmp_path):
    run = events.start(_args(tmp_path / "a"), {**_config(cache_clear="hook",
                                                          cache_clear_cmd="true"), "RANK": "0"})
    run.log.close()
    first = summary.read_events(tmp_path / "a" / "mlperf.log")[0]
    assert first["key"] == "cache_clear" and first["value"] is True
    assert first["metadata"]["method"] == "hook"

    with pytest.raises(events.CacheNotCleared, match="not dropped on this node"):
        events.start(_args(tmp_path / "b"), {**_config(cache_clear="hook",
                                                      cache_clear_cmd="false"), "RANK": "0"})
    with pytest.raises(events.CacheNotCleared, match="MLPERF_CACHE_CLEAR_CMD"):
        events.start(_args(tmp_path / "c"), {**_config(), "RANK": "0"})

    run = events.start(_args(tmp_path / "d"), {**_config(division="open"), "RANK": "0"})
    run.log.close()
    first = summary.read_events(tmp_path / "d" / "mlperf.log")[0]
    assert first["value"] is False and first["metadata"]["detail"]


def test_only_each_nodes_local_rank_zero_drops(tmp_path):
    marker = tmp_path / "dropped"
    config = _config(cache_clear="hook", cache_clear_cmd=f"touch {marker}")
    run = events.start(_args(tmp_path / "r"), {**config, "RANK": "9", "LOCAL_RANK": "1"})
    assert run is not None and not marker.exists()
    events.start(_args(tmp_path / "r"), {**config, "RANK": "8", "LOCAL_RANK": "0"})
    assert marker.exists()                      # node 1's local rank 0 (it logs nothing)
    assert not (tmp_path / "r" / "mlperf.log").exists()


def _seed_worker(rank, world, store_path, seeds, out):
    import torch

    from training.run import Run

    torch.distributed.init_process_group("gloo", init_method=f"file://{store_path}",
                                         rank=rank, world_size=world)
    got = []
    args = Namespace(seed=seeds[rank])
    replaced = events.seed_from_rank_zero(lambda seed, *a, **kw: got.append(seed),
                                          Run(args=args, rank=rank))
    replaced(seeds[rank], False)
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"seeded": got, "args": args.seed}, f)
    torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_every_rank_takes_rank_zeros_seed_before_megatron_seeds(tmp_path):
    """Two processes (gloo on the CPU; NCCL takes the same path with a CUDA tensor), each with
    its own node's seed: both seed Megatron, and set args.seed, with rank 0's."""
    import torch.multiprocessing as mp

    seeds = [91817, 4242]
    mp.spawn(_seed_worker, args=(2, str(tmp_path / "store"), seeds, str(tmp_path / "out")),
             nprocs=2)
    for rank in range(2):
        got = json.loads((tmp_path / f"out.{rank}").read_text())
        assert got == {"seeded": [91817], "args": 91817}


@pytest.mark.filterwarnings("ignore:Could not determine rank")
def test_counts_are_what_megatrons_datasets_read(mlperf_data, tmp_path):
    from megatron.core.datasets.blended_megatron_dataset_builder import \
        BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    from training import megatron_patches
    from training.data.record import read_record
    from training.run import Run

    class Tokenizer:
        vocab_size, eod, pad = 300, 1, 2
        unique_identifiers = {"class": "test tokenizer"}

    megatron_patches.apply(Run(args=None), names=("dataset_helpers",))
    train, valid = mlperf_data["DATA_PATH"], mlperf_data["SMALL_VALID"]
    config = GPTDatasetConfig(random_seed=1, sequence_length=64, path_to_cache=str(tmp_path),
                              blend_per_split=[([train], None), ([valid], None), None],
                              tokenizer=Tokenizer(), reset_position_ids=False,
                              reset_attention_mask=False, eod_mask_loss=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        built = BlendedMegatronDatasetBuilder(GPTDataset, [100, 10, 0], lambda: True,
                                              config).build()
    for dataset, prefix in zip(built, (train, valid)):
        record = read_record(prefix)
        assert events.dataset_counts(dataset) == (record["documents"], record["tokens"])
    assert events.dataset_counts(None) is None
