"""The study tools name the prefix tokens (class, distillation, register): each map against a plain loop over the
tokens it should read, on tiny models with register tokens, and the plain ViT's values unchanged."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from _tiny import TINY_RGB16, tiny_vit
from hypothesis import given
from hypothesis import strategies as st

from vit_einops.attention import MultiHeadAttention
from vit_einops.inspect import (
    AttentionRecorder,
    class_attention_grid,
    class_token_share,
    dino_mask,
    head_statistics,
    mean_attention_distance,
    model_position_similarity,
    patch_attention_grid,
    position_similarity,
    prefix_token_share,
    record_attention,
    show_attention,
    token_norms,
    write_report,
)

R = 3  # registers: not 1 or 4, so that an off-by-one or a hard-coded 4 shows
NAMES = ("cls", "reg1", "reg2", "reg3")


def registers_vit(**overrides):
    """16x16 RGB in 4x4 patches, a class token and R registers, E_pos on the patches only (DINOv2's layout)."""
    return tiny_vit(TINY_RGB16, **{"register_tokens": R, "layer_scale": 1e-5, "pos_embed_prefix": False, **overrides})


def random_maps(layers: int, b: int, h: int, n: int) -> torch.Tensor:
    return torch.rand(layers, b, h, n, n, dtype=torch.float64).softmax(-1)


# --- recorder -----------------------------------------------------------------------------------------------------


def test_recorder_names_the_prefix_rows_and_the_grid_and_records_the_encoder_only():
    model = registers_vit(image_size=(16, 24))  # a 4x6 grid: rows and columns cannot be swapped unseen
    # An attention layer outside the encoder (as an attention-pooling head has) is not one of the encoder's layers;
    # held by a LayerNorm so that the forward never calls it.
    model.head.norm.add_module("extra", MultiHeadAttention.from_config(model.config))
    with AttentionRecorder(model) as recorder:
        model(torch.rand(2, 3, 16, 24))
    assert recorder.prefix_tokens == NAMES
    assert recorder.grid == (4, 6)
    assert recorder.maps.shape == (2, 2, 4, 4 + 24, 4 + 24)
    with pytest.raises(ValueError, match="layer 2 out of range for the model's 2 attention layers"):
        AttentionRecorder(model, layers=[2])
    recorder.clear()
    with pytest.raises(RuntimeError, match="nothing recorded yet"):
        _ = recorder.grid
    bare = MultiHeadAttention.from_config(model.config)
    with AttentionRecorder(bare) as recorder:
        bare(torch.rand(1, 5, 32))
    assert recorder.prefix_tokens is None and recorder.maps.shape == (1, 1, 4, 5, 5)
    with pytest.raises(RuntimeError, match="this recorder's module has no patch_embed"):
        _ = recorder.grid


# --- maps over the patches ------------------------------------------------------------------------------------------


@given(st.sampled_from([(), ("cls",), ("cls", "dist"), NAMES, ("dist", "cls")]), st.integers(1, 3), st.integers(1, 3))
def test_class_and_patch_grids_equal_a_loop_over_the_patch_tokens(prefix, gh, gw):
    p = len(prefix)
    attention = torch.rand(2, 3, p + gh * gw, p + gh * gw, dtype=torch.float64).softmax(-1)
    received = torch.zeros(2, 3, gh, gw, dtype=torch.float64)
    for r, c in itertools.product(range(gh), range(gw)):
        key = p + r * gw + c
        received[..., r, c] = sum(attention[..., p + q, key] for q in range(gh * gw)) / (gh * gw)
    torch.testing.assert_close(patch_attention_grid(attention, (gh, gw), prefix), received, rtol=1e-12, atol=0)
    if "cls" not in prefix:
        with pytest.raises(ValueError, match="this model has none"):
            class_attention_grid(attention, (gh, gw), prefix)
        return
    row = prefix.index("cls")
    expected = torch.zeros(2, 3, gh, gw, dtype=torch.float64)
    for r, c in itertools.product(range(gh), range(gw)):
        expected[..., r, c] = attention[..., row, p + r * gw + c]
    assert torch.equal(class_attention_grid(attention, (gh, gw), prefix), expected)


def test_prefix_share_is_each_prefix_tokens_mean_over_the_patch_queries():
    maps = random_maps(2, 2, 3, 4 + 9)
    share = prefix_token_share(maps, (3, 3), NAMES)
    assert share.shape == (2, 2, 3, 4)
    for t, _ in enumerate(NAMES):
        expected = sum(maps[..., q, t] for q in range(4, 13)) / 9
        torch.testing.assert_close(share[..., t], expected, rtol=1e-12, atol=0)
    assert torch.equal(class_token_share(maps, (3, 3), NAMES), share[..., 0])
    assert torch.equal(class_token_share(maps, (3, 3), ("dist", "cls", "reg1", "reg2")), share[..., 1])
    with pytest.raises(ValueError, match=r"class_token_share reads the class token's row, but this model has none"):
        class_token_share(maps, (3, 3), ("reg1", "reg2", "reg3", "reg4"))
    # The registers are never read as patches: the default (one class token) does not fit 13 tokens on a 3x3 grid.
    with pytest.raises(ValueError, match=r"attention over 13 tokens does not fit a 3x3 grid after the 1 prefix"):
        class_token_share(maps, (3, 3))


def test_distance_and_statistics_count_patch_queries_and_keys_only():
    """Brute force: sum over patch pairs of A_ij times the pixel distance, over the attention they share."""
    maps = random_maps(2, 2, 3, 4 + 6)  # a 2x3 grid of 5-pixel patches after the 4 prefix tokens
    cells = list(itertools.product(range(2), range(3)))
    weighted = torch.zeros(2, 3, dtype=torch.float64)
    mass = torch.zeros(2, 3, dtype=torch.float64)
    for (i, (r1, c1)), (j, (r2, c2)) in itertools.product(enumerate(cells), enumerate(cells)):
        a = maps[..., 4 + i, 4 + j].sum(dim=1)  # pooled over images: (l, h)
        weighted += a * math.hypot(5 * (r1 - r2), 5 * (c1 - c2))
        mass += a
    distance = mean_attention_distance(maps, (2, 3), 5, NAMES)
    torch.testing.assert_close(distance, weighted / mass, rtol=1e-12, atol=0)
    stats = head_statistics(maps, (2, 3), 5, NAMES)
    assert set(stats) == {"distance", "patch_mass", "entropy", "prefix_share", "class_share"}
    assert stats["prefix_share"].shape == (2, 2, 3, 4)
    torch.testing.assert_close(stats["patch_mass"], 1 - stats["prefix_share"].sum(-1), rtol=0, atol=1e-12)
    assert "class_share" not in head_statistics(maps, (2, 3), 5, ("reg1", "reg2", "reg3", "reg4"))
    with pytest.raises(ValueError, match=r"does not fit a 2x3 grid after the 1 prefix tokens \('cls',\)"):
        mean_attention_distance(maps, (2, 3), 5)  # the default, one class token, does not fit 10 tokens


@pytest.mark.parametrize(
    "prefix, error, message",
    [
        ("cls", TypeError, "prefix_tokens must be a sequence of token names such as ('cls', 'reg1'), got 'cls'"),
        (None, TypeError, "prefix_tokens must be a sequence of token names such as ('cls', 'reg1'), got None"),
        (("cls", "cls"), ValueError, "prefix_tokens must be distinct non-empty names, got ('cls', 'cls')"),
        (("cls", 1), ValueError, "prefix_tokens must be distinct non-empty names, got ('cls', 1)"),
        (("cls", ""), ValueError, "prefix_tokens must be distinct non-empty names, got ('cls', '')"),
    ],
)
def test_prefix_tokens_that_are_not_distinct_names_are_refused(prefix, error, message):
    maps = random_maps(1, 1, 1, 6)
    for call in (
        lambda: class_attention_grid(maps[0], (2, 2), prefix),
        lambda: prefix_token_share(maps, (2, 2), prefix),
        lambda: mean_attention_distance(maps, (2, 2), 1, prefix),
    ):
        with pytest.raises(error, match=f"^{message.replace('(', '[(]').replace(')', '[)]')}$"):
            call()


# --- token norms and position embeddings ------------------------------------------------------------------------


def test_token_norms_name_the_prefix_rows_and_lay_the_patches_on_the_grid():
    model = registers_vit()
    x = torch.rand(2, 3, 16, 16)
    result = token_norms(model, x)
    output, norms = result  # still unpacks as the pair it always was
    assert torch.equal(output, model(x)) and result[1] is norms
    assert result.prefix_tokens == NAMES and result.grid == (4, 4)
    z = model.patch_embed(x)
    for layer, block in enumerate(model.blocks):
        z = block(z)
        assert torch.equal(norms[layer], torch.linalg.vector_norm(z, dim=-1))
        for r, c in itertools.product(range(4), range(4)):
            assert torch.equal(result.patch_norms[layer, :, r, c], norms[layer, :, 1 + R + 4 * r + c])


@pytest.mark.parametrize("prefix", [True, False])
def test_position_similarity_drops_the_prefix_rows_only_where_pos_embed_has_them(prefix):
    model = registers_vit(pos_embed_prefix=prefix)
    weight = model.patch_embed.pos_embed.weight.detach()[0]
    patches = weight[1 + R :] if prefix else weight
    assert len(patches) == 16
    expected = torch.zeros(4, 4, 4, 4)
    for (i, a), (j, b) in itertools.product(enumerate(patches), enumerate(patches)):
        expected[i // 4, i % 4, j // 4, j % 4] = torch.dot(a, b) / (a.norm() * b.norm())
    torch.testing.assert_close(model_position_similarity(model), expected, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match=r"^prefix_rows must be >= 0, got -1$"):
        position_similarity(weight, (4, 4), prefix_rows=-1)
    with pytest.raises(ValueError, match=r"^\d+ patch position embeddings \(after 2 prefix rows\) do not fit a 4x4"):
        position_similarity(weight, (4, 4), prefix_rows=2)


# --- show_attention and the report ----------------------------------------------------------------------------------


@torch.no_grad()
def class_rows_by_softmax_hook(model, x: torch.Tensor) -> list[torch.Tensor]:
    """Each block's class-token row over the patch keys (after the class token and the registers), read off the
    einsum path's softmax: [(b, h, 16)] per layer."""
    seen = []
    handles = [b.attn.fn.mha.attend.softmax.register_forward_hook(lambda m, a, out: seen.append(out))
               for b in model.blocks]  # fmt: skip
    try:
        model(x)
    finally:
        for handle in handles:
            handle.remove()
    return [a[:, :, 0, 1 + R :] for a in seen]


def test_show_attention_draws_a_register_models_class_row_over_the_patches():
    model = registers_vit()
    x = torch.rand(3, 16, 16)
    expected = class_rows_by_softmax_hook(model, x[None])[-1][0]  # (h, 16)
    fig = show_attention(model, x, preprocessed=True)
    heads = [ax for ax in fig.get_axes() if "head" in ax.get_title()]
    assert len(heads) == 4
    for h, ax in enumerate(heads):
        assert float(ax.get_title().split("\n")[1].removeprefix("max ")) == pytest.approx(
            expected[h].max().item(), rel=1e-3
        )


def test_report_of_a_register_model_names_its_prefix_tokens(tmp_path, unrendered):
    model = registers_vit()
    x = torch.rand(2, 3, 16, 16)
    paths = write_report(model, x, tmp_path / "r", layer=0)
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == [
        "arrays.npz", "attention.png", "attention_distance.png", "embedding_filters.png",
        "position_similarity.png", "prefix_share.png", "token_norms.png",
    ]  # fmt: skip
    assert set(paths) == {"arrays", "attention", "attention_distance", "embedding_filters",
                          "position_similarity", "prefix_share", "token_norms"}  # fmt: skip
    arrays = np.load(paths["arrays"])
    assert arrays["prefix_tokens"].tolist() == list(NAMES)
    rows = class_rows_by_softmax_hook(model, x)
    np.testing.assert_allclose(arrays["class_attention"], rows[0].reshape(2, 4, 4, 4).numpy(), atol=1e-6)
    # DINO's view of the drawn layer (0 here): its class rows, and the mask dino_view gives them
    np.testing.assert_allclose(arrays["dino_attention"], rows[0].reshape(2, 4, 4, 4).numpy(), atol=1e-6)
    expected_mask = dino_mask(torch.from_numpy(arrays["dino_attention"]).flatten(-2)).unflatten(-1, (4, 4))
    np.testing.assert_array_equal(arrays["dino_mask"], expected_mask.numpy())
    maps = torch.from_numpy(arrays["attention"])
    assert maps.shape == (2, 2, 4, 20, 20)
    np.testing.assert_array_equal(arrays["prefix_share"], prefix_token_share(maps, (4, 4), NAMES).numpy())
    np.testing.assert_array_equal(arrays["token_norms"], token_norms(model, x).norms.numpy())
    np.testing.assert_allclose(
        arrays["mean_attention_distance"], mean_attention_distance(maps, (4, 4), 4, NAMES).numpy(), rtol=1e-6
    )
    np.testing.assert_array_equal(arrays["position_similarity"], model_position_similarity(model).numpy())


def test_a_plain_vits_report_keeps_its_arrays_and_adds_the_prefix_ones(tmp_path, unrendered):
    """The paper's ViT: one class token, and the arrays it always had still read row 0 over columns 1..N'."""
    model = tiny_vit(TINY_RGB16)
    x = torch.rand(2, 3, 16, 16)
    arrays = np.load(write_report(model, x, tmp_path / "r")["arrays"])
    _, maps = record_attention(model, x)
    np.testing.assert_array_equal(arrays["class_attention"], maps[-1][:, :, 0, 1:].reshape(2, 4, 4, 4).numpy())
    np.testing.assert_array_equal(arrays["prefix_tokens"], np.array(["cls"]))
    np.testing.assert_array_equal(arrays["prefix_share"][..., 0], maps[..., 1:, 0].mean(-1).numpy())
    weight = model.patch_embed.pos_embed.weight.detach()
    np.testing.assert_array_equal(arrays["position_similarity"], position_similarity(weight, (4, 4)).numpy())


def test_a_model_without_a_class_token_shows_the_patches_attention(tmp_path, unrendered):
    """No "cls" among the prefix tokens (SigLIP's layout, here with registers too, so that prefix tokens remain):
    the drawn maps are the attention each patch receives from the patches, in the report and in show_attention,
    and there is no DINO figure. The attention-pooling head's own Attend is not among the recorded layers."""
    renamed = ("reg1", "reg2", "reg3")
    model = registers_vit(class_token=False, pool="map")
    x = torch.rand(1, 3, 16, 16)
    paths = write_report(model, x, tmp_path / "r")
    assert "dino_attention" not in np.load(paths["arrays"])
    arrays = np.load(paths["arrays"])
    assert "class_attention" not in arrays and "dino_mask" not in arrays
    assert arrays["prefix_tokens"].tolist() == list(renamed)
    maps = torch.from_numpy(arrays["attention"])
    assert maps.shape == (2, 1, 4, 3 + 16, 3 + 16)  # the two encoder layers only
    received = maps[-1][..., 3:, 3:].mean(-2).reshape(1, 4, 4, 4)  # mean over the patch queries, per patch key
    np.testing.assert_allclose(arrays["patch_attention"], received.numpy(), rtol=1e-6)
    fig = show_attention(model, x[0], preprocessed=True)
    heads = [ax for ax in fig.get_axes() if "head" in ax.get_title()]
    for h, ax in enumerate(heads):
        maximum = float(ax.get_title().split("\n")[1].removeprefix("max "))
        assert maximum == pytest.approx(received[0, h].max().item(), rel=1e-3)


def test_a_model_run_at_another_size_is_read_on_that_inputs_grid(tmp_path, unrendered):
    """dynamic_size: the maps, shares and DINO mask come out on the input's 6x5 grid, not the config's 4x4."""
    model = registers_vit(dynamic_size="timm")
    x = torch.rand(1, 3, 24, 20)
    with AttentionRecorder(model) as recorder:
        model(x)
    assert recorder.grid == (6, 5) and recorder.maps.shape == (2, 1, 4, 4 + 30, 4 + 30)
    arrays = np.load(write_report(model, x, tmp_path / "r")["arrays"])
    expected = recorder.maps[-1][:, :, 0, 4:].reshape(1, 4, 6, 5)
    np.testing.assert_allclose(arrays["class_attention"], expected.numpy(), rtol=1e-6)
    assert arrays["dino_mask"].shape == (1, 4, 6, 5)
