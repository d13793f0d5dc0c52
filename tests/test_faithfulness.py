"""Faithfulness scores (vit_einops.inspect.faithfulness and `vit-einops faithfulness`): the curves and AUCs of toy
models whose curves are worked out here by hand, identities that hold on any model, batching and seeding, the
refusals, and one command-line run on a briefly trained digits model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from _tiny import TINY_DIGITS, tiny_vit
from einops import reduce
from PIL import Image

from vit_einops import ViT
from vit_einops.commands.cli import main
from vit_einops.commands.faithfulness import image_files, parse_method
from vit_einops.inspect import (
    METHODS, METRICS, EmbeddingTarget, ImageTarget, Method, PatchTarget, explain, faithfulness,
)
from vit_einops.inspect.faithfulness import chosen_methods, patch_ranks
from vit_einops.inspect.targets import target_scores
from vit_einops.modelfile import save_vit
from vit_einops.preprocess import Preprocessing
from vit_einops.train import TrainConfig, train
from vit_einops.train.data import load_digits

PATCHES = 16  # TINY_DIGITS: 8x8 images in 2x2 patches
UNKNOWN = f"unknown method 'gradcam'; expected one of {', '.join(repr(name) for name in METHODS)}"


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    pass


class PatchLinear(ViT):
    """Two classes: logit 0 = sum_p w_p * (patch p's mean pixel), logit 1 = 0. On an image of ones the effect of
    removing patch p (setting it to 0) on logit 0 is -w_p exactly, so w is the oracle map."""

    def __init__(self, w: torch.Tensor) -> None:
        super().__init__(**dict(TINY_DIGITS, num_classes=2))
        self.w = w.double()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = reduce(x.double(), "b c (gh p1) (gw p2) -> b (gh gw)", "mean", p1=2, p2=2) @ self.w
        return torch.stack([z, torch.zeros_like(z)], dim=-1)


class Constant(ViT):
    """Logits (1, 0) whatever the image."""

    def __init__(self) -> None:
        super().__init__(**dict(TINY_DIGITS, num_classes=2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tensor([[1.0, 0.0]], dtype=torch.float64).expand(len(x), 2)


@pytest.fixture
def oracle(monkeypatch):
    """A method "oracle" in the registry: the model's own w on the grid (registered as any method is)."""
    method = Method("oracle", lambda model, images, target: model.w.view(4, 4).expand(len(images), 4, 4), False, "w")
    monkeypatch.setitem(METHODS, "oracle", method)


# Logit 0 on ones: 4 - 3.6 = 0.4 > 0, class 0; with one of the top patches gone, -0.6: class 1.
W = torch.tensor([1.0] * 4 + [-0.3] * 12, dtype=torch.float64)
ONES = torch.ones(6, 1, 8, 8)


def sigmoid(z):
    return 1 / (1 + math.exp(-z))


def test_the_oracle_curves_and_aucs_as_worked_out_by_hand(oracle):
    result = faithfulness(PatchLinear(W).double(), ONES, ["oracle"], preprocessed=True, steps=4, baseline="zero")
    # Deletion in 4 steps removes 0, 4, 8, 12, 16 patches, most relevant (largest w) first: the logit is the sum of
    # the w left, the score its class's softmax probability, the AUC the trapezoid at x = 0, 1/4, ..., 1.
    left = [0.4, -3.6, -2.4, -1.2, 0.0]
    deletion = [sigmoid(z) for z in left]
    torch.testing.assert_close(result.curves["oracle"]["deletion"], torch.tensor([deletion] * 6, dtype=torch.float64))
    expected = sum((a + b) / 2 * 0.25 for a, b in zip(deletion, deletion[1:]))
    assert result.aucs["oracle"]["deletion"].tolist() == pytest.approx([expected] * 6, rel=1e-12)
    # Insertion keeps 0, 4, 8, 12, 16 patches (the top ones): logits 0, 4, 4 - 1.2, 4 - 2.4, 0.4.
    insertion = [sigmoid(z) for z in (0.0, 4.0, 2.8, 1.6, 0.4)]
    torch.testing.assert_close(result.curves["oracle"]["insertion"][0], torch.tensor(insertion, dtype=torch.float64))
    # Positive perturbation: 0%, 10%, ..., 90% remove floor(16 k / 10) patches; one top patch gone flips the class,
    # so the hits are 1, 0, 0, ...: the trapezoid with the 0% point is 0.1 * (1 + 0) / 2, without it 0.
    assert result.curves["oracle"]["positive"][0].tolist() == [1.0] + [0.0] * 9
    assert result.aucs["oracle"]["positive"].tolist() == pytest.approx([0.05] * 6, rel=1e-12)
    # Negative: the -0.3 patches go first, raising the logit; at 90% (14 patches) 2 of the 1.0s are gone too:
    # logit 2 > 0. Every point hits: 0.9.
    assert result.aucs["oracle"]["negative"].tolist() == pytest.approx([0.9] * 6, rel=1e-12)
    assert result.x["positive"].tolist() == pytest.approx([k / 10 for k in range(10)])


def test_the_oracle_map_beats_the_random_map(oracle):
    shuffle = torch.randperm(PATCHES, generator=torch.Generator().manual_seed(0))
    w = torch.linspace(1.0, -0.9, PATCHES, dtype=torch.float64)[shuffle]
    summary = faithfulness(PatchLinear(w).double(), ONES, ["oracle"], preprocessed=True, baseline="zero").summary
    for name, metric in METRICS.items():
        oracle_mean, random_mean = summary["oracle"][name][0], summary["random"][name][0]
        assert oracle_mean < random_mean if metric.better == "lower" else oracle_mean > random_mean, name


def test_the_mean_baseline_is_each_channels_mean_over_the_images(oracle):
    images = torch.rand(4, 1, 8, 8, dtype=torch.float64)
    result = faithfulness(PatchLinear(W).double(), images, ["oracle"], preprocessed=True, steps=2)
    mean = images.mean().item()
    assert result.baseline == "mean" and result.colour == pytest.approx((mean,), rel=1e-12)
    # Every patch removed: every pixel the mean, logit 0 = sum(w) * mean, for each image; its probability of the
    # class the image itself is given (class 0 where its own logit 0 is positive).
    everything = sigmoid(W.sum().item() * mean)
    own = reduce(images, "b c (gh p1) (gw p2) -> b (gh gw)", "mean", p1=2, p2=2) @ W
    expected = [everything if z > 0 else 1 - everything for z in own.tolist()]
    assert 0 < sum(z > 0 for z in own.tolist()) < 4  # both classes among the images
    assert result.curves["oracle"]["deletion"][:, -1].tolist() == pytest.approx(expected, rel=1e-12)
    assert result.curves["oracle"]["insertion"][:, 0].tolist() == pytest.approx(expected, rel=1e-12)


def test_a_constant_model_scores_its_probability_everywhere():
    result = faithfulness(Constant().double(), torch.rand(3, 1, 8, 8), ["random"], preprocessed=True)
    p = sigmoid(1.0)
    for label in result.aucs:
        for name in ("deletion", "insertion"):
            assert result.aucs[label][name].tolist() == pytest.approx([p] * 3, rel=1e-12)
        for name in ("positive", "negative"):
            assert result.aucs[label][name].tolist() == pytest.approx([0.9] * 3, rel=1e-12)


@pytest.fixture(scope="module")
def vit():
    torch.manual_seed(0)
    return tiny_vit().double(), torch.rand(3, 1, 8, 8, dtype=torch.float64)


def test_deletion_and_insertion_meet_at_their_ends_and_batching_changes_nothing(vit):
    model, images = vit
    whole = faithfulness(model, images, preprocessed=True, batch_size=1000)
    sevens = faithfulness(model, images, preprocessed=True, batch_size=7)
    assert set(whole.curves) == set(METHODS)
    for label, curves in whole.curves.items():
        deletion, insertion = curves["deletion"], curves["insertion"]
        torch.testing.assert_close(deletion[:, 0], insertion[:, -1], rtol=1e-12, atol=1e-14)  # the whole image
        torch.testing.assert_close(deletion[:, -1], insertion[:, 0], rtol=1e-12, atol=1e-14)  # every patch 0
        assert (curves["positive"][:, 0] == 1).all() and (curves["negative"][:, 0] == 1).all()
        for name in METRICS:
            torch.testing.assert_close(sevens.curves[label][name], curves[name], rtol=1e-12, atol=1e-14)


def test_seeds_fix_the_random_map_and_the_order_of_ties(vit):
    model, images = vit
    a, b, c = (faithfulness(model, images, ["random"], preprocessed=True, seed=s) for s in (3, 3, 4))
    assert all(torch.equal(a.aucs["random"][m], b.aucs["random"][m]) for m in METRICS)
    assert any(not torch.equal(a.aucs["random"][m], c.aucs["random"][m]) for m in METRICS)
    assert a.summary == b.summary
    flat = torch.zeros(2, 4, 4)  # all ties: the order is the seed's, a different one per image
    first, again, other = patch_ranks(flat, 0), patch_ranks(flat, 0), patch_ranks(flat, 1)
    assert torch.equal(first, again) and not torch.equal(first, other) and not torch.equal(first[0, 0], first[0, 1])
    distinct = torch.arange(16.0).view(1, 4, 4)  # no ties: the order of the values, whatever the seed
    assert patch_ranks(distinct, 5)[0, 0].tolist() == list(range(15, -1, -1))
    assert patch_ranks(distinct, 5)[1, 0].tolist() == list(range(16))


def test_refusals_name_the_value_and_what_is_expected(vit, monkeypatch):
    model, images = vit
    with pytest.raises(ValueError) as refused:
        faithfulness(model, images, ["gradcam"], preprocessed=True)
    assert str(refused.value) == UNKNOWN
    for steps in (0, PATCHES + 1):
        with pytest.raises(ValueError, match=f"steps must be an int in \\[1, {PATCHES}\\], got {steps}"):
            faithfulness(model, images, preprocessed=True, steps=steps)
    bad = images.clone()
    bad[1, 0, 2, 3] = math.inf
    with pytest.raises(ValueError, match="images holds non-finite values"):
        faithfulness(model, bad, preprocessed=True)
    nan = Method("nan", lambda model, images, target: torch.full((len(images), 4, 4), math.nan), False, "nan")
    monkeypatch.setitem(METHODS, "nan", nan)
    with pytest.raises(ValueError, match="the maps of method 'nan' hold 48 non-finite values"):
        faithfulness(model, images, ["nan"], preprocessed=True)
    with pytest.raises(ValueError, match="method 'rollout \\(head_fusion max\\)' is given twice"):
        faithfulness(model, images, [("rollout", {"head_fusion": "max"})] * 2, preprocessed=True)
    with pytest.raises(ValueError, match="no classifier .*there is no predicted class"):
        faithfulness(tiny_vit(num_classes=0), torch.rand(1, 1, 8, 8), preprocessed=True)


def test_a_backbone_is_scored_by_its_targets_score_and_refused_without_one():
    torch.manual_seed(0)
    model = tiny_vit(num_classes=0).double()
    images = torch.rand(2, 1, 8, 8, dtype=torch.float64)
    target = PatchTarget(1, 2)
    result = faithfulness(model, images, ["relevance"], target, preprocessed=True, steps=2, baseline="zero")
    with torch.no_grad():
        whole = target_scores(model, images, target)[1]
        blank = target_scores(model, torch.zeros_like(images), target)[1]
    curves = result.curves["relevance"]
    for name in ("deletion", "positive", "negative"):  # y is the score s in every curve: the whole image's at 0%
        torch.testing.assert_close(curves[name][:, 0], whole)
    torch.testing.assert_close(curves["insertion"][:, -1], whole)
    torch.testing.assert_close(curves["deletion"][:, -1], blank)
    torch.testing.assert_close(curves["insertion"][:, 0], blank)
    assert "backbone target" in result.score and result.backbone
    assert {ax.get_ylabel() for ax in result.plot().axes} == {"the target's score"}



def test_a_mapping_of_methods_hands_each_its_parameters(vit, monkeypatch):
    """{name: params}, as explain_all takes them: the parameters reach the method, and change what is scored."""
    model, images = vit
    seen = []

    def spy(model, images, target, *, scale):
        seen.append(scale)
        return torch.arange(16.0, dtype=torch.float64).view(1, 4, 4).expand(len(images), 4, 4) * scale

    monkeypatch.setitem(METHODS, "spy", Method("spy", spy, False, "a ramp times scale", params={"scale": 1.0}))
    result = faithfulness(model, images, {"spy": {"scale": -1.0}}, preprocessed=True, steps=2)
    assert seen == [-1.0]
    assert result.methods == {"spy (scale -1)": ("spy", {"scale": -1.0}), "random": ("random", {"seed": 0})}
    turned, ramp = result.curves["spy (scale -1)"], faithfulness(model, images, {"spy": {}}, preprocessed=True,
                                                                 steps=2).curves["spy"]
    # The sign turned: most relevant first is the ramp's least relevant first (no ties), and deletion differs.
    assert torch.equal(turned["positive"], ramp["negative"]) and torch.equal(turned["negative"], ramp["positive"])
    assert not torch.equal(turned["deletion"], ramp["deletion"])
    given = {"rollout": {"head_fusion": "max"}, "relevance": {}}
    assert chosen_methods(given) == chosen_methods([("rollout", {"head_fusion": "max"}), "relevance"])
    assert list(chosen_methods(given)) == ["rollout (head_fusion max)", "relevance", "random"]


@pytest.mark.parametrize(
    "methods, labels",
    [
        ("random", ["random"]),
        (["random"], ["random"]),
        ([("random", {})], ["random"]),
        ({"random": {}}, ["random"]),
        ([("random", {"seed": 3}), "relevance"], ["random (seed 3)", "relevance"]),
        ({"relevance": {}}, ["relevance", "random"]),
        ([], ["random"]),
    ],
)
def test_the_random_map_is_given_once_however_it_is_named(methods, labels):
    assert list(chosen_methods(methods)) == labels


@pytest.mark.parametrize(
    "methods, error, message",
    [
        ([("rollout", {}, 1)], TypeError, "each method must be a name or a (name, params) pair, got tuple "
         "('rollout', {}, 1)"),
        ({"rollout": None}, TypeError, "the parameters of method 'rollout' must be a mapping, got NoneType"),
        ({"rollout": {"seed": 1}}, TypeError, "method 'rollout' takes no parameter seed (its parameters: residual, "
         "head_fusion, discard_ratio)"),
        ({"gradcam": {}}, ValueError, UNKNOWN),
        (3, TypeError, "methods must be None, a method name, a list of names or (name, params) pairs, or a mapping "
         "name -> params, got int"),
    ],
)  # fmt: skip
def test_methods_that_are_neither_names_pairs_nor_a_mapping_are_refused(methods, error, message):
    with pytest.raises(error) as refused:
        chosen_methods(methods)
    assert str(refused.value) == message


def _embedding_rows(rows: int) -> EmbeddingTarget:
    return EmbeddingTarget(torch.linspace(-1, 1, rows * 16, dtype=torch.float64).view(rows, 16) + 0.1)


COUNT = "one for every image, or one per image"


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: _embedding_rows(5), f"the target embedding holds 5 vectors for 3 images; expected (16,) or (3, 16): "
         f"{COUNT}"),
        (lambda: _embedding_rows(2), f"the target embedding holds 2 vectors for 3 images; expected (16,) or (3, 16): "
         f"{COUNT}"),
        (lambda: ImageTarget(torch.rand(2, 1, 8, 8, dtype=torch.float64), preprocessed=True),
         f"the target image holds 2 images for 3 images; expected 1 or 3: {COUNT}"),
    ],
)  # fmt: skip
def test_a_backbone_target_serves_every_image_or_one_each(make, message):
    """A (5, D) target for 3 images is refused, as explain refuses it, not cut to its first 3 rows; (2, D) and a
    2-image ImageTarget are refused naming both counts (an IndexError from deep inside before)."""
    torch.manual_seed(0)
    model = tiny_vit(num_classes=0).double()
    images = torch.rand(3, 1, 8, 8, dtype=torch.float64)
    for method in ("relevance", "grad-cam"):
        with pytest.raises(ValueError) as refused:
            faithfulness(model, images, [method], make(), preprocessed=True, steps=2)
        assert str(refused.value) == message
        with pytest.raises(ValueError) as refused:
            explain(model, images, method, make(), preprocessed=True)
        assert str(refused.value) == message


def test_one_target_embedding_per_image_scores_each_image_by_its_own():
    """(3, D) for 3 images: image i's curves start at cos(y_i, e_i), its copies scored against its own row."""
    torch.manual_seed(0)
    model = tiny_vit(num_classes=0).double()
    images = torch.rand(3, 1, 8, 8, dtype=torch.float64)
    target = _embedding_rows(3)
    result = faithfulness(model, images, ["relevance"], target, preprocessed=True, steps=2)
    with torch.no_grad():
        expected = torch.nn.functional.cosine_similarity(model(images), target.vector, dim=-1)
    torch.testing.assert_close(result.curves["relevance"]["deletion"][:, 0], expected)


# --- the command ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def digits_model(tmp_path_factory):
    """A digits model trained for 3 short epochs on 1024 digits (about 30% test accuracy): enough that where it
    looks can be told from a random map."""
    train_set, test_set = load_digits()
    torch.manual_seed(0)
    model = ViT(**TINY_DIGITS)
    config = TrainConfig(epochs=3, batch_size=32, lr=5e-3, warmup_epochs=1, weight_decay=0.05, seed=0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # module scope, so before the tests' own one-thread fixture; restored after
    try:
        train(model, train_set.subset(range(1024)), test_set.subset(range(16)), config, progress=False)
    finally:
        torch.set_num_threads(threads)
    path = tmp_path_factory.mktemp("digits") / "model.safetensors"
    model.preprocessing = Preprocessing.plain(8, 1)  # what vit-einops train records: resize, scale to [0, 1]
    save_vit(model.eval(), path)
    return path, test_set


def test_cli_scores_every_method_and_relevance_beats_the_random_map(digits_model, capsys):
    path, _ = digits_model
    assert main(["faithfulness", str(path), "--num-images", "32", "--out", "scores", "--no-progress", "--threads",
                 "1"]) == 0
    out = capsys.readouterr().out
    report = json.loads(Path("scores/faithfulness.json").read_text())
    assert set(report["methods"]) == set(METHODS) and report["images"] == 32 and report["patches"] == PATCHES
    assert report["convention"]["zero_point_included"] and report["x"]["positive"][0] == 0.0
    relevance, random = report["methods"]["relevance"]["auc"], report["methods"]["random"]["auc"]
    for name, metric in METRICS.items():
        if metric.better == "lower":
            assert relevance[name]["mean"] < random[name]["mean"], name
        else:
            assert relevance[name]["mean"] > random[name]["mean"], name
        low, high = relevance[name]["low"], relevance[name]["high"]
        assert low <= relevance[name]["mean"] <= high
        assert np.mean(relevance[name]["per_image"]) == pytest.approx(relevance[name]["mean"], rel=1e-12)
        row = next(line for line in out.splitlines() if line.startswith("relevance"))
        assert f"{relevance[name]['mean']:.3f} [{low:.3f}, {high:.3f}]" in row
    with Image.open("scores/faithfulness.png") as png:
        assert png.size[0] >= 600
    # The output exists now: refused, as every command refuses one, and replaced only with --force.
    assert main(["faithfulness", str(path), "--num-images", "2", "--out", "scores", "--no-progress"]) == 2
    assert "scores already holds faithfulness.json, faithfulness.png; pass --force" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--methods", "gradcam"], UNKNOWN),
        (["--methods", "rollout:head_fusion"], "--methods 'rollout:head_fusion': expected NAME or NAME:KEY=VALUE"),
        (["--methods", "rollout:seed=1"], "method 'rollout' takes no parameter seed"),
        (["--steps", "17"], "steps must be an int in [1, 16], got 17"),
        (["--steps", "0"], "steps must be an int in [1, 16], got 0"),
        (["--num-images", "0"], "--num-images must be"),
        (["--images", "empty"], "--images 'empty' holds no image files (.png"),
        (["--images", "notes"], "--images 'notes' holds no image files (.png"),
        (["--images", "broken"], "broken/0.png"),
    ],
)
def test_cli_refusals(digits_model, capsys, args, message):
    path, _ = digits_model
    Path("empty").mkdir()
    Path("notes").mkdir()
    Path("notes/readme.txt").write_text("not an image")
    Path("broken").mkdir()
    Path("broken/0.png").write_text("not a png")
    assert main(["faithfulness", str(path), "--out", "scores", "--no-progress", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vit-einops faithfulness: error:") and message in err, err
    if message == UNKNOWN:  # the whole line, exactly
        assert err == f"vit-einops faithfulness: error: {UNKNOWN}\n"
    assert not Path("scores").exists()


def test_methods_and_their_parameters_from_the_command_line():
    assert parse_method("rollout:head_fusion=max,residual=0.25") == ("rollout", {"head_fusion": "max", "residual": 0.25})
    assert parse_method("random:seed=3") == ("random", {"seed": 3}) and parse_method("relevance") == ("relevance", {})



def _model_file(tmp_path, **overrides):
    """A tiny untrained model file with the plain preprocessing of `vit-einops train`."""
    torch.manual_seed(0)
    model = tiny_vit(**overrides)
    model.preprocessing = Preprocessing.plain(8, 1)
    save_vit(model, tmp_path / "model.safetensors")
    return str(tmp_path / "model.safetensors")


def test_cli_scores_the_random_map_alone_or_with_its_own_seed(tmp_path, capsys):
    """--methods random was refused as given twice: the command's (name, params) pairs went unseen."""
    assert main(["faithfulness", _model_file(tmp_path), "--num-images", "2", "--steps", "2", "--methods", "random",
                 "--out", "scores", "--no-progress"]) == 0, capsys.readouterr().err
    assert list(json.loads(Path("scores/faithfulness.json").read_text())["methods"]) == ["random"]
    chosen = chosen_methods([parse_method(text) for text in ("random:seed=3", "relevance")])
    assert chosen == {"random (seed 3)": ("random", {"seed": 3}), "relevance": ("relevance", {"start_layer": 0})}


@pytest.mark.parametrize("rows", [5, 2])
def test_cli_refuses_a_target_embedding_for_another_number_of_images(tmp_path, capsys, rows):
    path = _model_file(tmp_path, num_classes=0)
    (tmp_path / "images").mkdir()
    for i in range(3):
        Image.fromarray(np.full((8, 8), 40 * i, np.uint8)).save(tmp_path / "images" / f"{i}.png")
    torch.save(_embedding_rows(rows).vector.float(), tmp_path / "target.pt")
    assert main(["faithfulness", path, "--images", str(tmp_path / "images"), "--target-embedding",
                 str(tmp_path / "target.pt"), "--methods", "relevance", "--out", "scores", "--no-progress"]) == 2
    message = f"the target embedding holds {rows} vectors for 3 images; expected (16,) or (3, 16): {COUNT}"
    assert capsys.readouterr().err == f"vit-einops faithfulness: error: {message}\n"
    assert not Path("scores").exists()


def test_an_image_folders_images_are_its_image_files_in_name_order(tmp_path):
    for name in ("b.png", "a.JPG", "c.txt", ".hidden.png", "d.webp"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "e.png").mkdir()  # a folder named like an image is opened, and refused, where it is read
    assert [p.name for p in image_files(tmp_path)] == ["a.JPG", "b.png", "d.webp", "e.png"]


def test_a_method_that_cannot_read_the_model_is_left_out_of_every_method_and_refused_by_name_before_scoring():
    # decompose needs a linear head: with a tanh pre_logits layer, "every method" scores the others, and asking
    # for it by name says why before any map is made
    from vit_einops.inspect import faithfulness
    from vit_einops.inspect.methods import METHODS

    torch.manual_seed(0)
    model = tiny_vit(representation_size=8).eval()
    images = torch.rand(2, 1, 8, 8)
    with pytest.raises(ValueError, match=r"^method 'decomposition' needs a linear classifier: this model's head has"):
        faithfulness(model, images, methods=["rollout", "decomposition"], preprocessed=True)
    result = faithfulness(model, images, methods=None, preprocessed=True, steps=2)
    assert list(result.aucs) == [name for name in METHODS if name != "decomposition"]
