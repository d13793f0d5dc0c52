"""What the embeddings learned: position-embedding similarity (Figure 7 centre) and the principal components
of the patch-embedding filters (Figure 7 left)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange

from ..base.budget import check_memory
from ..base.checks import check_grid, check_nonnegative_int, check_positive_int
from ..network.model import ViT
from ..network.patch_embed import conv_to_linear_weight


def position_similarity(pos_embed: torch.Tensor, grid: tuple[int, int], prefix_rows: int = 1) -> torch.Tensor:
    """Cosine similarity between the position embeddings of every pair of patches.

    Args:
        pos_embed: E_pos, (1, N, D) or (N, D); its first ``prefix_rows`` rows belong to the prefix tokens and are
            dropped: 1 for the paper's class token, every prefix token where E_pos covers the registers too, 0
            where it covers the patches only (``pos_embed_prefix=False``, DINOv2 and DeiT III).
            :func:`model_position_similarity` reads that from a model.
        grid: (gh, gw), the patch grid, gh * gw = N'.

    Returns (gh, gw, gh, gw): entry [r1, c1, r2, c2] compares patch (r1, c1) with patch (r2, c2); the slice
    [r1, c1] is one tile of the paper's grid of grids. Its (N')^2 entries, in float64 and then in pos_embed's dtype,
    are checked against the memory budget before they are computed.
    """
    gh, gw = check_grid("grid", grid)
    prefix_rows = check_nonnegative_int("prefix_rows", prefix_rows)
    weight = pos_embed.detach().reshape(-1, pos_embed.shape[-1])[prefix_rows:]  # (N', D)
    if weight.shape[0] != gh * gw:
        raise ValueError(
            f"{weight.shape[0]} patch position embeddings (after {prefix_rows} prefix rows) do not fit a {gh}x{gw} grid"
        )
    check_memory(
        (gh * gw) ** 2 * (8 + pos_embed.element_size()),
        f"the position-embedding similarity of every pair of {gh * gw:,} patches ({gh}x{gw} grid)",
    )
    unit = F.normalize(weight.double(), dim=-1)
    return rearrange(unit @ unit.T, "(r1 c1) (r2 c2) -> r1 c1 r2 c2", r1=gh, r2=gh).to(pos_embed.dtype)


def model_position_similarity(model: ViT) -> torch.Tensor:
    """:func:`position_similarity` of the model's own E_pos on the grid it was trained at, its prefix rows (when
    E_pos has any: ``config.pos_embed_prefix``) dropped. Shapes: -> (gh, gw, gh, gw)."""
    pos = model.patch_embed.pos_embed
    return position_similarity(pos.weight, pos.grid, pos.prefix)


def patch_embedding_matrix(model: ViT) -> torch.Tensor:
    """The model's E^T as a (D, p1*p2*c) matrix, whichever patchify it uses."""
    proj = model.patch_embed.proj
    weight = proj.weight.detach()
    return conv_to_linear_weight(weight) if weight.ndim == 4 else weight


def embedding_filter_components(model: ViT, num_components: int = 28) -> tuple[torch.Tensor, torch.Tensor]:
    """Principal components of the D patch-embedding filters (each a p1 x p2 x c patch), as in Figure 7 left.

    The filters (rows of E^T) are centred and decomposed by SVD; the top right singular vectors are the
    components. Returns (components (k, c, p1, p2), explained variance ratio (k,)), k = min(num_components,
    D, p1 * p2 * c). The sign of each component is arbitrary (SVD's).
    """
    check_positive_int("num_components", num_components)
    c, (p1, p2) = model.config.in_channels, model.config.patch_size
    filters = patch_embedding_matrix(model).double()
    centred = filters - filters.mean(dim=0, keepdim=True)
    _, s, vh = torch.linalg.svd(centred, full_matrices=False)
    k = min(num_components, vh.shape[0])
    ratio = s**2 / (s**2).sum()
    components = rearrange(vh[:k], "k (p1 p2 c) -> k c p1 p2", p1=p1, p2=p2, c=c)
    return components.float(), ratio[:k].float()
