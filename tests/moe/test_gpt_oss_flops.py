"""FLOPs per token of gpt-oss: its banded layers (a 128-key sliding window on every other layer)
compute the band of the score matrix, not the causal triangle, so at seq 8192 they count a
window's keys per query, not half the sequence; the launcher's model, the run's (from Megatron's
arguments) and the bench's peer count the same."""
from __future__ import annotations

import dataclasses

import pytest

from training.metrics import attention_keys, flops_per_token
from training.moe.gpt_oss import GPT_OSS_20B, GPT_OSS_20B_MLPERF, TINY_GPT_OSS
from training.run_description import Model


def test_banded_layers_count_the_band_not_the_triangle():
    model = Model.of(GPT_OSS_20B, 8, 8192)
    full = dataclasses.replace(model, sliding_window=None)
    s, w, q = 8192, 128, model.q_width
    assert [model.banded(n) for n in range(1, 9)] == [True, False] * 4   # the first banded
    # the band of a 128-key window in an 8192 x 8192 causal score matrix: s w - w^2 / 2 scores
    band = s * w - w * w / 2
    assert attention_keys(model, 1) == pytest.approx(band / s)
    assert attention_keys(model, 2) == s / 2 == attention_keys(full, 1)
    # four banded layers, forward + backward (3x), scores and values (2 x 2 FLOPs a key)
    saved = 3 * 4 * 4 * q * (s / 2 - band / s)
    assert flops_per_token(full) - flops_per_token(model) == pytest.approx(saved)
    assert flops_per_token(model) / flops_per_token(full) == pytest.approx(0.930, abs=1e-3)


def test_a_window_as_long_as_the_sequence_is_causal_attention():
    model = Model.of(TINY_GPT_OSS, seq_length=TINY_GPT_OSS.sliding_window)
    full = dataclasses.replace(model, sliding_window=None)
    assert flops_per_token(model) == pytest.approx(flops_per_token(full))


@pytest.mark.parametrize("preset", [GPT_OSS_20B, GPT_OSS_20B_MLPERF], ids=lambda p: p.name)
def test_the_run_counts_what_the_launcher_and_the_peer_count(preset):
    """loop_hooks (the run's metrics) reads the model from Megatron's parsed arguments
    (--window-size W-1,0, --window-attn-skip-freq 2); the launcher and the bench's peers from
    the preset: the same window, the same FLOPs."""
    from training.bench.peer_common import preset_named

    from tests.moe.model import megatron_moe_args

    args = megatron_moe_args(preset, 8, 8192)
    args.padded_vocab_size = preset.vocab_size
    run = Model.from_megatron_args(args)
    assert (run.sliding_window, run.window_skip_freq) == (preset.sliding_window, 2)
    launcher = Model.of(preset, 8, 8192)
    peer = Model.of(preset_named(preset.name), 8, 8192)
    assert flops_per_token(run) == pytest.approx(flops_per_token(launcher), rel=1e-12)
    assert flops_per_token(peer) == flops_per_token(launcher)


def test_a_window_pattern_from_a_manifest_reads_back():
    model = dataclasses.replace(Model.of(GPT_OSS_20B, 4, 4096), window_skip_freq=(1, 1, 0, 0))
    again = Model.from_dict(dict(model.to_dict(), window_skip_freq=[1, 1, 0, 0]))   # JSON
    assert again == model and [again.banded(n) for n in (1, 2, 3, 4)] == [True, True, False,
                                                                            False]


def test_the_flops_command_knows_gpt_oss(capsys):
    """`python -m training.moe flops --model gpt-oss-20b` (docs/gpt_oss.md quotes it)."""
    import json
    import runpy
    import sys
    from unittest import mock

    argv = ["training.moe", "flops", "--model", "gpt-oss-20b", "--num-layers", "8",
            "--seq-length", "8192", "--json"]
    with mock.patch.object(sys, "argv", argv), pytest.raises(SystemExit) as done:
        runpy.run_module("training.moe", run_name="__main__", alter_sys=True)
    assert done.value.code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["flops_per_token"] == flops_per_token(Model.of(GPT_OSS_20B, 8, 8192))
    assert out["shape"]["sliding_window"] == 128
