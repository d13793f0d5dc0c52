"""The explorer on models with tokens before the patches, DINO's mask, and two models side by side: the payload's
prefix shares, statistics and masks are those an independent computation of the recorded attention gives, each
pane is its own model's, and `vit-einops explore A B` refuses what it cannot show with one line."""

import hashlib

import numpy as np
import pytest
import torch
from _hostile import run_cli
from _tiny import TINY_DIGITS, TINY_RGB, TINY_RGB16, tiny_vit
from PIL import Image
from test_explore import decode, embedded
from test_explore_stats import class_sink, per_query_distance

from vit_einops import TokenLayout
from vit_einops.explore import write_explorer
from vit_einops.explore.payload import dino_pane
from vit_einops.inspect import dino_mask, dino_view, patch_feature_pca, record_attention, token_norms
from vit_einops.modelfile import save_vit
from vit_einops.preprocess import Preprocessing

# fam-common's test model with registers: 32 px in 8 px patches (a 4x4 grid), 4 registers, positions for the
# patches only: 1 + 4 prefix tokens, 21 tokens.
REGISTERS = dict(register_tokens=4, layer_scale=1e-5, pos_embed_prefix=False)
PREFIX = ["cls", "reg1", "reg2", "reg3", "reg4"]


def register_vit(**overrides):
    return tiny_vit(TINY_RGB, dim=32, heads=2, mlp_dim=64, **REGISTERS, **overrides)


def loop_mask(row: np.ndarray, keep: float = 0.6) -> np.ndarray:
    """DINO's mask by a loop: the patches taken highest first while the mass taken so far is below ``keep``."""
    share = row / row.sum()
    mask = np.zeros(len(row), dtype=bool)
    taken = 0.0
    for p in np.argsort(-share, kind="stable"):
        if taken >= keep:
            break
        mask[p] = True
        taken += share[p]
    return mask


def check_minimal_mask(row: np.ndarray, mask: np.ndarray, keep: float = 0.6) -> None:
    """The mask holds at least ``keep`` of the row's mass, its highest patches, and no fewer would do."""
    share = row / row.sum()
    assert share[mask].sum() >= keep
    assert share[mask].min() >= share[~mask].max(initial=0)
    assert share[mask].sum() - share[mask].min() < keep


def test_register_model_payload_shares_statistics_and_dino_masks_are_the_recorded_attentions(tmp_path):
    torch.manual_seed(0)
    model = register_vit()
    images = torch.rand(2, 3, 32, 32)
    [pane] = embedded(write_explorer(model, images, tmp_path / "e.html", top_k=1))["panes"]
    _, maps, _ = record_attention(model, images)
    maps = maps.double().numpy()  # (l, b, h, 21, 21)
    _, norms, _ = token_norms(model, images)
    assert (pane["layout"], pane["input_size"]) == ({"prefix": PREFIX, "grid": [4, 4]}, [32, 32])
    for i, image in enumerate(pane["images"]):
        stats = {key: np.array(value, dtype=float) for key, value in image["stats"].items()}
        shares = maps[:, i, :, 5:, :5].mean(axis=-2)  # (l, h, 5): patch queries' mass on each prefix token
        mass = maps[:, i, :, 5:, 5:].sum(axis=-1).mean(axis=-1)
        np.testing.assert_allclose(stats["prefix_share"], shares, atol=5e-7, rtol=0)
        np.testing.assert_allclose(stats["patch_mass"], mass, atol=5e-7, rtol=0)
        np.testing.assert_allclose(stats["prefix_share"].sum(-1) + stats["patch_mass"], 1, atol=5e-6, rtol=0)
        # Distance over patches only: the loop of test_explore_stats, on the block after the first four prefix
        # tokens (it reads keys and queries from index 1, skipping the one token left before the patches).
        distance = per_query_distance(maps[:, i : i + 1, :, 4:, 4:], 4, 4, 8, 8)
        np.testing.assert_allclose(stats["distance"], distance, atol=5e-7, rtol=0)
        entropy = -(maps[:, i] * np.log(maps[:, i])).sum(-1).mean(-1)
        np.testing.assert_allclose(stats["entropy"], entropy, atol=5e-7, rtol=0)
        np.testing.assert_allclose(stats["norms"], norms[:, i].numpy(), atol=5e-5 + 1e-6, rtol=0)
        assert stats["norms"].shape == (2, 21)
        # DINO: the last layer's class-token row over the 16 patches, per head, then the mean of heads.
        rows = maps[-1, i, :, 0, 5:]
        rows = np.concatenate([rows, rows.mean(0, keepdims=True)])
        masks = np.array(image["dino"]["masks"], dtype=bool)
        assert masks.shape == (3, 16)
        for head, (row, mask) in enumerate(zip(rows, masks, strict=True)):
            assert np.array_equal(mask, loop_mask(row)), head
            check_minimal_mask(row, mask)
            assert image["dino"]["kept"][head] == pytest.approx((row / row.sum())[mask].sum(), abs=5e-7)
        codes = decode(image["attention"], np.uint8, (2, 2, 21, 21))
        assert codes.shape[-1] == 21  # every token's column is stored: the page lists the prefix ones apart


def test_dino_pane_is_none_where_the_study_has_no_dino_view():
    """The study holds no DINO view for a model without a class token (its pane in
    test_siglip_and_deit_panes_name_their_tokens_and_only_deit_has_a_dino_view); the pane then has none either."""
    maps = torch.rand(2, 1, 2, 5, 5).softmax(-1)
    assert dino_pane(None) is None
    assert dino_pane(dino_view(maps, TokenLayout(("cls",), (2, 2))))["masks"].shape == (1, 3, 4)


def test_dino_pane_keeps_the_heads_masks_of_inspects_dino_view_and_the_mean_of_heads():
    torch.manual_seed(0)
    maps, layout = torch.rand(2, 3, 2, 6, 6).softmax(-1), TokenLayout(("cls", "reg1"), (2, 2))
    view = dino_view(maps, layout)
    pane = dino_pane(view)
    assert torch.equal(pane["masks"][:, :2], view.mask.flatten(-2))
    assert torch.equal(pane["masks"][:, 2], dino_mask(view.attention.double().mean(1).flatten(-2)))


def test_a_class_token_reading_only_itself_has_no_dino_mask(tmp_path):
    torch.manual_seed(0)
    model = class_sink(tiny_vit(TINY_RGB16, depth=1, heads=2))  # the last layer's head 0 reads the class token alone
    [pane] = embedded(write_explorer(model, torch.rand(1, 3, 16, 16), tmp_path / "e.html", top_k=1))["panes"]
    dino = pane["images"][0]["dino"]
    assert dino["masks"][0] == [0] * 16 and dino["kept"][0] is None  # head 0: no mass on the patches to split
    assert sum(dino["masks"][1]) > 0 and dino["kept"][1] >= 0.6  # head 1, and the mean of heads, have masks
    assert sum(dino["masks"][2]) > 0 and dino["kept"][2] >= 0.6


def test_two_models_side_by_side_are_each_their_own_models(tmp_path):
    torch.manual_seed(0)
    registers = register_vit()
    plain = tiny_vit(TINY_RGB, patch_size=16, depth=3)  # a 2x2 grid, 3 layers of 4 heads, the class token alone
    images = torch.rand(2, 3, 32, 32)
    hostile = "</script><b>reg</b>"
    page = write_explorer(
        [registers, plain], images, tmp_path / "e.html", names=[hostile, "plain"], titles=["x", "y"], top_k=1
    )
    assert page.read_text(encoding="utf-8").count("</script>") == 2
    data = embedded(page)
    assert data["titles"] == ["x", "y"] and [pane["name"] for pane in data["panes"]] == [hostile, "plain"]
    a, b = data["panes"]
    assert (a["depth"], a["heads"], a["layout"]) == (2, 2, {"prefix": PREFIX, "grid": [4, 4]})
    assert (b["depth"], b["heads"], b["layout"]) == (3, 4, {"prefix": ["cls"], "grid": [2, 2]})
    for pane, model in ((a, registers), (b, plain)):
        _, maps, layout = record_attention(model, images)
        for i, image in enumerate(pane["images"]):
            rowmax = decode(image["attention_rowmax"], np.float32, (pane["depth"], pane["heads"], layout.num_tokens))
            assert np.array_equal(rowmax, maps[:, i].double().numpy().max(-1).astype(np.float32))
            assert len(image["dino"]["masks"][0]) == layout.num_patches


def test_each_pane_carries_its_own_models_patch_pca_as_uint8(tmp_path):
    """Side by side, each pane's PCA colours are its own model's joint fit over the page's images, stored as
    round(255 c): exactly those codes, each within 1/510 of the colour."""
    torch.manual_seed(0)
    models = [register_vit(), tiny_vit(TINY_RGB, patch_size=16, depth=3)]
    images = torch.rand(2, 3, 32, 32)
    panes = embedded(write_explorer(models, images, tmp_path / "e.html", top_k=1))["panes"]
    for pane, model in zip(panes, models, strict=True):
        pca = patch_feature_pca(model, images)
        rgb = pca.rgb.numpy()  # (b, gh, gw, 3) in [0, 1]
        assert pane["pca_explained"] == pytest.approx(pca.explained_variance_ratio.tolist(), abs=1e-6)
        for i, image in enumerate(pane["images"]):
            codes = decode_png(image["pca"])
            assert codes.dtype == np.uint8 and codes.shape == (*pane["layout"]["grid"], 3)
            assert np.array_equal(codes, np.rint(rgb[i] * 255).astype(np.uint8))
            assert np.abs(codes / 255 - rgb[i]).max() <= 1 / 510 + 1e-12
        # min-max scaled over both images together: each channel reaches 0 and 255 somewhere
        stacked = np.stack([decode_png(image["pca"]) for image in pane["images"]])
        assert (stacked.min(axis=(0, 1, 2)) == 0).all() and (stacked.max(axis=(0, 1, 2)) == 255).all()


def test_bad_model_lists_are_named(tmp_path):
    model, images = tiny_vit(TINY_RGB), torch.rand(1, 3, 32, 32)
    with pytest.raises(ValueError, match="one model or two side by side, got 3"):
        write_explorer([model] * 3, images, tmp_path / "e.html")
    with pytest.raises(ValueError, match="got 1 names for 2 models"):
        write_explorer([model, model], images, tmp_path / "e.html", names=["a"])
    with pytest.raises(ValueError, match=r"each names its classes itself \(model.class_names\)"):
        write_explorer([model, model], images, tmp_path / "e.html", class_names=["a"] * 5)
    with pytest.raises(TypeError, match="a model's name must be a str, got int"):
        write_explorer(model, images, tmp_path / "e.html", names=[3])
    assert list(tmp_path.iterdir()) == []


# --- the command ------------------------------------------------------------------------------------------------


def model_files(tmp_path, photo_name="photo.png"):
    """reg.safetensors (DINOv2 with registers' layout: 4x4 grid, 2 layers of 2 heads), plain.safetensors (DINOv2
    without registers': LayerScale, E_pos over the class token; 2x2 grid, 3 layers of 4 heads, resizing to 32 px but
    normalised otherwise) and grey.safetensors (a 1-channel digits-sized model), with a 48x64 photo."""
    registers = register_vit()
    registers.preprocessing = Preprocessing.plain(32)
    plain = tiny_vit(TINY_RGB, patch_size=16, depth=3, layer_scale=1e-5)
    plain.preprocessing = Preprocessing(resize=(32, 32), mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))
    grey = tiny_vit(TINY_DIGITS)
    grey.preprocessing = Preprocessing.plain(8, channels=1)
    photo = tmp_path / photo_name
    Image.fromarray(np.arange(48 * 64 * 3, dtype=np.uint8).reshape(48, 64, 3)).save(photo)
    files = {
        name: save_vit(model, tmp_path / f"{name}.safetensors")
        for name, model in (("reg", registers), ("plain", plain), ("grey", grey))
    }
    return files, photo


def digests(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_explore_two_model_files_on_one_photo(tmp_path):
    files, photo = model_files(tmp_path)
    out = tmp_path / "x.html"
    result = run_cli("explore", files["reg"], files["plain"], "--image", photo, "--out", out, "--top-k", "1")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"explorer: {out} (") and "1 images, 2 models side by side)" in result.stdout
    data = embedded(out)
    assert data["titles"] == ["photo.png"]
    assert [(p["name"], p["layout"]) for p in data["panes"]] == [
        ("reg.safetensors", {"prefix": PREFIX, "grid": [4, 4]}),
        ("plain.safetensors", {"prefix": ["cls"], "grid": [2, 2]}),
    ]
    # Each pane shows the photo as its own model saw it: the same resize, normalisation undone.
    seen = np.asarray(Image.open(photo).resize((32, 32), Image.Resampling.BILINEAR))
    for pane in data["panes"]:
        assert np.array_equal(decode_png(pane["images"][0]["png"]), seen)


def decode_png(text):
    import base64
    import io

    return np.asarray(Image.open(io.BytesIO(base64.b64decode(text))))


def test_explore_one_file_twice_and_models_of_other_channels(tmp_path):
    files, photo = model_files(tmp_path)
    out = tmp_path / "same.html"
    # --top-k 1 here and below: one relevance map (one backward pass) per model keeps the test fast.
    result = run_cli("explore", files["reg"], files["reg"], "--image", photo, "--out", out, "--top-k", "1")
    assert result.returncode == 0, result.stderr
    a, b = embedded(out)["panes"]
    assert a == b and a["name"] == "reg.safetensors"
    # A grey model beside an RGB one: each reads the photo in its own mode and size.
    out = tmp_path / "grey.html"
    result = run_cli("explore", files["grey"], files["reg"], "--image", photo, "--out", out, "--top-k", "1")
    assert result.returncode == 0, result.stderr
    grey, rgb = embedded(out)["panes"]
    assert (grey["in_channels"], rgb["in_channels"]) == (1, 3)
    assert decode_png(grey["images"][0]["png"]).shape == (8, 8)
    assert decode_png(rgb["images"][0]["png"]).shape == (32, 32, 3)


@pytest.mark.parametrize("case", ["out is model A", "out is model B", "out is the image", "three models", "defaults"])
def test_explore_refuses_with_one_line_and_writes_nothing(tmp_path, case):
    files, photo = model_files(tmp_path)
    before = digests(tmp_path)
    args, message = {
        "out is model A": (
            [files["reg"], files["plain"], "--image", photo, "--out", files["reg"], "--force"],
            f"the output {files['reg']} is the input {files['reg']}; refused even with --force: write elsewhere",
        ),
        "out is model B": (
            [files["reg"], files["plain"], "--image", photo, "--out", files["plain"], "--force"],
            f"the output {files['plain']} is the input {files['plain']}; refused even with --force: write elsewhere",
        ),
        "out is the image": (
            [files["reg"], files["plain"], "--image", photo, "--out", photo, "--force"],
            f"the output {photo} is the input {photo}; refused even with --force: write elsewhere",
        ),
        "three models": (
            [files["reg"], files["plain"], files["reg"], "--out", tmp_path / "x.html"],
            "explore shows one MODEL or two side by side, got 3",
        ),
        "defaults": (
            [files["grey"], files["reg"], "--out", tmp_path / "x.html"],
            f"{files['grey']} and {files['reg']} have different default images (test digits for a digits model, "
            "sample photos otherwise): give --image FILE or --images DIR to explore both on the same images",
        ),
    }[case]
    result = run_cli("explore", *args)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith(f"vit-einops explore: error: {message}") and result.stderr.count("\n") == 1
    assert digests(tmp_path) == before


def test_siglip_and_deit_panes_name_their_tokens_and_only_deit_has_a_dino_view(tmp_path):
    """SigLIP's layout (no class token, attention pooling) beside a distilled DeiT's with another patch size: each
    pane's prefix tokens, grid and DINO view are its own, and the pooling head's attention is not among the
    encoder's layers."""
    torch.manual_seed(0)
    siglip = tiny_vit(TINY_RGB, dim=32, heads=2, mlp_dim=64, class_token=False, pool="map")
    deit = tiny_vit(TINY_RGB, dim=32, heads=2, mlp_dim=64, patch_size=4, distill_token=True)
    images = torch.rand(1, 3, 32, 32)
    page = embedded(
        write_explorer([siglip, deit], images, tmp_path / "e.html", top_k=1, names=["s", "d"], preprocessed=True)
    )
    first, second = page["panes"]
    assert (first["layout"], first["depth"]) == ({"prefix": [], "grid": [4, 4]}, 2)
    assert first["images"][0]["dino"] is None
    assert second["layout"] == {"prefix": ["cls", "dist"], "grid": [8, 8]}
    _, maps, layout = record_attention(deit, images, preprocessed=True)
    view = dino_pane(dino_view(maps.double(), layout))
    assert second["images"][0]["dino"]["masks"] == view["masks"][0].int().tolist()
    share = second["images"][0]["stats"]["prefix_share"]  # (l, h, 2): cls and dist columns over patch queries
    expected = maps[..., 2:, :2].double().mean(-2)[:, 0]
    np.testing.assert_allclose(np.array(share), expected.numpy(), atol=1e-6)
