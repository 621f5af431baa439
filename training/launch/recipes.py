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


# Where each recipe's hardware rule comes from (Transformer Engine decides at run time; these
# are its rules, read from its code and docs, so a launch is refused before any GPU work).
TE_NVIDIA = ("NVIDIA Transformer Engine, transformer_engine/pytorch/quantization.py "
             "(github.com/NVIDIA/TransformerEngine@d0067d0, 2.20.0.dev0)")
TE_ROCM = ("ROCm Transformer Engine, transformer_engine/pytorch/quantization.py "
           "(github.com/ROCm/TransformerEngine@030b792)")


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
    # the rule on each vendor and the function of TE_NVIDIA / TE_ROCM that states it
    nvidia: str = "any GPU Megatron runs on"
    amd: str = "any GPU Megatron runs on"

    def supports(self, sm: int | None, gfx: int | None) -> bool:
        if self.kind == "bf16":
            return True
        if sm is not None:
            return self.min_sm is not None and sm >= self.min_sm
        if gfx is not None:
            return self.min_gfx is not None and gfx >= self.min_gfx
        return False

    @property
    def megatron_recipe(self) -> tuple[str, str] | None:
        """(Megatron's flag, its value) that selects this recipe, e.g. ('--fp8-recipe', 'blockwise')."""
        if self.fp8_recipe:
            return "--fp8-recipe", self.fp8_recipe
        if self.fp4_recipe:
            return "--fp4-recipe", self.fp4_recipe
        return None


RECIPES: dict[str, Recipe] = {r.name: r for r in (
    Recipe("bf16", "bf16"),
    # Delayed scaling: the classic TE fp8 recipe, amax history over 1024 steps.
    Recipe("fp8", "fp8", fp8_recipe="delayed", fp8_format="hybrid",
           extra=("--fp8-amax-history-len", "1024", "--fp8-amax-compute-algo", "max"),
           min_sm=89, min_gfx=942,
           nvidia="sm89+ (Ada, Hopper, Blackwell); _compute_fp8_support",
           amd="gfx942, gfx950; check_fp8_support"),
    Recipe("fp8_tensorwise", "fp8", fp8_recipe="tensorwise", fp8_format="hybrid",
           min_sm=89, min_gfx=942,
           nvidia="sm89+ (Float8CurrentScaling, as fp8); _compute_fp8_support",
           amd="gfx942, gfx950; check_fp8_support"),
    # Block scaling (DeepSeek-V3's): 1x128 blocks for activations and gradients, 128x128 for
    # weights, e4m3 throughout (TE's default for this recipe).
    Recipe("fp8_blockwise", "fp8", fp8_recipe="blockwise", fp8_format="e4m3",
           min_sm=90, min_gfx=None,
           nvidia=("sm90+ with CUDA >= 12.9 (Hopper; Blackwell emulates it with MXFP8); "
                   "_compute_fp8_block_scaling_support and TE's docs, FP8 Blockwise Scaling, "
                   "'Supported devices'"),
           amd=("none ('FP8 block scaled gemm not yet supported for ROCm'); "
                "check_fp8_block_scaling_support")),
    # MXFP8 uses e4m3 for every tensor: hybrid (e5m2 gradients) with mxfp8 is known to diverge.
    Recipe("mxfp8", "fp8", fp8_recipe="mxfp8", fp8_format="e4m3", min_sm=100, min_gfx=950,
           nvidia="sm100 (Blackwell data centre); _compute_mxfp8_support",
           amd="gfx950 with NVTE_ROCM_ENABLE_MXFP8 set; check_mxfp8_support"),
    # MLPerf mxfp4 recipe: every layer in fp4.
    Recipe("mxfp4", "fp4", fp4_recipe="mxfp4", selective_bf16=False, min_sm=None, min_gfx=950,
           nvidia="none ('Only ROCm gfx950 supports MXFP4', ROCm TE's check_mxfp4_support)",
           amd="gfx950 (AITER's a4w4 GEMMs); check_mxfp4_support"),
    # NVFP4 paper recipe: first and last layers stay bf16.
    Recipe("nvfp4", "fp4", fp4_recipe="nvfp4", selective_bf16=True, min_sm=100, min_gfx=None,
           nvidia="sm100+ (Blackwell); _compute_nvfp4_support",
           amd=("not enabled here: check_nvfp4_support accepts gfx942/gfx950, unchecked "
                "against the MI355X image's Transformer Engine")),
)}

_TE_FP8_RECIPES = {"delayed": "fp8", "tensorwise": "fp8_tensorwise", "blockwise": "fp8_blockwise",
                   "mxfp8": "mxfp8"}


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


def precision_of(fp8_recipe: str | None, fp4_recipe: str | None) -> str:
    """The PRECISION whose Megatron flags select these recipes (the run side names its run by
    it); a recipe no entry selects keeps Megatron's name."""
    for recipe in RECIPES.values():
        if (recipe.fp8_recipe, recipe.fp4_recipe) == (fp8_recipe, fp4_recipe):
            return recipe.name
    return fp4_recipe or fp8_recipe or "bf16"


def hardware_rule(recipe: Recipe) -> str:
    """Which GPUs run the recipe, per vendor, with where the rule comes from."""
    return (f"NVIDIA: {recipe.nvidia} ({TE_NVIDIA}). AMD: {recipe.amd} ({TE_ROCM}).")
