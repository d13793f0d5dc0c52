"""`vit-einops inspect MODEL`: any model form, images of any mode, no training data, --layer, and its outputs."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from _interop import perturbed
from _tiny import TINY_RGB, tiny_vit
from PIL import Image

from vit_einops import Preprocessing
from vit_einops.commands.cli import main
from vit_einops.inspect import attention_rollout, explain
from vit_einops.interop import save_state_dict_file, to_timm, to_torchvision
from vit_einops.modelfile import load_vit, save_vit

PNG = b"\x89PNG\r\n\x1a\n"


def inspected_model(**options):
    """The interop tests' RGB model, smaller where the figures draw a panel each: 2 heads (per image), a 2x2 grid
    of positions and 16 embedding filters (dim 16) keep every figure at a third of TINY_RGB's drawing time."""
    return perturbed(tiny_vit(TINY_RGB, image_size=16, heads=2, dim=16, mlp_dim=32, **options))


@pytest.fixture
def files(tmp_path):
    rng = np.random.default_rng(0)
    rgb = Image.fromarray(rng.integers(0, 256, (45, 61, 3), dtype=np.uint8))
    rgb.save(tmp_path / "photo.jpg")
    rgb.convert("RGBA").save(tmp_path / "rgba.png")
    rgb.convert("P").save(tmp_path / "palette.png")
    Image.fromarray(rng.integers(0, 65536, (40, 40), dtype=np.uint16)).save(tmp_path / "deep.png")
    return [str(tmp_path / n) for n in ("photo.jpg", "rgba.png", "palette.png", "deep.png")]


def test_inspect_a_converted_file_with_images_of_several_modes(tmp_path, files, capsys, rendered_only):
    """A torchvision file and a timm file of the same model convert to the same weights (so one inspect covers
    both), then inspect reads images of four modes."""
    rendered_only("attention", "attention_distance", "position_similarity", "embedding_filters")  # checked below
    model = inspected_model()
    for source, export in (("timm", to_timm), ("torchvision", to_torchvision)):  # the torchvision one is inspected
        save_state_dict_file(export(model), tmp_path / f"{source}.pth")
        src, dst = str(tmp_path / f"{source}.pth"), str(tmp_path / "m.safetensors")
        args = ["convert", src, dst, "--from", source, "--heads", "2"]
        assert main([*args, "--force"]) == 0
        converted = load_vit(tmp_path / "m.safetensors")
        assert all(torch.equal(a, b) for a, b in zip(converted.state_dict().values(), model.state_dict().values()))
    images = sum((["--image", f] for f in files), [])
    assert main(["inspect", str(tmp_path / "m.safetensors"), *images, "--layer", "0", "--arrays", "full"]) == 0
    out = Path("m-inspect")  # the default: in the current directory, not beside the model file
    for name in ("attention", "attention_distance", "position_similarity", "embedding_filters"):
        assert (out / f"{name}.png").read_bytes()[:8] == PNG
    arrays = np.load(out / "arrays.npz")
    assert arrays["attention"].shape == (2, 4, 2, 5, 5)  # (layers, images, heads, n, n)
    assert arrays["images"].shape == (4, 3, 16, 16)
    # The drawn heads are layer 0's: the class token's row over the patches, as recorded.
    assert np.allclose(arrays["class_attention"], arrays["attention"][0][:, :, 0, 1:].reshape(4, 2, 2, 2), atol=1e-6)


def test_default_photos_for_a_register_model_not_trained_on_digits(tmp_path, capsys, default_ig_steps, rendered_only):
    """DINOv2's layout (registers, E_pos on the patches only): the report names the prefix tokens, draws the
    class token's attention over the patches alone, and adds the prefix-token, token-norm, DINO and methods
    figures, each method with the parameters the flags chose (the attention figure's rollout too) and every other
    method with its published defaults."""
    rendered_only("prefix_share", "token_norms")  # the two PNGs checked below; every other figure is still made
    model = inspected_model(register_tokens=3, layer_scale=1e-5, pos_embed_prefix=False)
    model.preprocessing = Preprocessing.timm(crop=16)
    save_vit(model, tmp_path / "m.safetensors")
    flags = ["--rollout-fusion", "max", "--discard-ratio", "0.5", "--start-layer", "1"]
    flags += ["--arrays", "full"]  # the recorded maps, checked against the rollout below
    assert main(["inspect", str(tmp_path / "m.safetensors"), "--out", str(tmp_path / "out"), *flags]) == 0
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == [
        "arrays.npz", "attention.png", "attention_distance.png", "decomposition.png", "embedding_filters.png",
        "methods.png", "patch_pca.png", "position_similarity.png", "prefix_share.png", "token_norms.png",
    ]  # fmt: skip
    arrays = np.load(out / "arrays.npz")
    assert arrays["method_labels"].tolist() == [
        "attention", "rollout (residual 0.5, head_fusion max, discard_ratio 0.5)",
        "gradient-rollout (discard_ratio 0.5)", "relevance (start_layer 1)", "grad-cam (layer -1)",
        "integrated-gradients (baseline black, steps 50, quadrature gausslegendre)",
        "attnlrp (patch_gamma 0.25, linear_gamma 0.1, stabilizer 1e-06)",
        "cp-lrp (patch_gamma 0.25, linear_gamma 0.1, stabilizer 1e-06)", "decomposition", "random (seed 0)",
    ]  # fmt: skip
    images = torch.from_numpy(arrays["images"])
    for name, params in (("rollout", dict(head_fusion="max", discard_ratio=0.5)), ("relevance", dict(start_layer=1))):
        expected = explain(model, images, name, preprocessed=True, **params)
        np.testing.assert_allclose(arrays[f"method_{name}"], expected.numpy(), rtol=1e-5, atol=1e-7)
    kept = arrays["prefix_tokens"].tolist().index("cls")  # the class token's own entry is never discarded
    rollout = attention_rollout(torch.from_numpy(arrays["attention"]), head_fusion="max", discard_ratio=0.5, kept=kept)
    np.testing.assert_allclose(arrays["rollout"], rollout.numpy(), rtol=1e-5, atol=1e-7)
    for name in ("prefix_share", "token_norms"):
        assert (out / f"{name}.png").read_bytes()[:8] == PNG
    assert arrays["images"].shape == (2, 3, 16, 16)  # scikit-learn's two photos
    assert arrays["prefix_tokens"].tolist() == ["cls", "reg1", "reg2", "reg3"]
    assert arrays["attention"].shape == (2, 2, 2, 8, 8)  # (layers, images, heads, 4 prefix + 4 patches, ...)
    last = arrays["attention"][-1][:, :, 0, 4:].reshape(2, 2, 2, 2)  # the class row over the patches
    np.testing.assert_allclose(arrays["class_attention"], last, atol=1e-6)
    np.testing.assert_allclose(arrays["dino_attention"], last, atol=1e-6)


def test_existing_output_layer_range_and_missing_preprocessing(tmp_path, files, capsys, rendered_only):
    rendered_only("attention")  # the one PNG checked below
    save_vit(inspected_model(), tmp_path / "bare.safetensors")
    base = ["inspect", str(tmp_path / "bare.safetensors"), "--image", files[0]]
    assert main(base) == 2
    assert "records no preprocessing; set one" in capsys.readouterr().err
    assert main([*base, "--preprocessing", "timm", "--layer", "5"]) == 2
    assert re.search(r"--layer 5 .*2 layers", capsys.readouterr().err)
    assert main([*base, "--preprocessing", "timm", "--discard-ratio", "1.5"]) == 2
    assert "discard_ratio must be in [0, 1), got 1.5" in capsys.readouterr().err
    out = tmp_path / "out"
    out.mkdir()
    (out / "attention.png").write_bytes(b"mine")
    args = [*base, "--preprocessing", "timm", "--out", str(out)]
    assert main(args) == 2
    assert f"{out} already holds attention.png; pass --force to replace them" in capsys.readouterr().err
    assert (out / "attention.png").read_bytes() == b"mine"
    assert main([*args, "--force"]) == 0
    assert (out / "attention.png").read_bytes()[:8] == PNG
