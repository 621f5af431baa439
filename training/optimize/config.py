"""The run the advisor reasons about: the launcher's run description, read from the manifest.

Everything was decided by the launcher (training/launch/) and written to the manifest as the
sections of training.run_description.RunDescription; nothing is re-decided. A lever names the
toggles it sets, and the run it leads to is the same description with those toggles
(`run.with_values(TP=2)`): the advisor speaks the registry's names throughout. What only the
advisor asks of a run (the GPU's memory, whether the fused linear cross-entropy runs, ...)
is below.
"""
from __future__ import annotations

from typing import Any

from training.platforms import PLATFORMS, platform_for_device_name
from training.run_description import RunDescription

from .inputs import BadInput

BACKENDS = ("native", "local", "transformer_engine")


def platform_of(manifest: dict, override: str | None) -> tuple[str | None, str]:
    """(training.platforms key or None, where it came from)."""
    if override:
        if override not in PLATFORMS:
            raise BadInput(f"--platform {override!r}: use one of {', '.join(PLATFORMS)}")
        return override, f"--platform {override}"
    caps = manifest.get("capabilities") or {}
    if caps.get("platform") in PLATFORMS:
        return caps["platform"], f"manifest capabilities.platform ({caps.get('source')})"
    device = ((manifest.get("run") or {}).get("versions") or {}).get("device")
    if device:
        found = platform_for_device_name(device)
        if found:
            return found.name, f"manifest run.versions.device ({device})"
    return None, "unknown (no GPU in the manifest: pass --platform, e.g. --platform h200)"


def _presets():
    """The launcher's preset tables, with the families that plug in from above registered."""
    import training.moe.presets  # noqa: F401 - registers the MoE presets and entry scripts
    from training.launch import presets

    return presets


def _preset_layers(name: str) -> int | None:
    preset = _presets().PRESETS.get(name)
    return preset.num_layers if preset else None


def from_manifest(manifest: dict, platform: str | None = None) -> RunDescription:
    """The manifest's run description, on the platform the advisor should assume."""
    try:
        run = RunDescription.from_dict(manifest)
    except (KeyError, TypeError, ValueError) as err:
        raise BadInput(f"the manifest lacks a field the advisor needs ({err}); "
                       "regenerate it with the launcher") from None
    if run.backend not in BACKENDS:
        raise BadInput(f"the manifest's backend {run.backend!r} is not resolved "
                       "(native, local or transformer_engine expected)")
    if run.model.preset_layers is None:  # a manifest written before the model recorded it
        run = _with_preset_layers(run, _preset_layers(run.model.name) or run.model.num_layers)
    return run.with_platform(platform_of(manifest, platform)[0])


def _with_preset_layers(run: RunDescription, layers: int) -> RunDescription:
    import dataclasses

    return dataclasses.replace(run, model=dataclasses.replace(run.model, preset_layers=layers))


# -- what the advisor asks of a run ---------------------------------------------------------------

def device_gib(run: RunDescription) -> float | None:
    """The GPU's memory, from the platform table; None when the platform is unknown."""
    info = PLATFORMS.get(run.platform) if run.platform else None
    return float(info.memory_gib) if info else None


def flce(run: RunDescription) -> bool:
    """A fused linear cross-entropy runs (never materialises logits): toggles.fused_linear_ce,
    the training script's rule."""
    return _fused_linear_ce(run)[0] is not None


def flce_reason(run: RunDescription) -> str:
    """Why the run's cross-entropy is the one it is (toggles.fused_linear_ce)."""
    return _fused_linear_ce(run)[1]


def _fused_linear_ce(run: RunDescription) -> tuple[str | None, str]:
    from training.launch.toggles import fused_linear_ce

    return fused_linear_ce(run.backend, bool(run["CROSS_ENTROPY_LOSS_FUSION"]), run.layout.tp,
                           run.layout.cp, run.kernels)


def fused_adam(run: RunDescription) -> bool:
    """Megatron's optimizer is a fused Adam: TE's or apex's, or the native backend's
    torch AdamW(fused=True) or MixedPrecisionAdamW. Otherwise torch's multi-tensor AdamW
    runs."""
    caps = run.capabilities
    return (run.backend == "native" or bool(caps.get("transformer_engine"))
            or bool(caps.get("apex_fused_wgrad")))


def optimizer_state(run: RunDescription) -> tuple[str, str, bool, float]:
    """(ADAM_MOMENTS_DTYPE, MASTER_WEIGHTS, OPTIMIZER_CPU_OFFLOAD, OPTIMIZER_OFFLOAD_FRACTION);
    a manifest older than these toggles ran Megatron's fp32 state."""
    return (str(run.get("ADAM_MOMENTS_DTYPE") or "fp32"), str(run.get("MASTER_WEIGHTS") or "fp32"),
            bool(run.get("OPTIMIZER_CPU_OFFLOAD")),
            float(run.get("OPTIMIZER_OFFLOAD_FRACTION") or 1.0))


def precision_aware(run: RunDescription) -> bool:
    """Megatron's precision-aware optimizer runs (training/launch/optimizer_state.py)."""
    moments, master, offload, _ = optimizer_state(run)
    return moments != "fp32" or master != "fp32" or offload


def available(run: RunDescription, library: str) -> bool:
    """Whether the launcher found a library on the run's node (capabilities: transformer_engine,
    apex_fused_wgrad, liger)."""
    return bool(run.capabilities.get(library))


def script(run: RunDescription) -> str:
    return _presets().SCRIPTS.get(run.family, f"examples/*/train_{run.family}.sh")


def shape_key(run: RunDescription) -> dict[str, Any]:
    """The run's shape in the levers.json `shape` vocabulary."""
    m, lay = run.model, run.layout
    return {"model": m.name, "num_layers": m.num_layers, "seq_length": m.seq_length,
            "mbs": lay.mbs, "global_batch": lay.global_batch, "gpus": lay.world_size,
            "tp": lay.tp, "pp": lay.pp, "dp": lay.dp, "precision": run.precision,
            "backend": run.backend}
