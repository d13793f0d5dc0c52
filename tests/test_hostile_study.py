"""The study tools and the model's head under hostile arguments: sizes that multiply past memory are refused by the
budget before anything is allocated, a patch grid that is not a pair of positive ints is refused by name wherever a
grid enters (a token layout, the distances, the position similarity), a layout that does not match the tokens it
labels is refused with both counts, a distilled head whose two classifiers disagree says how to change both, and a
seed past torch's int64 is refused by name while both of its ends are seeds."""

from __future__ import annotations

import doctest
import json
import re

import pytest
import torch
from _hostile import assert_user_error, run_cli, tiny_model
from _tiny import TINY_DIGITS, TINY_RGB16, tiny_vit
from test_hostile_budgets import refused_at_once
from torch import nn

from vit_einops import TokenLayout, max_memory
from vit_einops.inspect import (
    class_attention_grid,
    dino_view,
    explain,
    faithfulness,
    model_position_similarity,
    patch_distances,
    plot_prefix_share,
    plot_token_norms,
    position_similarity,
    run_study,
)
from vit_einops.modelfile import save_vit

MAPS = torch.full((1, 1, 2, 5, 5), 0.2)  # (l, b, h, n, n): a class token and 4 patches, uniform attention

# Everything that takes a patch grid: the token layout (which every study function on maps takes), the distances
# and the position similarity, called with ``grid``.
GRID_TAKERS = {
    "TokenLayout": lambda grid: TokenLayout(("cls",), grid),
    "patch_distances": lambda grid: patch_distances(grid, 2),
    "position_similarity": lambda grid: position_similarity(torch.ones(5, 3), grid),
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
    with pytest.raises(ValueError, match=re.escape("grid must be a (gh, gw) pair of positive ints") + ".*"
                       + re.escape("got (-1, -4)")):  # fmt: skip
        GRID_TAKERS[taker]((-1, -4))


@pytest.mark.parametrize("taker", GRID_TAKERS)
@pytest.mark.parametrize(("grid", "kind"), [((2.0, 2.0), "float"), ((True, 4), "bool")])
def test_a_grid_of_floats_or_bools_is_refused_by_name(taker, grid, kind):
    with pytest.raises(TypeError, match=re.escape(
        f"grid must be a (gh, gw) pair of positive ints, got {grid!r} (a {kind} side)"
    )):  # fmt: skip
        GRID_TAKERS[taker](grid)
    # The float sides never reach a reshape, whose cache could keep them for the equal ints (2.0 == 2) after.
    assert class_attention_grid(MAPS[0], TokenLayout(("cls",), (2, 2))).shape == (1, 2, 2, 2)
    assert dino_view(MAPS, TokenLayout(["cls"], [2, 2])).mask.shape == (1, 2, 2, 2)


@pytest.mark.parametrize("taker", GRID_TAKERS)
def test_a_grid_of_three_sides_is_refused_by_name(taker):
    with pytest.raises(ValueError, match=re.escape("grid must be a (gh, gw) pair of positive ints, got 3 values")):
        GRID_TAKERS[taker]((2, 2, 1))


# --- names and the tokens they label ------------------------------------------------------------------------------


def test_plot_token_norms_over_other_tokens_than_the_layouts_names_both_counts():
    norms = torch.ones(2, 1, 3)  # (l, b, n)
    with pytest.raises(ValueError, match=re.escape("3 tokens do not fit the layout of 4 prefix tokens")):
        plot_token_norms(norms, TokenLayout(("cls", "reg1", "reg2", "reg3"), (1, 1)))
    with pytest.raises(TypeError, match=re.escape("layout must be the TokenLayout of the recorded input")):
        plot_token_norms(norms, ("cls", "reg1"))


@pytest.mark.parametrize("names", [("cls",), ("cls", "reg1", "reg2")])
def test_plot_prefix_share_with_a_name_count_other_than_its_columns_names_both_counts(names):
    share = torch.full((2, 1, 2, 2), 0.25)  # (l, b, h, p): two prefix tokens
    with pytest.raises(ValueError, match=re.escape(f"{len(names)} prefix tokens {names} for 2 prefix-token columns")):
        plot_prefix_share(share, TokenLayout(names, (2, 2)))


# --- run_study, the one study both renderers draw -------------------------------------------------------------------


def forwards(model):
    calls = []
    model.patch_embed.register_forward_pre_hook(lambda *_: calls.append(1))
    return calls


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda m, x: run_study(nn.Linear(2, 2), x), TypeError, "run_study needs a vit-einops ViT, got Linear"),
        (lambda m, x: run_study(m, x, 3), TypeError, "run_study's target is a backbone target (EmbeddingTarget"),
        (lambda m, x: run_study(m, x, layer=2), ValueError, "layer 2 out of range for a ViT of depth 2 (valid: -2..1)"),
        (lambda m, x: run_study(m, x, layer=1.0), TypeError, "layer must be an int"),
        (lambda m, x: run_study(m, x[0, 0]), ValueError,
         "images must be an image (C, H, W) or a batch (B, C, H, W), got shape (8, 8)"),
        (lambda m, x: run_study(m, x.expand(2, 3, 8, 8)), ValueError, "expected 1 channels, got 3"),
    ],
    ids=["not a ViT", "a class target", "a layer past the depth", "a float layer", "a bare grid", "RGB for grey"],
)
def test_run_study_refuses_bad_arguments_by_name_before_any_forward_pass(call, error, message):
    model = tiny_vit()
    calls = forwards(model)
    with pytest.raises(error, match=re.escape(message)):
        call(model, torch.rand(2, 1, 8, 8))
    assert calls == []


def test_run_study_of_a_model_of_nan_weights_names_the_first_image_and_the_weights():
    """Its default check: the methods meet the nan first; the recorded pass then names the cause."""
    model = tiny_vit()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.fill_(float("nan"))
    with pytest.raises(ValueError, match=re.escape(
        "the model's outputs hold 20 non-finite values (nan or inf) of 20: in image 0 (and 1 more), whose "
        "preprocessed pixels are finite, so the model's weights are the likely cause"
    )):  # fmt: skip
        run_study(model, torch.rand(2, 1, 8, 8))


def test_run_studys_docstring_example_runs_as_written():
    finder, runner = doctest.DocTestFinder(), doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    [example] = finder.find(run_study, "run_study", globs={})
    assert runner.run(example).failed == 0 and len(example.examples) == 6


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


# --- seeds: torch's int64 -------------------------------------------------------------------------------------------

PAST_INT64 = [
    (2**63, "seed must be at most 2**63 - 1 (torch's integers are int64), got 9223372036854775808"),
    (-(2**63) - 1, "seed must be at least -2**63 (torch's integers are int64), got -9223372036854775809"),
]


@pytest.mark.parametrize("seed, message", PAST_INT64)
def test_a_seed_past_int64_is_refused_by_name_in_every_study_function(seed, message):
    """The reported -2**63 - 1 failed deep in torch ("Overflow when unpacking long long"); 2**63 was taken."""
    model, images = tiny_vit().double(), torch.rand(2, 1, 8, 8, dtype=torch.float64)
    calls = [
        lambda: faithfulness(model, images, ["attention"], preprocessed=True, seed=seed),
        lambda: faithfulness(model, images, [("random", {"seed": seed})], preprocessed=True),
        lambda: explain(model, images, "random", preprocessed=True, seed=seed),
    ]
    for call in calls:
        with pytest.raises(ValueError) as caught:
            call()
        assert str(caught.value) == message


@pytest.mark.parametrize("seed, message", PAST_INT64)
def test_a_seed_past_int64_is_refused_by_name_on_the_command_line(tmp_path, seed, message):
    path = save_vit(tiny_model(), tmp_path / "m.safetensors")
    for flags in (["--seed", str(seed)], ["--methods", f"random:seed={seed}"]):
        result = run_cli("faithfulness", path, "--num-images", "2", "--out", tmp_path / "out", "--no-progress", *flags)
        assert_user_error(result, "^vit-einops faithfulness: error: " + re.escape(message) + "$")
        assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("seed", [2**63 - 1, -(2**63)])
def test_int64s_ends_are_seeds(seed):
    """Each image's random map is seeded with seed + its index, wrapped into int64: the last image of a batch at
    2**63 - 1 has one."""
    model, images = tiny_vit().double(), torch.rand(3, 1, 8, 8, dtype=torch.float64)
    first, again = (faithfulness(model, images, ["attention"], preprocessed=True, seed=seed) for _ in range(2))
    assert first.seed == seed and first.summary == again.summary
    assert explain(model, images, "random", preprocessed=True, seed=seed).shape == (3, 4, 4)


def test_the_largest_seed_is_taken_on_the_command_line(tmp_path):
    path = save_vit(tiny_model(), tmp_path / "m.safetensors")
    result = run_cli("faithfulness", path, "--num-images", "3", "--methods", "attention", "--out", tmp_path / "out",
                     "--no-progress", "--seed", str(2**63 - 1))
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "out" / "faithfulness.json").read_text())["seed"] == 2**63 - 1
