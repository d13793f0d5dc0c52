"""Against the libraries themselves: torchvision's and timm's ViTs, state dicts and resampling functions.

torchvision and timm need torch 2.14.1 + torchvision 0.29.1 here, so these tests run in a second venv
(.ci/run-interop builds it); elsewhere they skip with that reason. VIT_EINOPS_REQUIRE_INTEROP=1 turns the skip
into a failure, so CI cannot pass without running them.

Tolerances: the float32 comparisons use tests/_equiv.py's F32_TOL (rtol 1e-4, atol 1e-5 x the largest |logit|):
torchvision runs nn.MultiheadAttention's fused kernels and timm SDPA, we the written-out einsum, so the two sum
in different orders; at ViT-B's depth float32 rounding accumulates to ~1e-6 relative, and a real mistake (a
swapped head, a wrong eps) moves logits by 1e-2 or more. The small configs run in float64 at F64_TOL (1e-10).
Set VIT_EINOPS_INTEROP_REPORT=path.json to record the max |logit difference| of every configuration.
"""

from __future__ import annotations

import importlib
import os

import pytest
import torch
from _equiv import F32_TOL, F64_TOL, assert_close
from _interop import assert_same_state, perturbed, report_diffs

from vit_einops.interop import (
    from_torchvision,
    load_timm,
    load_torchvision,
    resample_pos_embed,
    resample_vit,
    timm_kwargs,
    to_timm,
    to_torchvision,
    torchvision_config,
)
from vit_einops.presets import preset_config

REASON = (
    "{} is not installed: it needs torch 2.14.1 (torchvision 0.29.1); "
    ".ci/run-interop runs these tests in a venv of their own (.venv-interop-ci)"
)


def _library(name: str):
    if os.environ.get("VIT_EINOPS_REQUIRE_INTEROP") == "1":
        return importlib.import_module(name)  # CI: a missing library is a failure, not a skip
    return pytest.importorskip(name, reason=REASON.format(name))


torchvision = _library("torchvision")
timm = _library("timm")
from timm.layers import resample_abs_pos_embed  # noqa: E402
from timm.models.vision_transformer import VisionTransformer as TimmViT  # noqa: E402
from torchvision.models.vision_transformer import VisionTransformer as TorchvisionViT  # noqa: E402
from torchvision.models.vision_transformer import interpolate_embeddings  # noqa: E402

DIFFS: dict[str, float] = {}


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    report_diffs(DIFFS)


def compare(name: str, ours: torch.nn.Module, theirs: torch.nn.Module, x: torch.Tensor) -> None:
    with torch.no_grad():
        expected, actual = theirs(x), ours.eval()(x)
    DIFFS[name] = assert_close(actual, expected, F64_TOL if x.dtype == torch.float64 else F32_TOL, name)


# ---- torchvision ----


def test_torchvision_vit_b_16_logits_native_and_resampled():
    """Randomly initialised vit_b_16 at 224 px, then both moved to 256 px, each with torchvision's own resampling."""
    tv = perturbed(torchvision.models.vit_b_16())
    state = tv.state_dict()
    model = load_torchvision(state)  # heads 12 from Table 1 by width 768
    assert model.config == type(model.config)(**preset_config("vit_b_16"))
    x = torch.randn(1, 3, 224, 224)
    compare("torchvision vit_b_16 @224", model, tv, x)
    assert_same_state(to_torchvision(model), state)

    tv256 = torchvision.models.vit_b_16(image_size=256).eval()
    tv256.load_state_dict(interpolate_embeddings(256, 16, dict(state)))
    compare(
        "torchvision vit_b_16 @256 (resampled from 224)",
        resample_vit(model, 256, mode="torchvision"),
        tv256,
        torch.randn(1, 3, 256, 256),
    )


@pytest.mark.parametrize("name", ["vit_b_16", "vit_b_32", "vit_l_16", "vit_l_32", "vit_h_14"])
def test_torchvision_presets_keys_and_config(name):
    """Every torchvision ViT's keys and shapes, on the meta device (no memory): config inferred equals our preset."""
    with torch.device("meta"):
        state = getattr(torchvision.models, name)().state_dict()
    config = torchvision_config(state)
    assert config == type(config)(**preset_config(name))
    from_torchvision(state, config)  # every key and shape checked


@pytest.mark.parametrize("representation_size", [None, 20])
@pytest.mark.parametrize("image_size, new_size", [(32, 48), (48, 24)])
def test_torchvision_small_float64(representation_size, image_size, new_size):
    kwargs = dict(patch_size=8, num_layers=2, num_heads=4, hidden_dim=32, mlp_dim=64, num_classes=7)
    tv = perturbed(
        TorchvisionViT(image_size=image_size, representation_size=representation_size, **kwargs), 0.1
    ).double()
    model = load_torchvision(tv.state_dict(), heads=4).double()
    tag = f"torchvision float64 repr={representation_size} {image_size}px"
    compare(tag, model, tv, torch.randn(2, 3, image_size, image_size, dtype=torch.float64))
    assert_same_state(to_torchvision(model), tv.state_dict())
    new = TorchvisionViT(image_size=new_size, representation_size=representation_size, **kwargs).double().eval()
    new.load_state_dict(interpolate_embeddings(new_size, 8, tv.state_dict()))
    compare(f"{tag} -> {new_size}px", resample_vit(model, new_size, mode="torchvision"), new,
            torch.randn(2, 3, new_size, new_size, dtype=torch.float64))  # fmt: skip


def test_torchvision_legacy_mlp_names_as_torchvision_reads_them():
    """Checkpoints from before torchvision's MLP refactor (mlp.linear_1/2): torchvision and we read them alike."""
    kwargs = dict(image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=32, mlp_dim=64, num_classes=3)
    tv = perturbed(TorchvisionViT(**kwargs))
    legacy = {
        k.replace("mlp.0.", "mlp.linear_1.").replace("mlp.3.", "mlp.linear_2."): v for k, v in tv.state_dict().items()
    }
    reloaded = TorchvisionViT(**kwargs).eval()
    reloaded.load_state_dict(legacy)
    compare("torchvision legacy MLP names", load_torchvision(legacy, heads=4), reloaded, torch.randn(2, 3, 32, 32))


def test_torchvision_feature_extractor_as_in_the_course():
    """The course's feature extractor: torchvision's vit with ``heads`` replaced by Identity returns our pre-logits."""
    tv = perturbed(TorchvisionViT(image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=32, mlp_dim=64))
    model = load_torchvision(tv.state_dict(), heads=4).eval()
    tv.heads = torch.nn.Identity()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        ours = model.forward_head(model.forward_features(x), pre_logits=True)
        DIFFS["torchvision pre-logits"] = assert_close(ours, tv(x), F32_TOL, "pre-logits")


# ---- timm ----

TIMM_CASES = {
    "vit_tiny_patch16_224": dict(),
    "vit_small_patch32_224": dict(global_pool="avg", fc_norm=False),
    "vit_base_patch32_224": dict(num_classes=0),
}


@pytest.mark.parametrize("name", sorted(TIMM_CASES))
def test_timm_registered_models_native_and_resampled(name):
    """Registered timm models (random init) at 224 px, then at 288 px: timm resamples inside its forward
    (dynamic_img_size=True, resample_abs_pos_embed), we once with resample_vit(mode="timm")."""
    kwargs = TIMM_CASES[name]
    tm = perturbed(timm.create_model(name, pretrained=False, dynamic_img_size=True, **kwargs))
    state = tm.state_dict()
    model = load_timm(state, global_pool=kwargs.get("global_pool", "token"))
    compare(f"timm {name} {kwargs} @224", model, tm, torch.randn(1, 3, 224, 224))
    assert_same_state(to_timm(model), state)
    compare(
        f"timm {name} {kwargs} @288 (resampled from 224)",
        resample_vit(model, 288, mode="timm"),
        tm,
        torch.randn(1, 3, 288, 288),
    )


@pytest.mark.parametrize("global_pool", ["token", "avg"])
@pytest.mark.parametrize("img_size, new_size", [((32, 48), (48, 32)), ((48, 48), (24, 40))])
def test_timm_small_float64(global_pool, img_size, new_size):
    tm = TimmViT(img_size=img_size, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=7,
                 global_pool=global_pool, fc_norm=False, dynamic_img_size=True)  # fmt: skip
    tm = perturbed(tm, 0.1).double()
    model = load_timm(tm.state_dict(), heads=2, image_size=img_size, global_pool=global_pool).double()
    assert TimmViT(**timm_kwargs(model.config)).state_dict().keys() == tm.state_dict().keys()
    tag = f"timm float64 {global_pool} {img_size}"
    compare(tag, model, tm, torch.randn(2, 3, *img_size, dtype=torch.float64))
    # timm's resample_abs_pos_embed interpolates in float32 even for float64 weights (we stay in float64), so the
    # resampled positions differ by float32 rounding (~1e-7 relative); the logits then by ~1e-8, not 1e-16.
    # That the two conventions are the same is shown exactly, in float32, by test_resample_matches_timm_...
    x = torch.randn(2, 3, *new_size, dtype=torch.float64)
    with torch.no_grad():
        expected, actual = tm(x), resample_vit(model, new_size, mode="timm").eval()(x)
    DIFFS[f"{tag} -> {new_size}"] = assert_close(actual, expected, dict(rtol=1e-6, atol=1e-7), f"{tag} -> {new_size}")


def test_timm_model_from_our_export():
    """The other direction: our weights into a timm model built from timm_kwargs."""
    model = perturbed(load_timm(timm.create_model("vit_tiny_patch16_224").state_dict()))
    tm = TimmViT(**timm_kwargs(model.config)).eval()
    tm.load_state_dict(to_timm(model))
    compare("timm from our export, vit_tiny_patch16_224 @224", model, tm, torch.randn(1, 3, 224, 224))


def test_timm_fc_norm_average_pooling():
    """timm's default for global_pool='avg': LayerNorm after pooling (fc_norm), read from the keys."""
    tm = perturbed(TimmViT(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=5,
                           global_pool="avg"))  # fmt: skip
    assert "fc_norm.weight" in tm.state_dict()
    model = load_timm(tm.state_dict(), heads=2, global_pool="avg")
    assert model.config.fc_norm and model.config.pool == "mean"
    compare("timm avg pooling with fc_norm (float32)", model, tm, torch.randn(2, 3, 32, 32))
    assert_same_state(to_timm(model), tm.state_dict())


def test_timm_features():
    tm = perturbed(TimmViT(img_size=32, patch_size=8, embed_dim=32, depth=3, num_heads=2, num_classes=5))
    model = load_timm(tm.state_dict(), heads=2).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        expected = tm.forward_head(tm.forward_features(x), pre_logits=True)
        ours = model.forward_head(model.forward_features(x), pre_logits=True)
        DIFFS["timm pre-logits"] = assert_close(ours, expected, F32_TOL, "pre-logits")
        kwargs = dict(indices=[0, 2], norm=True, output_fmt="NLC", intermediates_only=True, return_prefix_tokens=True)
        theirs, ours = tm.forward_intermediates(x, **kwargs), model.forward_intermediates(x, **kwargs)
    for (patches, prefix), (our_patches, our_prefix) in zip(theirs, ours, strict=True):
        assert_close(our_patches, patches, F32_TOL, "intermediate patch tokens")
        assert_close(our_prefix, prefix, F32_TOL, "intermediate class token")


# ---- resampling against the libraries' own functions ----


@pytest.mark.parametrize("old, new", [(14, 16), (14, 24), (16, 7), (3, 5)])
def test_resample_matches_torchvision_interpolate_embeddings(old, new):
    pos = torch.randn(1, 1 + old * old, 32)
    theirs = interpolate_embeddings(new, 1, {"encoder.pos_embedding": pos})["encoder.pos_embedding"]
    assert torch.equal(resample_pos_embed(pos, new, mode="torchvision"), theirs)


@pytest.mark.parametrize("old, new", [((14, 14), (16, 16)), ((14, 14), (7, 7)), ((4, 6), (9, 5)), ((24, 24), (12, 20))])
def test_resample_matches_timm_resample_abs_pos_embed(old, new):
    pos = torch.randn(1, 1 + old[0] * old[1], 32)
    theirs = resample_abs_pos_embed(pos, new_size=list(new), old_size=list(old), num_prefix_tokens=1)
    assert torch.equal(resample_pos_embed(pos, new, old, mode="timm"), theirs)


# ---- LayerScale, register tokens, positions for the patches only (DINOv2, DeiT III) ----

DINOV2_CASES = {
    "vit_small_patch14_dinov2": dict(),  # LayerScale, E_pos over the class token too
    "vit_small_patch14_reg4_dinov2": dict(),  # LayerScale, 4 registers, E_pos over the patches only
    "vit_small_patch14_reg4_dinov2 (avg, 10 classes)": dict(global_pool="avg", num_classes=10),
}


def compare_features(name: str, ours: torch.nn.Module, theirs: torch.nn.Module, x: torch.Tensor) -> None:
    """forward_features (every token, registers included) and the logits (or pooled features) of both, each also
    within 1e-5 max abs difference (issue 19's bound for float32)."""
    with torch.no_grad():
        expected, actual = theirs.forward_features(x), ours.eval().forward_features(x)
    DIFFS[f"{name} forward_features"] = assert_close(actual, expected, F32_TOL, f"{name} forward_features")
    compare(name, ours, theirs, x)
    assert max(DIFFS[f"{name} forward_features"], DIFFS[name]) <= 1e-5, name


@pytest.mark.parametrize("case", sorted(DINOV2_CASES))
def test_timm_dinov2_registers_layer_scale(case):
    """timm's DINOv2 ViT-S/14 with and without registers (random init, 126 px: a 9 x 9 grid), read from its keys
    alone (registers, LayerScale, which tokens E_pos covers), then at 98 px, where timm resamples in its forward
    (dynamic_img_size) and we once with resample_vit."""
    kwargs = DINOV2_CASES[case]
    name = case.split(" ")[0]
    tm = perturbed(timm.create_model(name, pretrained=False, img_size=126, dynamic_img_size=True, **kwargs))
    state = tm.state_dict()
    # The named archs are recognised from the keys; the avg-pooled variant (fc_norm) fits no arch of the table, so
    # what no tensor holds is told, as timm builds it.
    told = dict(heads=6, act="gelu", layer_norm_eps=1e-6) if "avg" in case else {}
    model = load_timm(state, global_pool=kwargs.get("global_pool", "token"), **told)
    assert model.source.get("arch") == (None if told else name)
    registers = 4 if "reg4" in name else 0
    assert (model.config.register_tokens, model.config.pos_embed_prefix) == (registers, not registers)
    assert model.config.layer_scale is not None
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in tm.parameters())
    compare_features(f"timm {case} @126", model, tm, torch.randn(2, 3, 126, 126))
    assert_same_state(to_timm(model), state)
    compare_features(f"timm {case} @98 (resampled from 126)", resample_vit(model, 98, mode="timm"), tm,
                     torch.randn(2, 3, 98, 98))  # fmt: skip


@pytest.mark.parametrize("reg_tokens", [0, 3])
@pytest.mark.parametrize("no_embed_class", [False, True])
@pytest.mark.parametrize("global_pool", ["token", "avg"])
def test_timm_small_registers_layer_scale_both_ways(reg_tokens, no_embed_class, global_pool):
    """Every combination at a tiny size: timm -> ours (logits and tokens), and ours -> a timm model built from
    timm_kwargs, bit-identical state dicts both ways. init_values 0.5 so that a LayerScale read wrong shows."""
    tm = TimmViT(img_size=(28, 42), patch_size=7, embed_dim=32, depth=2, num_heads=4, num_classes=5,
                 global_pool=global_pool, fc_norm=False, reg_tokens=reg_tokens, no_embed_class=no_embed_class,
                 init_values=0.5)  # fmt: skip
    tm = perturbed(tm, 0.1)
    # A hand-built timm ViT of no family: what no tensor holds is told (timm's nn.GELU and LayerNorm eps 1e-6).
    model = load_timm(tm.state_dict(), heads=4, image_size=(28, 42), global_pool=global_pool, act="gelu",
                      layer_norm_eps=1e-6)  # fmt: skip
    assert (model.config.register_tokens, model.config.pos_embed_prefix) == (reg_tokens, not no_embed_class)
    tag = f"timm tiny reg={reg_tokens} no_embed_class={no_embed_class} {global_pool}"
    compare_features(tag, model, tm, torch.randn(2, 3, 28, 42))
    back = TimmViT(**timm_kwargs(model.config)).eval()
    back.load_state_dict(to_timm(model))
    assert_same_state(back.state_dict(), tm.state_dict())
    compare_features(f"{tag}, timm from our export", model, back, torch.randn(2, 3, 28, 42))
