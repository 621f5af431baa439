"""Precision recipes: PRECISION -> Megatron flags, selective-bf16 layers and the run-folder tag.

The recipe also fills the recipe-dependent defaults (FP8_FORMAT, FP4_SELECTIVE_BF16) with
source 'recipe', so the table shows which value came from the recipe. ROCm Megatron-LM's
spellings (TE_FP8/TE_FP8_RECIPE, TE_FP4/TE_FP4_RECIPE) resolve to the same PRECISION; a
disagreement between the two spellings is refused rather than guessed (the guards
fp8_and_fp4_together and precision_spelling_conflict).
"""
from __future__ import annotations

from dataclasses import dataclass

from .settings import Settings


@dataclass(frozen=True)
class Recipe:
    name: str                 # PRECISION value and run-folder tag
    kind: str                 # bf16 | fp8 | fp4
    fp8_recipe: str | None = None
    fp8_format: str | None = None         # default format
    fp4_recipe: str | None = None
    selective_bf16: bool | None = None    # default FP4_SELECTIVE_BF16
    extra: tuple[str, ...] = ()
    # hardware: minimum CUDA compute capability, minimum AMD gfx, as integers (None = never)
    min_sm: int | None = None
    min_gfx: int | None = None

    def supports(self, sm: int | None, gfx: int | None) -> bool:
        if self.kind == "bf16":
            return True
        if sm is not None:
            return self.min_sm is not None and sm >= self.min_sm
        if gfx is not None:
            return self.min_gfx is not None and gfx >= self.min_gfx
        return False


RECIPES: dict[str, Recipe] = {r.name: r for r in (
    Recipe("bf16", "bf16"),
    # Delayed scaling: the classic TE fp8 recipe, amax history over 1024 steps.
    Recipe("fp8", "fp8", fp8_recipe="delayed", fp8_format="hybrid",
           extra=("--fp8-amax-history-len", "1024", "--fp8-amax-compute-algo", "max"),
           min_sm=89, min_gfx=942),
    Recipe("fp8_tensorwise", "fp8", fp8_recipe="tensorwise", fp8_format="hybrid",
           min_sm=89, min_gfx=942),
    # MXFP8 uses e4m3 for every tensor: hybrid (e5m2 gradients) with mxfp8 is known to diverge.
    Recipe("mxfp8", "fp8", fp8_recipe="mxfp8", fp8_format="e4m3", min_sm=100, min_gfx=950),
    # MLPerf mxfp4 recipe: every layer in fp4.
    Recipe("mxfp4", "fp4", fp4_recipe="mxfp4", selective_bf16=False, min_sm=None, min_gfx=950),
    # NVFP4 paper recipe: first and last layers stay bf16.
    Recipe("nvfp4", "fp4", fp4_recipe="nvfp4", selective_bf16=True, min_sm=100, min_gfx=None),
)}

_TE_FP8_RECIPES = {"delayed": "fp8", "tensorwise": "fp8_tensorwise", "mxfp8": "mxfp8"}


def spelled_precision(settings: Settings) -> tuple[str | None, str | None]:
    """(the PRECISION that ROCm Megatron-LM's spelling names, how it was spelled), or
    (None, None) without TE_FP8=1/TE_FP4=1. Both switches on: fp8's (a guard refuses it)."""
    if settings.get("TE_FP8"):
        fp8_recipe = settings.get("TE_FP8_RECIPE") or "delayed"
        return _TE_FP8_RECIPES[fp8_recipe], f"TE_FP8=1 TE_FP8_RECIPE={fp8_recipe}"
    if settings.get("TE_FP4"):
        fp4_recipe = settings.get("TE_FP4_RECIPE") or "nvfp4"
        return fp4_recipe, f"TE_FP4=1 TE_FP4_RECIPE={fp4_recipe}"
    return None, None


def spelling_conflict(settings: Settings) -> str | None:
    """What a PRECISION that was given disagrees with in the TE_FP8/TE_FP4 spelling, if
    anything (the guard precision_spelling_conflict refuses it)."""
    if settings.setting("PRECISION").source == "default":
        return None
    precision = settings["PRECISION"]
    implied, spelling = spelled_precision(settings)
    te_fp8, te_fp4 = settings.get("TE_FP8"), settings.get("TE_FP4")
    if (implied is not None and implied != precision) or (
            (te_fp8 is False and RECIPES[precision].kind == "fp8")
            or (te_fp4 is False and RECIPES[precision].kind == "fp4")):
        return spelling or ("TE_FP8=0" if te_fp8 is False else "TE_FP4=0")
    return None


def derive_precision(settings: Settings) -> Recipe:
    """Settle PRECISION from either spelling (the guards refuse a disagreement); fill the
    recipe's defaults (source 'recipe')."""
    implied, spelling = spelled_precision(settings)
    if implied is not None and settings.setting("PRECISION").source == "default":
        settings.put("PRECISION", implied, "env", f"from {spelling}")
    recipe = RECIPES[settings["PRECISION"]]
    if recipe.fp8_format is not None:
        settings.put("FP8_FORMAT", recipe.fp8_format, "recipe", f"{recipe.name} recipe default")
    if recipe.selective_bf16 is not None:
        settings.put("FP4_SELECTIVE_BF16", recipe.selective_bf16, "recipe",
                     "mxfp4: every layer fp4 (MLPerf recipe)" if recipe.name == "mxfp4"
                     else "nvfp4: first/last layers bf16 (paper recipe)")
    return recipe


def recipe_args(recipe: Recipe, settings: Settings) -> list[str]:
    """GPT_ARGS words for the recipe."""
    args = ["--bf16"]
    if recipe.kind == "fp8":
        args += ["--fp8-format", settings["FP8_FORMAT"], "--fp8-recipe", recipe.fp8_recipe]
        args += list(recipe.extra)
    elif recipe.kind == "fp4":
        args += ["--fp4-format", "e2m1", "--fp4-recipe", recipe.fp4_recipe]
        if settings["FP4_SELECTIVE_BF16"]:
            args += ["--first-last-layers-bf16",
                     "--num-layers-at-start-in-bf16", str(settings["FP4_BF16_LAYERS_START"]),
                     "--num-layers-at-end-in-bf16", str(settings["FP4_BF16_LAYERS_END"])]
    return args


def platforms_supporting(recipe: Recipe) -> list[str]:
    from training.platforms import PLATFORMS

    return [name for name, p in PLATFORMS.items() if recipe.supports(p.sm, p.gfx)]
