"""Attention recording, rollout, attention distance and embedding analyses, each against an independent
computation (torch's own MultiheadAttention, closed forms, scikit-learn's PCA)."""

import itertools
import math

import numpy as np
import pytest
import torch
from _tiny import TINY_DIGITS
from _tiny import tiny_vit as shared_tiny_vit
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from vit_einops import TokenLayout, ViT
from vit_einops.network.attention import MultiHeadAttention, set_attn_impl
from vit_einops.network.kernels import ATTN_IMPLS
from vit_einops.inspect import (
    AttentionRecorder,
    attention_rollout,
    class_attention_grid,
    embedding_filter_components,
    explain_all,
    mean_attention_distance,
    patch_distances,
    position_similarity,
    record_attention,
    show_attention,
    write_report,
)
from vit_einops.inspect.study import study_decomposition
from vit_einops.reference import torch_mha_from


TINY = dict(TINY_DIGITS, depth=3)  # three blocks: rollout and per-layer statistics have a middle layer


def tiny_vit(**overrides) -> ViT:
    return shared_tiny_vit(TINY, **overrides)


def test_recording_leaves_outputs_unchanged_on_every_impl():
    """Probing hook_pattern makes a fused kernel form A with the einsum kernel's arithmetic (docs/probes.md): the
    output is the einsum and chunked kernels' exactly and the fused sdpa kernel's within float rounding."""
    x = torch.rand(3, 1, 8, 8)
    for impl in ATTN_IMPLS:
        model = tiny_vit(attn_impl=impl)
        expected = model(x)
        with AttentionRecorder(model) as rec:
            got = model(x)
        if impl == "sdpa":
            torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)
        else:
            assert torch.equal(got, expected), impl
        assert rec.maps.shape == (3, 3, 2, 17, 17)


def test_recorded_maps_agree_across_impls_and_rows_sum_to_one():
    torch.manual_seed(1)
    model = tiny_vit()
    x = torch.rand(4, 1, 8, 8)
    maps = {}
    for impl in ATTN_IMPLS:
        model.set_attn_impl(impl)
        _, maps[impl], _ = record_attention(model, x)
    for impl in ATTN_IMPLS:
        # Layer 0 sees identical q, k on every path; deeper layers inherit the paths' float32 rounding.
        assert torch.equal(maps[impl][0], maps["einsum"][0]), impl
        torch.testing.assert_close(maps[impl], maps["einsum"], atol=1e-6, rtol=0)
    rows = maps["sdpa"].sum(-1)
    torch.testing.assert_close(rows, torch.ones_like(rows), atol=1e-6, rtol=0)


def test_einsum_path_recording_equals_the_models_own_softmax():
    # On the einsum path the model forms A itself; a hook on attend.softmax sees it (before dropout).
    model = tiny_vit()
    seen = []
    handles = [
        m.softmax.register_forward_hook(lambda mod, inp, out: seen.append(out))
        for m in model.modules()
        if hasattr(m, "softmax")
    ]
    _, maps, _ = record_attention(model, torch.rand(2, 1, 8, 8))
    for h in handles:
        h.remove()
    assert torch.equal(maps, torch.stack(seen))


@pytest.mark.parametrize("impl", ATTN_IMPLS)
@pytest.mark.parametrize("masked", [False, True])
def test_recorded_maps_equal_torch_multihead_attention_weights(impl, masked):
    # Independent implementation: nn.MultiheadAttention carrying our weights (fused qkv is its in_proj).
    dim, heads, n = 12, 3, 5
    mha = set_attn_impl(MultiHeadAttention(dim, heads), impl).eval()
    ref = torch_mha_from(mha).eval()
    x = torch.randn(2, n, dim)
    mask = torch.rand(n, n) > 0.4 if masked else None
    if masked:
        mask |= torch.eye(n, dtype=torch.bool)  # every query keeps at least itself
    with AttentionRecorder(mha) as rec:
        mha(x, mask=mask)
    _, expected = ref(x, x, x, attn_mask=None if mask is None else ~mask, need_weights=True, average_attn_weights=False)
    torch.testing.assert_close(rec.maps[0], expected, atol=1e-6, rtol=1e-5)


def test_hooks_are_removed_on_exit_and_on_exceptions():
    model = tiny_vit()
    sites = model.probe_sites()
    with pytest.raises(ValueError):
        with AttentionRecorder(model):
            assert all(sites[f"blocks.{i}.attn.hook_pattern"].hooks for i in range(3)) and sites["hook_image"].hooks
            model(torch.rand(1, 1, 9, 9))  # wrong size: the model raises inside the block
    assert not any(site.hooks for site in sites.values())
    record_attention(model, torch.rand(1, 1, 8, 8))
    assert not any(site.hooks for site in sites.values())


def test_layer_selection_and_errors():
    model = tiny_vit()
    x = torch.rand(2, 1, 8, 8)
    _, all_maps, _ = record_attention(model, x)
    _, last, _ = record_attention(model, x, layers=[-1, 0])
    assert torch.equal(last, all_maps[[2, 0]])
    with pytest.raises(ValueError, match="layer 3 out of range for the model's 3 attention layers"):
        AttentionRecorder(model, layers=[3])
    with pytest.raises(TypeError, match="layer must be an int"):
        AttentionRecorder(model, layers=[1.0])
    with pytest.raises(ValueError, match="twice"):
        AttentionRecorder(model, layers=[0, -3])
    with pytest.raises(ValueError, match="no Attend"):
        AttentionRecorder(nn.Linear(2, 2))
    with pytest.raises(RuntimeError, match="nothing recorded"):
        _ = AttentionRecorder(model).maps


def test_repeated_forwards_concatenate_along_the_batch():
    model = tiny_vit()
    a, b = torch.rand(2, 1, 8, 8), torch.rand(3, 1, 8, 8)
    with AttentionRecorder(model) as rec:
        model(a)
        model(b)
    assert torch.allclose(rec.maps, record_attention(model, torch.cat([a, b]))[1], atol=1e-6)


# --- rollout ----------------------------------------------------------------------------------------------


def test_rollout_of_identity_attention_is_identity():
    eye = torch.eye(7).expand(4, 2, 3, 7, 7)
    assert torch.equal(attention_rollout(eye), torch.eye(7).expand(2, 7, 7))


@given(st.integers(1, 4), st.integers(2, 6), st.floats(0.0, 1.0))
def test_rollout_matches_a_plain_numpy_product(layers, n, residual):
    maps = torch.rand(layers, 2, 3, n, n, dtype=torch.float64).softmax(-1)
    expected = np.stack([np.eye(n)] * 2)
    for layer in maps.numpy():
        a = residual * np.eye(n) + (1 - residual) * layer.mean(axis=1)
        a /= a.sum(-1, keepdims=True)
        expected = a @ expected
    got = attention_rollout(maps, residual=residual)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got.sum(-1).numpy(), 1.0, atol=1e-12)  # still a mixture


def test_class_attention_grid_reads_the_class_row_in_row_major_order():
    maps = torch.zeros(1, 1, 2, 7, 7)
    maps[..., 0, 1:] = torch.arange(6.0)
    grid = class_attention_grid(maps[-1], TokenLayout(("cls",), (2, 3)))
    assert grid.shape == (1, 2, 2, 3)
    assert torch.equal(grid[0, 1], torch.tensor([[0.0, 1, 2], [3, 4, 5]]))
    with pytest.raises(ValueError, match="3x3 patch grid"):
        class_attention_grid(maps[0], TokenLayout(("cls",), (3, 3)))


def test_rollout_rejects_bad_arguments():
    with pytest.raises(ValueError, match="layers, b, h, n, n"):
        attention_rollout(torch.rand(2, 3, 4, 4))
    with pytest.raises(ValueError, match="residual"):
        attention_rollout(torch.rand(1, 1, 1, 3, 3), residual=1.5)
    with pytest.raises(ValueError, match="head_fusion"):
        attention_rollout(torch.rand(1, 1, 1, 3, 3), head_fusion="sum")


# --- attention distance -----------------------------------------------------------------------------------


def uniform_maps(gh: int, gw: int, layers: int = 2, heads: int = 3) -> torch.Tensor:
    n = gh * gw + 1
    return torch.full((layers, 2, heads, n, n), 1.0 / n)


@pytest.mark.parametrize(
    "grid, patch, expected",
    [
        ((1, 2), 4, 4 / 2),  # pairs (0, 4, 4, 0) px
        ((2, 2), 3, 3 * (2 + math.sqrt(2)) / 4),  # from any patch: 0, P, P, P*sqrt(2)
        ((1, 3), 1, 8 / 9),  # |i - j| over {0,1,2}^2: (0+1+2+1+0+1+2+1+0)/9
    ],
)
def test_mean_distance_of_uniform_attention_is_the_grids_mean_pairwise_distance(grid, patch, expected):
    got = mean_attention_distance(uniform_maps(*grid), TokenLayout(("cls",), grid), patch)
    torch.testing.assert_close(got, torch.full((2, 3), expected), atol=1e-6, rtol=0)


@given(st.integers(1, 5), st.integers(1, 5), st.integers(1, 4), st.integers(1, 4))
def test_mean_distance_of_uniform_attention_matches_brute_force(gh, gw, ph, pw):
    cells = list(itertools.product(range(gh), range(gw)))
    brute = np.mean(
        [math.hypot((r1 - r2) * ph, (c1 - c2) * pw) for (r1, c1), (r2, c2) in itertools.product(cells, cells)]
    )
    got = mean_attention_distance(uniform_maps(gh, gw).double(), TokenLayout(("cls",), (gh, gw)), (ph, pw))
    np.testing.assert_allclose(got.numpy(), brute, rtol=1e-12)
    np.testing.assert_allclose(patch_distances((gh, gw), (ph, pw)).mean().item(), brute, rtol=1e-12)


def test_self_attention_has_zero_distance_and_neighbour_attention_one_patch():
    n = 1 + 9
    own = torch.eye(n).expand(1, 1, 1, n, n)
    layout = TokenLayout(("cls",), (3, 3))
    assert mean_attention_distance(own, layout, 2).item() == 0.0
    right = torch.zeros(1, 1, 1, n, n)
    for i in range(9):  # each patch attends to its right neighbour, wrapping to the left end
        r, c = divmod(i, 3)
        right[..., 1 + i, 1 + r * 3 + (c + 1) % 3] = 1.0
    right[..., 0, 0] = 1.0
    expected = (6 * 2 + 3 * 4) / 9  # 6 queries one patch (2 px) away, 3 wrapping two patches (4 px)
    assert mean_attention_distance(right, layout, 2).item() == pytest.approx(expected)


# --- embeddings -------------------------------------------------------------------------------------------


def test_position_similarity_of_a_row_one_hot_embedding():
    # Patch (r, c) embeds as one-hot(r): same row -> cosine 1, different rows -> 0; the class row is dropped.
    gh, gw = 3, 4
    pos = torch.zeros(1, 1 + gh * gw, 8)
    pos[0, 0] = 5.0
    for r, c in itertools.product(range(gh), range(gw)):
        pos[0, 1 + r * gw + c, r] = 2.0
    sim = position_similarity(pos, (gh, gw))
    assert sim.shape == (gh, gw, gh, gw)
    for r1, c1, r2, c2 in itertools.product(range(gh), range(gw), range(gh), range(gw)):
        assert sim[r1, c1, r2, c2] == (1.0 if r1 == r2 else 0.0)


def test_position_similarity_of_angles_is_the_cosine_of_their_difference():
    angles = torch.rand(6) * 2 * math.pi
    pos = torch.stack([angles.cos(), angles.sin()], dim=-1) * torch.rand(6, 1).add(0.5)  # lengths do not matter
    sim = position_similarity(pos, (2, 3), prefix_rows=0)
    expected = torch.cos(angles[:, None] - angles[None, :]).reshape(2, 3, 2, 3)
    torch.testing.assert_close(sim, expected, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="3x3 grid"):
        position_similarity(pos, (3, 3), prefix_rows=0)


@pytest.mark.parametrize("patchify", ["conv", "linear"])
def test_filter_components_match_scikit_learn_pca(patchify):
    from sklearn.decomposition import PCA

    model = ViT(
        image_size=8, patch_size=2, in_channels=3, num_classes=0, dim=32, depth=1, heads=2, mlp_dim=8, patchify=patchify
    )
    components, explained = embedding_filter_components(model, num_components=5)
    assert components.shape == (5, 3, 2, 2)
    proj = model.patch_embed.proj.weight.detach()
    # (p1 p2 c) flattening, as E acts on a patch in Eq. 1 (conv kernels are (D, c, p1, p2)).
    filters = proj.permute(0, 2, 3, 1).reshape(32, -1) if patchify == "conv" else proj
    pca = PCA(n_components=5).fit(filters.double().numpy())
    ours = components.permute(0, 2, 3, 1).reshape(5, -1).double().numpy()
    signs = np.sign((ours * pca.components_).sum(-1, keepdims=True))
    np.testing.assert_allclose(ours * signs, pca.components_, atol=1e-5)
    np.testing.assert_allclose(explained.numpy(), pca.explained_variance_ratio_, rtol=1e-4)


# --- report -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("same", [None, "same", "equal"])
def test_report_runs_the_model_once_when_distance_images_are_the_drawn_ones(tmp_path, same, unrendered):
    model = tiny_vit()
    images = torch.rand(3, 1, 8, 8)
    distance_images = {None: None, "same": images, "equal": images.clone()}[same]
    calls = []  # every pass embeds its patches, whichever entry point (model(x), forward_features) it takes
    model.patch_embed.register_forward_pre_hook(lambda module, args: calls.append(len(args[0])))
    write_report(model, images, tmp_path, distance_images=distance_images, titles=["a", "b", "c"], arrays="full")
    report_calls = list(calls)
    calls.clear()
    decomposition = study_decomposition(model, images, None)  # the study's decomposition of the score, and
    given = {"decomposition": decomposition.decomposition.source_map()}  # methods.png's maps from it and their passes:
    explain_all(model, images, preprocessed=True, given=given)  # what the report adds to its one pass
    assert report_calls == [3] * (1 + len(calls))
    arrays = np.load(tmp_path / "arrays.npz")
    expected = mean_attention_distance(torch.from_numpy(arrays["attention"]), model.patch_embed.layout(), 2)
    np.testing.assert_allclose(arrays["mean_attention_distance"], expected.numpy(), rtol=1e-6)


def test_report_batches_other_distance_images_to_the_same_mean(tmp_path, unrendered):
    model = tiny_vit()
    images, others = torch.rand(2, 1, 8, 8), torch.rand(5, 1, 8, 8)
    write_report(model, images, tmp_path, distance_images=others, batch_size=2)
    _, maps, _ = record_attention(model, others)
    np.testing.assert_allclose(
        np.load(tmp_path / "arrays.npz")["mean_attention_distance"],
        mean_attention_distance(maps, model.patch_embed.layout(), 2).numpy(),
        rtol=1e-5,
    )


def test_an_unnamed_prediction_is_titled_by_class_name():
    model = tiny_vit()
    model.reset_classifier(10)  # zero-initialised: uniform probabilities, the first class wins
    assert "predicted class 0 (p 0.10)" in show_attention(model, torch.rand(1, 8, 8)).get_suptitle()
