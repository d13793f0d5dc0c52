"""Against Hugging Face transformers, and the three libraries' preprocessing.

- ``load_hf`` reproduces ``ViTForImageClassification`` / ``ViTModel`` outputs and ``output_attentions=True`` maps
  (eager attention), and ``save_hf`` writes a directory ``from_pretrained`` loads, round-tripping bit for bit.
- ``Preprocessing`` reproduces torchvision's ``ViT_B_16_Weights.IMAGENET1K_V1.transforms()``, timm's
  ``create_transform(**resolve_data_config({}, model=m))`` for an augreg ViT, and transformers' ``ViTImageProcessor``,
  on scikit-learn's two photos and generated images of odd sizes and modes (max |difference| <= 1e-6).

These libraries need torch 2.14.1 here, so the module runs in .ci/run-interop's venv and skips elsewhere with that
reason (VIT_EINOPS_REQUIRE_INTEROP=1 makes a missing library a failure).

Tolerances: logits and attention maps, float32, max |difference| < 1e-5 (the issue's bound; HF and we sum in
different orders, measured ~1e-6); float64 configs at 1e-10.
"""

from __future__ import annotations

import importlib
import json
import os

import numpy as np
import pytest
import torch
from _interop import assert_same_state, perturbed, report_diffs
from _tiny import TINY_RGB, tiny_vit
from PIL import Image

from vit_einops.images import open_image
from vit_einops.inspect import record_attention
from vit_einops.interop import load_hf, preprocessing_from_hf, save_hf
from vit_einops.preprocess import Preprocessing

REASON = "{} is not installed: it needs torch 2.14.1; .ci/run-interop runs these tests in a venv of their own"


def _library(name: str):
    if os.environ.get("VIT_EINOPS_REQUIRE_INTEROP") == "1":
        return importlib.import_module(name)
    return pytest.importorskip(name, reason=REASON.format(name))


transformers = _library("transformers")
torchvision = _library("torchvision")
timm = _library("timm")
sklearn_datasets = _library("sklearn.datasets")

# transformers.ViTConfig's names for our fields.
HF_NAMES = {
    "dim": "hidden_size", "depth": "num_hidden_layers", "heads": "num_attention_heads",
    "mlp_dim": "intermediate_size", "image_size": "image_size", "patch_size": "patch_size",
}  # fmt: skip
# The Hugging Face models built here: TINY_RGB's size (its classes are each test's num_labels).
SMALL = {hf: TINY_RGB[ours] for ours, hf in HF_NAMES.items()}


def _report(name: str, value: float) -> None:
    """Record a measured max difference in the interop report (run-interop prints it)."""
    report_diffs({name: value})


def _hf_model(cls_name: str, **kw):
    config = transformers.ViTConfig(**{**SMALL, **kw})
    model = getattr(transformers, cls_name)(config, **({"add_pooling_layer": True} if cls_name == "ViTModel" else {}))
    return perturbed(model)


def _save(model, path) -> str:
    model.save_pretrained(path)
    return str(path)


@pytest.mark.parametrize("labels", [None, ["cat", "dog", "fish"]])
def test_classifier_logits_and_attentions_match(tmp_path, labels):
    kw = {"num_labels": 3}
    if labels:
        kw |= {"id2label": dict(enumerate(labels)), "label2id": {n: i for i, n in enumerate(labels)}}
    hf = _hf_model("ViTForImageClassification", attn_implementation="eager", **kw)
    ours = load_hf(_save(hf, tmp_path / "hf")).eval()
    assert ours.config.layer_norm_eps == 1e-12 and ours.config.heads == 4 and ours.config.num_classes == 3
    assert ours.class_names == labels  # LABEL_0.. placeholders are no names
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        out = hf(pixel_values=x, output_attentions=True)
        logits, maps, _ = record_attention(ours, x, preprocessed=True)  # maps: (layers, b, h, n, n)
    assert (logits - out.logits).abs().max() < 1e-5
    ref = torch.stack(out.attentions)  # HF: one (b, h, n, n) per layer
    assert maps.shape == ref.shape
    assert (maps - ref).abs().max() < 1e-5
    _report("hf ViTForImageClassification logits, float32", (logits - out.logits).abs().max().item())
    _report("hf attentions (every layer and head), float32", (maps - ref).abs().max().item())


@pytest.mark.parametrize("impl", ["einsum", "chunked", "sdpa"])
def test_vitmodel_pooler_output_matches_float64(tmp_path, impl):
    hf = _hf_model("ViTModel").double()
    ours = load_hf(_save(hf, tmp_path / "hf"), dtype=torch.float64, attn_impl=impl).eval()
    assert ours.config.num_classes == 0 and ours.config.representation_size == 48
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    with torch.no_grad():
        expected = hf(pixel_values=x).pooler_output
        got = ours(x)
    assert (got - expected).abs().max() < 1e-10
    _report(f"hf ViTModel pooler_output, float64, {impl}", (got - expected).abs().max().item())


def test_save_hf_round_trips_bit_for_bit_and_loads_in_transformers(tmp_path):
    hf = _hf_model("ViTForImageClassification", num_labels=3, id2label={0: "a", 1: "b", 2: "c"})
    src = _save(hf, tmp_path / "src")
    ours = load_hf(src)
    out = save_hf(ours, tmp_path / "out")
    from safetensors.torch import load_file

    assert_same_state(load_file(out / "model.safetensors"), load_file(tmp_path / "src" / "model.safetensors"))
    again = transformers.ViTForImageClassification.from_pretrained(out).eval()
    assert again.config.id2label == {0: "a", 1: "b", 2: "c"}
    assert again.config.layer_norm_eps == 1e-12
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(again(pixel_values=x).logits, hf(pixel_values=x).logits)
    processor = json.loads((out / "preprocessor_config.json").read_text())
    assert transformers.ViTImageProcessor(**processor).size == {"height": 32, "width": 32}


def test_save_hf_of_our_model_loads_in_transformers_with_equal_logits(tmp_path):
    ours = perturbed(tiny_vit(TINY_RGB))
    ours.class_names = list("abcde")
    save_hf(ours, tmp_path / "hf")
    hf = transformers.ViTForImageClassification.from_pretrained(tmp_path / "hf").eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert (hf(pixel_values=x).logits - ours(x)).abs().max() < 1e-5
    assert [hf.config.id2label[i] for i in range(5)] == list("abcde")


def test_save_hf_refuses_what_hf_cannot_express_and_existing_dirs(tmp_path):
    mean_pool = tiny_vit(TINY_RGB, pool="mean")
    with pytest.raises(ValueError, match="pool 'mean'"):
        save_hf(mean_pool, tmp_path / "x")
    ok = tiny_vit(TINY_RGB)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "mine.txt").write_text("keep")
    with pytest.raises(FileExistsError, match="full already holds mine.txt; pass --force"):
        save_hf(ok, tmp_path / "full")
    with pytest.raises(ValueError, match="full holds mine.txt, which vit-einops does not write there; it is never"):
        save_hf(ok, tmp_path / "full", overwrite=True)  # a directory holding another file is never replaced
    assert os.listdir(tmp_path / "full") == ["mine.txt"] and (tmp_path / "full" / "mine.txt").read_text() == "keep"


# --- preprocessing against the libraries --------------------------------------------------------------------------


def _images(tmp_path) -> list[tuple[str, Image.Image, Image.Image]]:
    """(name, what open_image returns, the RGB image a library user would feed) for photos and odd inputs."""
    rng = np.random.default_rng(0)
    out = [
        (f"photo{i}", Image.fromarray(a), Image.fromarray(a))
        for i, a in enumerate(sklearn_datasets.load_sample_images().images)
    ]
    for h, w in [(37, 301), (500, 233), (224, 224), (100, 100), (257, 256)]:
        img = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        out.append((f"rgb{h}x{w}", img, img))
    rgba = Image.fromarray(rng.integers(0, 256, (50, 70, 4), dtype=np.uint8), "RGBA")
    grey = Image.fromarray(rng.integers(0, 256, (300, 200), dtype=np.uint8), "L")
    palette = grey.convert("P")
    out += [
        ("rgba", rgba, rgba.convert("RGB")),
        ("grey", grey, grey.convert("RGB")),
        ("palette", palette, palette.convert("RGB")),
    ]
    # 16-bit: written and read back as a PNG; the library reference gets the same image reduced to 8 bits
    # (PIL's own convert would clip every value above 255 to white).
    deep = rng.integers(0, 65536, (64, 96), dtype=np.uint16)
    Image.fromarray(deep).save(tmp_path / "deep.png")
    eight = Image.fromarray(np.clip(np.rint(deep / 257.0), 0, 255).astype(np.uint8)).convert("RGB")
    out.append(("16-bit", open_image(tmp_path / "deep.png"), eight))
    return out


def test_preprocessing_matches_torchvision_timm_and_hf(tmp_path):
    from timm.data import create_transform, resolve_data_config
    from torchvision.models import ViT_B_16_Weights

    refs = {
        "torchvision": (Preprocessing.torchvision(), ViT_B_16_Weights.IMAGENET1K_V1.transforms()),
        "timm": (
            Preprocessing.timm(),
            create_transform(
                **resolve_data_config({}, model=timm.create_model("vit_base_patch16_224.augreg_in21k_ft_in1k"))
            ),
        ),
    }
    processor = transformers.ViTImageProcessor()
    ours_hf = preprocessing_from_hf(processor.to_dict())
    assert ours_hf == Preprocessing.hf()  # the hf convention is ViTImageProcessor's defaults
    for name, mine, theirs in _images(tmp_path):
        for lib, (ours, ref) in refs.items():
            diff = (ours(mine) - ref(theirs)).abs().max().item()
            assert diff <= 1e-6, (lib, name, diff)
        expected = processor(theirs, return_tensors="pt")["pixel_values"][0]
        diff = (ours_hf(mine) - expected).abs().max().item()
        assert diff <= 1e-6, ("hf", name, diff)
        _report("preprocessing vs HF ViTImageProcessor", diff)
        for lib, (ours, ref) in refs.items():
            _report(f"preprocessing vs {lib}", (ours(mine) - ref(theirs)).abs().max().item())


def test_hf_processor_config_file_is_read(tmp_path):
    hf = _hf_model("ViTForImageClassification", num_labels=3)
    d = tmp_path / "hf"
    _save(hf, d)
    proc = transformers.ViTImageProcessor(size={"height": 32, "width": 32}, resample=3, image_mean=[0.1, 0.2, 0.3])
    proc.save_pretrained(d)
    model = load_hf(d)
    p = model.transforms()
    assert p.resize == (32, 32) and p.interpolation == "bicubic" and p.mean == (0.1, 0.2, 0.3)
    img = Image.fromarray(np.random.default_rng(1).integers(0, 256, (45, 77, 3), dtype=np.uint8))
    assert (p(img) - proc(img, return_tensors="pt")["pixel_values"][0]).abs().max() <= 1e-6


def test_vit_b16_from_a_save_pretrained_directory(tmp_path):
    """ViT-B/16 (the hub's google/vit-base-patch16-224 shape), random weights made here, one image."""
    hf = transformers.ViTForImageClassification(transformers.ViTConfig(num_labels=10, attn_implementation="eager"))
    hf = perturbed(hf, std=0.01)
    model = load_hf(_save(hf, tmp_path / "b16")).eval()
    assert model.config.dim == 768 and model.config.depth == 12 and model.config.heads == 12
    x = model.transforms()(Image.fromarray(sklearn_datasets.load_sample_images().images[0])).unsqueeze(0)
    with torch.no_grad():
        out = hf(pixel_values=x, output_attentions=True)
        logits, maps, _ = record_attention(model, x, preprocessed=True)
    _report("hf ViT-B/16 logits, float32", (logits - out.logits).abs().max().item())
    _report("hf ViT-B/16 attentions, float32", (maps - torch.stack(out.attentions)).abs().max().item())
    assert (logits - out.logits).abs().max() < 1e-5
    assert (maps - torch.stack(out.attentions)).abs().max() < 1e-5


def test_cli_convert_predict_inspect_from_a_save_pretrained_directory(tmp_path, capsys):
    from vit_einops.commands.cli import main

    hf = _hf_model("ViTForImageClassification", num_labels=3, id2label={0: "a", 1: "b", 2: "c"})
    _save(hf, tmp_path / "hf")
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (50, 70, 4), dtype=np.uint8), "RGBA").save(tmp_path / "x.png")
    assert main(["predict", str(tmp_path / "hf"), str(tmp_path / "x.png"), "--from", "hf", "--json"]) == 0
    top = json.loads(capsys.readouterr().out)[0]["top"]
    x = transformers.ViTImageProcessor(size={"height": 32, "width": 32})(
        Image.open(tmp_path / "x.png").convert("RGB"), return_tensors="pt"
    )["pixel_values"]
    with torch.no_grad():
        probs = hf(pixel_values=x).logits.softmax(-1)[0]
    assert [p["label"] for p in top] == [hf.config.id2label[i] for i in probs.argsort(descending=True).tolist()]
    assert abs(top[0]["probability"] - probs.max().item()) < 1e-5
    assert main(["convert", str(tmp_path / "hf"), str(tmp_path / "m.safetensors"), "--from", "hf"]) == 0
    inspect = ["inspect", str(tmp_path / "m.safetensors"), "--image", str(tmp_path / "x.png"), "--arrays", "full"]
    assert main(inspect) == 0
    assert np.load("m-inspect/arrays.npz")["attention"].shape == (2, 1, 4, 17, 17)
