"""Training: the schedule, augmentation, data loading, a short run that learns, exact resume, and the CLI."""

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from _tiny import TINY_DIGITS, model_flags
from PIL import Image
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset

from vit_einops import ViT
from vit_einops.commands.cli import main
from vit_einops.train.checkpoint import CheckpointError, load_checkpoint
from vit_einops.train.config import TrainConfig
from vit_einops.train.data import (
    describe_data,
    load_digits,
    load_folder_split,
    load_image,
    load_image_folder,
    stratified_split,
    stratified_subset,
)
from vit_einops.train.loop import TIMING_FIELDS, WarmupCosine, batch_totals, random_shift, resolve_device, train

TINY = dict(TINY_DIGITS, dropout=0.1)  # dropout: resuming must restore its random state too


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every test here on one thread (conftest's one_thread)."""


@pytest.fixture(scope="module")
def digits():
    return load_digits()


def test_warmup_then_cosine():
    f = WarmupCosine(warmup_steps=4, total_steps=14)
    assert [f(t) for t in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert f(4) == 1.0
    assert f(9) == pytest.approx(0.5)  # half way through the decay
    assert f(14) == pytest.approx(0.0, abs=1e-12) and f(20) == pytest.approx(0.0, abs=1e-12)
    assert WarmupCosine(0, 10)(0) == 1.0


def test_train_config_rejects_bad_values():
    # the error names the field and the value
    for bad, match in [
        (dict(epochs=0), r"\bepochs\b.* 0\b"),
        (dict(lr=0.0), r"\blr\b.* 0\.0\b"),
        (dict(warmup_epochs=-1), r"\bwarmup_epochs\b.* -1\b"),
        (dict(label_smoothing=1.0), r"\blabel_smoothing\b.* 1\.0\b"),
        (dict(shift=-1), r"\bshift\b.* -1\b"),
        (dict(seed=-2), r"\bseed\b.* -2\b"),
        (dict(weight_decay=-0.1), r"\bweight_decay\b.* -0\.1\b"),
        (dict(betas=(0.9, 1.0)), r"\bbetas\[1\].* 1\.0\b"),
    ]:
        with pytest.raises(ValueError, match=match):
            TrainConfig(**bad)
    for name in ("epochs", "batch_size", "warmup_epochs", "shift", "seed"):
        with pytest.raises(TypeError, match=rf"\b{name}\b.*\bint\b.* 2\.0\b"):
            TrainConfig(**{name: 2.0})


def test_random_shift_equals_per_image_slicing():
    images = torch.rand(5, 3, 6, 7)
    torch.manual_seed(3)
    got = random_shift(images, 2)
    torch.manual_seed(3)
    dy, dx = torch.randint(0, 5, (2, 5, 1))
    padded = F.pad(images, (2, 2, 2, 2))
    for i in range(5):
        y, x = int(dy[i]), int(dx[i])
        assert torch.equal(got[i], padded[i, :, y : y + 6, x : x + 7])
    assert random_shift(images, 0) is images


def test_batch_totals_stay_on_the_batch_device():
    # The meta device stands in for a GPU: a CPU tensor among the stacked ones would raise, as on cuda.
    logits = torch.tensor([[0.0, 2.0], [3.0, 1.0], [0.0, 1.0]])
    labels = torch.tensor([1, 1, 1])
    totals = batch_totals(torch.tensor(0.5), logits, labels)
    assert totals.tolist() == [1.5, 2.0, 3.0]
    on_meta = batch_totals(torch.tensor(0.5, device="meta"), logits.to("meta"), labels.to("meta"))
    assert on_meta.device.type == "meta" and on_meta.shape == (3,)


def test_digits_split_is_fixed_stratified_and_in_range(digits):
    train_set, test_set = digits
    assert (len(train_set), len(test_set)) == (1437, 360)
    assert train_set.images.shape[1:] == (1, 8, 8) and train_set.images.dtype == torch.float32
    assert train_set.images.min() == 0.0 and train_set.images.max() == 1.0
    counts = torch.bincount(test_set.labels, minlength=10)
    assert counts.min() >= 35 and counts.max() <= 37  # ~20% of each class's ~180 images
    again_train, _ = load_digits()
    assert torch.equal(again_train.images, train_set.images)


def test_stratified_split_is_a_partition():
    labels = torch.tensor([0] * 10 + [1] * 20)
    train_idx, test_idx = stratified_split(labels, 0.3, seed=1)
    assert sorted([*train_idx, *test_idx]) == list(range(30))
    assert np.bincount(labels[test_idx].numpy()).tolist() == [3, 6]
    with pytest.raises(ValueError, match="test fraction"):
        stratified_split(labels, 1.0, seed=1)


def make_folder(root, classes=("cat", "dog"), per_class=5, size=(12, 10)):
    for c, name in enumerate(classes):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            Image.new("RGB", size, (255 * c, 40 * i, 0)).save(root / name / f"{i}.png")
    (root / "README.txt").write_text("not a class folder")


def test_image_folder_loading(tmp_path):
    make_folder(tmp_path / "data")
    data = load_image_folder(tmp_path / "data", 8, in_channels=3)
    assert data.classes == ["cat", "dog"] and data.images.shape == (10, 3, 8, 8)
    assert data.labels.tolist() == [0] * 5 + [1] * 5
    assert torch.allclose(data.images[5:, 0], torch.ones(5, 8, 8))  # dog images are red
    grey = load_image(tmp_path / "data" / "dog" / "0.png", (4, 6), in_channels=1)
    assert grey.shape == (1, 4, 6)
    train_set, test_set = load_folder_split(tmp_path / "data", None, 8, test_fraction=0.4)
    assert (len(train_set), len(test_set)) == (6, 4) and sorted(test_set.labels.tolist()) == [0, 0, 1, 1]


def test_image_folder_through_a_models_own_transforms(tmp_path):
    """transform=model.transforms() reads each file as the model would at predict time (the course workflow)."""
    from vit_einops.images import open_image
    from vit_einops.preprocess import Preprocessing

    make_folder(tmp_path / "data", size=(40, 30))
    prep = Preprocessing.torchvision(16)  # resize 18, centre crop 16, ImageNet mean and std
    data = load_image_folder(tmp_path / "data", transform=prep)
    assert data.classes == ["cat", "dog"] and data.images.shape == (10, 3, 16, 16)
    expected = prep(open_image(tmp_path / "data" / "dog" / "3.png"))
    assert torch.equal(data.images[8], expected)  # the same numbers, not rescaled to [0, 1] or resized again


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({}, TypeError, "exactly one of image_size .* and transform="),
        ({"image_size": 8, "transform": lambda im: im}, TypeError, "exactly one of image_size"),
        ({"transform": "resize"}, TypeError, "transform must be callable .*, got str"),
        ({"transform": lambda im: im}, TypeError, r"must turn a PIL image into a \(C, H, W\) float tensor, got Image$"),
        (
            {"transform": lambda im: torch.zeros(3, im.size[0] % 2 + 4, 4)},
            ValueError,
            "transform made images of 2 shapes",
        ),
        (  # a std of 0 in a hand-made Normalize: it was loaded, and training went nan
            {"transform": lambda im: torch.full((3, 4, 4), float("nan") if im.size[0] == 11 else 0.5)},
            ValueError,
            r"transform .* made 1 of 11 images with non-finite values \(nan or inf\)$",
        ),
    ],
)
def test_image_folder_transform_errors(tmp_path, kwargs, error, message):
    make_folder(tmp_path / "data", size=(12, 10))
    Image.new("RGB", (11, 10)).save(tmp_path / "data" / "dog" / "odd.png")  # an odd width: a second shape
    with pytest.raises(error, match=message):
        load_image_folder(tmp_path / "data", **kwargs)


def test_image_folder_errors(tmp_path):
    make_folder(tmp_path / "data")
    make_folder(tmp_path / "test", classes=("cat", "bird"))
    with pytest.raises(ValueError, match="expected the training classes"):
        load_folder_split(tmp_path / "data", tmp_path / "test", 8)
    with pytest.raises(ValueError, match="does not exist"):
        load_image_folder(tmp_path / "missing", 8)
    (tmp_path / "data" / "cat" / "broken.png").write_bytes(b"not a png")
    with pytest.raises(ValueError, match="cannot read image.*broken.png"):
        load_image_folder(tmp_path / "data", 8)
    with pytest.raises(ValueError, match="needs a training folder"):
        describe_data(None, tmp_path / "test", 0.2)


def untimed(records):
    return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in records]


def run_tiny(digits, out=None, **kwargs):
    train_set, test_set = digits
    torch.manual_seed(0)
    model = ViT(**TINY)
    config = TrainConfig(**{"epochs": 2, "batch_size": 32, "warmup_epochs": 1, "seed": 5, **kwargs.pop("config", {})})
    result = train(
        model, train_set.subset(range(160)), test_set.subset(range(64)), config, out_dir=out, progress=False, **kwargs
    )
    return model, result


def test_one_short_epoch_lowers_the_loss(digits):
    # A ViT's loss sits near ln(10) for its first few dozen steps; 64 steps at a high rate get past that, at dim 32.
    train_set = digits[0].subset(range(1024))
    torch.manual_seed(0)
    model = ViT(**{**TINY, "dim": 32})

    def loss() -> float:
        with torch.no_grad():
            return F.cross_entropy(model.eval()(train_set.images), train_set.labels).item()

    before = loss()
    config = TrainConfig(epochs=1, batch_size=16, lr=3e-3, warmup_epochs=0, shift=0)
    train(model, train_set, digits[1].subset(range(32)), config, progress=False)
    assert loss() < before - 0.15


def test_resume_is_bit_identical_to_an_uninterrupted_run(digits, tmp_path, unrendered_training):
    whole, whole_result = run_tiny(digits, tmp_path / "whole")
    run_tiny(digits, tmp_path / "split", stop_after=1)
    assert load_checkpoint(tmp_path / "split" / "checkpoint").train_state["epoch"] == 1
    resumed, resumed_result = run_tiny(digits, tmp_path / "split", resume=True)
    for (name, a), b in zip(whole.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert whole_result.weights_sha256 == resumed_result.weights_sha256
    lines = [json.loads(line) for line in (tmp_path / "split" / "metrics.jsonl").read_text().splitlines()]
    assert untimed(lines) == untimed(whole_result.records) and len(lines) == 2
    for name in ("curves.png", "summary.json"):
        assert (tmp_path / "split" / name).stat().st_size > 0
    summary = json.loads((tmp_path / "whole" / "summary.json").read_text())
    recorded = json.loads((tmp_path / "whole" / "checkpoint" / "checkpoint.json").read_text())["files"]["model"][
        "sha256"
    ]
    assert summary["weights_sha256"] == [recorded]


def test_resume_refuses_a_different_recipe(digits, tmp_path, unrendered_training):
    run_tiny(digits, tmp_path, stop_after=1)
    with pytest.raises(CheckpointError, match="train_config"):
        run_tiny(digits, tmp_path, resume=True, config={"lr": 1e-2})
    with pytest.raises(CheckpointError, match="no checkpoint"):
        run_tiny(digits, tmp_path / "empty", resume=True)


def test_cli_train_then_inspect(tmp_path, capsys, rendered_only):
    rendered_only("attention", "attention_distance", "position_similarity", "embedding_filters")  # read below
    out = tmp_path / "run"
    assert main(["train", "--limit", "96", "--epochs", "1", "--out", str(out), "--no-progress", *model_flags()]) == 0
    assert "test accuracy" in capsys.readouterr().out
    flags = ["--num-images", "3", "--distance-images", "32", "--arrays", "full"]  # the maps are checked below
    assert main(["inspect", "--checkpoint", str(out / "checkpoint"), *flags]) == 0
    for name in ("attention", "attention_distance", "position_similarity", "embedding_filters"):
        with Image.open(out / "inspect" / f"{name}.png") as png:
            assert png.size[0] > 200, name
    arrays = np.load(out / "inspect" / "arrays.npz")
    assert arrays["attention"].shape == (2, 3, 2, 17, 17)
    assert arrays["mean_attention_distance"].shape == (2, 2)
    np.testing.assert_allclose(arrays["attention"].sum(-1), 1.0, atol=1e-5)
    # The run's model file carries what a study needs: the inputs it was trained on, the names, the provenance.
    from vit_einops.modelfile import load_vit

    model = load_vit(out / "model.safetensors")
    assert model.class_names == [str(d) for d in range(10)]
    assert model.preprocessing.resize == (8, 8) and model.preprocessing.mean == (0.0,)
    assert model.source == {"library": "vit-einops", "trained_on": "digits", "seed": 0}
    capsys.readouterr()
    assert main(["inspect", str(out / "model.safetensors"), "--num-images", "2", "--force"]) == 0
    assert str(out / "inspect" / "attention.png") in capsys.readouterr().out  # the run's inspect/, as before


def test_cli_trains_on_a_folder_and_inspects_a_given_image(tmp_path, unrendered):
    make_folder(tmp_path / "data", per_class=6)
    out = tmp_path / "run"
    args = ["--data", str(tmp_path / "data"), "--image-size", "8", "--patch-size", "4", "--dim", "16", "--depth", "1"]
    assert (
        main(["train", *args, "--heads", "2", "--mlp-dim", "16", "--epochs", "1", "--out", str(out), "--no-progress"])
        == 0
    )
    ckpt = load_checkpoint(out / "checkpoint")
    assert ckpt.config.num_classes == 2 and ckpt.config.in_channels == 3
    assert ckpt.train_state["data"]["classes"] == ["cat", "dog"]
    image = tmp_path / "data" / "dog" / "0.png"
    assert (
        main(
            ["inspect", "--checkpoint", str(out / "checkpoint"), "--image", str(image), "--out", str(tmp_path / "figs")]
        )
        == 0
    )
    assert np.load(tmp_path / "figs" / "arrays.npz")["images"].shape == (1, 3, 8, 8)


def test_cli_preset_on_the_digits_needs_a_fitting_patch_size(tmp_path, capsys):
    assert main(["train", "--preset", "vit_ti_16", "--epochs", "1", "--out", str(tmp_path), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert re.search(r"vit-einops train: error: --preset vit_ti_16\b.*\b16\b.*\b8\b", err), err
    assert "pass --patch-size 1, 2, 4 or 8" in err
    assert not (tmp_path / "checkpoint").exists()


def test_an_embedding_head_is_not_trained_as_a_classifier():
    """CLIP's projection (ViTConfig.embedding) outputs no classes: train() refuses it before anything runs."""
    model = ViT(**{**TINY_DIGITS, "embedding": True})
    data = TensorDataset(torch.rand(4, 1, 8, 8), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError) as err:
        train(model, data, config=TrainConfig(epochs=1, batch_size=2), device="cpu", progress=False)
    assert str(err.value) == (
        "the model's head is an embedding projection (its 10 outputs are an embedding, not class logits); call "
        "model.reset_classifier(K) for a classifier of the data's K classes"
    )


def test_cli_preset_takes_its_number_of_classes_from_the_data(tmp_path):
    small = ["--patch-size", "4", "--dim", "16", "--depth", "1", "--heads", "2", "--mlp-dim", "16", "--limit", "32"]
    out = tmp_path / "run"
    assert main(["train", "--preset", "vit_ti_16", *small, "--epochs", "1", "--out", str(out), "--no-progress"]) == 0
    assert load_checkpoint(out / "checkpoint").config.num_classes == 10  # not the preset's 1000


# --- any Dataset or DataLoader (issue 9) -------------------------------------------------------------------------


def train_tiny(train_data, test_data, out=None, model_kwargs=None, **kwargs):
    """A tiny ViT trained for 2 epochs; the recipe's seed also fixes the sampler order."""
    torch.manual_seed(0)
    model = ViT(**{**TINY, **(model_kwargs or {})})
    config = TrainConfig(epochs=2, batch_size=32, warmup_epochs=1, seed=5)
    return model, train(model, train_data, test_data, config, out_dir=out, progress=False, **kwargs)


def same_weights(a, b):
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


@pytest.fixture(scope="module")
def small(digits):
    return digits[0].subset(range(160)), digits[1].subset(range(64))


def test_a_tensor_dataset_and_a_dataloader_over_it_train_exactly_as_the_in_memory_dataset(small):
    train_set, test_set = small
    reference, ref = train_tiny(train_set, test_set)
    tensors, tensor_test = TensorDataset(train_set.images, train_set.labels), TensorDataset(*test_set[:])
    as_dataset, got = train_tiny(tensors, tensor_test)
    assert same_weights(as_dataset, reference) and untimed(got.records) == untimed(ref.records)
    assert reference.class_names == [str(d) for d in range(10)]  # from ImageDataset.classes
    assert as_dataset.class_names is None  # a TensorDataset has no names
    # A DataLoader with the sampler train() would use (it calls set_epoch on it): the same batches again. Without
    # dropout, since iter(DataLoader) draws a worker seed from the global RNG, which dropout would then feel.
    no_dropout = {"dropout": 0.0}
    reference, ref = train_tiny(train_set, test_set, model_kwargs=no_dropout)
    sampler = DistributedSampler(tensors, num_replicas=1, rank=0, shuffle=True, seed=5)
    loader = DataLoader(tensors, batch_size=32, sampler=sampler)
    as_loader, got = train_tiny(loader, DataLoader(tensor_test, 17), model_kwargs=no_dropout)
    assert same_weights(as_loader, reference) and untimed(got.records) == untimed(ref.records)


def test_a_shuffling_dataloader_resumes_exactly(small, tmp_path, unrendered_training):
    # train() reseeds the global RNG before each epoch's iter(loader); RandomSampler draws its order from it.
    tensors, test = TensorDataset(*small[0][:]), small[1]
    whole, _ = train_tiny(DataLoader(tensors, batch_size=32, shuffle=True), test)  # no files: the same weights
    train_tiny(DataLoader(tensors, batch_size=32, shuffle=True), test, tmp_path / "split", stop_after=1)
    resumed, _ = train_tiny(DataLoader(tensors, batch_size=32, shuffle=True), test, tmp_path / "split", resume=True)
    assert same_weights(resumed, whole)
    in_order, _ = train_tiny(DataLoader(tensors, batch_size=32), test)  # the shuffle did change the batches
    assert not same_weights(in_order, whole)


def test_a_dataloader_with_its_own_generator_warns_on_resume_and_does_not_repeat(
    small, tmp_path, unrendered_training
):
    # Its generator's state after epoch 1 is in no checkpoint: a fresh one replays epoch 1's order in epoch 2.
    tensors, test = TensorDataset(*small[0][:]), small[1]

    def loader():
        return DataLoader(tensors, batch_size=32, shuffle=True, generator=torch.Generator().manual_seed(7))

    whole, _ = train_tiny(loader(), test)
    train_tiny(loader(), test, tmp_path / "split", stop_after=1)
    with pytest.warns(UserWarning, match="own generator=.*will not repeat"):
        resumed, _ = train_tiny(loader(), test, tmp_path / "split", resume=True)
    assert not same_weights(resumed, whole)


class FolderDataset(Dataset):
    """torchvision.datasets.ImageFolder's interface, written out: ``.classes``, items (image tensor, label)."""

    def __init__(self, root, size):
        self.classes = sorted(d.name for d in root.iterdir() if d.is_dir())
        self.samples = [(p, i) for i, c in enumerate(self.classes) for p in sorted((root / c).glob("*.png"))]
        self.size = size

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, index):
        path, label = self.samples[index]
        return load_image(path, self.size, in_channels=3), label


def test_train_on_a_folder_dataset_and_a_dataloader_over_it(tmp_path):
    make_folder(tmp_path / "data", per_class=6)
    folder = FolderDataset(tmp_path / "data", 8)
    rgb = {"in_channels": 3, "num_classes": 2}
    reference, ref = train_tiny(load_image_folder(tmp_path / "data", 8), folder, model_kwargs=rgb)
    as_dataset, got = train_tiny(folder, folder, model_kwargs=rgb)
    assert same_weights(as_dataset, reference) and untimed(got.records) == untimed(ref.records)
    as_loader, got = train_tiny(DataLoader(folder, batch_size=4, shuffle=True), folder, model_kwargs=rgb)
    assert as_loader.class_names == ["cat", "dog"] and [r["epoch"] for r in got.records] == [1, 2]
    with pytest.raises(ValueError, match=r"\b2 classes \(cat, dog\).*\b3 outputs"):
        train_tiny(folder, folder, model_kwargs={**rgb, "num_classes": 3})


def test_data_of_the_wrong_kind_is_refused_saying_what_is_expected(small):
    train_set, test_set = small
    dicts = [{"pixel_values": x, "labels": y} for x, y in zip(train_set.images[:8], train_set.labels[:8], strict=True)]
    cases = [
        (iter([]), TypeError, "must be a map-style Dataset .* or a DataLoader, got list_iterator"),
        (TensorDataset(train_set.images[:0], train_set.labels[:0]), ValueError, "the training data is empty"),
        (DataLoader(dicts, batch_size=4), TypeError, r"must yield \(images, labels\) pairs, got a dict with keys"),
        (TensorDataset(train_set.images, train_set.labels.float()), TypeError, "integer class labels"),
    ]
    for data, error, match in cases:
        with pytest.raises(error, match=match):
            train_tiny(data, test_set)


def test_device_auto_is_cuda_when_available_else_cpu():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto") == torch.device(expected)
    assert resolve_device("cpu") == torch.device("cpu") and resolve_device(torch.device("cpu")).type == "cpu"
    with pytest.raises(ValueError, match=r"\bdevice\b.*'gpu0'"):
        resolve_device("gpu0")
    with pytest.raises(TypeError, match="device must be"):
        resolve_device(0)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="asked for CUDA"):
            resolve_device("cuda")


def test_train_on_device_auto_puts_the_model_there(small):
    model, _ = train_tiny(*small, device="auto")
    assert next(model.parameters()).device.type == ("cuda" if torch.cuda.is_available() else "cpu")


def test_stratified_subset_takes_every_class_in_its_share(digits):
    index = stratified_subset(digits[0].labels, 20)
    assert torch.bincount(digits[0].labels[index], minlength=10).tolist() == [2] * 10
    assert list(index) == sorted(set(index.tolist()))
    labels = torch.tensor([0] * 90 + [1] * 10)
    assert np.bincount(labels[stratified_subset(labels, 10)].numpy()).tolist() == [9, 1]
    assert list(stratified_subset(labels, 500)) == list(range(100))
    with pytest.raises(ValueError, match=r"\blimit\b.*\b0$"):
        stratified_subset(labels, 0)


# --- what a run reports: its folder, its schedule, its curves, its per-class scores -----------------------------------


@pytest.mark.parametrize(
    "data, expected",
    [
        (None, "digits"),
        ("pizza_steak_sushi/train", "pizza_steak_sushi"),
        ("pizza_steak_sushi/Test", "pizza_steak_sushi"),
        ("food/photos", "photos"),
        ("flowers/validation/", "flowers"),
    ],
)
def test_the_default_output_folder_is_named_after_the_data(tmp_path, data, expected):
    from vit_einops.commands.train import default_out

    assert default_out(None if data is None else str(tmp_path / data)) == Path("runs") / expected


def test_cli_writes_a_split_folders_run_under_the_datas_name(tmp_path):
    make_folder(tmp_path / "pizza_steak_sushi" / "train", per_class=4)
    args = ["--data", str(tmp_path / "pizza_steak_sushi" / "train"), "--image-size", "8", "--patch-size", "4"]
    assert main(["train", *args, *model_flags(dict(TINY, depth=1)), "--epochs", "1", "--no-progress"]) == 0
    summary = json.loads(Path("runs/pizza_steak_sushi/summary.json").read_text())  # in the test's own cwd
    assert summary["classes"] == ["cat", "dog"]


def test_warm_up_is_capped_at_a_fifth_of_a_short_run_and_says_so_once(digits, capsys):
    from vit_einops.train.loop import warmup_steps

    assert warmup_steps(TrainConfig(epochs=3), 23) == (13, True)  # 5 epochs asked, int(0.2 * 69) given
    assert warmup_steps(TrainConfig(), 23) == (115, False)  # the default 5 of 120 epochs: under the cap
    assert warmup_steps(TrainConfig(epochs=10, warmup_epochs=2), 7) == (14, False)  # exactly the cap
    _, result = run_tiny(digits, config={"epochs": 3, "warmup_epochs": 5, "batch_size": 32})  # 5 steps an epoch
    # 5 is the default: the note says so rather than "the 5 epochs asked" to a user who asked none.
    assert capsys.readouterr().err.count(
        "note: warm-up capped at 3 steps (0.6 epochs), 20% of the run, instead of the default warm-up of 5 epochs "
        "(warmup_epochs, --warmup-epochs), so that the learning rate still decays\n"
    ) == 1
    # The rate at the end of each epoch, by the cosine formula after 3 warm-up steps of 15: it decays to 0.
    expected = [2e-3 * 0.5 * (1 + math.cos(math.pi * (5 * e - 3) / 12)) for e in (1, 2, 3)]
    assert [r["lr"] for r in result.records] == pytest.approx(expected, rel=1e-12, abs=1e-18)
    run_tiny(digits, config={"epochs": 1, "warmup_epochs": 3, "batch_size": 32})
    assert "instead of the 3 epochs asked (warmup_epochs), so" in capsys.readouterr().err


def test_curves_show_train_and_test_loss_and_accuracy_on_whole_epochs():
    from vit_einops.train.plots import plot_curves

    records = [
        {"epoch": e, "train_loss": 2.0 / e, "test_loss": 2.2 / e, "train_acc": 0.3 * e, "test_acc": 0.25 * e}
        for e in (1, 2, 3)
    ]
    fig = plot_curves(records)
    fig.canvas.draw()
    loss, acc = fig.axes
    assert [line.get_label() for line in loss.get_lines()] == ["train", "test"]
    assert [list(line.get_ydata()) for line in loss.get_lines()] == [[2.0, 1.0, 2.0 / 3], [2.2, 1.1, 2.2 / 3]]
    assert [line.get_label() for line in acc.get_lines()] == ["train", "test"]
    for ax in (loss, acc):
        low, high = ax.get_xlim()
        shown = [t for t in ax.get_xticks() if low <= t <= high]
        assert shown and all(float(t).is_integer() for t in shown), shown


def test_summary_gives_per_class_accuracy_and_the_confusion_matrix_of_the_final_model(digits, tmp_path):
    from sklearn.metrics import confusion_matrix

    model, result = run_tiny(digits, tmp_path)
    test_set = digits[1].subset(range(64))
    summary = json.loads((tmp_path / "summary.json").read_text())
    with torch.no_grad():
        logits = model.eval()(test_set.images)
    expected = confusion_matrix(test_set.labels.numpy(), logits.argmax(-1).numpy(), labels=range(10))
    assert summary["classes"] == [str(d) for d in range(10)]
    assert summary["confusion_matrix"] == expected.tolist()
    counts = np.bincount(test_set.labels.numpy(), minlength=10)
    assert [sum(row) for row in summary["confusion_matrix"]] == counts.tolist()  # rows: the true classes
    per_class = [expected[i, i] / counts[i] if counts[i] else None for i in range(10)]
    assert list(summary["per_class_accuracy"].values()) == pytest.approx(per_class, rel=1e-12)
    assert summary["test_acc"] == np.trace(expected) / counts.sum()
    smoothed = F.cross_entropy(logits.double(), test_set.labels, label_smoothing=0.1).item()
    assert result.records[-1]["test_loss"] == pytest.approx(smoothed, rel=1e-6)
    with Image.open(tmp_path / "confusion.png") as png:
        assert png.size[0] > 300


def test_the_confusion_figure_draws_class_names_as_literal_text():
    """Class names come from folder names: "$x_1$" or an unbalanced "$\\frac{" is text, never mathtext (which would
    raise ParseException on the second, and typeset the first)."""
    from vit_einops.base.plot import figure_png
    from vit_einops.train.plots import plot_confusion

    names = ["$x_1$", "$\\frac{", "plain"]
    fig = plot_confusion([[3, 1, 0], [0, 2, 0], [1, 0, 0]], names)
    assert figure_png(fig).startswith(b"\x89PNG")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == names
    assert [t.get_text() for t in ax.get_yticklabels()] == ["$x_1$ (75.0%)", "$\\frac{ (100.0%)", "plain (0.0%)"]
    with pytest.raises(ValueError, match=r"expected a 3x3 confusion matrix for 3 classes, got 2 rows"):
        plot_confusion([[1, 0, 0], [0, 1, 0]], names)
