"""The token layout (prefix tokens by name, then the patch grid) and the study tools that read by it: each map
against a plain loop over the tokens it should read, on tiny models with register tokens, and the plain ViT's
values unchanged."""

from __future__ import annotations

import itertools
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from _tiny import TINY_RGB16, tiny_vit
from hypothesis import given
from hypothesis import strategies as st

from vit_einops import TokenLayout
from vit_einops.network.attention import MultiHeadAttention
from vit_einops.inspect import (
    AttentionRecorder,
    class_attention_grid,
    dino_mask,
    dino_view,
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


def test_recorder_carries_the_layout_and_records_the_encoder_only():
    model = registers_vit(image_size=(16, 24))  # a 4x6 grid: rows and columns cannot be swapped unseen
    # An attention layer outside the encoder (as an attention-pooling head has) is not one of the encoder's layers;
    # held by a LayerNorm so that the forward never calls it.
    model.head.norm.add_module("extra", MultiHeadAttention.from_config(model.config))
    with AttentionRecorder(model) as recorder:
        model(torch.rand(2, 3, 16, 24))
    assert recorder.layout == TokenLayout(NAMES, (4, 6)) == model.patch_embed.layout()
    assert recorder.maps.shape == (2, 2, 4, 4 + 24, 4 + 24)
    with pytest.raises(ValueError, match="layer 2 out of range for the model's 2 attention layers"):
        AttentionRecorder(model, layers=[2])
    recorder.clear()
    with pytest.raises(RuntimeError, match="nothing recorded yet"):
        _ = recorder.layout
    bare = MultiHeadAttention.from_config(model.config)
    with AttentionRecorder(bare) as recorder:
        bare(torch.rand(1, 5, 32))
    assert recorder.layout is None and recorder.maps.shape == (1, 1, 4, 5, 5)


# --- the layout -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, prefix",
    [
        ({}, ("cls",)),
        ({"distill_token": True}, ("cls", "dist")),
        ({"register_tokens": 1}, ("cls", "reg1")),
        ({"register_tokens": R, "distill_token": True}, ("cls", "dist", "reg1", "reg2", "reg3")),
        ({"class_token": False, "pool": "map"}, ()),
        ({"class_token": False, "pool": "map", "register_tokens": 2}, ("reg1", "reg2")),
    ],
)
def test_the_patch_embedding_names_the_tokens_it_inserts_in_the_order_it_inserts_them(overrides, prefix):
    """The names against the tokens themselves: each prefix module's weight is found at the position the layout
    gives its name (E_pos off, so the embedding's output there is that weight alone)."""
    model = tiny_vit(TINY_RGB16, **overrides)
    layout = model.patch_embed.layout()
    assert (layout.prefix, layout.grid) == (prefix, (4, 4))
    assert (layout.num_prefix, layout.num_patches, layout.num_tokens) == (len(prefix), 16, len(prefix) + 16)
    assert layout.num_prefix == model.num_prefix_tokens
    with torch.no_grad():
        model.patch_embed.pos_embed.weight.zero_()
        tokens = model.patch_embed(torch.rand(1, 3, 16, 16))[0]
    assert tokens.shape[0] == layout.num_tokens
    weights = {"cls": "cls_token", "dist": "dist_token"}
    for name in prefix:
        module = getattr(model.patch_embed, weights.get(name, "reg_token"))
        row = int(name[3:]) - 1 if name.startswith("reg") else 0
        assert torch.equal(tokens[layout.index(name)], module.weight[0, row])
    labels = layout.labels()
    assert labels[: len(prefix)] == prefix and labels[len(prefix)] == "patch (0, 0)" and labels[-1] == "patch (3, 3)"
    assert len(set(labels)) == layout.num_tokens


def test_a_layout_splits_any_axis_into_its_prefix_tokens_and_the_patch_grid():
    layout = TokenLayout(("cls", "reg1"), (2, 3))
    x = torch.arange(4 * 8 * 5).reshape(4, 8, 5)  # the tokens along dim 1
    prefix, patches = layout.split(x, dim=1)
    assert torch.equal(prefix, x[:, :2]) and patches.shape == (4, 2, 3, 5)
    for r, c in itertools.product(range(2), range(3)):
        assert torch.equal(patches[:, r, c], x[:, 2 + 3 * r + c])
    assert torch.equal(x[:, layout.patches], x[:, 2:])
    with pytest.raises(ValueError, match=re.escape(
        "5 tokens do not fit the layout of 2 prefix tokens ('cls', 'reg1') and a 2x3 patch grid (2 + 6 = 8)"
    )):  # fmt: skip
        layout.split(x)
    with pytest.raises(ValueError, match=re.escape("no 'dist' token here: the prefix tokens are ('cls', 'reg1')")):
        layout.index("dist")
    many = TokenLayout(tuple(f"reg{i + 1}" for i in range(1000)), (2, 2))  # a message names eight, and counts the rest
    with pytest.raises(ValueError, match=re.escape("prefix tokens are ('reg1', 'reg2', 'reg3', 'reg4', 'reg5', 'reg6', "
                                                   "'reg7', 'reg8', ... 992 more)") + "$"):  # fmt: skip
        many.index("cls")


def test_the_layout_of_another_input_size_follows_dynamic_size():
    dynamic = registers_vit(dynamic_size="timm")
    assert dynamic.patch_embed.layout((24, 20)) == TokenLayout(NAMES, (6, 5))
    with pytest.raises(ValueError, match=re.escape("image height 18 is not divisible by patch height 4")):
        dynamic.patch_embed.layout((18, 20))
    with pytest.raises(ValueError, match=re.escape("image_size (24, 20): this embedding takes (16, 16) only")):
        registers_vit().patch_embed.layout((24, 20))


def test_a_billion_registers_are_named_only_within_the_memory_budget():
    from test_hostile_budgets import refused_at_once

    from vit_einops import max_memory
    from vit_einops.network.patch_embed import PatchEmbedding

    with torch.device("meta"):  # the sizes without the weights: only the names could be made
        embedding = PatchEmbedding(16, 4, 3, 8, register_tokens=10**9)
    with max_memory("1GiB"), refused_at_once(re.escape("naming 1,000,000,000 reg tokens needs about 67.1 GiB")):
        embedding.layout()
    with max_memory("1GiB"), refused_at_once(re.escape("naming 4,000,000,001 tokens needs about 268.2 GiB")):
        TokenLayout(("cls",), (40_000, 100_000)).labels()


@pytest.mark.parametrize(
    "prefix, grid, error, message",
    [
        ("cls", (2, 2), TypeError, "prefix must be a tuple of token names such as ('cls', 'reg1'), got 'cls'"),
        (None, (2, 2), TypeError, "prefix must be a tuple of token names such as ('cls', 'reg1'), got None"),
        (("cls", "cls"), (2, 2), ValueError, "prefix must be distinct non-empty names, got ('cls', 'cls')"),
        (("cls", 1), (2, 2), ValueError, "prefix must be distinct non-empty names, got ('cls', 1)"),
        (("cls", ""), (2, 2), ValueError, "prefix must be distinct non-empty names, got ('cls', '')"),
        ((), (2, 0), ValueError, "grid must be a (gh, gw) pair of positive ints (each at most 2**63 - 1), got (2, 0)"),
        ((), (2.0, 2), TypeError, "grid must be a (gh, gw) pair of positive ints, got (2.0, 2) (a float side)"),
    ],
)
def test_a_layout_of_names_that_are_not_distinct_or_a_grid_that_is_not_two_sizes_is_refused(
    prefix, grid, error, message
):
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        TokenLayout(prefix, grid)


def test_the_study_tools_refuse_what_is_not_a_layout_and_a_layout_the_maps_do_not_fit():
    maps = random_maps(1, 1, 1, 6)
    calls = {
        "class_attention_grid": lambda layout: class_attention_grid(maps[0], layout),
        "prefix_token_share": lambda layout: prefix_token_share(maps, layout),
        "mean_attention_distance": lambda layout: mean_attention_distance(maps, layout, 1),
    }
    for call in calls.values():
        with pytest.raises(TypeError, match=re.escape("layout must be the TokenLayout of the recorded input")):
            call((2, 2))
        with pytest.raises(ValueError, match=re.escape("6 tokens do not fit the layout of 1 prefix tokens ('cls',)")):
            call(TokenLayout(("cls",), (2, 3)))


# --- maps over the patches ------------------------------------------------------------------------------------------


@given(st.sampled_from([(), ("cls",), ("cls", "dist"), NAMES, ("dist", "cls")]), st.integers(1, 3), st.integers(1, 3))
def test_class_and_patch_grids_equal_a_loop_over_the_patch_tokens(prefix, gh, gw):
    p = len(prefix)
    attention = torch.rand(2, 3, p + gh * gw, p + gh * gw, dtype=torch.float64).softmax(-1)
    received = torch.zeros(2, 3, gh, gw, dtype=torch.float64)
    for r, c in itertools.product(range(gh), range(gw)):
        key = p + r * gw + c
        received[..., r, c] = sum(attention[..., p + q, key] for q in range(gh * gw)) / (gh * gw)
    layout = TokenLayout(prefix, (gh, gw))
    torch.testing.assert_close(patch_attention_grid(attention, layout), received, rtol=1e-12, atol=0)
    if "cls" not in prefix:
        with pytest.raises(ValueError, match="this model has none"):
            class_attention_grid(attention, layout)
        return
    row = prefix.index("cls")
    expected = torch.zeros(2, 3, gh, gw, dtype=torch.float64)
    for r, c in itertools.product(range(gh), range(gw)):
        expected[..., r, c] = attention[..., row, p + r * gw + c]
    assert torch.equal(class_attention_grid(attention, layout), expected)


def test_prefix_share_is_each_prefix_tokens_mean_over_the_patch_queries():
    maps = random_maps(2, 2, 3, 4 + 9)
    share = prefix_token_share(maps, TokenLayout(NAMES, (3, 3)))
    assert share.shape == (2, 2, 3, 4)
    for t, _ in enumerate(NAMES):
        expected = sum(maps[..., q, t] for q in range(4, 13)) / 9
        torch.testing.assert_close(share[..., t], expected, rtol=1e-12, atol=0)
    # The registers are never read as patches: one class token and a 3x3 grid do not fit 13 tokens.
    with pytest.raises(ValueError, match=r"13 tokens do not fit the layout of 1 prefix tokens \('cls',\) and a 3x3"):
        prefix_token_share(maps, TokenLayout(("cls",), (3, 3)))


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
    layout = TokenLayout(NAMES, (2, 3))
    distance = mean_attention_distance(maps, layout, 5)
    torch.testing.assert_close(distance, weighted / mass, rtol=1e-12, atol=0)
    stats = head_statistics(maps, layout, 5)
    assert set(stats) == {"distance", "patch_mass", "entropy", "prefix_share"}
    assert stats["prefix_share"].shape == (2, 2, 3, 4)
    torch.testing.assert_close(stats["patch_mass"], 1 - stats["prefix_share"].sum(-1), rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match=r"10 tokens do not fit the layout of 1 prefix tokens \('cls',\) and a 2x3"):
        mean_attention_distance(maps, TokenLayout(("cls",), (2, 3)), 5)  # one class token does not fit 10 tokens


# --- token norms and position embeddings ------------------------------------------------------------------------


def test_token_norms_name_the_prefix_rows_and_lay_the_patches_on_the_grid():
    model = registers_vit()
    x = torch.rand(2, 3, 16, 16)
    result = token_norms(model, x)
    output, norms, layout = result
    assert torch.equal(output, model(x)) and result.norms is norms
    assert layout == TokenLayout(NAMES, (4, 4))
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
    handles = [b.attn.mha.attend.softmax.register_forward_hook(lambda m, a, out: seen.append(out))
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
    paths = write_report(model, x, tmp_path / "r", layer=0, arrays="full")
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == [
        "arrays.npz", "attention.png", "attention_distance.png", "decomposition.png", "embedding_filters.png",
        "methods.png", "patch_pca.png", "position_similarity.png", "prefix_share.png", "token_norms.png",
    ]  # fmt: skip
    assert set(paths) == {"arrays", "attention", "attention_distance", "decomposition", "embedding_filters",
                          "methods", "patch_pca", "position_similarity", "prefix_share", "token_norms"}  # fmt: skip
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
    layout = TokenLayout(NAMES, (4, 4))
    np.testing.assert_array_equal(arrays["prefix_share"], prefix_token_share(maps, layout).numpy())
    np.testing.assert_array_equal(arrays["token_norms"], token_norms(model, x).norms.numpy())
    np.testing.assert_allclose(
        arrays["mean_attention_distance"], mean_attention_distance(maps, layout, 4).numpy(), rtol=1e-6
    )
    np.testing.assert_array_equal(arrays["position_similarity"], model_position_similarity(model).numpy())


def test_a_plain_vits_report_keeps_its_arrays_and_adds_the_prefix_ones(tmp_path, unrendered):
    """The paper's ViT: one class token, and the arrays it always had still read row 0 over columns 1..N'."""
    model = tiny_vit(TINY_RGB16)
    x = torch.rand(2, 3, 16, 16)
    arrays = np.load(write_report(model, x, tmp_path / "r")["arrays"])
    _, maps, _ = record_attention(model, x)
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
    paths = write_report(model, x, tmp_path / "r", arrays="full")
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
    assert recorder.layout.grid == (6, 5) and recorder.maps.shape == (2, 1, 4, 4 + 30, 4 + 30)
    arrays = np.load(write_report(model, x, tmp_path / "r")["arrays"])
    expected = recorder.maps[-1][:, :, 0, 4:].reshape(1, 4, 6, 5)
    np.testing.assert_allclose(arrays["class_attention"], expected.numpy(), rtol=1e-6)
    assert arrays["dino_mask"].shape == (1, 4, 6, 5)


# --- the docs' examples on the families whose tokens differ -----------------------------------------------------------

FAMILIES = {  # the layouts the docs must hold for: two prefix tokens, five, none
    "deit_distilled": ({"distill_token": True}, ("cls", "dist")),
    "dinov2_registers": ({"register_tokens": 4, "pos_embed_prefix": False, "layer_scale": 1e-5},
                         ("cls", "reg1", "reg2", "reg3", "reg4")),  # fmt: skip
    "siglip": ({"class_token": False, "pool": "map"}, ()),
}


@pytest.mark.parametrize("family", FAMILIES)
def test_the_docs_inspect_examples_run_as_written_on_each_token_layout(family, unrendered, monkeypatch):
    """docs/attention.md's blocks that use vit_einops.inspect and docs/registers.md's token norms, run as written on
    a tiny model of each family in place of the page's ViT; their results against loops over the tokens with the
    prefix count written here, not read from the layout. The figures they save are made but not rendered (each file
    a stub): test_docs.py renders and checks the pages' own."""
    from matplotlib.figure import Figure
    from test_docs import blocks

    def stub(fig, fname, *args, **kwargs):
        if hasattr(fname, "write"):  # save_figure renders into memory, then writes the file atomically
            fname.write(b"png")
        else:
            Path(fname).write_bytes(b"png")

    monkeypatch.setattr(Figure, "savefig", stub)

    from vit_einops.images import sample_images
    from vit_einops.preprocess import Preprocessing

    overrides, names = FAMILIES[family]
    p = len(names)
    torch.manual_seed(0)
    # 56 px in 14 px patches, the size registers.md's blocks feed: a 4x4 grid, as TINY_RGB16's.
    model = tiny_vit(TINY_RGB16, image_size=56, patch_size=14, **overrides)
    model.preprocessing = Preprocessing.torchvision(crop=56)
    photos, titles = sample_images()
    photos[0].save("photo.png")
    images = torch.stack([model.transforms()(photo) for photo in photos])
    namespace = {"torch": torch, "model": model, "photos": photos, "names": titles, "images": images}
    root = Path(__file__).resolve().parent.parent
    pages = [(root / "docs" / "attention.md", "vit_einops.inspect"), (root / "docs" / "registers.md", "token_norms(")]
    for path, needle in pages:
        for line, source in blocks(path, "python"):
            if needle in source and "dino_view" not in source:
                exec(compile(source.replace("(with_registers, without)", "(model,)").replace(
                    '(("with registers", with_registers), ("without", without))', '(("model", model),)'
                ), f"{path.name}:{line}", "exec"), namespace)  # fmt: skip
    maps, layout = namespace["maps"], namespace["layout"]
    assert layout == TokenLayout(names, (4, 4)) and maps.shape == (2, 2, 4, p + 16, p + 16)
    cells = list(itertools.product(range(4), range(4)))
    weighted = torch.zeros(2, 4, dtype=torch.float64)
    mass = torch.zeros(2, 4, dtype=torch.float64)
    for (i, (r1, c1)), (j, (r2, c2)) in itertools.product(enumerate(cells), enumerate(cells)):
        a = maps[..., p + i, p + j].double().sum(dim=1)  # patch query i, patch key j, pooled over the images
        weighted += a * math.hypot(14 * (r1 - r2), 14 * (c1 - c2))
        mass += a
    torch.testing.assert_close(namespace["distance"].double(), weighted / mass, rtol=1e-5, atol=0)
    stats = namespace["stats"]
    expected_share = maps[..., p:, :p].mean(dim=-2)
    torch.testing.assert_close(stats["prefix_share"], expected_share, rtol=1e-6, atol=0)
    torch.testing.assert_close(stats["patch_mass"], maps[..., p:, p:].sum(-1).mean(-1), rtol=1e-5, atol=1e-7)
    assert namespace["relevance"].shape == (2, p + 16, p + 16)
    assert namespace["relevance5"].shape == (2, 5, p + 16, p + 16)
    assert namespace["rollout"].shape == (2, p + 16, p + 16)
    norms = namespace["norms"]
    assert norms.layout.prefix == names
    assert torch.equal(norms.patch_norms, norms.norms[..., p:].reshape(2, 2, 4, 4))
    heads = [ax for ax in namespace["fig"].get_axes() if "head" in ax.get_title()]
    assert len(heads) == 4  # show_attention: the class row, or without a class token the patches' mean
    with AttentionRecorder(model) as recorder:
        model(images)
    if "cls" in names:
        assert dino_view(recorder.maps, recorder.layout).mask.shape == (2, 4, 4, 4)
    else:
        with pytest.raises(ValueError, match=re.escape("use the mean over patch queries (patch_attention_grid)")):
            dino_view(recorder.maps, recorder.layout)
