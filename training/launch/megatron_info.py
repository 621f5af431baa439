"""What the installed Megatron offers, asked of Megatron itself (imported lazily: slow)."""
from __future__ import annotations

import functools


@functools.cache
def fp4_recipes() -> tuple[str, ...]:
    """The --fp4-recipe values the installed Megatron accepts."""
    from megatron.core.enums import Fp4Recipe

    return tuple(recipe.value for recipe in Fp4Recipe)
