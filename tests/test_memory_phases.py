"""loop_hooks.PhasePeaks: each iteration's peak memory split at Megatron's zero_grad and
optimizer step, on a stand-in for torch.cuda's allocator counters (the H200 runs record the
real ones in metrics.jsonl and the manifest's summary)."""
from __future__ import annotations

from training.loop_hooks import PhasePeaks

GIB = 2**30


class FakeCuda:
    """torch.cuda's allocated / peak / reserved counters, driven by alloc and free."""

    def __init__(self, allocated: float):
        self.allocated = self.peak = self.reserved = allocated

    def alloc(self, gib: float) -> None:
        self.allocated += gib * GIB
        self.peak = max(self.peak, self.allocated)
        self.reserved = max(self.reserved, self.allocated)

    def free(self, gib: float) -> None:
        self.allocated -= gib * GIB

    def max_memory_allocated(self) -> float:
        return self.peak

    def max_memory_reserved(self) -> float:
        return self.reserved

    def reset_peak_memory_stats(self) -> None:
        self.peak = self.allocated


class FakeOptimizer:
    """Megatron's distributed optimizer, as memory sees it: step() makes fp32 copies of the
    gradients (kept until the next zero_grad) and a temporary while clipping."""

    def __init__(self, cuda: FakeCuda, fp32_grads: float, temporary: float):
        self.cuda, self.fp32_grads, self.temporary = cuda, fp32_grads, temporary
        self.holding = False
        self.calls: list[str] = []

    def zero_grad(self):
        self.calls.append("zero_grad")
        if self.holding:
            self.cuda.free(self.fp32_grads)
            self.holding = False

    def step(self):
        self.calls.append("step")
        self.cuda.alloc(self.fp32_grads)
        self.holding = True
        self.cuda.alloc(self.temporary)
        self.cuda.free(self.temporary)
        return True, 1.0, None


def train_step(cuda: FakeCuda, optimizer, activations: float) -> None:
    optimizer.zero_grad()
    cuda.alloc(activations)            # forward stores them, backward frees them
    cuda.free(activations)
    optimizer.step()


def test_each_phase_gets_its_own_peak_and_the_run_peak_covers_them_all():
    cuda = FakeCuda(allocated=40 * GIB)          # weights, grads, main params, moments
    cuda.alloc(5.0)                              # set-up transient, before the first step
    cuda.free(5.0)
    optimizer = FakeOptimizer(cuda, fp32_grads=10.0, temporary=2.0)
    peaks = PhasePeaks(cuda)
    peaks.wrap(optimizer)

    train_step(cuda, optimizer, activations=9.0)
    assert peaks.last["between_steps"] == 45 * GIB       # the set-up, before iteration 1
    assert peaks.last["forward_backward"] == 49 * GIB
    assert peaks.last["optimizer_step"] == 52 * GIB      # fp32 grads + the temporary
    cuda.alloc(3.0)                                      # an evaluation between steps,
    cuda.free(3.0)                                       # with the fp32 grads still held
    train_step(cuda, optimizer, activations=9.0)
    assert peaks.last["between_steps"] == 53 * GIB
    # the fp32 grads were freed at zero_grad: they are not in the forward/backward's peak
    assert peaks.last["forward_backward"] == 49 * GIB
    assert optimizer.calls == ["zero_grad", "step"] * 2
    assert peaks.run == {"forward_backward": 49 * GIB, "optimizer_step": 52 * GIB,
                         "between_steps": 53 * GIB}
    assert peaks.peak_allocated() == 53 * GIB
    # torch's counter now covers only the phase under way; the run's peak is kept
    assert cuda.max_memory_allocated() == 50 * GIB
    assert peaks.peak_reserved() == 53 * GIB


def test_the_phase_under_way_counts_in_the_run_peak():
    cuda = FakeCuda(allocated=10 * GIB)
    optimizer = FakeOptimizer(cuda, fp32_grads=1.0, temporary=0.0)
    peaks = PhasePeaks(cuda)
    peaks.wrap(optimizer)
    train_step(cuda, optimizer, activations=2.0)
    cuda.alloc(30.0)                                 # after the last step, before finish()
    assert peaks.peak_allocated() == 41 * GIB


def test_a_step_that_raises_still_closes_its_phase():
    cuda = FakeCuda(allocated=10 * GIB)
    peaks = PhasePeaks(cuda)

    class Failing(FakeOptimizer):
        def step(self):
            self.cuda.alloc(4.0)
            raise RuntimeError("out of memory")

    optimizer = Failing(cuda, fp32_grads=0.0, temporary=0.0)
    peaks.wrap(optimizer)
    optimizer.zero_grad()
    try:
        optimizer.step()
    except RuntimeError:
        pass
    assert peaks.last["optimizer_step"] == 14 * GIB
