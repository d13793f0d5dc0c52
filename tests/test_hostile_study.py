"""The study tools and the model's head under hostile arguments: sizes that multiply past memory are refused by the
budget before anything is allocated, a patch grid that is not a pair of positive ints is refused by name wherever a
grid enters, names that do not match the tokens they label are refused with both counts, and a distilled head whose
two classifiers disagree says how to change both."""

from __future__ import annotations

import re

import pytest
import torch
from _tiny import TINY_DIGITS, TINY_RGB16, tiny_vit
from test_hostile_budgets import refused_at_once
from torch import nn

from vit_einops import max_memory
from vit_einops.inspect import (
    class_attention_grid,
    class_token_share,
    dino_view,
    head_statistics,
    last_layer_class_attention,
    mean_attention_distance,
    model_position_similarity,
    patch_attention_grid,
    patch_distances,
    plot_prefix_share,
    plot_token_norms,
    position_similarity,
    prefix_token_share,
)

MAPS = torch.full((1, 1, 2, 5, 5), 0.2)  # (l, b, h, n, n): a class token and 4 patches, uniform attention

# Every study function that takes a patch grid, called with ``grid`` (and the name it gives that argument).
GRID_TAKERS = {
    "class_attention_grid": ("grid_size", lambda grid: class_attention_grid(MAPS[0], grid)),
    "patch_attention_grid": ("grid_size", lambda grid: patch_attention_grid(MAPS[0], grid)),
    "last_layer_class_attention": ("grid_size", lambda grid: last_layer_class_attention(MAPS, grid)),
    "dino_view": ("grid", lambda grid: dino_view(MAPS, grid)),
    "prefix_token_share": ("grid_size", lambda grid: prefix_token_share(MAPS, grid)),
    "class_token_share": ("grid_size", lambda grid: class_token_share(MAPS, grid)),
    "head_statistics": ("grid_size", lambda grid: head_statistics(MAPS, grid, 2)),
    "mean_attention_distance": ("grid_size", lambda grid: mean_attention_distance(MAPS, grid, 2)),
    "patch_distances": ("grid_size", lambda grid: patch_distances(grid, 2)),
    "position_similarity": ("grid_size", lambda grid: position_similarity(torch.ones(5, 3), grid)),
}


# --- sizes that multiply -----------------------------------------------------------------------------------------


def test_patch_distances_of_a_3000x3000_grid_are_refused_before_648_tb_are_allocated():
    with max_memory("1GiB"), refused_at_once(re.escape(
        "the pixel distances between every pair of 9,000,000 patches (3000x3000 grid) needs about 589.4 TiB, over "
        "the max-memory limit of 1.0 GiB; pass --max-memory 649TiB to allow it"
    )):  # fmt: skip
        patch_distances((3000, 3000), 16)


def test_position_similarity_of_a_model_with_a_million_patches_is_refused_before_it_is_computed():
    with torch.device("meta"):  # the sizes of a 1000x1000 grid without its 64 MiB of E_pos: only sizes are read
        model = tiny_vit(TINY_DIGITS, image_size=1000, patch_size=1)
    with max_memory("1GiB"), refused_at_once(re.escape(
        "the position-embedding similarity of every pair of 1,000,000 patches (1000x1000 grid) needs about 10.9 TiB, "
        "over the max-memory limit of 1.0 GiB; pass --max-memory 13TiB to allow it"
    )):  # fmt: skip
        model_position_similarity(model)
    with max_memory("1MiB"):  # the digits model's 4x4 grid: 256 pairs, 3 KiB
        similarity = model_position_similarity(tiny_vit())
    assert similarity.shape == (4, 4, 4, 4)
    torch.testing.assert_close(similarity[1, 2, 1, 2], torch.tensor(1.0))


# --- patch grids --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("taker", GRID_TAKERS)
def test_a_negative_grid_whose_product_fits_the_tokens_is_refused_by_name(taker):
    name, call = GRID_TAKERS[taker]
    with pytest.raises(ValueError, match=re.escape(f"{name} must be a (gh, gw) pair of positive ints") + ".*"
                       + re.escape("got (-1, -4)")):  # fmt: skip
        call((-1, -4))


@pytest.mark.parametrize("taker", GRID_TAKERS)
@pytest.mark.parametrize(("grid", "kind"), [((2.0, 2.0), "float"), ((True, 4), "bool")])
def test_a_grid_of_floats_or_bools_is_refused_by_name(taker, grid, kind):
    name, call = GRID_TAKERS[taker]
    with pytest.raises(TypeError, match=re.escape(
        f"{name} must be a (gh, gw) pair of positive ints, got {grid!r} (a {kind} side)"
    )):  # fmt: skip
        call(grid)
    # The float sides never reach einops, whose recipe cache would keep them for the equal ints (2.0 == 2) after.
    assert class_attention_grid(MAPS[0], (2, 2)).shape == (1, 2, 2, 2)
    assert dino_view(MAPS, [2, 2]).mask.shape == (1, 2, 2, 2)


@pytest.mark.parametrize("taker", GRID_TAKERS)
def test_a_grid_of_three_sides_is_refused_by_name(taker):
    name, call = GRID_TAKERS[taker]
    with pytest.raises(ValueError, match=re.escape(f"{name} must be a (gh, gw) pair of positive ints, got 3 values")):
        call((2, 2, 1))


# --- names and the tokens they label ------------------------------------------------------------------------------


def test_plot_token_norms_with_more_names_than_tokens_names_both_counts():
    norms = torch.ones(2, 1, 3)  # (l, b, n)
    with pytest.raises(ValueError, match=re.escape("4 names in prefix_tokens for norms over 3 tokens")):
        plot_token_norms(norms, ("cls", "reg1", "reg2", "reg3"))


def test_plot_token_norms_with_as_many_names_as_tokens_leaves_no_patch_and_is_refused():
    with pytest.raises(ValueError, match=re.escape("3 names in prefix_tokens for norms over 3 tokens")):
        plot_token_norms(torch.ones(2, 1, 3), ("cls", "reg1", "reg2"))


@pytest.mark.parametrize("names", [("cls",), ("cls", "reg1", "reg2")])
def test_plot_prefix_share_with_a_name_count_other_than_its_columns_names_both_counts(names):
    share = torch.full((2, 1, 2, 2), 0.25)  # (l, b, h, p): two prefix tokens
    with pytest.raises(ValueError, match=re.escape(f"{len(names)} names in prefix_tokens for 2 prefix-token columns")):
        plot_prefix_share(share, names)


# --- a distilled head's two classifiers -----------------------------------------------------------------------------

TWO_CLASSIFIERS = re.escape("head.fc has 3 outputs but head.fc_dist has 5") + ".*" + re.escape(
    "Assign both head.fc and head.fc_dist (nn.Linear(32, num_classes) each), or call "
    "model.reset_classifier(num_classes)"
)


def test_a_distilled_model_with_only_fc_replaced_says_to_replace_both():
    model = tiny_vit(TINY_RGB16, distill_token=True)
    model.head.fc = nn.Linear(32, 3)
    with pytest.raises(ValueError, match=TWO_CLASSIFIERS):
        model.num_classes
    with pytest.raises(ValueError, match=TWO_CLASSIFIERS):
        model(torch.zeros(1, 3, 16, 16))
    model.head.fc_dist = nn.Linear(32, 3)
    assert model.num_classes == 3
    assert model(torch.zeros(1, 3, 16, 16)).shape == (1, 3)


def test_a_distilled_model_given_timms_head_swap_says_to_replace_both():
    model = tiny_vit(TINY_RGB16, distill_token=True)
    model.head = nn.Linear(32, 3)  # becomes head.fc alone
    with pytest.raises(ValueError, match=TWO_CLASSIFIERS):
        model(torch.zeros(1, 3, 16, 16))


def test_a_distilled_model_with_only_fc_removed_says_to_replace_both():
    model = tiny_vit(TINY_RGB16, distill_token=True)
    model.head.fc = nn.Identity()
    with pytest.raises(ValueError, match=re.escape("head.fc has 0 outputs but head.fc_dist has 5")):
        model(torch.zeros(1, 3, 16, 16))
