"""The launch defaults derived from other settings (training/launch/toggles.py), stated over
every input they take rather than at one value (issue 55: a mutation of a launch default
survived the tests named for it). The launcher and a plain torchrun both call these, so a
wrong rule here changes what is trained on both paths."""
from __future__ import annotations

import itertools

from training.launch.toggles import auto_backend, default_metrics_warmup_iters, fused_linear_ce

ARCHS = ("sm90", "sm100", "sm80", "gfx942", "gfx950", None)
PRECISIONS = ("bf16", "fp8", "mxfp8", "nvfp4", "fp16")


def test_metrics_warmup_is_a_fifth_of_the_run_between_two_and_ten():
    assert default_metrics_warmup_iters(None) == 2
    for total in range(0, 400):
        warmup = default_metrics_warmup_iters(total)
        assert 2 <= warmup <= 10, total
        assert warmup == min(10, max(2, total // 5)), total   # the docs' rule, in its words:
        if 10 <= total < 55:                                   # a fifth, between 2 and 10
            assert warmup == total // 5, total


def test_auto_backend_is_native_exactly_where_the_rule_says():
    """native without TE, for a model TE computes wrong, and for bf16 MoE on sm90 (measured
    faster there); the TE backend everywhere else. Every combination of the inputs."""
    for te, moe, arch, precision, blocked in itertools.product(
            (True, False), (True, False), ARCHS, PRECISIONS, (None, "a reason")):
        backend, why = auto_backend(te, moe, arch, precision, blocked)
        native = (not te) or blocked is not None or (moe and precision == "bf16" and arch == "sm90")
        assert backend == ("native" if native else "transformer_engine"), (te, moe, arch, precision, blocked)
        assert why, "every choice says why"


def test_fused_linear_cross_entropy_follows_the_rule_for_every_layout():
    for backend, fusion, tp, cp, kernels in itertools.product(
            ("native", "transformer_engine", "local"), (True, False), (1, 2, 8), (1, 2),
            ("liger", "torch", None)):
        chosen, why = fused_linear_ce(backend, fusion, tp, cp, kernels)
        if not fusion or tp > 1 or cp > 1 or backend == "local":
            expected = None
        elif backend == "native":
            expected = kernels
        else:
            expected = "liger" if kernels == "liger" else None
        assert chosen == expected, (backend, fusion, tp, cp, kernels)
        assert why
