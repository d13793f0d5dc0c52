"""The numbers the explorer shows beside the maps, where the model makes them awkward: heads that attend only to the
class token (their mean attention distance is undefined, and marked so), non-finite models (refused, with the
cause), a classifier that gives no gradient (relevance is the identity, and the payload says so), and strings that
would break out of the page's embedded JSON (the same JSON, written without the characters HTML or JS parse)."""

import itertools
import json
import math

import numpy as np
import pytest
import torch
from _tiny import TINY_RGB16, tiny_vit
from hypothesis import given, settings
from hypothesis import strategies as st
from test_explore import embedded

from vit_einops import TokenLayout
from vit_einops.explore import write_explorer
from vit_einops.explore.page import embed_json
from vit_einops.inspect import head_statistics, mean_attention_distance, record_attention

# Each blanked or broke the page while only "</" was escaped: "<!--" then "<script" and a space, "/" or ">" leave
# the HTML parser inside the data block past its "</script>".
HOSTILE = [
    "<!--<script>",
    "</script><script>window.pwned = 1</script>",
    "a\u2028b\u2029c",
    "&lt;&amp;",
    "x <!--<script y",
]


def class_sink(model, head=0):
    """Make ``head`` of layer 0 put its whole weight, exactly (float32 softmax underflows to 0), on the class token:
    the token's feature 0 is +10, every patch's -10, and the head's keys read feature 0 a thousand times over while
    its query is a constant."""
    dim = model.config.dim
    d = dim // model.config.heads
    with torch.no_grad():
        embed = model.patch_embed
        embed.proj.weight[0] = 0
        embed.proj.bias[0] = -10
        embed.pos_embed.weight[..., 0] = 0
        embed.cls_token.weight.zero_()
        embed.cls_token.weight[..., 0] = 10
        qkv = model.blocks[0].attn.mha.qkv
        q, k = slice(head * d, (head + 1) * d), slice(dim + head * d, dim + (head + 1) * d)
        qkv.weight[q] = 0
        qkv.bias[q] = 0
        qkv.bias[head * d] = 1
        qkv.weight[k] = 0
        qkv.bias[k] = 0
        qkv.weight[dim + head * d, 0] = 1000
    return model


def per_query_distance(maps: np.ndarray, gh: int, gw: int, ph: int, pw: int) -> np.ndarray:
    """The mean attention distance by loops (l, h): each patch query's weights over patch keys renormalised, their
    mean distance, averaged over queries and images weighted by the mass each query puts on patches; nan where no
    query puts any."""
    layers, images, heads, n, _ = maps.shape
    cells = list(itertools.product(range(gh), range(gw)))
    out = np.full((layers, heads), np.nan)
    for layer, head in itertools.product(range(layers), range(heads)):
        total = weight = 0.0
        for b, i in itertools.product(range(images), range(1, n)):
            mass = maps[layer, b, head, i, 1:].sum()
            if mass == 0:
                continue
            (r1, c1) = cells[i - 1]
            mean = sum(
                maps[layer, b, head, i, j] / mass * math.hypot((r1 - r2) * ph, (c1 - c2) * pw)
                for j, (r2, c2) in enumerate(cells, start=1)
            )
            total += mass * mean
            weight += mass
        if weight > 0:
            out[layer, head] = total / weight
    return out


@st.composite
def attention_maps(draw):
    """Softmax rows (l, b, h, n, n) on a small grid; some queries, and some whole heads, on the class token only."""
    gh, gw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    layers, images, heads, n = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(1, 3)), gh * gw + 1
    seed = draw(st.integers(0, 2**16))
    generator = torch.Generator().manual_seed(seed)
    maps = torch.randn(layers, images, heads, n, n, generator=generator, dtype=torch.float64).mul(3).softmax(-1)
    sink_rows = torch.rand(layers, images, heads, n, generator=generator) < draw(st.sampled_from([0.0, 0.3, 1.0]))
    sink_heads = torch.rand(layers, 1, heads, 1, generator=generator) < 0.4
    one_hot = torch.zeros(n, dtype=torch.float64)
    one_hot[0] = 1
    maps = torch.where((sink_rows | sink_heads)[..., None], one_hot, maps)
    return maps, (gh, gw), (draw(st.integers(1, 4)), draw(st.integers(1, 4)))


@settings(max_examples=25, deadline=None)
@given(attention_maps())
def test_mean_distance_matches_a_per_query_computation_and_is_nan_only_without_patch_attention(case):
    maps, (gh, gw), (ph, pw) = case
    expected = per_query_distance(maps.numpy(), gh, gw, ph, pw)
    layout = TokenLayout(("cls",), (gh, gw))
    got = mean_attention_distance(maps, layout, (ph, pw)).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)  # nan in the same places
    stats = head_statistics(maps, layout, (ph, pw))
    for b in range(maps.shape[1]):
        one = per_query_distance(maps[:, b : b + 1].numpy(), gh, gw, ph, pw)
        np.testing.assert_allclose(stats["distance"][:, b].numpy(), one, rtol=1e-10, atol=1e-12)
    mass = maps[..., 1:, 1:].sum(-1).mean(-1)
    torch.testing.assert_close(stats["patch_mass"], mass, rtol=1e-12, atol=1e-15)
    assert torch.equal(stats["distance"].isnan(), stats["patch_mass"] == 0)
    for key in ("entropy", "prefix_share"):
        assert torch.isfinite(stats[key]).all()


def test_a_head_on_the_class_token_alone_has_patch_mass_0_no_distance_and_finite_other_statistics():
    torch.manual_seed(0)
    model = class_sink(tiny_vit(TINY_RGB16))
    _, maps, layout = record_attention(model, torch.rand(2, 3, 16, 16))
    assert torch.equal(maps[0, :, 0, :, 0], torch.ones(2, 17))  # exactly: the patches get 0.0
    stats = head_statistics(maps, layout, 4)
    assert stats["distance"][0, :, 0].isnan().all() and torch.equal(stats["patch_mass"][0, :, 0], torch.zeros(2))
    assert torch.equal(stats["entropy"][0, :, 0], torch.zeros(2))
    assert torch.equal(stats["prefix_share"][0, :, 0, layout.index("cls")], torch.ones(2))
    others = torch.ones_like(stats["distance"], dtype=torch.bool)
    others[0, :, 0] = False
    assert torch.isfinite(stats["distance"][others]).all() and (stats["patch_mass"][others] > 0.5).all()
    pooled = mean_attention_distance(maps, layout, 4)
    assert pooled[0, 0].isnan() and torch.isfinite(pooled.flatten()[1:]).all()


def test_the_page_marks_the_class_sink_heads_distance_as_null_beside_its_patch_mass(tmp_path):
    torch.manual_seed(0)
    model = class_sink(tiny_vit(TINY_RGB16))
    images = torch.rand(2, 3, 16, 16)
    data = embedded(write_explorer(model, images, tmp_path / "e.html"))
    _, maps, layout = record_attention(model, images)
    stats = head_statistics(maps.double(), layout, 4)
    for i, image in enumerate(data["panes"][0]["images"]):
        distance, mass = np.array(image["stats"]["distance"], dtype=float), np.array(image["stats"]["patch_mass"])
        assert np.isnan(distance[0, 0]) and mass[0, 0] == 0  # null in the JSON
        assert np.isfinite(np.delete(distance.ravel(), 0)).all()
        np.testing.assert_allclose(distance, stats["distance"][:, i].numpy(), atol=5e-7, rtol=0)
        np.testing.assert_allclose(mass, stats["patch_mass"][:, i].numpy(), atol=5e-7, rtol=0)


@pytest.mark.parametrize(
    "where, value, message",
    [
        ("blocks.0.attn.mha.qkv.weight", float("nan"), r"the model's logits hold \d+ non-finite values"),
        ("head.fc.weight", float("inf"), r"the model's logits hold \d+ non-finite values"),
        ("blocks.1.mlp.ff.fc2.weight", 1e38, r"non-finite values .*check the model's weights"),
    ],
)
def test_a_non_finite_model_is_refused_with_the_cause_and_nothing_is_written(tmp_path, where, value, message):
    model = tiny_vit(TINY_RGB16)
    with torch.no_grad():
        model.get_parameter(where).fill_(value)
    with pytest.raises(ValueError, match=message):
        write_explorer(model, torch.rand(1, 3, 16, 16), tmp_path / "e.html")
    assert list(tmp_path.iterdir()) == []


def test_relevance_is_flagged_as_the_identity_when_the_classifier_gives_no_gradient(tmp_path):
    model = tiny_vit(TINY_RGB16)
    trained = embedded(write_explorer(model, torch.rand(1, 3, 16, 16), tmp_path / "a.html"))
    assert [c["relevance_identity"] for c in trained["panes"][0]["images"][0]["top"]] == [False] * 5
    model.reset_classifier(5)  # the paper's zero-initialised head: every logit is 0, whatever the attention
    fresh = embedded(write_explorer(model, torch.rand(1, 3, 16, 16), tmp_path / "b.html"))
    assert [c["relevance_identity"] for c in fresh["panes"][0]["images"][0]["top"]] == [True] * 5


@settings(max_examples=30, deadline=None)
@given(st.lists(st.sampled_from(HOSTILE) | st.text(max_size=12), min_size=1, max_size=4))
def test_embedded_json_is_the_same_json_without_characters_html_or_js_would_parse(strings):
    payload = {"names": strings, "nested": {"<k>&": strings[0]}, "n": [1, 2.5, None]}
    text = embed_json(payload)
    assert json.loads(text) == payload
    assert not set(text) & {"<", ">", "&", "\u2028", "\u2029"}


def test_a_non_finite_number_in_the_payload_is_named():
    with pytest.raises(ValueError, match=r"non-finite number \(nan or inf\) where a value was expected"):
        embed_json({"x": [1.0, float("nan")]})
