"""timm's EVA-02 (``eva02_tiny_patch14_224``, ``eva02_small_patch14_224``) against timm's own ``Eva``, whole models at
their real sizes with random weights (``perturbed``): RoPE on the patch tokens, SwiGLU, q and v biases, mean pooling
and fc_norm, read by ``load_timm(state_dict, arch=name)``.

Compared at the native 224 px (a 16 x 16 grid, the RoPE reference grid), at another resolution two ways (a model
built at 336 px: E_pos learned at 24 x 24, RoPE positions scaled from the 16 x 16 reference; and timm's
``dynamic_img_size=True`` against our ``dynamic_size="timm"`` on a 280 x 196 input, a 20 x 14 grid), on every
attention path. float32, max |difference| <= 1e-5 on ``forward_features``, on the pooled output, and on the
attention maps ``record_attention`` records against the probabilities timm's written-out softmax computes. Our
export goes back into timm's ``Eva`` bit for bit. Every measurement goes to the interop report
(tests/_interop.py report_diffs).
"""

from __future__ import annotations

import importlib

import pytest
import torch
from _interop import assert_same_state, interop_library, perturbed, report_diffs

from vit_einops import ATTN_IMPLS, Attend
from vit_einops.inspect import record_attention
from vit_einops.interop import load_timm, timm_class, timm_kwargs, to_timm

timm = interop_library("timm")

TOL = 1e-5
NAMES = ["eva02_tiny_patch14_224", "eva02_small_patch14_224"]
DYNAMIC = (280, 196)  # a 20 x 14 grid of 14 px patches: neither side the reference's 16
DIFFS: dict[str, float] = {}


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    report_diffs(DIFFS)


def _timm(name: str, std: float = 0.02, **kwargs) -> torch.nn.Module:
    torch.manual_seed(0)
    return perturbed(timm.create_model(name, pretrained=False, **kwargs), std=std)


def _dynamic_twin(model: torch.nn.Module) -> torch.nn.Module:
    """timm's model of the same name and weights with dynamic_img_size=True: E_pos resampled and RoPE computed for
    each input's grid."""
    twin = timm.create_model(model.pretrained_cfg["architecture"], pretrained=False, dynamic_img_size=True).eval()
    twin.load_state_dict(model.state_dict())
    return twin


@pytest.fixture(scope="module", params=NAMES)
def native(request):
    """timm's model as timm.create_model(name) builds it (its RoPE table cached for 16 x 16), and ours loaded from
    its state dict."""
    theirs = _timm(request.param)
    return request.param, load_timm(theirs.state_dict(), arch=request.param), theirs


@pytest.fixture(scope="module")
def resized(native):
    """Both built at 336 px: timm's E_pos of 24 x 24 rows and RoPE for 24 x 24 scaled to the 16 x 16 reference."""
    name = native[0]
    theirs = _timm(name, img_size=336)
    return name, load_timm(theirs.state_dict(), arch=name, image_size=336), theirs


@pytest.fixture(scope="module")
def dynamic(native):
    """timm's dynamic_img_size=True and our dynamic_size="timm", the native model's weights."""
    name, _, theirs = native
    return name, load_timm(theirs.state_dict(), arch=name, dynamic_size="timm"), _dynamic_twin(theirs)


@pytest.fixture(scope="module")
def peaked(native):
    """For the attention maps, noise of std 0.05: with 0.02 the rows stay near uniform (largest probability 0.02
    against 1/n = 0.004), with 0.05 they peak (up to 0.5), so that 1e-5 bounds probabilities that differ. Both the
    fixed-size models and their dynamic twins."""
    name = native[0]
    theirs = _timm(name, std=0.05)
    state = theirs.state_dict()
    return name, {
        "native": (load_timm(state, arch=name), theirs),
        "dynamic": (load_timm(state, arch=name, dynamic_size="timm"), _dynamic_twin(theirs)),
    }


def _set_impl(model: torch.nn.Module, impl: str) -> None:
    model.set_attn_impl(impl)
    for attend in model.modules():
        if isinstance(attend, Attend):
            attend.chunk_elements = 2**16  # a few blocks of queries per layer: the chunked path really chunks


def _check(what: str, actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.shape == expected.shape, what
    diff = DIFFS[what] = (actual - expected).abs().max().item()
    assert diff <= TOL, f"{what}: max |difference| {diff:.2e} > {TOL:g}"


def _compare(tag: str, ours: torch.nn.Module, theirs: torch.nn.Module, x: torch.Tensor) -> None:
    with torch.no_grad():
        _check(f"{tag} forward_features", ours.forward_features(x), theirs.forward_features(x))
        _check(f"{tag} pooled", ours(x), theirs(x))


@pytest.mark.parametrize("impl", ATTN_IMPLS)
def test_native_size(native, impl):
    name, ours, theirs = native
    _set_impl(ours, impl)
    _compare(f"timm {name} 224 {impl}", ours, theirs, torch.randn(2, 3, 224, 224))


@pytest.mark.parametrize("impl", ATTN_IMPLS)
def test_built_at_another_resolution(resized, impl):
    name, ours, theirs = resized
    assert ours.config.image_size == (336, 336) and ours.config.rope_grid == (16, 16)
    assert ours.patch_embed.layout((336, 336)).grid == (24, 24)
    _set_impl(ours, impl)
    _compare(f"timm {name} built at 336 {impl}", ours, theirs, torch.randn(1, 3, 336, 336))


@pytest.mark.parametrize("impl", ATTN_IMPLS)
def test_dynamic_size(dynamic, impl):
    name, ours, theirs = dynamic
    _set_impl(ours, impl)
    _compare(f"timm {name} dynamic {DYNAMIC[0]}x{DYNAMIC[1]} {impl}", ours, theirs, torch.randn(1, 3, *DYNAMIC))


def _timm_attention(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """(layers, b, h, n, n): the probabilities of timm's written-out softmax (fused_attn off), as each block's
    EvaAttention hands them to its attn_drop."""
    maps, handles, fused = [], [], [block.attn.fused_attn for block in model.blocks]
    for block in model.blocks:
        block.attn.fused_attn = False
        handles.append(block.attn.attn_drop.register_forward_hook(lambda m, args, out: maps.append(args[0])))
    try:
        with torch.no_grad():
            model(x)
    finally:
        for handle in handles:
            handle.remove()
        for block, was in zip(model.blocks, fused, strict=True):
            block.attn.fused_attn = was
    return torch.stack(maps)


@pytest.mark.parametrize("impl", ATTN_IMPLS)
@pytest.mark.parametrize("case", ["native", "dynamic"])
def test_recorded_attention_is_timms(peaked, case, impl):
    """record_attention on each path records the A timm attends with, RoPE and the q bias inside, rows and columns
    named by the layout: the class token, then the input's grid."""
    name, models = peaked
    ours, theirs = models[case]
    size = (224, 224) if case == "native" else DYNAMIC
    x = torch.randn(1, 3, *size)
    _set_impl(ours, impl)
    _, maps, layout = record_attention(ours, x, preprocessed=True)
    expected = _timm_attention(theirs, x)
    assert layout.prefix == ("cls",) and layout.grid == (size[0] // 14, size[1] // 14)
    assert maps.shape == expected.shape == (12, 1, ours.config.heads, layout.num_tokens, layout.num_tokens)
    _check(f"timm {name} attention {size[0]}x{size[1]} {impl}", maps, expected)


def test_our_export_is_timms_model(native):
    """to_timm loads into timm.create_model(name) bit for bit, and timm_class(config)(**timm_kwargs(config)) builds
    a model that takes it and computes what ours does."""
    name, ours, theirs = native
    exported = to_timm(ours)
    fresh = timm.create_model(name, pretrained=False)
    fresh.load_state_dict(exported)
    assert_same_state(fresh.state_dict(), theirs.state_dict())
    module, cls = timm_class(ours.config).rsplit(".", 1)
    assert getattr(importlib.import_module(module), cls) is type(theirs)
    back = type(theirs)(**timm_kwargs(ours.config)).eval()
    back.load_state_dict(exported)
    ours.set_attn_impl("einsum")
    _compare(f"timm {name} 224 from our export", ours, back, torch.randn(2, 3, 224, 224))
