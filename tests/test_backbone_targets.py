"""A model without a classifier (num_classes 0: DINO, DINOv2, CLIP and SigLIP towers; or one whose head projects
into an embedding, as CLIP's image tower with its projection: ViTConfig.embedding) never shows or uses classes, and
its relevance is for the targets that fit a backbone: an embedding, another image, a patch. predict refuses it.

Relevance is checked against Chefer et al.'s recipe written apart (the einsum softmax's output and its gradient
through a tensor hook, as tests/test_relevance.py checks class targets), with the score written by hand here:
cosine similarities as dot products of unit vectors, in float64 (atol 1e-10)."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import zlib

import numpy as np
import pytest
import torch

from _equiv import chefer_reference
from _tiny import TINY_RGB16, tiny_vit
from vit_einops.inspect import (
    EmbeddingTarget,
    ImageTarget,
    PatchTarget,
    attention_gradients,
    attention_relevance,
    load_embedding,
    patch_similarity,
)

BACKBONE = dict(TINY_RGB16, num_classes=0)
KINDS = (
    "EmbeddingTarget(vector) (--target-embedding FILE), ImageTarget(image) (--target-image PATH) or "
    "PatchTarget(row, col) (--target-patch ROW,COL)"
)


def unit(v: torch.Tensor) -> torch.Tensor:
    return v / (v * v).sum(-1, keepdim=True).sqrt()


def embedding_score(e):
    return lambda model, x: (unit(model(x)) * unit(e)).sum(-1)


def patch_score(row, col, prefix):
    def score(model, x):
        z = unit(model.forward_features(x)[:, prefix:])  # (b, patches, D)
        gw = x.shape[-1] // 4
        return (z * z[:, row * gw + col][:, None]).sum(-1).mean(-1)

    return score


@pytest.fixture
def backbone():
    torch.manual_seed(0)
    return tiny_vit(BACKBONE, register_tokens=2).double()


@pytest.mark.parametrize("impl", ["einsum", "sdpa"])
def test_relevance_for_an_embedding_equals_the_gradient_of_its_cosine_similarity(backbone, impl):
    x = torch.rand(2, 3, 16, 16, dtype=torch.float64)
    for e in (torch.randn(32, dtype=torch.float64), torch.randn(2, 32, dtype=torch.float64)):
        expected = chefer_reference(backbone, x, embedding_score(e))
        backbone.set_attn_impl(impl)
        got = attention_relevance(backbone, x, EmbeddingTarget(e), preprocessed=True)
        assert got.shape == (2, 19, 19)
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-10)
        assert not torch.equal(got, torch.eye(19, dtype=got.dtype).expand_as(got))  # the score reaches A


def test_relevance_for_another_image_is_that_for_its_embedding(backbone):
    x, other = torch.rand(2, 3, 16, 16, dtype=torch.float64), torch.rand(3, 16, 16, dtype=torch.float64)
    with torch.no_grad():
        e = backbone(other[None])[0]
    expected = chefer_reference(backbone, x, embedding_score(e))
    got = attention_relevance(backbone, x, ImageTarget(other, preprocessed=True), preprocessed=True)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-10)
    output, _, grads, scores = attention_gradients(backbone, x, ImageTarget(other, preprocessed=True))
    torch.testing.assert_close(output, backbone(x).detach(), rtol=0, atol=1e-12)
    torch.testing.assert_close(scores[:, 0], embedding_score(e)(backbone, x).detach(), rtol=0, atol=1e-12)
    assert grads.shape == (1, 2, 2, 4, 19, 19)


def test_relevance_for_a_patch_is_that_of_the_mean_similarity_to_its_token(backbone):
    x = torch.rand(2, 3, 16, 16, dtype=torch.float64)
    expected = chefer_reference(backbone, x, patch_score(1, 2, prefix=3))
    torch.testing.assert_close(
        attention_relevance(backbone, x, PatchTarget(1, 2), preprocessed=True), expected, rtol=0, atol=1e-10
    )
    # The map itself: cos(z_j, z_p), 1 at the chosen patch.
    z = unit(backbone.forward_features(x)[:, 3:]).detach()
    similarity = patch_similarity(backbone, x, PatchTarget(1, 2), preprocessed=True)
    assert similarity.shape == (2, 4, 4)
    torch.testing.assert_close(similarity.flatten(1), (z * z[:, 6:7]).sum(-1), rtol=0, atol=1e-12)
    torch.testing.assert_close(similarity[:, 1, 2], torch.ones(2, dtype=torch.float64), rtol=0, atol=1e-12)


@pytest.mark.parametrize("target", [None, 3, torch.tensor([0, 1])])
def test_a_backbone_refuses_class_targets_and_names_the_three_kinds(target):
    model = tiny_vit(BACKBONE)
    what = "there is no predicted class" if target is None else f"target {target!r:.60} names no class"
    message = (
        f"this model has no classifier (num_classes 0: its output is pooled features), so {what}; give a target "
        f"that fits a backbone: {KINDS}"
    )
    with pytest.raises(ValueError) as err:
        attention_relevance(model, torch.rand(2, 3, 16, 16), target, preprocessed=True)
    assert str(err.value) == message


def test_a_classifier_keeps_class_targets_and_takes_backbone_targets():
    torch.manual_seed(1)
    model = tiny_vit(TINY_RGB16).double()
    x = torch.rand(1, 3, 16, 16, dtype=torch.float64)
    predicted = model(x).argmax(-1)
    by_default = attention_relevance(model, x, preprocessed=True)
    torch.testing.assert_close(by_default, attention_relevance(model, x, predicted), rtol=0, atol=0)
    expected = chefer_reference(model, x, patch_score(0, 3, prefix=1))
    torch.testing.assert_close(attention_relevance(model, x, PatchTarget(0, 3)), expected, rtol=0, atol=1e-10)


@pytest.mark.parametrize(
    ("target", "error", "match"),
    [
        (EmbeddingTarget(torch.ones(31)), ValueError, r"shape \(31,\); this model's output is 32 wide, so expected "
         r"\(32,\) or \(2, 32\) for 2 images"),
        (EmbeddingTarget(torch.ones(3, 32)), ValueError, r"expected \(32,\) or \(2, 32\)"),
        (PatchTarget(4, 0), ValueError,
         r"target patch \(4, 0\) is outside the 4 x 4 patch grid \(rows 0..3, cols 0..3\)"),
    ],
)  # fmt: skip
def test_targets_that_do_not_fit_the_model_are_named(target, error, match):
    with pytest.raises(error, match=match):
        attention_relevance(tiny_vit(BACKBONE), torch.rand(2, 3, 16, 16), target, preprocessed=True)


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda: EmbeddingTarget(torch.tensor([1.0, float("nan")])), ValueError,
         "the target embedding holds non-finite values (nan or inf)"),
        (lambda: EmbeddingTarget(torch.zeros(4)), ValueError,
         "the target embedding has norm 0: its cosine similarity is undefined"),
        (lambda: EmbeddingTarget(torch.ones(2, 2, 2)), ValueError,
         "the target embedding must be a float vector (D,) or one per image (b, D), got torch.float32 shape (2, 2, 2)"),
        (lambda: EmbeddingTarget(torch.ones(4, dtype=torch.long)), ValueError,
         "the target embedding must be a float vector (D,) or one per image (b, D), got torch.int64 shape (4,)"),
        (lambda: EmbeddingTarget([1.0, 2.0]), TypeError, "the target embedding must be a torch.Tensor, got list"),
        (lambda: PatchTarget(-1, 0), ValueError, None),
        (lambda: PatchTarget(0, 1.5), TypeError, None),
    ],
)  # fmt: skip
def test_hostile_targets_are_refused_at_construction(make, error, message):
    with pytest.raises(error) as err:
        make()
    if message is not None:
        assert str(err.value) == message
    else:
        assert "target patch" in str(err.value)


def test_embeddings_load_from_each_format_and_refuse_hostile_files(tmp_path):
    from safetensors.torch import save_file

    v = torch.randn(32)
    torch.save(v, tmp_path / "e.pt")
    np.save(tmp_path / "e.npy", v.numpy())
    save_file({"embedding": v}, tmp_path / "e.safetensors")
    for name in ("e.pt", "e.npy", "e.safetensors"):
        torch.testing.assert_close(load_embedding(tmp_path / name), v, rtol=0, atol=0)

    np.save(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    torch.save({"v": v, "f": print}, tmp_path / "pickle.pt")
    save_file({"a": v, "b": v.clone()}, tmp_path / "two.safetensors")
    np.save(tmp_path / "nan.npy", np.array([1.0, np.nan]))
    (tmp_path / "text.pt").write_text("not a tensor")
    (tmp_path / "e.txt").write_text("1 2 3")
    (tmp_path / "dir.npy").mkdir()
    where = {name: f"target embedding {str(tmp_path / name)!r}" for name in os.listdir(tmp_path)}
    cases = {
        "obj.npy": f"{where['obj.npy']} cannot be read as npy: Object arrays cannot be loaded when allow_pickle=False",
        "pickle.pt": f"{where['pickle.pt']} cannot be read as pt: UnpicklingError",
        "two.safetensors": f"{where['two.safetensors']} holds 2 tensors (a, b); expected one",
        "nan.npy": f"{where['nan.npy']}: the target embedding holds non-finite values (nan or inf)",
        "text.pt": f"{where['text.pt']} cannot be read as pt: UnpicklingError",
        "e.txt": f"{where['e.txt']}: expected a .pt, .npy or .safetensors file",
        "dir.npy": f"{str(tmp_path / 'dir.npy')!r} is a directory, not a regular file",
    }
    for name, message in cases.items():
        with pytest.raises(ValueError) as err:
            load_embedding(tmp_path / name)
        assert str(err.value) == message


def _payload(page) -> dict:
    text = page.read_text(encoding="utf-8")
    return json.loads(re.search(r'<script type="application/json" id="explorer-data">(.*?)</script>', text, re.S)[1])


NO_CLASS = re.compile(r"class \d|predict|probability|logit", re.I)


def test_a_backbone_page_lists_no_class_and_holds_the_targets_relevance(backbone, tmp_path):
    from vit_einops.explore import write_explorer

    x = torch.rand(2, 3, 16, 16, dtype=torch.float64)
    plain = _payload(write_explorer(backbone, x, tmp_path / "plain.html", preprocessed=True))
    [pane] = plain["panes"]
    assert pane["classifier"] is False
    assert [(image["top"], image["target"]) for image in pane["images"]] == [([], None)] * 2
    assert not NO_CLASS.search(json.dumps(plain))

    target = PatchTarget(2, 1)
    page = _payload(write_explorer(backbone, x, tmp_path / "patch.html", preprocessed=True, target=target))
    assert not NO_CLASS.search(json.dumps(page))
    expected = attention_relevance(backbone, x, target, preprocessed=True).numpy()
    scores = patch_score(2, 1, prefix=3)(backbone, x).detach()
    for i, image in enumerate(page["panes"][0]["images"]):
        entry = image["target"]
        assert entry["name"] == "mean cosine similarity of the patches to patch (2, 1)"
        assert entry["score"] == pytest.approx(float(scores[i]), abs=1e-12)
        stored = np.frombuffer(zlib.decompress(base64.b64decode(entry["relevance"])), "<f2").reshape(19, 19)
        # float16 after division by a power of two: relative error 2^-11 (the page's stated precision)
        scale = entry["relevance_scale"]
        np.testing.assert_allclose(stored * scale, expected[i], rtol=2**-11, atol=scale * 2**-25)
        assert image["top"] == []


def test_the_report_and_the_page_explain_a_target_from_the_relevance_methods_start_layer(
    backbone, tmp_path, unrendered
):
    """The relevance method's start_layer reaches the target's relevance in both renderers of one study."""
    from vit_einops.explore import write_explorer
    from vit_einops.inspect import write_report

    x, target = torch.rand(1, 3, 16, 16, dtype=torch.float64), PatchTarget(1, 2)
    params = {"relevance": {"start_layer": 1}}
    expected = attention_relevance(backbone, x, target, preprocessed=True, start_layer=1).numpy()
    assert not np.allclose(expected, attention_relevance(backbone, x, target, preprocessed=True).numpy())
    write_report(backbone, x, tmp_path / "r", target=target, method_params=params)
    np.testing.assert_allclose(np.load(tmp_path / "r" / "arrays.npz")["target_relevance"], expected, rtol=0, atol=1e-6)
    page = write_explorer(backbone, x, tmp_path / "p.html", preprocessed=True, target=target, method_params=params)
    entry = _payload(page)["panes"][0]["images"][0]["target"]
    stored = np.frombuffer(zlib.decompress(base64.b64decode(entry["relevance"])), "<f2").reshape(19, 19)
    scale = entry["relevance_scale"]
    np.testing.assert_allclose(stored * scale, expected[0], rtol=2**-11, atol=scale * 2**-25)


def test_a_classifier_page_keeps_its_classes_beside_the_target(tmp_path):
    from vit_einops.explore import write_explorer

    model = tiny_vit(TINY_RGB16)
    x = torch.rand(1, 3, 16, 16)
    [pane] = _payload(write_explorer(model, x, tmp_path / "e.html", top_k=2, target=PatchTarget(0, 0)))["panes"]
    assert pane["classifier"] is True
    [image] = pane["images"]
    assert [c["index"] for c in image["top"]] == model(x).topk(2).indices[0].tolist()
    assert image["target"]["name"] == "mean cosine similarity of the patches to patch (0, 0)"
    with pytest.raises(TypeError, match="the explorer's target is a backbone target"):
        write_explorer(model, x, tmp_path / "f.html", target=3)


@pytest.fixture
def backbone_file(tmp_path):
    from PIL import Image

    from vit_einops.modelfile import save_vit
    from vit_einops.preprocess import Preprocessing

    torch.manual_seed(2)
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(tmp_path / "a.png")
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(tmp_path / "b.png")
    model = tiny_vit(BACKBONE)
    model.preprocessing = Preprocessing.plain((16, 16), channels=3)
    return save_vit(model, tmp_path / "dino.safetensors")


def test_cli_targets_reach_the_page_and_the_report(backbone_file, tmp_path, capsys, unrendered):
    from vit_einops.commands.cli import main

    base = [str(backbone_file), "--image", str(tmp_path / "a.png")]
    torch.save(torch.randn(32), tmp_path / "e.pt")
    names = {
        "--target-embedding": (str(tmp_path / "e.pt"), "cosine similarity of the output to the target embedding"),
        "--target-image": (str(tmp_path / "b.png"), "cosine similarity of the output to the target image's output"),
        "--target-patch": ("1,3", "mean cosine similarity of the patches to patch (1, 3)"),
    }
    for flag, (value, name) in names.items():
        out = tmp_path / f"{flag[2:]}.html"
        assert main(["explore", *base, "--out", str(out), flag, value]) == 0
        [image] = _payload(out)["panes"][0]["images"]
        assert image["top"] == [] and image["target"]["name"] == name
    assert main(["inspect", *base, "--out", str(tmp_path / "r"), "--target-patch", "1,3"]) == 0
    arrays = np.load(tmp_path / "r" / "arrays.npz")
    assert arrays["target_relevance"].shape == (1, 17, 17) and arrays["target_similarity"].shape == (1, 4, 4)
    assert arrays["target_similarity"][0, 1, 3] == pytest.approx(1.0, abs=1e-6)


def test_a_backbone_report_titles_no_prediction(backbone_file, tmp_path):
    """Every figure rendered: the one whole report of a model without a classifier nor a target."""
    from vit_einops.inspect import write_report

    with suptitles() as texts:
        write_report(tiny_vit(BACKBONE), torch.rand(2, 3, 16, 16), tmp_path / "r", titles=["x", "y"])
    assert_no_prediction(texts)


def assert_no_prediction(titles):
    assert titles and not any("predicted" in t or "class " in t.replace("class token", "") for t in titles), titles


@contextlib.contextmanager
def suptitles():
    """The figures' titles, as the report draws them."""
    import matplotlib.figure

    texts = []
    original = matplotlib.figure.SubFigure.suptitle

    def keep(self, text, *a, **k):
        texts.append(text)
        return original(self, text, *a, **k)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(matplotlib.figure.SubFigure, "suptitle", keep)
        yield texts


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--target-patch", "1;2", "--target-patch expects ROW,COL (two non-negative integers, e.g. 3,5), got '1;2'"),
        ("--target-patch", "-1,2", "--target-patch expects ROW,COL (two non-negative integers, e.g. 3,5), got '-1,2'"),
        ("--target-patch", "4,0", "target patch (4, 0) is outside the 4 x 4 patch grid (rows 0..3, cols 0..3)"),
        ("--target-embedding", "short.npy", "the target embedding has shape (31,); this model's output is 32 wide, "
         "so expected (32,) or (1, 32) for 1 images"),
        ("--target-embedding", "nan.npy", "target embedding {}: the target embedding holds non-finite values (nan or "
         "inf)"),
        ("--target-embedding", "pickle.pt", "target embedding {} cannot be read as pt: UnpicklingError"),
        ("--target-embedding", "big.npy", "{} is 67,108,993 bytes, over the 67,108,864 this file type may hold"),
        ("--target-embedding", "fifo.npy", "{} is a FIFO, not a regular file"),
    ],
)  # fmt: skip
def test_cli_refuses_hostile_targets_in_one_line(backbone_file, tmp_path, capsys, flag, value, message):
    from vit_einops.commands.cli import main

    np.save(tmp_path / "short.npy", np.ones(31, np.float32))
    np.save(tmp_path / "nan.npy", np.array([1.0, np.nan], np.float32))
    torch.save({"f": print}, tmp_path / "pickle.pt")
    with open(tmp_path / "big.npy", "wb") as f:
        f.truncate((64 << 20) + 129)
    os.mkfifo(tmp_path / "fifo.npy")
    path = tmp_path / value
    if flag == "--target-embedding":
        value, message = str(path), message.replace("{}", repr(str(path)))
    for command in (["explore", "--out", str(tmp_path / "e.html")], ["inspect", "--out", str(tmp_path / "r")]):
        capsys.readouterr()
        argv = [command[0], str(backbone_file), "--image", str(tmp_path / "a.png"), *command[1:], f"{flag}={value}"]
        assert main(argv) == 2
        assert capsys.readouterr().err == f"vit-einops {command[0]}: error: {message}\n"


# ---- an embedding head (CLIP's image tower with its projection) is a backbone, not a classifier ----

# CLIP's image tower at TINY_RGB16's size: pre-norm, no patch bias, a bias-free projection head to a 12-wide
# embedding (ViTConfig.embedding: what the family registry says of CLIP's openai, laion2b... tags).
CLIP_PROJECTION = dict(TINY_RGB16, num_classes=12, pre_norm=True, patch_bias=False, head_bias=False,
                       layer_norm_eps=1e-5, embedding=True)  # fmt: skip
NO_CLASSES = "this model has no classifier (its head is an embedding projection: its output is a 12-wide embedding, " \
    "not class logits), so {}; give a target that fits a backbone: " + KINDS  # fmt: skip
PREDICT_REFUSAL = (
    "this model outputs a 12-wide embedding (its head is an embedding projection, as CLIP's image tower's), not "
    "class logits: it has no classes to predict. Compare model(x) with other embeddings, or study it as a backbone: "
    "vit-einops inspect or explore with --target-embedding FILE or --target-image PATH (vit_einops.inspect's "
    "EmbeddingTarget, ImageTarget)"
)


@pytest.fixture
def clip():
    torch.manual_seed(3)
    return tiny_vit(CLIP_PROJECTION).double()


@pytest.fixture
def clip_file(tmp_path):
    from PIL import Image

    from vit_einops.modelfile import save_vit
    from vit_einops.preprocess import Preprocessing

    torch.manual_seed(4)
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(tmp_path / "a.png")
    model = tiny_vit(CLIP_PROJECTION)
    model.preprocessing = Preprocessing.plain((16, 16), channels=3)
    return save_vit(model, tmp_path / "clip.safetensors")


def test_an_embedding_head_survives_its_model_file_and_a_new_classifier_ends_it(clip_file):
    from torch import nn

    from vit_einops import ViTConfig, load_vit

    model = load_vit(clip_file)
    assert (model.config.embedding, model.config.has_classifier, model.has_classifier) == (True, False, False)
    assert model.num_classes == 12  # the embedding's width
    assert load_vit(clip_file, embedding=False).has_classifier  # no tensor holds it: a loader may be told
    model.reset_classifier(3)  # a classifier now, fine-tuned from the tower
    assert (model.config.embedding, model.has_classifier) == (False, True)
    model = load_vit(clip_file)
    model.head.fc = nn.Linear(32, 7, bias=False)
    assert (model.config.embedding, model.has_classifier) == (False, True)
    with pytest.raises(ValueError) as err:
        ViTConfig(**{**CLIP_PROJECTION, "num_classes": 0})
    assert str(err.value) == "embedding True needs the projection's outputs: num_classes is its width, got 0"


def test_predict_refuses_an_embedding_head(clip_file, tmp_path, capsys):
    from vit_einops import load_vit, predict
    from vit_einops.commands.cli import main

    assert main(["predict", str(clip_file), str(tmp_path / "a.png")]) == 2
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == ("", f"vit-einops predict: error: {PREDICT_REFUSAL}\n")
    with pytest.raises(ValueError) as err:
        predict(load_vit(clip_file), torch.rand(1, 3, 16, 16))
    assert str(err.value) == PREDICT_REFUSAL


def test_an_embedding_head_takes_backbone_targets_and_refuses_classes(clip):
    from vit_einops.inspect import METHODS, explain_all, grad_cam, integrated_gradients

    x = torch.rand(2, 3, 16, 16, dtype=torch.float64)
    e = torch.randn(12, dtype=torch.float64)
    expected = chefer_reference(clip, x, embedding_score(e))
    got = attention_relevance(clip, x, EmbeddingTarget(e), preprocessed=True)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-10)
    for target, what in ((None, "there is no predicted class"), (3, "target 3 names no class")):
        for tool in (attention_relevance, grad_cam, integrated_gradients):
            with pytest.raises(ValueError) as err:
                tool(clip, x, target, preprocessed=True)
            assert str(err.value) == NO_CLASSES.format(what)
    # Without a target the gradient methods are left out, as for a backbone without a classifier.
    backbone = tiny_vit(BACKBONE).double()
    assert list(explain_all(clip, x, preprocessed=True)) == list(explain_all(backbone, x, preprocessed=True))
    assert list(explain_all(clip, x, EmbeddingTarget(e), preprocessed=True)) == list(METHODS)


def test_an_embedding_head_page_and_report_explain_the_target_embedding_and_list_no_class(
    clip_file, tmp_path, rendered_only
):
    from vit_einops import load_vit
    from vit_einops.commands.cli import main
    from vit_einops.inputs import model_inputs
    from vit_einops.inspect import explain

    rendered_only("target")  # the other figures' titles are made with them, not when they are rendered
    e = torch.randn(12)
    torch.save(e, tmp_path / "e.pt")
    base = [str(clip_file), "--image", str(tmp_path / "a.png"), "--target-embedding", str(tmp_path / "e.pt")]
    assert main(["explore", *base, "--out", str(tmp_path / "e.html")]) == 0
    with suptitles() as titles:
        assert main(["inspect", *base, "--out", str(tmp_path / "r")]) == 0
    assert_no_prediction(titles)
    model = load_vit(clip_file)
    x = model_inputs(model, [str(tmp_path / "a.png")])
    expected = attention_relevance(model, x, EmbeddingTarget(e), preprocessed=True)

    payload = _payload(tmp_path / "e.html")
    [pane] = payload["panes"]
    [image] = pane["images"]
    assert pane["classifier"] is False and image["top"] == []
    assert not NO_CLASS.search(json.dumps(payload))
    entry = image["target"]
    assert entry["name"] == "cosine similarity of the output to the target embedding"
    stored = np.frombuffer(zlib.decompress(base64.b64decode(entry["relevance"])), "<f2").reshape(17, 17)
    scale = entry["relevance_scale"]
    np.testing.assert_allclose(stored * scale, expected[0].numpy(), rtol=2**-11, atol=scale * 2**-25)

    arrays = np.load(tmp_path / "r" / "arrays.npz")
    np.testing.assert_allclose(arrays["target_relevance"], expected.numpy(), rtol=0, atol=1e-6)
    relevance = explain(model, x, "relevance", EmbeddingTarget(e), preprocessed=True)
    np.testing.assert_allclose(arrays["method_relevance"], relevance.numpy(), rtol=0, atol=1e-6)
