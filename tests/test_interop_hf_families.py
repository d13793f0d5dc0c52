"""The transformers families against transformers itself: Dinov2Model, Dinov2WithRegistersModel,
DeiTForImageClassificationWithTeacher, CLIPVisionModel, CLIPVisionModelWithProjection and SiglipVisionModel.

Each is built here with random (perturbed) weights at a tiny size, saved with ``save_pretrained`` and read by
``load_hf``; float32, max |difference| <= 1e-5 (the issue's bound) for the last hidden state, the pooled output or
logits, at the native size and two others (HF's ``interpolate_pos_encoding=True``; DINOv2 always interpolates), and
our recorded attention of every encoder layer against ``output_attentions`` (eager) for every head and token,
register and distillation tokens included. Then ``save_hf`` writes the directory back and ``from_pretrained`` reads
it to the same outputs. Runs in .ci/run-interop's venv (transformers needs torch 2.14.1), skips elsewhere.
"""

from __future__ import annotations

import json

import pytest
import torch
from _interop import interop_library, perturbed, report_diffs

from vit_einops import predict
from vit_einops.inspect import AttentionRecorder
from vit_einops.interop import load_hf, save_hf

transformers = interop_library("transformers")

TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2)
PATCH8 = dict(TINY, intermediate_size=64, image_size=32, patch_size=8)
DINO = dict(TINY, image_size=56, patch_size=14, layerscale_value=0.5)
# architecture -> (transformers config, its keyword arguments, the input sizes: native first, then two others)
FAMILIES = {
    "Dinov2Model": ("Dinov2Config", DINO, [56, 42, (70, 28)]),
    "Dinov2WithRegistersModel": ("Dinov2WithRegistersConfig", dict(DINO, num_register_tokens=4), [56, 42, (70, 28)]),
    "DeiTForImageClassificationWithTeacher": ("DeiTConfig", dict(PATCH8, num_labels=3), [32, 48, (40, 24)]),
    "CLIPVisionModel": ("CLIPVisionConfig", PATCH8, [32, 48, (40, 24)]),
    "CLIPVisionModelWithProjection": ("CLIPVisionConfig", dict(PATCH8, projection_dim=16), [32, 48, (40, 24)]),
    "SiglipVisionModel": ("SiglipVisionConfig", PATCH8, [32, 48, (40, 24)]),
}
# What the HF model holds that ours has no use for: DINOv2's mask token (masked image modelling, in pre-training).
UNUSED = {"Dinov2Model": {"embeddings.mask_token"}, "Dinov2WithRegistersModel": {"embeddings.mask_token"}}


def _hf(arch: str, **kw):
    config_name, fields, _ = FAMILIES[arch]
    config = getattr(transformers, config_name)(**{**fields, **kw}, attn_implementation="eager")
    return perturbed(getattr(transformers, arch)(config))


def _sizes(arch: str) -> list[tuple[int, int]]:
    return [(s, s) if isinstance(s, int) else s for s in FAMILIES[arch][2]]


def _hf_outputs(arch: str, hf, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """last_hidden_state, the pooled output or logits, and the attention maps (layers, b, h, n, n)."""
    native = x.shape[-1] == hf.config.image_size and x.shape[-2] == hf.config.image_size
    kw = {} if arch.startswith("Dinov2") else {"interpolate_pos_encoding": not native}
    with torch.no_grad():
        out = hf(pixel_values=x, output_attentions=True, **kw)
        if arch.startswith("DeiT"):  # the teacher's output has no tokens: its backbone's
            tokens = hf.deit(pixel_values=x, **kw).last_hidden_state
            pooled = ("logits", out.logits)
        else:
            tokens = out.last_hidden_state
            projected = arch.endswith("Projection")
            pooled = ("image_embeds", out.image_embeds) if projected else ("pooler_output", out.pooler_output)
    return {"last_hidden_state": tokens, pooled[0]: pooled[1], "attention": torch.stack(out.attentions)}


def _our_outputs(arch: str, ours, x: torch.Tensor) -> dict[str, torch.Tensor]:
    depth = len(ours.blocks)
    with torch.no_grad(), AttentionRecorder(ours, layers=range(depth)) as rec:
        out = ours(x)
        if arch.startswith("CLIP"):  # CLIP's last_hidden_state comes before post_layernorm (our head.norm)
            tokens = ours.blocks(ours.patch_embed(x))
        else:
            tokens = ours.forward_features(x)
    maps = rec.maps[:, : x.shape[0]]  # the first forward's maps; the CLIP branch ran the blocks twice
    pooled = {"DeiT": "logits", "CLIPVisionModelWithProjection": "image_embeds"}
    name = next((v for k, v in pooled.items() if arch.startswith(k)), "pooler_output")
    return {"last_hidden_state": tokens, name: out, "attention": maps}


def _assert_equal_outputs(arch: str, hf, ours, label: str) -> None:
    diffs = {}
    for size in _sizes(arch):
        x = torch.randn(2, 3, *size)
        expected, got = _hf_outputs(arch, hf, x), _our_outputs(arch, ours, x)
        assert got.keys() == expected.keys()
        for name, value in expected.items():
            assert got[name].shape == value.shape, (size, name)
            diff = (got[name] - value).abs().max().item()
            diffs[f"{label} {arch} {size[0]}x{size[1]} {name}"] = diff
    report_diffs(diffs)
    worst = max(diffs, key=diffs.__getitem__)
    assert diffs[worst] <= 1e-5, (worst, diffs[worst])


@pytest.mark.parametrize("arch", FAMILIES)
def test_load_hf_equals_transformers_at_three_sizes_and_in_every_attention_map(tmp_path, arch):
    hf = _hf(arch)
    hf.save_pretrained(tmp_path / "hf")
    ours = load_hf(tmp_path / "hf").eval()
    assert ours.source["architecture"] == arch
    assert ours.config.dynamic_size == ("timm" if arch == "Dinov2WithRegistersModel" else "hf")
    _assert_equal_outputs(arch, hf, ours, "hf")
    hf_count = sum(p.numel() for name, p in hf.named_parameters() if name not in UNUSED.get(arch, ()))
    folded = hf.config.hidden_size if arch == "Dinov2WithRegistersModel" else 0  # the class token's E_pos row
    assert sum(p.numel() for p in ours.parameters()) == hf_count - folded


@pytest.mark.parametrize("arch", FAMILIES)
def test_save_hf_writes_the_architecture_back_with_equal_outputs(tmp_path, arch):
    hf = _hf(arch)
    hf.save_pretrained(tmp_path / "src")
    ours = load_hf(tmp_path / "src")
    save_hf(ours, tmp_path / "out")
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["architectures"] == [arch]
    again = getattr(transformers, arch).from_pretrained(tmp_path / "out", attn_implementation="eager").eval()
    assert type(again.config) is type(hf.config)
    _assert_equal_outputs(arch, again, ours, "hf round trip")
    # and the file's tensors are transformers' own where no fold changed them
    from safetensors.torch import load_file

    src, out = load_file(tmp_path / "src" / "model.safetensors"), load_file(tmp_path / "out" / "model.safetensors")
    assert sorted(out) == sorted(src)
    changed = {k for k in src if not torch.equal(src[k], out[k])}
    if arch == "Dinov2WithRegistersModel":  # the class token's position row, folded into it and written as zeros
        assert changed == {"embeddings.cls_token", "embeddings.position_embeddings", "embeddings.mask_token"}
    elif arch == "Dinov2Model":
        assert changed == {"embeddings.mask_token"}  # unused at inference: written as zeros
    else:
        assert changed == set()


def test_teacher_labels_clip_projection_and_a_siglip_tower_without_its_head(tmp_path):
    labels = {0: "cat", 1: "dog", 2: "fish"}
    deit = _hf("DeiTForImageClassificationWithTeacher", id2label=labels, label2id={v: k for k, v in labels.items()})
    deit.save_pretrained(tmp_path / "deit")
    model = load_hf(tmp_path / "deit")
    assert model.class_names == ["cat", "dog", "fish"] and model.patch_embed.layout().prefix == ("cls", "dist")
    clip = _hf("CLIPVisionModelWithProjection")
    clip.save_pretrained(tmp_path / "clip")
    model = load_hf(tmp_path / "clip")
    assert (model.config.num_classes, model.config.head_bias, model.config.act) == (16, False, "quick_gelu")
    assert model.class_names is None  # projection outputs are no classes
    assert (model.config.embedding, model.has_classifier) == (True, False)  # an embedding head: a backbone
    with pytest.raises(ValueError, match=r"^this model outputs a 16-wide embedding \(its head is an embedding "
                                         r"projection"):  # fmt: skip
        predict(model, torch.rand(1, 3, 32, 32))
    assert load_hf(save_hf(model, tmp_path / "ours")).config.embedding  # written back as the projection
    _hf("CLIPVisionModel").save_pretrained(tmp_path / "tower")
    assert (load_hf(tmp_path / "tower").config.embedding, load_hf(tmp_path / "tower").num_classes) == (False, 0)
    siglip = _hf("SiglipVisionModel", vision_use_head=False)
    siglip.save_pretrained(tmp_path / "siglip")
    model = load_hf(tmp_path / "siglip").eval()
    assert model.config.pool == "mean" and model.patch_embed.layout().prefix == ()
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        assert (model.forward_features(x) - siglip(pixel_values=x).last_hidden_state).abs().max() <= 1e-5


WHOLE = [("CLIPModel", "CLIPVisionModelWithProjection"), ("SiglipModel", "SiglipVisionModel")]


@pytest.mark.parametrize(("whole", "tower"), WHOLE)
def test_a_whole_clip_or_siglip_model_reads_as_its_vision_tower(tmp_path, whole, tower):
    """The hub's CLIP and SigLIP checkpoints are whole models: the image tower is read, the text tower left."""
    text = dict(TINY, intermediate_size=64)
    config = getattr(transformers, whole.replace("Model", "Config"))(
        vision_config=PATCH8, text_config=text, **({"projection_dim": 16} if whole == "CLIPModel" else {})
    )
    config.vision_config._attn_implementation = "eager"
    hf = perturbed(getattr(transformers, whole)(config))
    hf.save_pretrained(tmp_path / "hf")
    ours = load_hf(tmp_path / "hf").eval()
    assert ours.source["architecture"] == tower
    assert ours.config.embedding is (whole == "CLIPModel")  # CLIP's projection to the joint embedding, SigLIP's none
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad(), AttentionRecorder(ours, layers=range(len(ours.blocks))) as rec:
        got = ours(x)
        vision = hf.vision_model(pixel_values=x, output_attentions=True)
    expected = hf.visual_projection(vision.pooler_output) if whole == "CLIPModel" else vision.pooler_output
    output = "image_embeds" if whole == "CLIPModel" else "pooler_output"
    diffs = {
        f"hf {whole} 32x32 {output}": (got - expected).abs().max(),
        f"hf {whole} 32x32 attention": (rec.maps - torch.stack(vision.attentions)).abs().max(),
    }
    report_diffs({k: v.item() for k, v in diffs.items()})
    assert max(diffs.values()) <= 1e-5
