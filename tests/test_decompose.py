"""The score split into heads, MLPs and the named rest (vit_einops.inspect.decompose): the sums on a tiny model of
every family and pooling, for a class and two backbone targets, on the three attention kernels; the total against
the model's own output; the source split against the heads; the logit lens's ends; ablation against a copy with
zeroed output-projection columns; patching's ends; and the refusals. timm's own modules: test_interop_decompose.py."""

from __future__ import annotations

import copy

import pytest
import torch
from _tiny import FAMILIES as TINY_FAMILIES
from _tiny import TINY_DIGITS, TINY_RGB16, tiny_vit

from vit_einops.inspect import EmbeddingTarget, PatchTarget
from vit_einops.inspect.decompose import ablate_heads, decompose, logit_lens, patch_heads, patch_passes, patch_positions

# Beside every pooling and token layout: CLIP's pre-norm, and E_pos on the patches alone (the prefix tokens
# inserted after it).
FAMILIES = {
    **TINY_FAMILIES,
    "clip": dict(pre_norm=True, patch_bias=False),
    "registers outside E_pos": dict(register_tokens=2, pos_embed_prefix=False),
}
KERNELS = ("einsum", "chunked", "sdpa")


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Tiny models: one torch thread runs them fastest on a shared machine."""


def _model(base=TINY_RGB16, **options):
    torch.manual_seed(0)
    model = tiny_vit(base, **options)
    with torch.no_grad():  # noise on every parameter: the zero-initialised head and biases would hide a slip
        for p in model.parameters():
            p.add_(torch.randn_like(p), alpha=0.1)
    return model


def _x(b=2, base=TINY_RGB16, seed=1):
    torch.manual_seed(seed)
    return torch.randn(b, base.get("in_channels", 3), base["image_size"], base["image_size"])


def _check_sums(d, reference):
    """The parts add up to the total, the total is ``reference`` (the model's own score), the sources to the heads."""
    scale = reference.abs().max().item() + 1e-3
    parts = d.heads.sum((1, 2)) + d.mlps.sum(1) + d.rest
    assert (parts - d.total).abs().max() <= 1e-5 * scale
    assert (d.total - reference).abs().max() <= 1e-5 * scale
    assert torch.equal(d.rest, sum(d.parts.values()))
    assert (d.by_source.sum(-1) - d.heads).abs().max() <= 1e-5 * scale


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_parts_sum_to_the_class_logit_on_every_kernel(family):
    model, x = _model(**FAMILIES[family]), _x()
    logits = model(x)
    classes = logits.argmax(-1)
    heads = {}
    for impl in KERNELS:
        model.set_attn_impl(impl)
        d = decompose(model, x, by_source=True, preprocessed=True)
        _check_sums(d, logits.gather(1, classes[:, None])[:, 0])
        heads[impl] = d
    for impl in KERNELS[1:]:
        for name in ("heads", "mlps", "rest", "by_source"):
            torch.testing.assert_close(getattr(heads[impl], name), getattr(heads["einsum"], name), rtol=0, atol=1e-5)
    assert d.heads.shape == (2, 2, 4) and d.mlps.shape == (2, 2) and d.by_source.shape == (2, 2, 4, d.layout.num_tokens)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_parts_sum_to_a_backbone_targets_score(family):
    """An embedding's cosine (its output's norm observed) and a patch target's mean cosine, against the scores the
    targets compute themselves from the model's output."""
    model, x = _model(num_classes=0, **FAMILIES[family]), _x()
    torch.manual_seed(2)
    embedding = EmbeddingTarget(torch.randn(TINY_RGB16["dim"]))
    for impl in KERNELS:
        model.set_attn_impl(impl)
        d = decompose(model, x, embedding, by_source=True, preprocessed=True)
        _check_sums(d, embedding.scores(model(x)))
        patch = PatchTarget(1, 2)
        tokens = model.forward_features(x)
        d = decompose(model, x, patch, by_source=True, preprocessed=True)
        _check_sums(d, patch.similarity(tokens, d.layout).flatten(1).mean(-1))


def test_an_embedding_head_is_read_through_its_projection():
    """CLIP's image tower: the classifier is an embedding projection, so the target is an embedding."""
    model = _model(pre_norm=True, num_classes=12, embedding=True)
    x, e = _x(), EmbeddingTarget(torch.randn(12))
    d = decompose(model, x, e, by_source=True, preprocessed=True)
    _check_sums(d, e.scores(model(x)))


def test_the_named_parts():
    """The rest is named part by part; an attention pool's MLP is one of them."""
    d = decompose(_model(), _x(), preprocessed=True)
    assert list(d.parts) == [
        "patch and prefix tokens", "position embeddings", "classifier's bias", "final norm's shift",
        "attention output biases",
    ]  # fmt: skip
    d = decompose(_model(class_token=False, pool="map"), _x(), preprocessed=True)
    assert "attention pool's MLP" in d.parts and "attention pool's biases" in d.parts
    d = decompose(_model(pre_norm=True), _x(), preprocessed=True)
    assert "embeddings (after the pre-norm)" in d.parts


def test_sources_of_one_head_and_the_top_parts():
    d = decompose(_model(), _x(), by_source=True, preprocessed=True)
    torch.testing.assert_close(d.sources(1, 3), d.by_source[:, 1, 3], rtol=0, atol=1e-7)
    top = d.top(3)
    shares = sorted([abs(s) for s in d.heads[0].flatten().tolist()] + [abs(s) for s in d.mlps[0].tolist()])
    assert [abs(s) for _, s in top] == pytest.approx(shares[::-1][:3])


def test_the_logit_lens_ends_at_the_models_score_and_starts_at_the_embeddings():
    model, x = _model(layer_scale=0.5), _x()
    lens = logit_lens(model, x, preprocessed=True)
    logits = model(x)
    classes = logits.argmax(-1)
    assert lens.shape == (2, 3)
    torch.testing.assert_close(lens[:, -1], logits.gather(1, classes[:, None])[:, 0], rtol=0, atol=1e-5)
    _, cache = model.run_with_cache(x, "blocks.0.hook_resid_pre")
    start = model.head(cache["resid_pre", 0]).gather(1, classes[:, None])[:, 0]
    torch.testing.assert_close(lens[:, 0], start, rtol=0, atol=1e-6)


def test_a_zero_ablated_head_is_the_model_with_its_output_columns_zeroed():
    model, x = _model(layer_scale=0.5), _x(3)
    changes = ablate_heads(model, x, [(1, 2), [(0, 1), (1, 3)]], mode="zero", preprocessed=True)
    logits = model(x)
    classes = logits[:, :, None].argmax(1)
    d = TINY_RGB16["dim"] // TINY_RGB16["heads"]
    for row, heads in enumerate([[(1, 2)], [(0, 1), (1, 3)]]):
        cut = copy.deepcopy(model)
        with torch.no_grad():
            for layer, head in heads:
                cut.blocks[layer].attn.mha.proj.weight[:, head * d : (head + 1) * d] = 0
        expected = cut(x).gather(1, classes)[:, 0] - logits.gather(1, classes)[:, 0]
        torch.testing.assert_close(changes[row], expected, rtol=0, atol=1e-5)


def test_mean_ablation_over_one_reference_image_is_its_head_output():
    """With one reference image the mean is that image's own output: ablating its heads with itself changes
    nothing."""
    model, x = _model(), _x(1)
    changes = ablate_heads(model, x, [(0, 0), (1, 3)], reference=x, preprocessed=True)
    torch.testing.assert_close(changes, torch.zeros(2, 1), rtol=0, atol=1e-6)


def test_patching_counts_its_passes_and_one_position_is_the_hand_patched_run():
    """patch_heads and patch_positions give finite shares of the counted shape; patch_positions' entry (layer 1,
    class token) is the share that copying that one token of block 1's clean input into the corrupted run, by hand
    through run_with_hooks, restores."""
    model = _model(TINY_DIGITS, num_classes=5)
    clean, corrupted = _x(1, TINY_DIGITS, 1), _x(1, TINY_DIGITS, 2)
    heads = patch_heads(model, clean, corrupted, preprocessed=True)
    assert heads.shape == (2, 2) and torch.isfinite(heads).all()
    assert patch_passes(model, "heads") == 2 + 2 * 2 and patch_passes(model, "positions") == 2 + 2 * 17
    positions = patch_positions(model, clean, corrupted, preprocessed=True)
    assert positions.shape == (2, 17)
    clean_logit = model(clean)
    cls = clean_logit.argmax(-1)
    high, low = clean_logit[0, cls], model(corrupted)[0, cls]
    _, cache = model.run_with_cache(clean, "blocks.1.hook_resid_pre")

    def patch(z, hook):
        z = z.clone()
        z[:, 0] = cache["resid_pre", 1][:, 0]
        return z

    restored = model.run_with_hooks(corrupted, [("blocks.1.hook_resid_pre", patch)])[0, cls]
    torch.testing.assert_close(positions[1, 0], ((restored - low) / (high - low))[0], rtol=0, atol=1e-5)


def test_patching_identical_images_is_refused_by_name():
    model, x = _model(TINY_DIGITS, num_classes=5), _x(1, TINY_DIGITS)
    for fn, who in ((patch_heads, "patch_heads"), (patch_positions, "patch_positions")):
        with pytest.raises(ValueError, match=rf"^{who}: the clean and corrupted images give the same score"):
            fn(model, x, x.clone(), preprocessed=True)


def test_hostile_inputs_give_exact_messages():
    model, x = _model(TINY_DIGITS, num_classes=5), _x(1, TINY_DIGITS)
    d = decompose(model, x, preprocessed=True)
    with pytest.raises(ValueError, match=r"^layer must be an int in \[0, 1\], got 2$"):
        d.sources(2, 0)
    with pytest.raises(ValueError, match=r"^head must be an int in \[0, 1\], got -1$"):
        d.sources(0, -1)
    with pytest.raises(ValueError, match=r"^layer must be an int in \[0, 1\], got 5$"):
        ablate_heads(model, x, [(5, 0)], preprocessed=True)
    with pytest.raises(ValueError, match=r"^head must be an int in \[0, 1\], got 2$"):
        ablate_heads(model, x, (0, 2), preprocessed=True)
    with pytest.raises(ValueError, match=r"^heads names no head: expected \(layer, head\) pairs or lists of them, got"):
        ablate_heads(model, x, [], preprocessed=True)
    with pytest.raises(ValueError, match=r"^heads holds an empty set of heads"):
        ablate_heads(model, x, [[]], preprocessed=True)
    with pytest.raises(TypeError, match=r"^a head is a \(layer, head\) pair, got 3$"):
        ablate_heads(model, x, [[3]], preprocessed=True)
    with pytest.raises(ValueError, match=r"^unknown mode 'max'; expected one of 'mean', 'zero'$"):
        ablate_heads(model, x, [(0, 0)], mode="max", preprocessed=True)
    with pytest.raises(ValueError, match=r"^patch_heads: the corrupted images have shape \(2, 1, 8, 8\), the clean"):
        patch_heads(model, x, _x(2, TINY_DIGITS), preprocessed=True)
    with pytest.raises(ValueError, match=r"^this model has no classifier \(num_classes 0"):
        decompose(_model(TINY_DIGITS, num_classes=0), x, preprocessed=True)
    with pytest.raises(ValueError, match=r"^decompose needs a linear classifier: .* tanh pre_logits"):
        decompose(_model(TINY_DIGITS, representation_size=8), x, preprocessed=True)
    with pytest.raises(ValueError, match=r"^decompose explains one class per image"):
        decompose(model, x, [[1, 2]], preprocessed=True)


def test_the_command_prints_the_top_parts_and_writes_its_report_once(tmp_path, capsys):
    """`vit-einops decompose MODEL --image PATH --out DIR`: the printed split and the JSON are the Python function's
    numbers; an existing report is refused without --force."""
    import json

    import numpy as np
    from PIL import Image

    from vit_einops import Preprocessing
    from vit_einops.commands.cli import main
    from vit_einops.modelfile import save_vit

    model = _model()
    model.preprocessing = Preprocessing(resize=(16, 16), mean=(0.5,) * 3, std=(0.25,) * 3)
    save_vit(model, tmp_path / "m.safetensors")
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (20, 24, 3), dtype=np.uint8)).save(tmp_path / "a.png")
    out = tmp_path / "out"
    args = ["decompose", str(tmp_path / "m.safetensors"), "--image", str(tmp_path / "a.png"), "--out", str(out)]
    assert main([*args, "--top", "3"]) == 0
    printed = capsys.readouterr().out
    report = json.loads((out / "decomposition.json").read_text())
    assert (out / "decomposition.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    d = decompose(model, tmp_path / "a.png")
    torch.testing.assert_close(torch.tensor(report["heads"]), d.heads[0], rtol=0, atol=1e-6)
    assert report["total"] == pytest.approx(float(d.total[0]), abs=1e-6)
    assert printed.startswith(f"class {report['class']}'s logit: ")
    assert report["class"] == int(model(model.transforms()(Image.open(tmp_path / "a.png"))[None]).argmax())
    assert [line.split()[0] for line in printed.splitlines()[1:4]] == [name for name, _ in d.top(3)]
    assert main(args) == 2
    assert "decomposition.json" in capsys.readouterr().err
    assert main([*args, "--force"]) == 0


def test_the_decomposition_method_is_the_heads_source_shares_on_the_grid():
    """METHODS["decomposition"]: every head's share from each patch, summed over layers and heads; with the prefix
    tokens' shares it adds up to all the heads' shares."""
    from vit_einops.inspect import explain

    model, x = _model(register_tokens=2), _x()
    grid = explain(model, x, "decomposition", preprocessed=True)
    d = decompose(model, x, by_source=True, preprocessed=True)
    assert grid.shape == (2, 4, 4)
    prefix = d.by_source.sum((1, 2))[:, : d.layout.num_prefix].sum(-1)
    torch.testing.assert_close(grid.sum((1, 2)) + prefix, d.heads.sum((1, 2)), rtol=0, atol=1e-5)


def test_a_study_decomposes_once_and_its_decomposition_methods_map_is_explains(monkeypatch):
    """run_study's decomposition gives the "decomposition" method's map (one decompose per study, not two), equal
    to explain's; explain_all takes a given map as it is and refuses a given name that is no method."""
    import vit_einops.inspect.methods as methods_module
    import vit_einops.inspect.study as study_module
    from vit_einops.inspect import explain, explain_all, run_study

    model, x = _model(register_tokens=2), _x()
    expected = explain(model, x, "decomposition", preprocessed=True)
    calls = []

    def counted(*args, **kwargs):
        calls.append(args)
        return decompose(*args, **kwargs)

    monkeypatch.setattr(study_module, "decompose", counted)
    monkeypatch.setattr(methods_module, "decompose", counted)
    study = run_study(model, x)
    assert len(calls) == 1
    torch.testing.assert_close(study.methods["decomposition"], expected, rtol=0, atol=0)
    torch.testing.assert_close(study.decomposition.decomposition.source_map(), expected, rtol=0, atol=0)
    given = torch.zeros(2, 4, 4)
    maps = explain_all(model, x, preprocessed=True, given={"decomposition": given})
    assert maps["decomposition"] is given and len(calls) == 1 and list(maps) == list(study.methods)
    with pytest.raises(ValueError, match=r"unknown method 'gradcam' in given; expected some of 'attention', "):
        explain_all(model, x, preprocessed=True, given={"gradcam": given})


def test_a_model_in_training_mode_is_decomposed_in_eval_mode_and_left_as_it_was():
    """Dropout would break the sum: the parts are read with the model in eval mode, its mode restored."""
    model, x = _model(dropout=0.5, attn_dropout=0.5), _x()
    model.train()
    d = decompose(model, x, preprocessed=True)
    assert model.training
    model.eval()
    _check_sums(decompose(model, x, by_source=True, preprocessed=True), d.total)


def test_a_patch_target_on_a_dynamic_size_input_reads_its_own_grid():
    """An input of another shape than the model's (dynamic_size): the patch target and the layout are the input's
    grid (3 x 5 patches here)."""
    model = _model(num_classes=0, dynamic_size="timm")
    x = torch.randn(1, 3, 12, 20)
    patch = PatchTarget(2, 4)
    d = decompose(model, x, patch, by_source=True, preprocessed=True)
    assert d.layout.grid == (3, 5) and d.source_map().shape == (1, 3, 5)
    _check_sums(d, patch.similarity(model.forward_features(x), d.layout).flatten(1).mean(-1))
