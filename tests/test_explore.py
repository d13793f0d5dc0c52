"""The explorer page without a browser: the arrays it embeds decode (here with zlib, base64 and numpy alone) to the
recorded maps within the precision it states; the file is self-contained; bad inputs and existing files get the
exact outcome asked for; and `vit-einops explore` writes it from a model file."""

import base64
import io
import json
import os
import re
import zlib

import numpy as np
import pytest
import torch
from _tiny import TINY_DIGITS, TINY_RGB, tiny_vit
from PIL import Image

from vit_einops.commands.cli import main
from vit_einops.explore import write_explorer
from vit_einops.images import to_uint8
from vit_einops.inspect import (
    PatchTarget,
    attention_relevance,
    attention_rollout,
    explain,
    head_statistics,
    record_attention,
    run_study,
    token_grid,
    token_norms,
    write_report,
)
from vit_einops.explore.payload import dino_pane, pca_colours, to_half
from vit_einops.modelfile import save_vit
from vit_einops.preprocess import Preprocessing

# 16 px in 4 px patches: a 4x4 grid of maps on 16 px inputs; 7 classes, more than the page's top 5.
EXPLORED = dict(TINY_RGB, image_size=16, patch_size=4, num_classes=7)


def embedded(page) -> dict:
    text = page.read_text(encoding="utf-8")
    match = re.search(r'<script type="application/json" id="explorer-data">(.*?)</script>', text, re.S)
    assert match, "no embedded data"
    return json.loads(match.group(1))


def decode(text: str, dtype, shape) -> np.ndarray:
    return np.frombuffer(zlib.decompress(base64.b64decode(text)), dtype=np.dtype(dtype).newbyteorder("<")).reshape(
        shape
    )


@pytest.mark.parametrize("bits", [8, 4])
def test_embedded_arrays_are_the_recorded_numbers_within_the_stated_precision(tmp_path, bits):
    model = tiny_vit(EXPLORED)
    images = torch.rand(2, 3, 16, 16)
    page = write_explorer(model, images, tmp_path / "e.html", titles=["a", "b"], bits=bits)
    shared = embedded(page)
    [data] = shared["panes"]
    logits, maps, layout = record_attention(model, images)
    maps = maps.double().numpy()
    depth, _, heads, n, _ = maps.shape
    assert (data["depth"], data["heads"], data["patch"]) == (2, 4, [4, 4])
    assert data["layout"] == {"prefix": ["cls"], "grid": [4, 4]}
    assert n == 17 and data["name"] == "model"
    levels = 2**bits - 1
    assert shared["attention_levels"] == levels
    top = logits.softmax(-1).topk(5, dim=-1)
    relevance = attention_relevance(model, images, top.indices).double().numpy()
    rollout = attention_rollout(torch.from_numpy(maps)).numpy()
    stats = head_statistics(torch.from_numpy(maps), layout, 4)
    _, norms, _ = token_norms(model, images)
    for i, image in enumerate(data["images"]):
        codes = decode(image["attention"], np.uint8, (depth, heads, n, n))
        rowmax = decode(image["attention_rowmax"], np.float32, (depth, heads, n))
        assert np.array_equal(rowmax, maps[:, i].max(-1).astype(np.float32))
        restored = codes * (rowmax.astype(np.float64)[..., None] / levels)
        error = np.abs(restored - maps[:, i])
        assert (error <= rowmax[..., None] / (2 * levels) * (1 + 1e-6)).all()
        assert error.max() > rowmax.max() / (2 * levels) / 10  # it is quantised, not stored exactly
        for c, cls in enumerate(image["top"]):
            assert cls["index"] == int(top.indices[i, c]) and cls["name"] == f"class {cls['index']}"
            assert cls["probability"] == pytest.approx(float(top.values[i, c]))
            stored = decode(cls["relevance"], np.float16, (n, n)).astype(np.float64) * cls["relevance_scale"]
            bound = np.abs(relevance[i, c]) * 2**-11 + cls["relevance_scale"] * 2**-25
            assert (np.abs(stored - relevance[i, c]) <= bound).all()
        stored = decode(image["rollout"], np.float16, (n, n)).astype(np.float64) * image["rollout_scale"]
        assert (np.abs(stored - rollout[i]) <= np.abs(rollout[i]) * 2**-11 + image["rollout_scale"] * 2**-25).all()
        for key in ("distance", "entropy", "patch_mass"):
            np.testing.assert_allclose(image["stats"][key], stats[key][:, i].numpy(), atol=5e-7, rtol=0)
        # The one prefix token's share is the class token's share of inspect's statistics.
        share = stats["prefix_share"][:, i]
        np.testing.assert_allclose(image["stats"]["prefix_share"], share, atol=5e-7, rtol=0)
        np.testing.assert_allclose(image["stats"]["norms"], norms[:, i].numpy(), atol=5e-5 + 1e-6, rtol=0)
        picture = Image.open(io.BytesIO(base64.b64decode(image["png"])))
        assert np.array_equal(np.asarray(picture), to_uint8(images[i]))  # inputs in [0, 1] are drawn as they are
    assert shared["titles"] == ["a", "b"]


def test_page_is_self_contained_and_states_its_precision(tmp_path):
    page = write_explorer(tiny_vit(EXPLORED), torch.rand(1, 3, 16, 16), tmp_path / "e.html")
    text = page.read_text(encoding="utf-8")
    assert not re.search(r"https?://", text)
    assert not re.search(r"""(?:src|href)\s*=\s*["']?(?!data:)[^"'\s>]""", text)  # only data: URLs, if any
    assert "<link" not in text and "<script src" not in text
    assert "default-src 'none'" in text  # the browser itself blocks any request the page might try
    assert "Stated precision" in text and "(row maximum)/${2 * DATA.attention_levels}" in text


def test_titles_cannot_break_out_of_the_page(tmp_path):
    hostile = "</script><script>alert(1)</script>"
    page = write_explorer(tiny_vit(EXPLORED), torch.rand(1, 3, 16, 16), tmp_path / "e.html", titles=[hostile])
    text = page.read_text(encoding="utf-8")
    assert text.count("</script>") == 2  # the data block's and the code's own
    assert embedded(page)["titles"] == [hostile]


def test_class_names_and_pictures_are_used(tmp_path):
    model = tiny_vit(EXPLORED)
    model.class_names = [f"name{i}" for i in range(7)]
    picture = np.full((40, 40, 3), 200, dtype=np.uint8)
    page = write_explorer(model, torch.rand(1, 3, 16, 16), tmp_path / "e.html", pictures=[picture], top_k=3)
    image = embedded(page)["panes"][0]["images"][0]
    assert [c["name"] for c in image["top"]] == [f"name{c['index']}" for c in image["top"]]
    assert len(image["top"]) == 3
    shown = np.asarray(Image.open(io.BytesIO(base64.b64decode(image["png"]))))
    assert np.array_equal(shown, picture)


def test_existing_output_is_refused_unless_overwrite_and_a_failed_run_keeps_it(tmp_path):
    model, images = tiny_vit(EXPLORED), torch.rand(1, 3, 16, 16)
    out = tmp_path / "e.html"
    out.write_text("mine")
    with pytest.raises(FileExistsError, match="--force"):
        write_explorer(model, images, out)
    assert out.read_text() == "mine"
    dangling = tmp_path / "link.html"
    dangling.symlink_to(tmp_path / "nowhere.html")  # a link the user made counts as their file too
    with pytest.raises(FileExistsError):
        write_explorer(model, images, dangling)
    dangling.unlink()
    fifo = tmp_path / "fifo.html"
    os.mkfifo(fifo)  # never opened: writing would block until a reader came
    # Refused as what --force would not replace either, rather than offered overwrite=True.
    with pytest.raises(ValueError, match="fifo.html is a FIFO, not a regular file; it is never replaced, even with"):
        write_explorer(model, images, fifo)
    fifo.unlink()
    bad = images.clone()
    bad[0, 0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        write_explorer(model, bad, out, overwrite=True)
    assert out.read_text() == "mine"
    write_explorer(model, images, out, overwrite=True)
    assert "explorer-data" in out.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.html"]  # no temporary file left behind


def test_bad_arguments_are_named(tmp_path):
    model, images = tiny_vit(EXPLORED), torch.rand(2, 3, 16, 16)
    with pytest.raises(IsADirectoryError, match="directory"):
        write_explorer(model, images, tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        write_explorer(model, images, tmp_path / "missing" / "e.html")
    with pytest.raises(ValueError, match="bits.*got 9"):
        write_explorer(model, images, tmp_path / "e.html", bits=9)
    with pytest.raises(ValueError, match="1 titles for 2 images"):
        write_explorer(model, images, tmp_path / "e.html", titles=["x"])
    with pytest.raises(ValueError, match=r"images must be an image \(C, H, W\) or a batch \(B, C, H, W\)"):
        write_explorer(model, images[0, 0], tmp_path / "e.html")
    with pytest.raises(ValueError, match=r"images holds no image: shape \(0, 3, 16, 16\)"):
        write_explorer(model, images[:0], tmp_path / "e.html")
    with pytest.raises(ValueError, match=r"pictures\[0\]"):
        write_explorer(model, images, tmp_path / "e.html", pictures=[np.zeros((4, 4, 3)), np.zeros((4, 4, 3))])
    with pytest.raises(TypeError, match="vit-einops ViT"):
        write_explorer(torch.nn.Linear(2, 2), images, tmp_path / "e.html")
    assert list(tmp_path.iterdir()) == []


def test_model_mode_is_restored(tmp_path):
    model = tiny_vit(EXPLORED).train()
    write_explorer(model, torch.rand(1, 3, 16, 16), tmp_path / "e.html")
    assert model.training


# --- the command ------------------------------------------------------------------------------------------------


def digits_model_file(tmp_path):
    model = tiny_vit(TINY_DIGITS)
    model.class_names = [str(i) for i in range(10)]
    model.preprocessing = Preprocessing.plain(8, channels=1)
    return save_vit(model, tmp_path / "digits.safetensors")


def test_explore_command_on_a_digits_model_file(tmp_path, capsys):
    model_file = digits_model_file(tmp_path)
    out = tmp_path / "explore.html"
    assert main(["explore", str(model_file), "--out", str(out)]) == 0
    data = embedded(out)
    assert data["titles"] == [f"test digit, label {d}" for d in range(4)]
    [pane] = data["panes"]
    assert pane["name"] == "digits.safetensors"
    assert all(c["name"] == str(c["index"]) for image in pane["images"] for c in image["top"])
    assert f"explorer: {out}" in capsys.readouterr().out
    before = out.read_bytes()
    assert main(["explore", str(model_file), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vit-einops explore: error: ") and "exists" in err and err.count("\n") == 1
    assert out.read_bytes() == before
    flags = ["--rollout-fusion", "min", "--discard-ratio", "0.25", "--start-layer", "-1"]
    assert main(["explore", str(model_file), "--out", str(out), "--force", "--top-k", "2", *flags]) == 0
    [pane] = embedded(out)["panes"]
    assert len(pane["images"][0]["top"]) == 2
    labels = {m["name"]: m["label"] for m in pane["methods"]}
    assert labels["rollout"] == "rollout (residual 0.5, head_fusion min, discard_ratio 0.25)"
    assert labels["gradient-rollout"] == "gradient-rollout (discard_ratio 0.25)"
    assert labels["relevance"] == "relevance (start_layer -1)"
    assert main(["explore", str(model_file), "--out", str(out), "--force", "--discard-ratio", "nan"]) == 2
    assert "discard_ratio must be a float in [0, 1), got nan" in capsys.readouterr().err


def test_explore_command_with_image_files_and_sample_photos(tmp_path, capsys):
    model = tiny_vit(TINY_RGB)
    # Normalising: the page is handed the model's inputs, which no longer look like pixels in [0, 1].
    model.preprocessing = Preprocessing(resize=(32, 32), mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))
    model_file = save_vit(model, tmp_path / "rgb.safetensors")
    photo = tmp_path / "photo.png"
    Image.fromarray(np.arange(48 * 64 * 3, dtype=np.uint8).reshape(48, 64, 3)).save(photo)
    out = tmp_path / "one.html"
    assert main(["explore", str(model_file), "--image", str(photo), "--out", str(out), "--bits", "6"]) == 0
    data = embedded(out)
    assert data["titles"] == ["photo.png"] and data["attention_bits"] == 6
    shown = np.asarray(Image.open(io.BytesIO(base64.b64decode(data["panes"][0]["images"][0]["png"]))))
    expected = np.asarray(Image.open(photo).resize((32, 32), Image.Resampling.BILINEAR))
    assert np.array_equal(shown, expected)  # the picture is what the model saw, normalisation undone
    out2 = tmp_path / "samples.html"
    assert main(["explore", str(model_file), "--out", str(out2)]) == 0
    assert embedded(out2)["titles"] == ["china.jpg", "flower.jpg"]


def test_explore_command_errors_are_one_line(tmp_path, capsys):
    fresh = tiny_vit(EXPLORED)  # no preprocessing recorded
    model_file = save_vit(fresh, tmp_path / "fresh.safetensors")
    assert main(["explore", str(model_file), "--out", str(tmp_path / "e.html")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vit-einops explore: error: ") and "preprocessing" in err
    assert main(["explore", str(tmp_path / "nope.safetensors"), "--out", str(tmp_path / "e.html")]) == 2
    assert "no such model file" in capsys.readouterr().err
    assert not (tmp_path / "e.html").exists()


@pytest.mark.parametrize("params", [{}, {"rollout": {"head_fusion": "max", "discard_ratio": 0.5}}])
def test_the_pages_rollout_is_the_reports_for_the_same_model_images_and_params(tmp_path, params, unrendered):
    """One rollout: the pane stores the report's rollout matrices (arrays.npz), float16 after the same scale."""
    torch.manual_seed(0)
    model = tiny_vit(EXPLORED)
    images = torch.rand(2, 3, 16, 16)
    write_report(model, images, tmp_path / "r", method_params=params)
    with np.load(tmp_path / "r" / "arrays.npz") as arrays:
        report = arrays["rollout"]
    [pane] = embedded(write_explorer(model, images, tmp_path / "e.html", method_params=params))["panes"]
    n = report.shape[-1]
    for i, image in enumerate(pane["images"]):
        values, scale = to_half(report[i])
        assert image["rollout_scale"] == scale
        assert np.array_equal(decode(image["rollout"], np.float16, (n, n)), values)


def test_the_report_and_the_page_draw_one_study(tmp_path, unrendered, one_thread):
    """One study run, two renderers: run_study called directly gives the arrays the report writes and the page
    embeds (the page's as it stores them): the rollout, the methods, the patch PCA, DINO's view (of the last layer in
    both) and the target's relevance from the relevance method's start_layer, with its scores."""
    torch.manual_seed(0)
    model = tiny_vit(EXPLORED).eval()
    images, target = torch.rand(1, 3, 16, 16), PatchTarget(1, 2)
    params = {"relevance": {"start_layer": 1}, "integrated-gradients": {"steps": 2}}  # 2 steps: the test's time
    study = run_study(model, images, target, params)
    assert study.layer == 1 and study.dino.mask.shape == (1, 4, 4, 4) and study.target.relevance.shape == (1, 17, 17)
    # The relevance method's map is the class token's row of the target's relevance: one rule, one start_layer, one
    # differentiable pass; and it is the map explain gives on its own.
    assert torch.equal(study.methods["relevance"], token_grid(study.target.relevance, study.run.layout))
    assert torch.equal(study.methods["relevance"], explain(model, images, "relevance", target, preprocessed=True,
                                                           start_layer=1))  # fmt: skip
    write_report(model, images, tmp_path / "r", target=target, method_params=params)
    with np.load(tmp_path / "r" / "arrays.npz") as arrays:
        written = {name: arrays[name] for name in arrays.files}
    expected = {
        "rollout": study.rollout,
        "patch_pca": study.pca.projections,
        **{f"method_{name.replace('-', '_')}": value for name, value in study.methods.items()},
        "dino_attention": study.dino.attention,
        "dino_mask": study.dino.mask,
        "class_attention": study.dino.attention,
        "target_relevance": study.target.relevance,
        "target_score": study.target.scores,
    }
    for name, value in expected.items():
        assert np.array_equal(written[name], value.numpy()), name
    assert written["class_attention_layer"] == study.layer
    page = write_explorer(model, images, tmp_path / "e.html", top_k=1, target=target, method_params=params)
    [image] = embedded(page)["panes"][0]["images"]
    picture = np.asarray(Image.open(io.BytesIO(base64.b64decode(image["pca"]))))
    assert np.array_equal(picture, pca_colours(study.pca.rgb)[0])
    values, scale = to_half(study.rollout[0].numpy())
    assert image["rollout_scale"] == scale and np.array_equal(decode(image["rollout"], np.float16, (17, 17)), values)
    assert image["dino"]["masks"] == dino_pane(study.dino)["masks"][0].int().tolist()
    assert image["dino"]["masks"][:4] == study.dino.mask[0].flatten(-2).int().tolist()
    values, scale = to_half(study.target.relevance[0].double().numpy())
    assert image["target"]["relevance_scale"] == scale
    assert np.array_equal(decode(image["target"]["relevance"], np.float16, (17, 17)), values)
    assert image["target"]["score"] == float(study.target.scores[0])
