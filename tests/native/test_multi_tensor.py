"""training/native/multi_tensor.py: apex's multi-tensor l2 norm and scale as torch foreach ops,
against Megatron's local fallbacks (CPU; the memory and Megatron's clip path: tests/gpu; which
ops Megatron gets: tests/test_megatron_patches.py)."""
from __future__ import annotations

import pytest
import torch
from megatron.core import utils

from training.native.multi_tensor import foreach_l2_norm, foreach_scale

FLAG = torch.zeros(1, dtype=torch.int)


def _tensors(dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=gen).to(dtype) for shape in ((7,), (3, 4), (2, 2, 5))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_l2_norm_is_the_norm_of_all_elements_and_of_each_tensor(dtype):
    tensors = _tensors(dtype)
    total, per = foreach_l2_norm(2048, FLAG, [tensors], True)
    flat = torch.cat([t.float().flatten() for t in tensors])
    assert total.shape == (1,) and total.dtype == torch.float32
    torch.testing.assert_close(total[0], torch.linalg.vector_norm(flat), rtol=1e-6, atol=0)
    torch.testing.assert_close(per, torch.stack([t.float().norm() for t in tensors]),
                               rtol=1e-6, atol=0)
    assert foreach_l2_norm(2048, FLAG, [tensors], False)[1] is None


def test_l2_norm_of_no_tensors_is_zero():
    total, per = foreach_l2_norm(2048, FLAG, [[]], False)
    assert total.tolist() == [0.0] and per is None


def test_l2_norm_keeps_a_non_finite_gradient_visible():
    tensors = _tensors()
    tensors[1][0, 0] = float("nan")
    assert torch.isnan(foreach_l2_norm(2048, FLAG, [tensors], False)[0]).all()


def test_in_place_scale_writes_the_same_tensors_and_values_as_megatrons_local_version():
    ours, ref = _tensors(), _tensors()
    pointers = [t.data_ptr() for t in ours]
    foreach_scale(2048, FLAG, [ours, ours], 0.37)
    utils.local_multi_tensor_scale(2048, FLAG, [ref, ref], 0.37)
    assert [t.data_ptr() for t in ours] == pointers
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("scale", [1.0, 0.37])
def test_scale_into_other_tensors_matches_megatrons_local_version(scale):
    """The non-distributed optimizer copies fp32 main params into bf16 params with scale 1."""
    src = _tensors()
    ours = [torch.empty_like(t, dtype=torch.bfloat16) for t in src]
    ref = [torch.empty_like(t, dtype=torch.bfloat16) for t in src]
    foreach_scale(2048, FLAG, [src, ours], scale)
    utils.local_multi_tensor_scale(2048, FLAG, [src, ref], scale)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_scale_by_one_in_place_changes_nothing():
    ours, ref = _tensors(), _tensors()
    foreach_scale(2048, FLAG, [ours, ours], 1.0)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
