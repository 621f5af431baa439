"""A plain `torchrun training/pretrain_gpt.py <flags>` runs what the launcher runs: its
invocation, without the words the launcher owns (our arguments and the Megatron flags they
imply), parses with Megatron's own parser and our arguments into the same values as the
launcher's DRY_RUN invocation, once training.arguments.as_the_launcher has derived them."""
from __future__ import annotations

import pytest

from tests.launch.helpers import launch
from training.arguments import (TOGGLE_OF, ArgumentConflict, add_training_args,
                                as_the_launcher, megatron_parser)
from training.launch.toggles import BY_NAME, MEGATRON_BUCKETS

# Megatron flags the launcher emits because of a toggle of ours (value flags take one word).
IMPLIED = {"--transformer-impl": 1, "--no-rope-fusion": 0, "--no-persist-layer-norm": 0,
           "--no-masked-softmax-fusion": 0, "--no-check-for-nan-in-loss-and-grad": 0}


def _our_flags() -> dict[str, int]:
    """Each option string of our argument groups -> the words of value it takes."""
    import argparse

    parser = add_training_args(argparse.ArgumentParser())
    flags = {}
    for action in parser._actions:
        for option in action.option_strings:
            flags[option] = 0 if action.nargs == 0 else 1
    return flags


def launcher_words(result) -> list[str]:
    words = []
    for bucket in MEGATRON_BUCKETS:
        words += result.buckets[bucket]
    return words + result.user_args


def without_launcher_owned(words: list[str]) -> list[str]:
    owned = {**_our_flags(), **IMPLIED}
    kept, skip = [], 0
    for word in words:
        if skip:
            skip -= 1
        elif word in owned:
            skip = owned[word]
        else:
            kept.append(word)
    return kept


# (the launcher's toggles, what a user types instead on a plain invocation)
CATALOGUE = [
    ({}, []),
    ({"TOTAL_ITERS": 100}, []),                      # the metrics warm-up follows TOTAL_ITERS
    ({"TOTAL_ITERS": 7}, []),
    ({"NAN_CHECK": "bucket"}, ["--nan-check", "bucket"]),
    ({"METRICS_WARMUP_ITERS": 7}, ["--metrics-warmup-iters", "7"]),
    ({"NATIVE_KERNELS": "torch"}, ["--native-kernels", "torch"]),
    ({"FUSED_SINGLE_QKV_ROPE": 0}, ["--no-fused-single-qkv-rope"]),
    ({"CE_CHUNK_MEM": 2}, ["--ce-chunk-mem", "2"]),
    ({"TRANSFORMER_IMPL": "native"}, ["--transformer-backend", "native"]),
    # the launcher's guard turns the fused QKV RoPE off for the local spec (no kernel);
    # guards do not run under torchrun, so a plain invocation says so itself
    ({"TRANSFORMER_IMPL": "local"}, ["--transformer-backend", "local",
                                     "--no-fused-single-qkv-rope"]),
]


@pytest.mark.parametrize("toggles,plain_extra", CATALOGUE, ids=lambda v: str(v))
def test_plain_invocation_parses_as_the_launchers(base_env, toggles, plain_extra):
    result = launch(base_env, MODEL_SIZE="tiny", **toggles)
    full = launcher_words(result)
    plain = without_launcher_owned(full) + plain_extra
    assert "--transformer-backend" not in without_launcher_owned(full)
    derived, _notes = as_the_launcher(plain)
    theirs = vars(megatron_parser().parse_args(full))
    ours = vars(megatron_parser().parse_args(derived))
    assert theirs.pop("run_dir") == str(result.log_dir) and ours.pop("run_dir") is None
    assert ours == theirs, {k: (ours[k], theirs[k]) for k in ours if ours[k] != theirs.get(k)}


def test_the_launchers_invocation_is_left_as_it_is(base_env):
    words = launcher_words(launch(base_env, MODEL_SIZE="tiny"))
    assert as_the_launcher(words) == (words, [])


def test_defaults_of_our_arguments_are_the_registrys():
    args = megatron_parser().parse_args([])
    for dest, toggle in TOGGLE_OF.items():
        assert getattr(args, dest) == BY_NAME[toggle].default, dest


def test_a_derivation_is_shown_with_its_reason():
    argv, notes = as_the_launcher(["--train-iters", "30", "--transformer-backend", "native"])
    assert argv[-2:] == ["--metrics-warmup-iters", "6"]
    assert "--metrics-warmup-iters 6 (20% of --train-iters, between 2 and 10)" in notes
    assert "--transformer-impl local (implied by --transformer-backend native)" in notes
    assert argv[:2] == ["--transformer-impl", "local"]


def test_an_explicit_megatron_flag_keeps_its_value_and_a_contradiction_is_refused():
    argv, _ = as_the_launcher(["--transformer-backend", "native", "--transformer-impl", "local"])
    assert argv.count("--transformer-impl") == 1
    with pytest.raises(ArgumentConflict, match="--transformer-impl transformer_engine "
                                               "contradicts --transformer-backend native"):
        as_the_launcher(["--transformer-backend", "native",
                         "--transformer-impl", "transformer_engine"])


def test_low_precision_without_te_layers_is_a_contradiction():
    """Only TE's layers compute in fp8/fp4: on the native or local backend (given, or auto's
    choice: a biased MoE block is kept off TE) the flag would train in bf16 without a word."""
    from training.launch.capabilities import for_platform

    for words in (["--transformer-backend", "native", "--fp8-format", "hybrid"],
                  ["--transformer-backend", "local", "--fp4-format", "e2m1"]):
        with pytest.raises(ArgumentConflict, match="needs the TE backend's layers"):
            as_the_launcher(words)
    moe = ["--num-experts", "8", "--moe-grouped-gemm"]
    clamp = ["--disable-bias-linear", "--quick-geglu", "--activation-func-clamp-value", "7"]
    with pytest.raises(ArgumentConflict, match="biased experts and router") as biased:
        as_the_launcher([*moe, "--fp8-format", "hybrid"], for_platform("h200"))
    # never pointed at the TE backend it cannot have; what lifts the blocker where it can be
    assert "use --transformer-backend transformer_engine" not in str(biased.value)
    assert "--disable-bias-linear lifts it" in str(biased.value)
    with pytest.raises(ArgumentConflict, match="clamped quick-GeGLU") as clamped:
        as_the_launcher([*moe, *clamp, "--fp8-format", "hybrid"], for_platform("h200"))
    assert "--disable-bias-linear" not in str(clamped.value).split("Drop")[-1]
    argv, _ = as_the_launcher(["--fp8-format", "hybrid"], for_platform("h200"))
    assert argv[argv.index("--transformer-backend") + 1] == "transformer_engine"


def test_device_counts_outside_their_layout_are_a_contradiction():
    moe = ["--num-experts", "8", "--moe-grouped-gemm", "--moe-token-dispatcher-type",
           "alltoall", "--moe-device-counts"]
    as_the_launcher(["--transformer-backend", "native", *moe])
    for words in (["--transformer-backend", "local"], ["--tensor-model-parallel-size", "2"],
                  ["--transformer-backend", "native", "--expert-model-parallel-size", "2"]):
        with pytest.raises(ArgumentConflict, match="drop --moe-device-counts"):
            as_the_launcher([*words, *moe])
    # Megatron's own defaults (allgather dispatcher, sequential experts), or no experts at all
    for words, why in ((["--num-experts", "8"], "MOE_GROUPED_GEMM=0"), ([], "no experts")):
        with pytest.raises(ArgumentConflict, match=why):
            as_the_launcher(["--transformer-backend", "native", *words, "--moe-device-counts"])


def test_a_cuda_graph_of_a_step_that_reads_the_gpu_from_the_host_is_a_contradiction():
    """The guard cuda_graph's rule for a plain torchrun (no launcher to turn anything off)."""
    graph = ["--cuda-graph-impl", "full_iteration", "--transformer-backend", "native"]
    as_the_launcher([*graph, "--native-kernels", "torch", "--cross-entropy-loss-fusion"])
    as_the_launcher([*graph, "--native-kernels", "liger"])     # Megatron's cross-entropy
    # Liger's kernel in our sync-free loop (training/native/cross_entropy.py): no host read
    as_the_launcher([*graph, "--native-kernels", "liger", "--cross-entropy-loss-fusion"])
    cases = ((["--native-kernels", "torch", "--nan-check", "bucket"], "use --nan-check step"),
             (["--native-kernels", "torch", "--num-experts", "8"], "add --moe-device-counts"))
    for words, fix in cases:
        with pytest.raises(ArgumentConflict, match=fix):
            as_the_launcher([*graph, *words])


def test_pretrain_exits_2_with_one_line_on_a_contradiction(capsys):
    from training.pretrain_gpt import argv_as_the_launcher

    with pytest.raises(SystemExit) as exit_info:
        argv_as_the_launcher(["--transformer-backend", "local",
                              "--transformer-impl=transformer_engine"], rank=0)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("pretrain_gpt.py: --transformer-impl")
