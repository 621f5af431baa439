"""gpt-oss's tensors: Hugging Face's GptOssForCausalLM <-> our GPTModel, both ways, exactly.

One conversion table (`table`), both directions, in the row model of the other families
(training/checkpoint/layout.py: every row of one of our tensors is one row of one Hugging Face
tensor; layout.table_to_megatron and table_to_hf apply a table to state dicts either way). The
experts, which Hugging Face multiplies as x @ W with gate and up interleaved, are read through
VIEWS: per tensor, the steps (each an invertible rearrangement, Step) that turn the stored
tensor into the rows the table reads; the way back and the stored shape follow from them. Beside the table: the copy into a built model (the parity tests,
whichever experts module the backend built) and an export to a Hugging Face folder.

Where the layouts differ (per layer; Megatron's names are the native/local spec's modules):
  linear_qkv      q_proj, k_proj, v_proj (weights and biases) stacked per KV group:
                  [q heads of group g, k_g, v_g] rows, gpt-oss's head dim 64 apart from hidden/heads
  linear_proj     o_proj (weight, bias)
  sinks           self_attn.sinks [heads] -> self_attention.core_attention.softmax_offset (the
                  name Megatron's and TE's attentions give the learnable softmax offset)
  norms           input_layernorm, post_attention_layernorm -> pre_mlp_layernorm
  router          mlp.router.weight / bias -> mlp.router.weight / bias (same layout)
  experts fc1     mlp.experts.gate_up_proj [E, hidden, 2F], gate and up INTERLEAVED in its
                  columns (gate = [..., 0::2], up = [..., 1::2]) -> linear_fc1 [E, 2F, hidden],
                  gate rows then up rows (Megatron's GLU chunks halves); its bias the same way
  experts fc2     mlp.experts.down_proj [E, F, hidden] (x @ W) -> linear_fc2 [E, hidden, F]
                  (W x); down_proj_bias [E, hidden] as it is
This table is bf16/fp32. The CLI (`python -m training.checkpoint import/export`) converts
folders with it one layer at a time (gpt_oss_files.py), and dequantizes the hub's MXFP4 experts
(…_blocks, …_scales) on import; exports are bf16/fp32, never re-quantized to MXFP4.
Tested: tests/moe/test_gpt_oss_checkpoint.py (round trip bit for bit, forward equal),
tests/moe/test_gpt_oss_import.py (the CLI's folders, MXFP4) and tests/moe/test_gpt_oss_parity.py
(logits against Hugging Face's own forward).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from . import layout
from .layout import EMBEDDING, FINAL_NORM, HF_EMBEDDING, HF_HEAD, HF_NORM, OUTPUT, Block


class GptOssShapeError(ValueError):
    """A state dict whose tensors do not fit the shape given (message printed as is)."""


def _shape(config) -> dict:
    """The table's sizes from a GptOssConfig or a dict of it."""
    get = config.get if isinstance(config, dict) else lambda k, d=None: getattr(config, k, d)
    hidden, heads = get("hidden_size"), get("num_attention_heads")
    return {"layers": get("num_hidden_layers"), "heads": heads,
            "groups": get("num_key_value_heads"), "head_dim": get("head_dim") or hidden // heads,
            "hidden": hidden, "experts": get("num_local_experts"),
            "ffn": get("intermediate_size"), "vocab": get("vocab_size")}


@dataclass(frozen=True)
class Step:
    """One rearrangement of a stored tensor into the rows the table reads: `read` turns the
    stored tensor into them, `write` is its inverse, `shape` the stored shape -> the read one
    (and, the steps here being their own shape's inverse, back)."""
    read: Callable
    write: Callable
    shape: Callable


def _halves(t):
    """[..., 2F] gate/up interleaved -> [..., 2F] gate half then up half."""
    return torch.cat([t[..., 0::2], t[..., 1::2]], dim=-1)


def _pairs(t):
    gate, up = t.chunk(2, dim=-1)
    return torch.stack([gate, up], dim=-1).flatten(-2)


# gate and up interleaved in the last axis (Hugging Face) <-> gate half then up half (Megatron's
# GLU chunks halves); x @ W ([E, in, out]) <-> W x ([E, out, in])
DEINTERLEAVE = Step(_halves, _pairs, lambda shape: tuple(shape))
TRANSPOSE = Step(lambda t: t.transpose(1, 2), lambda t: t.transpose(1, 2),
                 lambda shape: (shape[0], shape[2], shape[1], *shape[3:]))

# Hugging Face tensors the table reads in another form than stored, by name suffix: the steps
# from stored to read, in order; the way back is the same steps inverted, in reverse.
VIEWS = {
    "mlp.experts.gate_up_proj": (DEINTERLEAVE, TRANSPOSE),
    "mlp.experts.gate_up_proj_bias": (DEINTERLEAVE,),
    "mlp.experts.down_proj": (TRANSPOSE,),
}


def _steps(name: str) -> tuple[Step, ...]:
    return next((steps for suffix, steps in VIEWS.items() if name.endswith(suffix)), ())


def _view(name: str, tensor, way: int):
    """`name`'s tensor as stored -> as the table reads it (way 0), or back (way 1)."""
    steps = _steps(name)
    if not steps:
        return tensor
    for step in (steps if way == 0 else reversed(steps)):
        tensor = step.read(tensor) if way == 0 else step.write(tensor)
    return tensor.contiguous()


def stored_shape(name: str, read_shape: tuple) -> tuple:
    """The shape `name` has as stored, from the shape the table reads (its steps' shapes back,
    in reverse)."""
    for step in reversed(_steps(name)):
        read_shape = step.shape(read_shape)
    return tuple(read_shape)


def table(config) -> list[tuple[str, tuple, tuple, dict]]:
    """gpt-oss's conversion table, both directions: (our key, its shape, its rows as blocks of
    Hugging Face tensors, those tensors' shapes as the table reads them), layout's row model."""
    n = _shape(config)
    h, hd, heads, groups = n["hidden"], n["head_dim"], n["heads"], n["groups"]
    e, f = n["experts"], n["ffn"]
    q_rows, kv_rows = heads * hd, groups * hd

    def whole(ours: str, theirs: str, shape: tuple) -> tuple:
        return ours, shape, (Block(theirs, 0, layout.flat_rows(shape)),), {theirs: shape}

    rows = [whole(EMBEDDING, HF_EMBEDDING, (n["vocab"], h))]
    for i in range(n["layers"]):
        src, dst = f"model.layers.{i}.", f"decoder.layers.{i}."
        attn, ours = src + "self_attn.", dst + "self_attention."
        for kind, tail in (("weight", (h,)), ("bias", ())):
            names = [f"{attn}{p}_proj.{kind}" for p in "qkv"]
            rows.append((f"{ours}linear_qkv.{kind}", (q_rows + 2 * kv_rows, *tail),
                         layout.qkv_blocks(*names, groups, heads // groups, hd),
                         dict(zip(names, [(q_rows, *tail), (kv_rows, *tail), (kv_rows, *tail)]))))
        rows += [whole(f"{ours}linear_proj.weight", f"{attn}o_proj.weight", (h, q_rows)),
                 whole(f"{ours}linear_proj.bias", f"{attn}o_proj.bias", (h,)),
                 whole(f"{ours}core_attention.softmax_offset", f"{attn}sinks", (heads,)),
                 whole(f"{dst}input_layernorm.weight", f"{src}input_layernorm.weight", (h,)),
                 whole(f"{dst}pre_mlp_layernorm.weight", f"{src}post_attention_layernorm.weight",
                       (h,)),
                 whole(f"{dst}mlp.router.weight", f"{src}mlp.router.weight", (e, h)),
                 whole(f"{dst}mlp.router.bias", f"{src}mlp.router.bias", (e,))]
        experts, mine = src + "mlp.experts.", dst + "mlp.experts."
        rows += [whole(f"{mine}linear_fc1.weight", f"{experts}gate_up_proj", (e, 2 * f, h)),
                 whole(f"{mine}linear_fc1.bias", f"{experts}gate_up_proj_bias", (e, 2 * f)),
                 whole(f"{mine}linear_fc2.weight", f"{experts}down_proj", (e, h, f)),
                 whole(f"{mine}linear_fc2.bias", f"{experts}down_proj_bias", (e, h))]
    rows += [whole(FINAL_NORM, HF_NORM, (h,)), whole(OUTPUT, HF_HEAD, (n["vocab"], h))]
    return rows


def _refuse_misfit(what: str, got: tuple, want: tuple, config) -> None:
    if tuple(got) != tuple(want):
        n = _shape(config)
        raise GptOssShapeError(f"{what} {tuple(got)}, the config's heads ({n['heads']} / "
                               f"{n['groups']} groups of {n['head_dim']}), hidden {n['hidden']}, "
                               f"experts {n['experts']} of {n['ffn']} make {tuple(want)}")


def hf_to_megatron(hf: dict, config) -> dict:
    """Hugging Face GptOss state dict -> our GPTModel's (the native backend's module names,
    experts as one [E, out, in] tensor per projection)."""
    rows = table(config)
    seen = {}
    for key, _shape_, _blocks, reads in rows:
        for name, want in reads.items():
            seen[name] = _view(name, hf[name], 0)
            _refuse_misfit(f"{key.split('.')[-2]} is built from {name}, of shape",
                           seen[name].shape, want, config)
    return layout.table_to_megatron(rows, seen)


def megatron_to_hf(ours: dict, config) -> dict:
    """Our GPTModel's state dict (hf_to_megatron's names) -> Hugging Face GptOss's."""
    rows = table(config)
    for key, shape, _blocks, _reads in rows:
        _refuse_misfit(f"{key.split('.')[-2]} is", ours[key].shape, shape, config)
    return {name: _view(name, t, 1) for name, t in layout.table_to_hf(rows, ours).items()}


# -- into and out of a built model -----------------------------------------------------------

def _experts_tensors(experts, name: str, kind: str) -> list[torch.Tensor]:
    """Each local expert's `kind` (weight | bias) of projection `name`, as views to copy into,
    for the experts modules Megatron can build (native grouped, TE grouped, SequentialMLP)."""
    if hasattr(experts, "local_experts"):                                   # SequentialMLP
        return [getattr(getattr(e, name), kind) for e in experts.local_experts]
    linear = getattr(experts, name)
    tensor = getattr(linear, kind, None)
    if tensor is not None and tensor.dim() == (3 if kind == "weight" else 2):   # native
        return list(tensor.unbind(0))
    return [getattr(linear, f"{kind}{i}") for i in range(linear.num_gemms)]  # TE grouped


# Transformer Engine's spec fuses the attention's input norm into linear_qkv
TE_NAMES = {"input_layernorm.weight": "self_attention.linear_qkv.layer_norm_weight"}


def _te_name(key: str, params: dict) -> str:
    """The TE spec's name of a native-spec key, where the model has that one instead."""
    for native, te in TE_NAMES.items():
        if key.endswith(native) and key not in params:
            return key[: -len(native)] + te
    return key


@torch.no_grad()
def copy_into(gpt_model, ours: dict) -> None:
    """Copy hf_to_megatron's tensors into a built GPTModel (any experts module, the native or
    the TE spec's names); every tensor of the table lands somewhere, and every parameter of
    the model gets one."""
    params = dict(gpt_model.named_parameters())
    done = set()
    for key, value in ours.items():
        key = _te_name(key, params)
        if ".mlp.experts." in key:
            layer = int(key.split(".")[2])
            name, kind = key.rsplit(".", 2)[-2:]
            experts = gpt_model.decoder.layers[layer].mlp.experts
            for target, source in zip(_experts_tensors(experts, name, kind), value):
                target.copy_(source)
            done.update(n for n in params if n.startswith(f"decoder.layers.{layer}.mlp.experts.")
                        and f".{name}.{kind}" in n)
            continue
        if key not in params:
            raise GptOssShapeError(f"the model has no parameter {key}")
        params[key].copy_(value)
        done.add(key)
    missing = sorted(set(params) - done)
    if missing:
        raise GptOssShapeError(f"no tensor for {len(missing)} parameter(s): {missing[:4]}")


def copy_hf_gpt_oss_weights(hf_model, gpt_model) -> None:
    """A Hugging Face GptOssForCausalLM's weights into our GPTModel."""
    copy_into(gpt_model, hf_to_megatron(hf_model.state_dict(), hf_model.config))


def native_state(gpt_model) -> dict:
    """Our model's tensors under hf_to_megatron's names (the native grouped experts as
    built; others stacked into [E, out, in])."""
    state = {}
    te_to_native = {te: native for native, te in TE_NAMES.items()}
    for name, param in gpt_model.named_parameters():
        if ".mlp.experts." not in name:
            for te, native in te_to_native.items():
                if name.endswith(te):
                    name = name[: -len(te)] + native
            state[name] = param.detach()
    for i, layer in enumerate(gpt_model.decoder.layers):
        for name in ("linear_fc1", "linear_fc2"):
            for kind in ("weight", "bias"):
                state[f"decoder.layers.{i}.mlp.experts.{name}.{kind}"] = torch.stack(
                    [t.detach() for t in _experts_tensors(layer.mlp.experts, name, kind)])
    return state


def export_hf(gpt_model, hf_config, folder: Path) -> Path:
    """Write our model as a Hugging Face GptOss folder (config.json, model.safetensors)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = megatron_to_hf(native_state(gpt_model), hf_config)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"),
              metadata={"format": "pt"})
    hf_config.save_pretrained(folder)
    return folder
