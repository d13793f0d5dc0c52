"""The explorer and inspect at sizes where the attention no longer fits (DINOv2's 1,374 tokens), on tiny models that
take the same code paths: a pane over its attention budget keeps the mean of heads and the prefix tokens' rows,
which decode to the recorded numbers within the 8-bit step, and says what it left out; the final tokens of the
similarity view give DINO's patch similarity within the stated bound; one recorded pass serves every view; and a
run over --max-memory is refused with one line before any forward pass. The 518 px sizes, times and the estimate
against the measured peak are benchmarks/native_size.py's."""

import re

import numpy as np
import pytest
import torch
from _tiny import TINY_RGB, tiny_vit
from test_explore import EXPLORED, decode, embedded

from vit_einops import ViT, max_memory
from vit_einops.commands.cli import main
from vit_einops.explore import write_explorer
from vit_einops.explore.payload import COSINE_BOUND, pane_memory
from vit_einops.inspect import (
    PatchTarget,
    explain_all,
    patch_similarity,
    record_attention,
    token_grid,
    write_report,
)
from vit_einops.inspect.decompose import decomposition_bytes
from vit_einops.inspect.methods import METHODS
from vit_einops.inspect.recorded import study_memory
from vit_einops.inspect.report import report_memory
from vit_einops.inspect.study import study_decomposition, target_relevance
from vit_einops.modelfile import save_vit
from vit_einops.network.config import ViTConfig
from vit_einops.network.sizes import forward_bytes
from vit_einops.preprocess import Preprocessing

# EXPLORED: depth 2, 4 heads, 17 tokens (the class token and a 4x4 grid): every row of every head is 2,312 codes an
# image, the mean of heads and the class token's rows 714.
FULL, MEAN = 2 * 4 * 17 * 17, 2 * (4 * 17 + 17 * 17)


def rows_within_step(codes, rowmax, recorded, levels=255):
    restored = codes * (rowmax.astype(np.float64)[..., None] / levels)
    assert np.array_equal(rowmax, recorded.max(-1).astype(np.float32))
    assert (np.abs(restored - recorded) <= rowmax[..., None] / (2 * levels) * (1 + 1e-6)).all()


@pytest.mark.parametrize("budget", [MEAN, MEAN - 1])
def test_a_pane_over_its_budget_keeps_the_mean_and_prefix_rows_and_says_what_it_left_out(tmp_path, budget):
    torch.manual_seed(0)
    model, images = tiny_vit(EXPLORED, num_classes=0), torch.rand(1, 3, 16, 16)  # no classes: no relevance to wait for
    page = write_explorer(model, images, tmp_path / "e.html", attention_budget=budget)
    [pane] = embedded(page)["panes"]
    image = pane["images"][0]
    maps = record_attention(model, images)[1][:, 0].double().numpy()  # (l, h, n, n)
    assert pane["attention_queries"] == 1  # the class token's rows alone, of every layer and head
    rows_within_step(decode(image["attention"], np.uint8, (2, 4, 1, 17)), decode(image["attention_rowmax"],
                     np.float32, (2, 4, 1)), maps[:, :, :1])  # fmt: skip
    over = f"every head's row of every query would be {FULL / 1e6:.1f} MB of codes, over the budget of "
    first = f"left out: each head's attention rows of the 16 patch queries ({over}{budget / 1e6:.1f} MB); kept: "
    if budget == MEAN:
        mean = maps.mean(axis=1)  # (l, n, n), each row quantised on its own maximum
        rows_within_step(decode(image["attention_mean"], np.uint8, (2, 17, 17)),
                         decode(image["attention_mean_rowmax"], np.float32, (2, 17)), mean)  # fmt: skip
        assert pane["left_out"] == [
            first + "each head's rows of the 1 prefix token, and the mean of the heads' rows for every query"
        ]
    else:
        assert image["attention_mean"] is None and pane["left_out"] == [
            first + "each head's rows of the 1 prefix token",
            "left out: the mean of the heads' rows of the patch queries (it does not fit the budget either)",
        ]
    if budget == MEAN:
        whole = write_explorer(model, images, tmp_path / "f.html", attention_budget=FULL)  # all of it fits
        assert embedded(whole)["panes"][0]["left_out"] == [] and embedded(whole)["panes"][0]["attention_queries"] == 17


def test_final_tokens_give_dinos_patch_similarity_within_the_stated_bound(tmp_path):
    torch.manual_seed(0)
    model, images = tiny_vit(EXPLORED, num_classes=0), torch.rand(2, 3, 16, 16)
    [pane] = embedded(write_explorer(model, images, tmp_path / "e.html"))["panes"]
    similarity = patch_similarity(model, images, PatchTarget(2, 1), preprocessed=True).double().numpy()
    for i, image in enumerate(pane["images"]):
        tokens = decode(image["tokens"], np.float16, (17, pane["token_dim"])).astype(np.float64)
        unit = tokens * image["tokens_scale"] / np.linalg.norm(tokens * image["tokens_scale"], axis=1, keepdims=True)
        cosines = unit[1:] @ unit[1 + 2 * 4 + 1]  # every patch against patch (2, 1): token 10
        assert np.abs(cosines - similarity[i].ravel()).max() <= COSINE_BOUND


def count_forwards(model):
    calls = []
    model.patch_embed.register_forward_pre_hook(lambda *_: calls.append(1))
    return calls


def method_passes(model, images, target=None):
    """The passes of the study's decomposition (none for a model with no score to decompose), of a target's
    relevance (its one differentiable pass, which gives the "relevance" method's map) and of the other explanation
    methods' maps (explain_all, the "decomposition" method's map given by the decomposition), which a page or report
    adds to its own."""
    calls = count_forwards(model)
    decomposition = study_decomposition(model, images, target)
    given = {} if decomposition is None else {"decomposition": decomposition.decomposition.source_map()}
    if target is not None:
        relevance = target_relevance(model, images, target, METHODS["relevance"].params["start_layer"]).relevance
        given["relevance"] = token_grid(relevance, model.patch_embed.layout(images.shape[-2:]))
    explain_all(model, images, target, preprocessed=True, given=given)
    return len(calls)


def test_one_recorded_pass_serves_every_view_of_the_explorer(tmp_path):
    """A model without a classifier and no target: its page runs the model once for its own views (the attention,
    token norms, PCA and the similarity view's tokens come from the same pass) beside the explanation methods'
    passes; a classifier adds the one differentiable pass of its relevance."""
    tower = ViT(image_size=16, patch_size=4, dim=32, depth=2, heads=2, mlp_dim=64, num_classes=0).eval()
    images = torch.rand(2, 3, 16, 16)
    methods = method_passes(tower, images)
    calls = count_forwards(tower)
    write_explorer(tower, images, tmp_path / "e.html", preprocessed=True)
    assert len(calls) == 1 + methods
    classifier = tiny_vit(EXPLORED)
    images = torch.rand(1, 3, 16, 16)
    methods = method_passes(classifier, images)
    calls = count_forwards(classifier)
    write_explorer(classifier, images, tmp_path / "c.html", top_k=1)
    assert len(calls) == 2 + methods


def test_inspect_draws_a_backbone_targets_relevance_and_similarity_from_one_recorded_pass(tmp_path, rendered_only):
    """The report's figures and arrays read one recorded pass (the PCA, token norms and similarity map included);
    the target's relevance is one differentiable pass, which gives the relevance method its map (in methods)."""
    rendered_only("target")  # every figure is made from the pass; the target's is the one read here
    tower = ViT(image_size=16, patch_size=4, dim=32, depth=2, heads=2, mlp_dim=64, num_classes=0).eval()
    images = torch.rand(2, 3, 16, 16)
    methods = method_passes(tower, images, PatchTarget(1, 2))
    calls = count_forwards(tower)
    paths = write_report(tower, images, tmp_path / "r", target=PatchTarget(1, 2))
    assert len(calls) == 1 + methods
    assert paths["target"] == tmp_path / "r" / "target.png" and paths["target"].read_bytes()[:4] == b"\x89PNG"
    arrays = np.load(paths["arrays"])
    images = torch.from_numpy(arrays["images"])
    expected = patch_similarity(tower, images, PatchTarget(1, 2), preprocessed=True).numpy()
    np.testing.assert_allclose(arrays["target_similarity"], expected, atol=1e-6)  # from the one recorded pass


def test_a_run_over_max_memory_is_refused_with_one_line_before_any_work(tmp_path, capsys):
    model = tiny_vit(TINY_RGB)
    model.preprocessing = Preprocessing.plain(32)
    calls = count_forwards(model)
    with max_memory("64MiB"), pytest.raises(ValueError, match="an explorer page of 1 model on 1 image at 17 tokens"):
        write_explorer(model, torch.rand(1, 3, 32, 32), tmp_path / "e.html")
    assert calls == [] and not (tmp_path / "e.html").exists()  # refused before any forward pass
    model_file = save_vit(model, tmp_path / "m.safetensors")
    out = tmp_path / "e.html"
    args = ["explore", str(model_file), "--out", str(out), "--max-memory", "64MiB"]  # the model loads in KBs
    assert main(args) == 2
    err = capsys.readouterr().err
    pattern = (
        r"vit-einops explore: error: an explorer page of 1 model on 2 images at 17 tokens, with the [\d.]+ [MG]iB this "
        r"process holds now, needs about [\d.]+ [MG]iB, over the max-memory limit of 64\.0 MiB; pass "
        r"--max-memory (\d+[MG]iB) to allow it \(in Python: VIT_EINOPS_MAX_MEMORY=\1, or with "
        r"vit_einops\.max_memory\('\1'\)\)\n"
    )
    assert re.fullmatch(pattern, err), err
    assert not out.exists()
    report = tmp_path / "r"
    assert main(["inspect", str(model_file), "--out", str(report), "--max-memory", "64MiB"]) == 2
    err = capsys.readouterr().err
    assert re.fullmatch(
        r"vit-einops inspect: error: inspect of 2 images at 17 tokens, with the [\d.]+ [MG]iB this process holds now, "
        r"needs about [\d.]+ [MG]iB, over the max-memory limit of 64\.0 MiB; pass --max-memory \d+[MG]iB .*\n",
        err,
    ), err
    assert not report.exists()


def test_the_report_and_the_pane_estimate_one_study_the_same_where_it_holds_the_same():
    """One estimate: where a target's differentiable pass is the peak (ViT-B/16 on 4 images), the report and the
    pane both hold its gradients beside the maps, and estimate it alike: the pass with four copies of the maps, beside
    the study's decomposition (its numbers) and the target's relevance (float32, b n n)."""
    config = ViTConfig(image_size=224, patch_size=16, num_classes=1000, dim=768, depth=12, heads=12, mlp_dim=3072)
    maps = 12 * 4 * 12 * 197**2 * 4
    peak = forward_bytes(config, 4, kept=12, grad=True) + 4 * maps + decomposition_bytes(config, 4) + 4 * 197**2 * 4
    assert report_memory(config, 4, target=True) == peak
    assert pane_memory(config, 4, classes=0, target=True, budget=24_000_000)[0] == peak
    # The pane's relevance for 5 classes, from one pass, holds three copies of the maps per class, and runs beside
    # the study's recorded maps (the target's pass runs before they exist).
    assert pane_memory(config, 4, classes=5, target=True, budget=24_000_000)[0] == peak + 13 * maps


STUDIED = {
    "ViT-B/16": dict(image_size=224, patch_size=16, num_classes=1000, dim=768, depth=12, heads=12, mlp_dim=3072),
    "DINOv2-S/14 at 518 px": dict(
        image_size=518, patch_size=14, num_classes=0, dim=384, depth=12, heads=6, mlp_dim=1536, register_tokens=4
    ),
    "tiny": dict(EXPLORED),
}


@pytest.mark.parametrize("name", STUDIED)
@pytest.mark.parametrize("b", [1, 4])
@pytest.mark.parametrize("target", [False, True])
def test_each_renderers_estimate_is_its_studys_and_never_below_it(name, b, target):
    """One estimate of the study (study_memory with no renderer's work): the report's and the pane's add their own
    work to it, so neither is below it, and where the study's own phases are the peak (a backbone with no target:
    no gradient pass) the report's is the study's exactly; the study's rollout is counted there once."""
    config = ViTConfig(**STUDIED[name])
    own = study_memory(config, b, target=target)
    reports = [report_memory(config, b, target=target, arrays=arrays) for arrays in ("none", "figures", "full")]
    assert own <= reports[0] <= reports[1] <= reports[2]
    for classes in (0, 5):
        assert pane_memory(config, b, classes=classes, target=target, budget=24_000_000)[0] >= own
    if name == "DINOv2-S/14 at 518 px" and not target:
        n, maps = 1374, 12 * b * 6 * 1374**2 * 4
        record = forward_bytes(config, b, kept=12) + maps
        assert reports[1] == own == record + 3 * 12 * b * n * n * 8
