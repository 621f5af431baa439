"""MoE CPU tests: Megatron's torch.compile'd helpers (router, weighted SwiGLU) run eagerly here.
Compiling them with inductor on the CPU costs ~20 s per test process and changes no number
(the same ops, unfused); the GPU tests run them compiled, as training does."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _eager_megatron_helpers():
    import torch._dynamo

    with torch._dynamo.config.patch(disable=True):
        yield
