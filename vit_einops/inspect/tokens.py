"""What the study tools read the tokens by: the :class:`~vit_einops.network.patch_embed.TokenLayout` of the input (its prefix
tokens by name, then the patches of its grid), from ``recorder.layout`` or ``model.patch_embed.layout(image_size)``.
No tool assumes that token 0 is a class token or that the grid is the config's."""

from __future__ import annotations

from typing import Any

from ..network.patch_embed import ClassToken, TokenLayout

CLASS_TOKEN = ClassToken.NAME


def check_layout(layout: Any, tokens: int | None = None) -> TokenLayout:
    """``layout`` if it is a TokenLayout (of ``tokens`` tokens, when given); a TypeError or ValueError otherwise."""
    if not isinstance(layout, TokenLayout):
        raise TypeError(
            "layout must be the TokenLayout of the recorded input (recorder.layout, "
            f"model.patch_embed.layout(image_size)), got {type(layout).__name__} {layout!r:.60}"
        )
    if tokens is not None:
        layout.check(tokens)
    return layout
