"""What a new user meets in the first hour: a study command's default output lands in the current directory (or
in a training run's own folder), never inside or beside the model it reads, which may sit in a hub cache."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from _hostile import assert_user_error, grey_png, run_cli, tiny_model
from _tiny import TINY_RGB16, tiny_vit
from test_hostile_writes import INSPECT, REPORT, tree

from vit_einops.inspect.report import ARRAYS
from vit_einops.interop import save_hf, save_state_dict_file, to_timm


@pytest.fixture
def hub_cache(tmp_path):
    """A Hugging Face model folder and a timm weights file laid out as in the hub's cache (snapshots/<commit>/)."""
    snapshot = tmp_path / "hub" / "models--org--tiny" / "snapshots" / "0123abcd"
    save_hf(tiny_model(class_names=[f"digit {i}" for i in range(10)]), snapshot)
    timm_file = tmp_path / "hub" / "models--timm--tiny" / "snapshots" / "4567ef01" / "tiny.pth"
    timm_file.parent.mkdir(parents=True)
    save_state_dict_file(to_timm(tiny_vit(TINY_RGB16)), timm_file)
    return {"hf": snapshot, "timm": timm_file}


@pytest.mark.parametrize(
    "form, flags, written",
    [("hf", [], "0123abcd-inspect"), ("timm", ["--heads", str(TINY_RGB16["heads"])], "tiny-inspect")],
)
def test_inspect_of_a_model_in_a_cache_writes_in_the_current_directory(
    tmp_path, hub_cache, unrendered, form, flags, written
):
    before = tree(tmp_path / "hub")
    image = grey_png(tmp_path / "digit.png")  # given, so that no sample images are loaded
    result = run_cli("inspect", hub_cache[form], "--image", image, *flags, *INSPECT)
    assert result.returncode == 0, result.stderr
    assert tree(tmp_path / "hub") == before  # nothing inside the model's folder nor beside its file
    assert sorted(os.listdir(written)) == REPORT
    assert f"attention: {Path(written) / 'attention.png'}" in result.stdout


def test_a_default_output_inside_the_model_is_refused_naming_out(tmp_path, hub_cache, monkeypatch):
    """Run from inside the Hugging Face folder, the default ./NAME-inspect would lie inside it: refused, before any
    work, naming the flag that chooses another place."""
    before = tree(tmp_path / "hub")
    monkeypatch.chdir(hub_cache["hf"])
    assert_user_error(
        run_cli("inspect", ".", *INSPECT),
        r"the output 0123abcd-inspect lies inside the input \.; refused even with --force: write elsewhere, "
        r"with --out DIR \(this is the default output for MODEL\)",
    )
    assert tree(tmp_path / "hub") == before


def test_an_output_inside_a_hugging_face_folder_is_refused(tmp_path, hub_cache):
    """A Hugging Face folder holds model.safetensors as a training run does, but all of it is read (config.json,
    preprocessor_config.json): no output may go inside it, as inspect's --out or as convert's destination."""
    folder = hub_cache["hf"]
    before = tree(tmp_path / "hub")
    for argv, out in (
        (["inspect", folder, "--out", folder / "inspect", *INSPECT], folder / "inspect"),
        (["convert", folder, folder / "config.json", "--from", "hf", "--force"], folder / "config.json"),
    ):
        message = rf"the output {re.escape(str(out))} lies inside the input {re.escape(str(folder))};"
        assert_user_error(run_cli(*argv), message)
    assert tree(tmp_path / "hub") == before


@pytest.mark.parametrize("kept", list(ARRAYS))  # every choice write_report knows is one --arrays takes
def test_inspect_says_how_large_its_arrays_are_and_keeps_the_maps_only_when_asked(tmp_path, unrendered, kept):
    """Every layer's attention maps (l, b, h, n, n) are most of a full arrays.npz (540 MB for one image of DINOv2-S
    at 518 px): the default keeps the arrays the figures draw, --arrays full adds the maps, --arrays none writes no
    file; the output line gives the file's size and what --arrays full would add."""
    from vit_einops.modelfile import save_vit

    save_vit(tiny_model(), tmp_path / "m.safetensors")
    out = tmp_path / "r"
    result = run_cli("inspect", tmp_path / "m.safetensors", "--image", grey_png(tmp_path / "g.png"), "--out", out,
                     "--arrays", kept, *INSPECT)  # fmt: skip
    assert result.returncode == 0, result.stderr
    line = [line for line in result.stdout.splitlines() if line.lstrip().startswith("arrays:")]
    maps = 2 * 1 * 2 * 17 * 17 * 4  # layers x images x heads x tokens^2 x float32
    if kept == "none":
        assert not (out / "arrays.npz").exists()
        assert line == ["              arrays: none written (--arrays none)"]
        return
    import numpy as np

    size = (out / "arrays.npz").stat().st_size
    stored = np.load(out / "arrays.npz")
    assert ("attention" in stored) == (kept == "full")
    assert stored["class_attention"].shape == (1, 2, 4, 4)  # what attention.png draws is there either way
    adds = f"; --arrays full adds every layer's attention maps, {maps / 1024:.1f} KiB" if kept == "figures" else ""
    assert line == [f"              arrays: {out / 'arrays.npz'} ({size / 1024:.1f} KiB{adds})"]


def test_the_maps_left_out_by_default_are_counted_from_the_sizes():
    """The maps --arrays full adds, for DINOv2-S at 518 px (1 + 37 x 37 tokens, 12 layers of 6 heads), and the
    memory estimate counting their copy into arrays.npz only when they are written."""
    from vit_einops.inspect.report import attention_maps_bytes, report_memory
    from vit_einops.network.config import ViTConfig

    config = ViTConfig(image_size=518, patch_size=14, dim=384, depth=12, heads=6, mlp_dim=1536, num_classes=0)
    assert attention_maps_bytes(config, 1) == 12 * 6 * 1370**2 * 4  # 540,561,600 bytes
    full = report_memory(config, 1, target=False, arrays="full")
    assert full >= 2 * attention_maps_bytes(config, 1)  # the maps and their copy in the file's buffer
    assert report_memory(config, 1, target=False, arrays="figures") <= full


def _texts(fig) -> list[str]:
    """Every text a figure draws (titles, labels, notes), each on one line."""
    from matplotlib.text import Text

    return [t.get_text().replace("\n", " ") for t in fig.findobj(Text) if t.get_text()]


@pytest.mark.parametrize("classes", [0, 3])
def test_a_headless_model_without_a_target_says_why_methods_png_lacks_the_gradient_methods(
    tmp_path, monkeypatch, classes
):
    """A SigLIP-like tower (no class token, no registers, attention pooling) without a classifier nor a target:
    methods.png names the gradient methods it leaves out and the flags that give them a target, and
    prefix_share.png says that the model has no prefix tokens instead of drawing an empty chart. With a
    classifier the gradient methods are drawn, and no note is."""
    import torch

    import vit_einops.inspect.report as report_module
    from vit_einops.inspect import write_report

    drawn = {}
    for name in dir(report_module):  # the two figures under test drawn, the others skipped (most of the time)
        if name.startswith("plot_") and name not in ("plot_methods", "plot_prefix_share"):
            monkeypatch.setattr(report_module, name, lambda *args, **kwargs: None)
    monkeypatch.setattr(report_module, "save_figure", lambda fig, path: drawn.setdefault(Path(path).stem, fig))
    tower = tiny_vit(TINY_RGB16, num_classes=classes, class_token=False, pool="map")
    write_report(tower, torch.rand(1, 3, 16, 16), tmp_path / "r", arrays="none")
    from vit_einops.inspect import METHODS

    gradient = ", ".join(name for name, method in METHODS.items() if method.gradient)
    note = (
        f"Not drawn: {gradient}; they need a target: this model has no classifier; pass --target-embedding FILE, "
        "--target-image PATH or --target-patch ROW,COL (target= in Python)."
    )
    texts = _texts(drawn["methods"])
    assert (note in texts) == (classes == 0)
    assert any(t.startswith("grad-cam") for t in texts) == (classes > 0)  # a column heading
    (chart,) = drawn["prefix_share"].axes
    assert [t.get_text() for t in chart.texts] == [
        "This model has no prefix tokens (no class token, no registers):\nno token before the patches takes any of "
        "their attention."
    ]
    assert len(chart.lines) == 0 and not chart.axison  # no chart drawn


@pytest.mark.parametrize("saved", ["model", "wrapped"])
def test_a_whole_pickled_model_is_refused_in_our_words_saying_to_save_the_state_dict(tmp_path, saved):
    """torch.save(model) pickles the object, not its weights: refused in one line of our own that says what the file
    holds and how to save weights instead; none of torch's text (terminal escapes, advice to unpickle anyway)."""
    import torch

    model = tiny_model()
    torch.save(model if saved == "model" else {"model": model}, tmp_path / "m.pth")
    result = run_cli("predict", tmp_path / "m.pth", grey_png(tmp_path / "g.png"))
    assert_user_error(
        result,
        re.escape(
            f"{tmp_path / 'm.pth'}: holds a pickled object (vit_einops.network.model.ViT), not weights; objects are "
            "never unpickled here (that could run code): save the weights instead, with "
            "torch.save(model.state_dict(), PATH) where the model was made (or vit_einops.save_vit(model, PATH) for "
            "a vit-einops ViT)"
        ) + "$",
    )
    assert "weights_only" not in result.stderr and "\x1b" not in result.stderr and "\\x1b" not in result.stderr


@pytest.mark.parametrize("target", [None, "patch"])
def test_the_explorer_page_says_why_it_holds_no_gradient_method(target):
    """The page's data carries the same reason methods.png prints (the page lists it, disabled, among the methods:
    tests/test_explore_browser.py); a target, or a classifier, makes the gradient methods and leaves no note."""
    import torch

    from vit_einops.explore.page import explorer_pane
    from vit_einops.inspect import METHODS, PatchTarget

    tower = tiny_vit(TINY_RGB16, num_classes=0, class_token=False, pool="map")
    pane = explorer_pane(tower, torch.rand(1, 3, 16, 16), name="tower", preprocessed=True,
                         target=None if target is None else PatchTarget(1, 1))  # fmt: skip
    methods = [m["name"] for m in pane["methods"]]
    if target is None:
        assert methods == [name for name, method in METHODS.items() if not method.gradient]
        gradient = ", ".join(name for name, method in METHODS.items() if method.gradient)
        assert pane["methods_note"] == (
            f"{gradient}: not on this page; they need a target: this model has no classifier; pass "
            "--target-embedding FILE, --target-image PATH or --target-patch ROW,COL (target= in Python)"
        )
    else:
        assert methods == list(METHODS)
        assert pane["methods_note"] == ""


def test_inspect_and_explore_take_a_folder_of_images_as_faithfulness_does(tmp_path, unrendered):
    """--images DIR, as faithfulness reads it (its image files in name order, hidden and other files skipped): inspect
    draws them after any --image, at most --num-images, titled by file name; explore shows them; a folder without
    images is refused by name in both."""
    import numpy as np
    from test_explore import embedded

    from vit_einops.modelfile import save_vit

    save_vit(tiny_model(), tmp_path / "m.safetensors")
    folder = tmp_path / "photos"
    folder.mkdir()
    for name in ("b.png", "a.png", ".hidden.png", "c.png"):
        grey_png(folder / name)
    (folder / "notes.txt").write_text("not an image")
    one = grey_png(tmp_path / "first.png")
    result = run_cli("inspect", tmp_path / "m.safetensors", "--image", one, "--images", folder, "--num-images", "2",
                     "--out", tmp_path / "r", "--distance-images", "2")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert np.load(tmp_path / "r" / "arrays.npz")["images"].shape == (3, 1, 8, 8)  # first.png, a.png, b.png
    result = run_cli("explore", tmp_path / "m.safetensors", "--images", folder, "--out", tmp_path / "p.html")
    assert result.returncode == 0, result.stderr
    assert embedded(tmp_path / "p.html")["titles"] == ["a.png", "b.png", "c.png"]
    (tmp_path / "empty").mkdir()
    suffixes = ".png, .jpg, .jpeg, .bmp, .gif, .tif, .tiff, .webp"
    for command, flags in (("inspect", ["--out", tmp_path / "r2"]), ("explore", ["--out", tmp_path / "e.html"])):
        assert_user_error(
            run_cli(command, tmp_path / "m.safetensors", "--images", tmp_path / "empty", *flags),
            re.escape(f"--images {str(tmp_path / 'empty')!r} holds no image files ({suffixes})"),
        )


def test_patch_pca_png_names_each_image_by_its_file_literally(tmp_path, monkeypatch):
    """patch_pca.png titles each image as the other figures do, by its file's name (with the prediction), as
    literal text: "$x$" stays dollars, a control character is escaped."""
    import vit_einops.inspect.report as report_module

    drawn = {}
    for name in dir(report_module):
        if name.startswith("plot_") and name != "plot_patch_pca":
            monkeypatch.setattr(report_module, name, lambda *args, **kwargs: None)
    monkeypatch.setattr(report_module, "save_figure", lambda fig, path: drawn.setdefault(Path(path).stem, fig))
    from vit_einops.modelfile import save_vit

    save_vit(tiny_model(), tmp_path / "m.safetensors")
    files = [grey_png(tmp_path / "cost $x$.png"), grey_png(tmp_path / "bell\x07.png")]
    result = run_cli("inspect", tmp_path / "m.safetensors", *sum((["--image", f] for f in files), []),
                     "--out", tmp_path / "r", "--arrays", "none", *INSPECT)  # fmt: skip
    assert result.returncode == 0, result.stderr
    titles = [ax.get_title() for ax in drawn["patch_pca"].axes[:2]]
    assert [t.splitlines()[0] for t in titles] == ["cost $x$.png", "bell\\x07.png"]
    assert all(t.splitlines()[1].startswith("predicted ") for t in titles)
    assert all(not ax.title.get_parse_math() for ax in drawn["patch_pca"].axes[:2])


def test_the_explorer_titles_a_training_runs_pane_by_the_run(tmp_path):
    """MODEL given as a run's model file (or its checkpoint/): the pane is titled by the run's folder, not by
    "model.safetensors" or "checkpoint", names every run shares; any other model by its file's name, as before."""
    from test_explore import embedded

    from vit_einops.modelfile import save_vit

    run = tmp_path / "digits-lr3e-4"
    (run / "checkpoint").mkdir(parents=True)  # what makes a folder a training run (training_run)
    save_vit(tiny_model(), run / "model.safetensors")
    save_vit(tiny_model(), tmp_path / "other.safetensors")
    other = tmp_path / "other.safetensors"
    for model, name in ((run / "model.safetensors", "digits-lr3e-4"), (other, "other.safetensors")):
        page = tmp_path / f"{name}.html"
        result = run_cli("explore", model, "--image", grey_png(tmp_path / "g.png"), "--out", page)
        assert result.returncode == 0, result.stderr
        assert [pane["name"] for pane in embedded(page)["panes"]] == [name]


def test_inspect_lists_why_methods_and_prefix_share_hold_less_for_a_siglip_like_tower(tmp_path, unrendered):
    """The lines that list the written files say what the figures say: the gradient methods missing for want of a
    target (naming the flags), and prefix_share.png holding only a note for a model without prefix tokens."""
    from vit_einops.inspect import METHODS
    from vit_einops.modelfile import save_vit
    from vit_einops.preprocess import Preprocessing

    tower = tiny_vit(TINY_RGB16, num_classes=0, class_token=False, pool="map")
    tower.preprocessing = Preprocessing.plain(16, 3)
    save_vit(tower, tmp_path / "tower.safetensors")
    out = tmp_path / "r"
    result = run_cli("inspect", tmp_path / "tower.safetensors", "--image", grey_png(tmp_path / "g.png"),
                     "--out", out, *INSPECT)  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = {line.split(":")[0].strip(): line for line in result.stdout.splitlines()}
    gradient = ", ".join(name for name, method in METHODS.items() if method.gradient)
    assert lines["methods"] == (
        f"             methods: {out / 'methods.png'} (without {gradient}: they need a target: this model has no "
        "classifier; pass --target-embedding FILE, --target-image PATH or --target-patch ROW,COL (target= in Python))"
    )
    assert lines["prefix_share"] == (
        f"        prefix_share: {out / 'prefix_share.png'} (a note only: this model has no prefix tokens, no class "
        "token nor registers)"
    )
    assert lines["attention"] == f"           attention: {out / 'attention.png'}"  # nothing to say of the others
