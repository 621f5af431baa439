"""gpt-oss's tensors: Hugging Face's GptOssForCausalLM <-> our GPTModel, both ways, exactly.

Self-contained (one family's table, to join the per-family conversion package): functions of
state dicts, so a round trip is tested bit for bit, plus the copy into a built model (the parity
tests, whichever experts module the backend built) and an export to a Hugging Face folder.

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
The hub's gpt-oss checkpoints hold the experts in MXFP4 (…_blocks, …_scales): load them with
transformers (which dequantizes) and convert the model's state dict; this table is bf16/fp32.
Tested: tests/moe/test_gpt_oss_checkpoint.py (round trip bit for bit, forward equal) and
tests/moe/test_gpt_oss_parity.py (logits against Hugging Face's own forward).
"""
from __future__ import annotations

from pathlib import Path

import torch

HF_EMBEDDING, HF_NORM, HF_HEAD = "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"
EMBEDDING = "embedding.word_embeddings.weight"
FINAL_NORM = "decoder.final_layernorm.weight"
OUTPUT = "output_layer.weight"


class GptOssShapeError(ValueError):
    """A state dict whose tensors do not fit the shape given (message printed as is)."""


def _shape(config) -> tuple[int, int, int, int, int]:
    """(layers, heads, KV groups, head dim, hidden) from a GptOssConfig or a dict of it."""
    get = config.get if isinstance(config, dict) else lambda k, d=None: getattr(config, k, d)
    hidden, heads = get("hidden_size"), get("num_attention_heads")
    return (get("num_hidden_layers"), heads, get("num_key_value_heads"),
            get("head_dim") or hidden // heads, hidden)


def _qkv(q, k, v, groups: int):
    """Stack q, k, v (weights [rows, hidden] or biases [rows]) per KV group."""
    tail = q.shape[1:]
    parts = [t.reshape(groups, -1, *tail) for t in (q, k, v)]
    return torch.cat(parts, dim=1).reshape(-1, *tail)


def _unqkv(qkv, groups: int, per_group: int, head_dim: int):
    tail = qkv.shape[1:]
    grouped = qkv.reshape(groups, (per_group + 2) * head_dim, *tail)
    q, k, v = torch.split(grouped, [per_group * head_dim, head_dim, head_dim], dim=1)
    return (q.reshape(-1, *tail).contiguous(), k.reshape(-1, *tail).contiguous(),
            v.reshape(-1, *tail).contiguous())


def _deinterleave(t):
    """[..., 2F] gate/up interleaved -> [..., 2F] gate half then up half."""
    return torch.cat([t[..., 0::2], t[..., 1::2]], dim=-1)


def _interleave(t):
    gate, up = t.chunk(2, dim=-1)
    return torch.stack([gate, up], dim=-1).flatten(-2)


def hf_to_megatron(hf: dict, config) -> dict:
    """Hugging Face GptOss state dict -> our GPTModel's (the native backend's module names,
    experts as one [E, out, in] tensor per projection)."""
    layers, heads, groups, head_dim, _ = _shape(config)
    out = {EMBEDDING: hf[HF_EMBEDDING], FINAL_NORM: hf[HF_NORM], OUTPUT: hf[HF_HEAD]}
    for i in range(layers):
        src, dst = f"model.layers.{i}.", f"decoder.layers.{i}."
        attn, ours = src + "self_attn.", dst + "self_attention."
        for kind in ("weight", "bias"):
            out[f"{ours}linear_qkv.{kind}"] = _qkv(*(hf[f"{attn}{p}_proj.{kind}"] for p in "qkv"),
                                                   groups)
            out[f"{ours}linear_proj.{kind}"] = hf[f"{attn}o_proj.{kind}"]
        out[ours + "core_attention.softmax_offset"] = hf[attn + "sinks"]
        out[dst + "input_layernorm.weight"] = hf[src + "input_layernorm.weight"]
        out[dst + "pre_mlp_layernorm.weight"] = hf[src + "post_attention_layernorm.weight"]
        for kind in ("weight", "bias"):
            out[f"{dst}mlp.router.{kind}"] = hf[f"{src}mlp.router.{kind}"]
        experts = src + "mlp.experts."
        out[dst + "mlp.experts.linear_fc1.weight"] = _deinterleave(
            hf[experts + "gate_up_proj"]).transpose(1, 2).contiguous()
        out[dst + "mlp.experts.linear_fc1.bias"] = _deinterleave(hf[experts + "gate_up_proj_bias"])
        out[dst + "mlp.experts.linear_fc2.weight"] = hf[experts + "down_proj"].transpose(
            1, 2).contiguous()
        out[dst + "mlp.experts.linear_fc2.bias"] = hf[experts + "down_proj_bias"]
    _check_heads(out, config)
    return out


def megatron_to_hf(ours: dict, config) -> dict:
    """Our GPTModel's state dict (hf_to_megatron's names) -> Hugging Face GptOss's."""
    layers, heads, groups, head_dim, _ = _shape(config)
    _check_heads(ours, config)
    out = {HF_EMBEDDING: ours[EMBEDDING], HF_NORM: ours[FINAL_NORM], HF_HEAD: ours[OUTPUT]}
    for i in range(layers):
        src, dst = f"decoder.layers.{i}.", f"model.layers.{i}."
        attn, theirs = src + "self_attention.", dst + "self_attn."
        for kind in ("weight", "bias"):
            q, k, v = _unqkv(ours[f"{attn}linear_qkv.{kind}"], groups, heads // groups, head_dim)
            out.update({f"{theirs}q_proj.{kind}": q, f"{theirs}k_proj.{kind}": k,
                        f"{theirs}v_proj.{kind}": v,
                        f"{theirs}o_proj.{kind}": ours[f"{attn}linear_proj.{kind}"]})
        out[theirs + "sinks"] = ours[attn + "core_attention.softmax_offset"]
        out[dst + "input_layernorm.weight"] = ours[src + "input_layernorm.weight"]
        out[dst + "post_attention_layernorm.weight"] = ours[src + "pre_mlp_layernorm.weight"]
        for kind in ("weight", "bias"):
            out[f"{dst}mlp.router.{kind}"] = ours[f"{src}mlp.router.{kind}"]
        experts = dst + "mlp.experts."
        out[experts + "gate_up_proj"] = _interleave(
            ours[src + "mlp.experts.linear_fc1.weight"].transpose(1, 2)).contiguous()
        out[experts + "gate_up_proj_bias"] = _interleave(ours[src + "mlp.experts.linear_fc1.bias"])
        out[experts + "down_proj"] = ours[src + "mlp.experts.linear_fc2.weight"].transpose(
            1, 2).contiguous()
        out[experts + "down_proj_bias"] = ours[src + "mlp.experts.linear_fc2.bias"]
    return out


def _check_heads(ours: dict, config) -> None:
    layers, heads, groups, head_dim, hidden = _shape(config)
    want = ((heads + 2 * groups) * head_dim, hidden)
    got = tuple(ours["decoder.layers.0.self_attention.linear_qkv.weight"].shape)
    if got != want:
        raise GptOssShapeError(f"linear_qkv is {got}, the config's heads ({heads} / {groups} "
                               f"groups of {head_dim}) and hidden {hidden} make {want}")


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
