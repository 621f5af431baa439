"""AdamW with low-precision state for Megatron's precision-aware distributed optimizer.

Megatron 0.19.2's `--use-precision-aware-optimizer` hands the optimizer the bf16 parameter
shards themselves (views into the DDP parameter buffer), their gradients as `decoupled_grad`
(views into the gradient buffer: no fp32 copy), and leaves the master weights and the moments
to the optimizer. It is written for Transformer Engine's FusedAdam; this class speaks the same
interface (the constructor's keywords, `initialize_state`, `get_unscaled_state`,
`set_scaled_state`) for the native backend, where TE is not installed.

State per parameter element (bytes):

    moments        exp_avg + exp_avg_sq: 4 + 4 (fp32) or 2 + 2 (bf16, ADAM_MOMENTS_DTYPE=bf16)
    master weights MAIN_PARAMS=fp32: an fp32 copy (4)
                   MAIN_PARAMS=remainder: the low 16 bits of the fp32 master (2); the bf16
                     parameter holds the high 16, rounded to nearest, so the fp32 master is
                     rebuilt exactly at each step (TE's store_param_remainders, same scheme)
                   MAIN_PARAMS=stochastic: none (0); the bf16 parameter is the master and each
                     update is rounded to bf16 stochastically: unbiased, so updates far below
                     bf16's resolution still move the weights on average
    step           one float32 CPU scalar per parameter group, shared by its parameters (the
                   per-parameter 'step' Megatron's checkpoint code reads without TE/apex),
                   and the same count as the group's 'step' (where TE or apex imports,
                   Megatron's distributed optimizer saves and restores the step from the
                   param groups, where TE's FusedAdam keeps it)

Arithmetic is fp32 in registers: the state is loaded, converted, updated, and stored once per
step (moments rounded to nearest). Two implementations of the same update:

  - a Triton kernel (CUDA): one launch per parameter group and dtype combination over all its
    tensors, through tables of pointers and a block table (apex's multi-tensor-apply layout);
  - torch (CPU, and NATIVE_KERNELS=torch): foreach copies gather the tensors of a batch into one
    flat fp32 scratch (at most CHUNK elements), the update runs on the flat scratch, foreach
    copies scatter it back. The scratch bounds the step's extra memory (5 x 4 B x CHUNK).
"""
from __future__ import annotations

import math
from typing import Any

import torch

MAIN_PARAMS = ("fp32", "remainder", "stochastic")
MOMENT_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# Master-weight storage per mode, and its bytes per element.
MASTER_BYTES = {"fp32": 4, "remainder": 2, "stochastic": 0}

# The torch path's batch: at most this many elements gathered into one flat fp32 scratch.
CHUNK = 1 << 24
# The Triton kernel's elements per program.
BLOCK = 4096

# Kernel modes: how the parameter and its master are stored.
_FP32_PARAM, _FP32_MASTER, _REMAINDER, _STOCHASTIC = 0, 1, 2, 3
_MODE = {"fp32": _FP32_MASTER, "remainder": _REMAINDER, "stochastic": _STOCHASTIC}


def _dtype(value: Any) -> torch.dtype:
    if isinstance(value, torch.dtype):
        return value
    try:
        return MOMENT_DTYPES[str(value)]
    except KeyError:
        raise ValueError(f"unsupported state dtype {value!r}: use fp32 or bf16") from None


class MixedPrecisionAdamW(torch.optim.Optimizer):
    """Decoupled-weight-decay Adam (AdamW) with bf16 or fp32 moments and fp32, 16-bit-remainder
    or stochastically rounded bf16 master weights. Accepts the keywords Megatron passes to
    Transformer Engine's FusedAdam under --use-precision-aware-optimizer."""

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, adam_w_mode: bool = True,
                 bias_correction: bool = True, master_weights: bool = True,
                 master_weight_dtype=torch.float32, exp_avg_dtype=torch.float32,
                 exp_avg_sq_dtype=torch.float32, use_decoupled_grad: bool = False,
                 store_param_remainders: bool | None = None, capturable: bool = False,
                 *, main_params: str = "fp32", kernels: str = "auto", seed: int = 0):
        if not adam_w_mode:
            raise ValueError("MixedPrecisionAdamW implements decoupled weight decay (AdamW) only")
        if not bias_correction:
            raise ValueError("MixedPrecisionAdamW always applies Adam's bias correction")
        if capturable:
            raise ValueError("MixedPrecisionAdamW is not capturable (no CUDA-graphed step)")
        if _dtype(master_weight_dtype) != torch.float32:
            raise ValueError("master weights are fp32 (MAIN_PARAMS chooses how they are kept)")
        if main_params not in MAIN_PARAMS:
            raise ValueError(f"main_params={main_params!r}: use one of {', '.join(MAIN_PARAMS)}")
        if kernels not in ("auto", "triton", "torch"):
            raise ValueError(f"kernels={kernels!r}: use auto, triton or torch")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)
        super().__init__(params, defaults)
        self.exp_avg_dtype = _dtype(exp_avg_dtype)
        self.exp_avg_sq_dtype = _dtype(exp_avg_sq_dtype)
        self.master_weights = master_weights
        self.main_params = main_params
        self.use_decoupled_grad = use_decoupled_grad
        self.kernels = kernels
        self.seed = seed
        self._tables: dict[tuple, tuple] = {}

    # -- state ----------------------------------------------------------------------------------
    def _mode(self, p: torch.Tensor) -> int:
        if p.dtype == torch.float32:
            return _FP32_PARAM
        if p.dtype != torch.bfloat16:
            raise TypeError(f"MixedPrecisionAdamW takes bf16 or fp32 parameters, not {p.dtype}")
        if not self.master_weights:
            raise ValueError("bf16 parameters need master_weights=True (MAIN_PARAMS chooses "
                             "how the master is kept)")
        return _MODE[self.main_params]

    def _group_of(self, p: torch.Tensor) -> dict:
        return next(g for g in self.param_groups if any(q is p for q in g["params"]))

    def _step_tensor(self, group: dict) -> torch.Tensor:
        """The group's shared step counter (one tensor object in every parameter's state)."""
        for q in group["params"]:
            step = self.state[q].get("step") if q in self.state else None
            if step is not None:
                return step
        return torch.zeros((), dtype=torch.float32)

    def _empty_master(self, p: torch.Tensor) -> torch.Tensor:
        mode = self._mode(p)
        if mode == _FP32_MASTER:
            return p.detach().float()
        if mode == _REMAINDER:
            return torch.zeros(p.shape, dtype=torch.int16, device=p.device)
        return torch.empty(0, dtype=torch.float32, device=p.device)

    @torch.no_grad()
    def initialize_state(self, p: torch.Tensor, group: dict | None = None) -> None:
        """Zero moments, the master equal to the parameter, the group's step."""
        group = group or self._group_of(p)
        state = self.state[p]
        state["step"] = self._step_tensor(group)
        state["exp_avg"] = torch.zeros(p.shape, dtype=self.exp_avg_dtype, device=p.device)
        state["exp_avg_sq"] = torch.zeros(p.shape, dtype=self.exp_avg_sq_dtype, device=p.device)
        state["master_param"] = self._empty_master(p)

    @torch.no_grad()
    def get_unscaled_state(self, p: torch.Tensor, key: str) -> torch.Tensor:
        """A state tensor in fp32 (what Megatron's checkpoint code saves): the moments
        converted, the master rebuilt (fp32 copy, bf16 + remainder, or the bf16 parameter)."""
        state = self.state[p]
        if key == "master_param":
            return master_fp32(p, state["master_param"], self._mode(p))
        if key == "step":
            return state["step"]
        return state[key].float()

    @torch.no_grad()
    def set_scaled_state(self, p: torch.Tensor, key: str, value: torch.Tensor) -> None:
        """Store an fp32 state tensor (a checkpoint's): moments in their dtype; the master
        split into this mode's storage, and the bf16 parameter set from it."""
        if p not in self.state or "exp_avg" not in self.state[p]:
            self.initialize_state(p)
        state = self.state[p]
        value = value.to(device=p.device).view(p.shape)
        if key == "master_param":
            mode = self._mode(p)
            if mode == _FP32_PARAM:
                p.copy_(value)
            elif mode == _FP32_MASTER:
                state["master_param"].copy_(value)
                p.copy_(value)
            elif mode == _REMAINDER:
                high, low = split_fp32(value.float())
                p.view(torch.int16).copy_(high)
                state["master_param"].copy_(low)
            else:
                p.copy_(value)
            return
        state[key].copy_(value)

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's loader casts floating state to the parameter's dtype (an fp32 master or
        moment would become bf16, an int16 remainder bf16): keep the saved tensors and store
        them in this optimizer's dtypes instead. The parameters are not touched (Megatron loads
        them, then the master, through set_scaled_state)."""
        saved_ids = [pid for g in state_dict["param_groups"] for pid in g["params"]]
        saved = state_dict["state"]
        super().load_state_dict({**state_dict, "state": {}})
        params = [p for g in self.param_groups for p in g["params"]]
        steps: dict[int, torch.Tensor] = {}
        for pid, p in zip(saved_ids, params):
            values = saved.get(pid)
            if not values:
                continue
            group = self._group_of(p)
            key = id(group)
            if key not in steps:
                # the group's count first: where TE/apex imports, Megatron restores only that
                # one (the per-parameter step it passes is the fresh optimizer's zero); older
                # checkpoints of ours have the per-parameter one only
                step = group.get("step")
                if step is None:
                    step = values.get("step")
                steps[key] = (torch.tensor(float(step), dtype=torch.float32)
                              if step is not None else torch.zeros((), dtype=torch.float32))
            state = self.state[p]
            state["step"] = steps[key]
            state["exp_avg"] = values["exp_avg"].to(device=p.device, dtype=self.exp_avg_dtype)
            state["exp_avg_sq"] = values["exp_avg_sq"].to(device=p.device,
                                                          dtype=self.exp_avg_sq_dtype)
            master = values.get("master_param")
            state["master_param"] = self._adopt_master(p, master)

    def _adopt_master(self, p: torch.Tensor, master: torch.Tensor | None) -> torch.Tensor:
        mode = self._mode(p)
        if master is None or mode in (_FP32_PARAM, _STOCHASTIC):
            return self._empty_master(p)
        master = master.to(device=p.device)
        if mode == _FP32_MASTER:
            return master.float().view(p.shape).clone()
        if master.dtype == torch.int16:
            return master.view(p.shape).clone()
        return split_fp32(master.float().view(p.shape))[1]

    def state_bytes(self) -> int:
        """Bytes of every state tensor (moments and masters; the step scalars excluded)."""
        return sum(t.numel() * t.element_size() for s in self.state.values()
                   for k, t in s.items() if k != "step" and isinstance(t, torch.Tensor))

    # -- the step -------------------------------------------------------------------------------
    def _grad(self, p: torch.Tensor) -> torch.Tensor | None:
        return getattr(p, "decoupled_grad", None) if self.use_decoupled_grad else p.grad

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for index, group in enumerate(self.param_groups):
            live = [p for p in group["params"] if self._grad(p) is not None]
            if not live:
                continue
            for p in live:
                if p not in self.state or "exp_avg" not in self.state[p]:
                    self.initialize_state(p, group)
            step = self.state[live[0]]["step"]
            for p in live:  # one counter per group (a load may have made copies)
                self.state[p]["step"] = step
            step += 1
            t = float(step)
            group["step"] = int(t)   # where Megatron reads it when TE/apex imports
            beta1, beta2 = group["betas"]
            hyper = dict(lr=float(group["lr"]), beta1=beta1, beta2=beta2, eps=group["eps"],
                         wd=float(group["weight_decay"]), bc1=1 - beta1 ** t,
                         bc2_sqrt=math.sqrt(1 - beta2 ** t),
                         seed=(self.seed * 1_000_003 + int(t) * 7919 + index) % (2 ** 31))
            by_kind: dict[tuple, list] = {}
            for p in live:
                g = self._grad(p)
                if g.shape != p.shape:
                    g = g.view(p.shape)
                by_kind.setdefault((self._mode(p), p.dtype, g.dtype, p.device), []).append((p, g))
            for (mode, _, _, device), pairs in by_kind.items():
                ps = [p for p, _ in pairs]
                gs = [g for _, g in pairs]
                ms = [self.state[p]["exp_avg"] for p in ps]
                vs = [self.state[p]["exp_avg_sq"] for p in ps]
                xs = [self.state[p]["master_param"] for p in ps]
                if self._use_triton(device):
                    self._triton_update(ps, gs, ms, vs, xs, mode, hyper)
                else:
                    torch_update(ps, gs, ms, vs, xs, mode, hyper)
        return loss

    def _use_triton(self, device: torch.device) -> bool:
        if self.kernels == "torch":
            return False
        if device.type != "cuda":
            if self.kernels == "triton":
                raise RuntimeError("kernels='triton' needs CUDA tensors")
            return False
        return True

    def _triton_update(self, ps, gs, ms, vs, xs, mode: int, hyper: dict) -> None:
        from training.native.adamw_triton import launch

        key = tuple(t.data_ptr() for t in (*ps, *gs, *ms, *vs, *xs))
        tables = self._tables.get(key)
        if tables is None:  # built once per group (parameters and buffers do not move)
            if len(self._tables) >= 16:
                self._tables.clear()
            tables = self._tables[key] = pointer_tables(ps, gs, ms, vs, xs, BLOCK)
        launch(tables, mode, hyper, BLOCK)


# -- bit-level helpers (shared by the torch path, the tests and the checkpoint code) -------------

def split_fp32(value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 -> (high 16 bits rounded to nearest, as int16: the bf16 parameter's bits;
    the low 16 bits as a signed int16 remainder). Negative remainder: the high half was
    rounded up, so rebuilding subtracts one from it first."""
    bits = value.contiguous().view(torch.int32)
    low = (bits << 16) >> 16
    high = (bits >> 16) + (low < 0).to(torch.int32)
    return high.to(torch.int16), low.to(torch.int16)


def join_fp32(high: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
    """The fp32 value split_fp32 split (exactly)."""
    high32 = high.to(torch.int32)
    low32 = low.to(torch.int32)
    high32 = high32 - (low32 < 0).to(torch.int32)
    return ((high32 << 16) | (low32 & 0xFFFF)).view(torch.float32)


def master_fp32(p: torch.Tensor, stored: torch.Tensor, mode: int) -> torch.Tensor:
    if mode == _FP32_MASTER:
        return stored.float().clone()
    if mode == _REMAINDER:
        return join_fp32(p.contiguous().view(torch.int16), stored.view(p.shape))
    return p.float()


def stochastic_round_bf16(value: torch.Tensor, generator: torch.Generator | None = None
                          ) -> torch.Tensor:
    """fp32 -> bf16, rounding the magnitude up with probability equal to the part cut off."""
    bits = value.contiguous().view(torch.int32)
    noise = torch.randint(0, 1 << 16, bits.shape, dtype=torch.int32, device=bits.device,
                          generator=generator)
    return ((bits + noise) & -65536).view(torch.float32).to(torch.bfloat16)


# -- torch implementation -------------------------------------------------------------------------

def _batches(sizes: list[int], chunk: int):
    """(tensor index, start, length) pieces grouped so each batch holds at most `chunk`."""
    batch, total = [], 0
    for i, n in enumerate(sizes):
        for start in range(0, n, chunk):
            length = min(chunk, n - start)
            if total + length > chunk and batch:
                yield batch
                batch, total = [], 0
            batch.append((i, start, length))
            total += length
    if batch:
        yield batch


def _pieces(tensors, batch, view_dtype=None):
    out = []
    for i, start, length in batch:
        flat = tensors[i].view(-1)
        if view_dtype is not None:
            flat = flat.view(view_dtype)
        out.append(flat[start:start + length])
    return out


def torch_update(ps, gs, ms, vs, xs, mode: int, hyper: dict, chunk: int = CHUNK) -> None:
    """One AdamW step over the lists, in fp32 on flat scratch batches (see the module text)."""
    device = ps[0].device
    generator = None
    if mode == _STOCHASTIC:
        generator = torch.Generator(device=device).manual_seed(hyper["seed"])
    for batch in _batches([p.numel() for p in ps], chunk):
        sizes = [length for _, _, length in batch]
        total = sum(sizes)
        scratch = torch.empty((4, total), dtype=torch.float32, device=device)
        p32, g32, m32, v32 = scratch
        split = lambda flat: list(flat.split(sizes))  # noqa: E731
        torch._foreach_copy_(split(g32), _pieces(gs, batch))
        torch._foreach_copy_(split(m32), _pieces(ms, batch))
        torch._foreach_copy_(split(v32), _pieces(vs, batch))
        if mode == _REMAINDER:
            high = torch.empty(total, dtype=torch.int32, device=device)
            low = torch.empty(total, dtype=torch.int32, device=device)
            torch._foreach_copy_(split(high), _pieces(ps, batch, torch.int16))
            torch._foreach_copy_(split(low), _pieces(xs, batch))
            p32.view(torch.int32).copy_(join_fp32(high, low).view(torch.int32))
        elif mode == _FP32_MASTER:
            torch._foreach_copy_(split(p32), _pieces(xs, batch))
        else:
            torch._foreach_copy_(split(p32), _pieces(ps, batch))

        m32.lerp_(g32, 1 - hyper["beta1"])
        v32.mul_(hyper["beta2"]).addcmul_(g32, g32, value=1 - hyper["beta2"])
        denom = v32.sqrt().div_(hyper["bc2_sqrt"]).add_(hyper["eps"])
        p32.mul_(1 - hyper["lr"] * hyper["wd"]).addcdiv_(m32, denom,
                                                          value=-hyper["lr"] / hyper["bc1"])
        del denom

        torch._foreach_copy_(_pieces(ms, batch), split(m32))
        torch._foreach_copy_(_pieces(vs, batch), split(v32))
        if mode == _REMAINDER:
            high16, low16 = split_fp32(p32)
            torch._foreach_copy_(_pieces(ps, batch, torch.int16), split(high16))
            torch._foreach_copy_(_pieces(xs, batch), split(low16))
        elif mode == _STOCHASTIC:
            rounded = stochastic_round_bf16(p32, generator)
            torch._foreach_copy_(_pieces(ps, batch), split(rounded))
        else:
            if mode == _FP32_MASTER:
                torch._foreach_copy_(_pieces(xs, batch), split(p32))
            torch._foreach_copy_(_pieces(ps, batch), split(p32))


def pointer_tables(ps, gs, ms, vs, xs, block: int) -> dict:
    """The Triton kernel's tables: per operand a typed anchor tensor (its first non-empty one,
    the kernel's argument) and each tensor's place as an element offset from it; the element
    counts; and per program (block of `block` elements) its tensor and start. Empty tensors
    (the masters of modes that keep none) get offset 0 and are never read."""
    device = ps[0].device
    sizes = torch.tensor([p.numel() for p in ps], dtype=torch.int64)
    blocks = (sizes + block - 1) // block
    tensor_of_block = torch.repeat_interleave(torch.arange(len(ps), dtype=torch.int32), blocks)
    first = torch.cumsum(blocks, 0) - blocks
    start = (torch.arange(int(blocks.sum()), dtype=torch.int64)
             - torch.repeat_interleave(first, blocks)) * block

    def anchored(tensors, fallback):
        anchor = next((t for t in tensors if t.numel()), fallback)
        offsets = [(t.data_ptr() - anchor.data_ptr()) // t.element_size() if t.numel() else 0
                   for t in tensors]
        return anchor, torch.tensor(offsets, dtype=torch.int64)

    anchors, host = [], {}
    for name, tensors in (("p", ps), ("g", gs), ("m", ms), ("v", vs), ("x", xs)):
        anchor, host[name] = anchored(tensors, anchors[0] if anchors else ps[0])
        anchors.append(anchor)
    host.update(numel=sizes, block_tensor=tensor_of_block, block_start=start)
    tables = {k: v.to(device) for k, v in host.items()}
    tables["programs"] = int(blocks.sum())
    tables["aligned"] = aligned_for_vectors(ps, gs, ms, vs, xs, block=block)
    tables["anchors"] = tuple(anchors)   # the kernel's typed arguments
    return tables


def aligned_for_vectors(*lists, block: int) -> bool:
    """The kernel may treat its accesses as 16-byte vectors (training/native/adamw_triton.py,
    ALIGNED): every tensor starts on a 16-byte boundary, holds a multiple of 8 elements (a
    block's mask then never changes inside a vector) and blocks start at multiples of 16
    elements. Megatron's buffers align each parameter's start (to 64 elements with the
    distributed optimizer) and Llama's tensor sizes are multiples of 8; anything else (a
    DP shard of odd size) takes the element-wise accesses."""
    if block % 16:
        return False
    return all(t.data_ptr() % 16 == 0 and t.numel() % 8 == 0
               for tensors in lists for t in tensors if t.numel())
