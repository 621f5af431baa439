"""Core attention with attention sinks and a sliding window, for the native backend (gpt-oss).

gpt-oss's attention differs from Llama's in two ways that torch's SDPA cannot express:

  sinks    a learnable logit per head that joins every query's softmax as one more column
           and is then dropped (its value is zero): p_j = exp(x_j) / (sum_i exp(x_i) + exp(s_h))
  window   every other layer sees only the last W keys (itself included): a banded causal mask

megatron-core 0.19.2 names them `softmax_type="learnable"` (the parameter `softmax_offset`, one
per head) and `window_size=(W - 1, 0)` with `window_attn_skip_freq` (which layers are banded:
`is_layer_window_attention`); TE's fused attention and Megatron's unfused local attention run
them, SDPA does not. Here they run through torch's flex attention: the band is a block mask
(blocks outside it are skipped), and the sinks are a correction of flex's output by its
log-sum-exp, which flex returns and differentiates through:

    out = flex_out * exp(lse) / (exp(lse) + exp(s)) = flex_out * sigmoid(lse - s)

(the sink column only enlarges the denominator, so the probabilities of the real keys are
flex's scaled by that factor). On the GPU flex runs compiled (its Triton kernel, forward and
backward); torch 2.11's flex has no backward on the CPU, where `sink_attention_reference` (the
scores in fp32, the sink column appended, softmax, the column dropped) runs instead whenever a
gradient is needed. The tests compare the two, forward and backward (tests/moe/
test_gpt_oss_attention.py), and the model against Hugging Face's GptOssForCausalLM.
"""
from __future__ import annotations

import functools
import warnings

import torch

IMPLS = ("auto", "flex", "reference")


def window_of(config, layer_number: int) -> int | None:
    """This layer's window in keys (the query's own included), or None for full attention:
    Megatron's window_size (left, right) and its own per-layer rule."""
    from megatron.core.transformer.utils import is_layer_window_attention

    window = getattr(config, "window_size", None)
    if not is_layer_window_attention(window, getattr(config, "window_attn_skip_freq", None),
                                     layer_number):
        return None
    left, right = window
    if right != 0 or left < 0:
        raise ValueError(f"window_size={tuple(window)}: the native attention runs causal "
                         "windows only, (W - 1, 0)")
    return left + 1


def needs_flex(config) -> bool:
    """Sinks or a window: what SDPAttention cannot run."""
    return (getattr(config, "softmax_type", "vanilla") != "vanilla"
            or getattr(config, "window_size", None) is not None)


def banded_causal_mask(seq: int, window: int | None, device) -> torch.Tensor:
    """[seq, seq] True where query i may see key j: j <= i, and i - j < window."""
    i = torch.arange(seq, device=device)[:, None]
    j = torch.arange(seq, device=device)[None, :]
    allowed = j <= i
    if window is not None:
        allowed = allowed & (i - j < window)
    return allowed


def _wide(t: torch.Tensor) -> torch.Tensor:
    """At least fp32 (fp64 stays fp64: the tests' exact checks)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def sink_attention_reference(q, k, v, sinks, window: int | None, scale: float):
    """The plain computation, in fp32. q [b, heads, s, d], k and v [b, groups, s, d], sinks
    [heads] (None: no sink column). Returns [b, heads, s, d] in q's dtype."""
    heads, groups = q.shape[1], k.shape[1]
    k = _wide(k.repeat_interleave(heads // groups, dim=1))
    v = _wide(v.repeat_interleave(heads // groups, dim=1))
    scores = (_wide(q) @ k.transpose(-1, -2)) * scale
    allowed = banded_causal_mask(q.shape[2], window, q.device)
    scores = scores.masked_fill(~allowed, float("-inf"))
    if sinks is not None:
        column = _wide(sinks).view(1, heads, 1, 1).expand(*scores.shape[:3], 1)
        probs = torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    return (probs @ v).to(q.dtype)


def apply_sinks(out, lse, sinks):
    """A softmax over the keys (out, its log-sum-exp lse [b, heads, s]) turned into one with a
    sink column per head: out * sigmoid(lse - s), in fp32. Differentiable in all three."""
    if sinks is None:
        return out
    factor = torch.sigmoid(_wide(lse) - _wide(sinks).view(1, -1, 1))
    return (_wide(out) * factor.unsqueeze(-1)).to(out.dtype)


# Training runs whole sequences: flex's main (Triton) kernel always. Under BACKEND AUTO torch
# 2.11 picks its decoding kernel for a query shorter than 128 tokens, whose lowering finds no
# config (NoValidChoicesError) when the query length x the query heads per group rounds past
# the block mask's 128-row blocks: e.g. a 96-token document alone with 2 heads per group
# (BLOCK_M = next_power_of_2(96 * 2) = 256 does not divide 128); issue 51's gpt-oss GPU run.
KERNEL_OPTIONS = {"BACKEND": "TRITON"}


@functools.lru_cache(maxsize=None)
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


@functools.lru_cache(maxsize=32)
def block_mask(seq: int, window: int | None, device: str):
    """Flex's block mask of the banded causal pattern (cached per shape: built once per run)."""
    from torch.nn.attention.flex_attention import create_block_mask

    if window is None:
        def mask(b, h, q_idx, kv_idx):
            return q_idx >= kv_idx
    else:
        def mask(b, h, q_idx, kv_idx):
            return (q_idx >= kv_idx) & (q_idx - kv_idx < window)
    return create_block_mask(mask, None, None, seq, seq, device=device)


def sink_attention_flex(q, k, v, sinks, window: int | None, scale: float):
    """flex attention with the block mask of this window, then the sink correction."""
    return flex_with_sinks(q, k, v, block_mask(q.shape[2], window, str(q.device)), sinks, scale)


def flex_with_sinks(q, k, v, mask, sinks, scale: float):
    """flex attention ([b, h, s, d]) under a block mask, then the sink correction (sinks None:
    none). Compiled on the GPU; eager elsewhere (forward only on the CPU in torch 2.11)."""
    from torch.nn.attention.flex_attention import AuxRequest, flex_attention

    kwargs = dict(block_mask=mask, scale=scale, enable_gqa=k.shape[1] != q.shape[1],
                  return_aux=AuxRequest(lse=True))
    if q.is_cuda:
        out, aux = _compiled_flex()(q, k, v, kernel_options=KERNEL_OPTIONS, **kwargs)
    else:
        with warnings.catch_warnings():   # "flex_attention called without torch.compile()"
            warnings.simplefilter("ignore", UserWarning)
            out, aux = flex_attention(q, k, v, **kwargs)
    return apply_sinks(out, aux.lse, sinks)


def sink_attention(q, k, v, sinks, window: int | None, scale: float, impl: str = "auto"):
    """auto: flex where it runs (the GPU; the CPU without a gradient), the reference else."""
    if impl not in IMPLS:
        raise ValueError(f"unknown sink-attention implementation {impl!r}: use {IMPLS}")
    if impl == "auto":
        grad = torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (q, k, v, sinks))
        impl = "flex" if q.is_cuda or not grad else "reference"
    fn = sink_attention_flex if impl == "flex" else sink_attention_reference
    return fn(q, k, v, sinks, window, scale)


def _sdpa_attention():
    from training.native.attention import SDPAttention

    return SDPAttention


class FlexSinkAttention(_sdpa_attention()):
    """Megatron's core-attention slot (SDPAttention's checks: causal self-attention, no context
    parallelism) for a config with sinks (softmax_type learnable) and/or a window. The sinks are
    the parameter `softmax_offset` [heads], as Megatron's DotProductAttention and TE's attention
    name it, so checkpoints move between the backends. `impl` (IMPLS) is kept on the instance."""

    def __init__(self, config, layer_number: int, attn_mask_type, attention_type: str,
                 attention_dropout: float | None = None, softmax_scale: float | None = None,
                 cp_comm_type: str | None = None, pg_collection=None, impl: str = "auto"):
        import math

        super().__init__(config, layer_number, attn_mask_type, attention_type,
                         attention_dropout, softmax_scale, cp_comm_type, pg_collection)
        if self.dropout:
            raise ValueError(f"FlexSinkAttention has no attention dropout (got {self.dropout})")
        if config.softmax_type not in ("vanilla", "learnable"):
            raise ValueError(f"softmax_type={config.softmax_type!r}: the native attention runs "
                             "vanilla or learnable")
        tp = config.tensor_model_parallel_size
        self.heads = config.num_attention_heads // tp
        self.window = window_of(config, layer_number)
        self.softmax_scale = softmax_scale or 1.0 / math.sqrt(config.kv_channels)
        self.impl = impl
        self.softmax_offset = None
        if config.softmax_type == "learnable":
            device = "cpu" if config.use_cpu_initialization else torch.cuda.current_device()
            self.softmax_offset = torch.nn.Parameter(torch.empty(
                self.heads, device=device, dtype=config.params_dtype))
            if config.perform_initialization:
                config.init_method(self.softmax_offset)
            # tensor parallel: each rank holds its heads' sinks (Megatron's own attribute)
            self.softmax_offset.tensor_model_parallel = tp > 1
            self.softmax_offset.partition_dim = 0

    def forward(self, query, key, value, attention_mask=None, attn_mask_type=None,
                attention_bias=None, packed_seq_params=None):
        from training.native.attention import check_inputs

        check_inputs(type(self).__name__, attention_mask, attention_bias)
        if packed_seq_params is not None:   # documents kept apart: block-causal, same window
            return self.documents(query, key, value, packed_seq_params, window=self.window,
                                  sinks=self.softmax_offset)
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))   # [b, h, s, d]
        out = sink_attention(q, k, v, self.softmax_offset, self.window, self.softmax_scale,
                             self.impl)
        s, b = query.shape[0], query.shape[1]
        return out.permute(2, 0, 1, 3).reshape(s, b, -1)

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (),
                           metadata: dict | None = None):
        """The sinks as Megatron's attentions save them (heads along axis 0, split by TP)."""
        from megatron.core.parallel_state import get_tensor_model_parallel_group
        from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

        state = self.state_dict(prefix="", keep_vars=True) if self.softmax_offset is not None \
            else {}
        return make_sharded_tensors_for_checkpoint(
            state, prefix, {"softmax_offset": 0}, sharded_offsets,
            tp_group=get_tensor_model_parallel_group(),
            dp_cp_group=(metadata or {}).get("dp_cp_group"))

    def extra_repr(self) -> str:
        return (f"heads={self.heads}, window={self.window}, "
                f"sinks={self.softmax_offset is not None}, impl={self.impl}")


def core_attention_for(config):
    """The native backend's core attention for this config: SDPA, or flex for sinks/window."""
    return FlexSinkAttention if needs_flex(config) else _sdpa_attention()


def describe(config) -> str:
    if not needs_flex(config):
        return ""
    parts = []
    if config.softmax_type == "learnable":
        parts.append("a learnable sink per head")
    if config.window_size is not None:
        parts.append(f"a {config.window_size[0] + 1}-key window "
                     f"(window_attn_skip_freq={config.window_attn_skip_freq})")
    return ("torch flex attention (compiled on the GPU; the fp32 reference on the CPU in "
            "training) with " + " and ".join(parts))
