"""NAN_CHECK=step: the per-iteration check of the loss and global gradient norm."""
from __future__ import annotations

import math

import pytest
import torch

from training.loop_hooks import NonFiniteError, check_finite


@pytest.mark.parametrize("loss,grad_norm", [(2.5, 1.0), (torch.tensor(2.5), 0.3), (2.5, None),
                                            (None, 0.7)])
def test_finite_values_pass(loss, grad_norm):
    assert check_finite(7, loss, grad_norm) is None


@pytest.mark.parametrize("loss,grad_norm,named", [
    (math.nan, 1.0, "loss is nan"), (2.0, math.inf, "gradient norm is inf"),
    (torch.tensor(float("nan")), math.nan, "loss is nan and gradient norm is nan")])
def test_non_finite_stops_with_iteration_and_remedy(loss, grad_norm, named):
    with pytest.raises(NonFiniteError) as err:
        check_finite(12, loss, grad_norm)
    message = str(err.value)
    assert message.startswith(f"iteration 12: {named}")
    assert "NAN_CHECK=bucket" in message
