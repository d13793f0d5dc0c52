"""Hostile inputs to the model's configuration and forward, as a table: each case names the input, the exact error
type and the words that name the bad value. Cases that are accepted say so and assert what comes out."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from _hostile import raw_model_file
from _tiny import TINY_RGB16

from vit_einops import ClassificationHead, TransformerEncoderBlock, ViT, ViTConfig, create_vit
from vit_einops.modelfile import load_vit

TINY = TINY_RGB16
NAN, INF = float("nan"), float("inf")

# (field, value, error type, words in the message)
BAD_CONFIG = [
    ("layer_norm_eps", NAN, ValueError, "layer_norm_eps must be a positive finite float, got nan"),
    ("layer_norm_eps", INF, ValueError, "layer_norm_eps must be a positive finite float, got inf"),
    ("layer_norm_eps", -INF, ValueError, "got -inf"),
    ("layer_norm_eps", 0.0, ValueError, "layer_norm_eps must be a positive finite float, got 0.0"),
    ("layer_norm_eps", -1e-6, ValueError, "got -1e-06"),
    ("layer_norm_eps", "1e-6", TypeError, "layer_norm_eps must be a positive finite float, got '1e-6' of type str"),
    ("layer_norm_eps", True, TypeError, "got True of type bool"),
    ("layer_norm_eps", None, TypeError, "got None of type NoneType"),
    ("dropout", NAN, ValueError, r"dropout must be a float in [0, 1), got nan"),
    ("dropout", INF, ValueError, r"dropout must be a float in [0, 1), got inf"),
    ("dropout", 1.0, ValueError, r"dropout must be in [0, 1), got 1.0"),
    ("dropout", -0.1, ValueError, r"dropout must be in [0, 1), got -0.1"),
    ("dropout", True, TypeError, "dropout must be a float in [0, 1), got True of type bool"),
    ("dropout", "0.1", TypeError, "got '0.1' of type str"),
    ("dropout", None, TypeError, "got None"),
    ("attn_dropout", NAN, ValueError, "attn_dropout must be a float in [0, 1), got nan"),
    ("attn_dropout", 1.5, ValueError, "attn_dropout must be in [0, 1), got 1.5"),
    ("image_size", 16.0, TypeError, "image_size must be an int, got 16.0 of type float"),
    ("image_size", True, TypeError, "image_size must be an int, got True of type bool"),
    ("image_size", (16,), ValueError, "image_size must be an int or an (h, w) pair, got (16,)"),
    ("image_size", (16, 16, 3), ValueError, "image_size must be an int or an (h, w) pair"),
    ("image_size", (16, NAN), TypeError, "image_size[1] must be an int, got nan"),
    ("image_size", -16, ValueError, "image_size must be a positive int, got -16"),
    ("image_size", "16", TypeError, "image_size must be an int, got '16' of type str"),
    ("image_size", None, TypeError, "image_size must be an int, got None"),
    ("image_size", 18, ValueError, "image height 18 is not divisible by patch height 4"),
    ("patch_size", 0, ValueError, "patch_size must be a positive int, got 0"),
    ("patch_size", 3.5, TypeError, "patch_size must be an int, got 3.5"),
    ("patch_size", 32, ValueError, "image height 16 is not divisible by patch height 32"),
    ("in_channels", 0, ValueError, "in_channels must be a positive int, got 0"),
    ("in_channels", 2.0, TypeError, "in_channels must be an int, got 2.0"),
    ("num_classes", -1, ValueError, "num_classes must be >= 0, got -1"),
    ("num_classes", True, TypeError, "num_classes must be an int, got True of type bool"),
    ("num_classes", 3.0, TypeError, "num_classes must be an int, got 3.0"),
    ("num_classes", "10", TypeError, "num_classes must be an int, got '10'"),
    ("dim", 0, ValueError, "dim must be a positive int, got 0"),
    ("dim", NAN, TypeError, "dim must be an int, got nan of type float"),
    ("dim", 30, ValueError, "dim 30 is not divisible by heads 4"),
    ("depth", 0, ValueError, "depth must be a positive int, got 0"),
    ("depth", True, TypeError, "depth must be an int, got True"),
    ("heads", 0, ValueError, "heads must be a positive int, got 0"),
    ("heads", 64, ValueError, "dim 32 is not divisible by heads 64"),
    ("mlp_dim", 0, ValueError, "mlp_dim must be a positive int, got 0"),
    ("mlp_dim", INF, TypeError, "mlp_dim must be an int, got inf"),
    ("pool", "max", ValueError, "unknown pool 'max'; expected one of 'cls', 'mean'"),
    ("pool", None, ValueError, "unknown pool None"),
    ("pool", ["cls"], ValueError, "unknown pool ['cls']"),
    ("patchify", "unfold", ValueError, "unknown patchify 'unfold'; expected one of 'conv', 'linear'"),
    ("representation_size", 0, ValueError, "representation_size must be a positive int, got 0"),
    ("representation_size", True, TypeError, "representation_size must be an int, got True"),
    ("representation_size", 2.5, TypeError, "representation_size must be an int, got 2.5"),
    ("fc_norm", 1, TypeError, "fc_norm must be a bool, got 1 of type int"),
    ("fc_norm", "yes", TypeError, "fc_norm must be a bool, got 'yes'"),
    ("fc_norm", None, TypeError, "fc_norm must be a bool, got None"),
    # bounded as image_size is: past int64 it failed in the forward ("int too big to convert")
    ("rope_grid", 10**39, ValueError,
     "rope_grid must be at most 2**63 - 1 (torch's integers are int64), got 1000000000000000000000000000000000000000"),
    ("rope_grid", (4, 2**63), ValueError,
     "rope_grid[1] must be at most 2**63 - 1 (torch's integers are int64), got 9223372036854775808"),
    ("rope_grid", 0, ValueError, "rope_grid must be a positive int, got 0"),
    ("image_size", 2**63, ValueError,
     "image_size must be at most 2**63 - 1 (torch's integers are int64), got 9223372036854775808"),
]


@pytest.mark.parametrize("field, value, error, words", BAD_CONFIG, ids=[f"{c[0]}={c[1]!r}" for c in BAD_CONFIG])
def test_bad_config_field_is_refused_where_it_enters(field, value, error, words):
    for build in (lambda: ViT(**{**TINY, field: value}), lambda: ViTConfig(**{**TINY, field: value})):
        with pytest.raises(error) as err:
            build()
        assert words in str(err.value)
    with pytest.raises(error):  # the same check when a stored config is read back (a file, a checkpoint)
        ViTConfig.from_dict({**TINY, field: value})


def test_a_model_file_with_a_rope_grid_past_int64_is_refused_as_it_loads(tmp_path):
    """The reported tampered file: rope_grid 10**39 loaded, and every forward failed inside torch."""
    path = raw_model_file(tmp_path / "m.safetensors", config={"rope_grid": [10**39, 4]})
    with pytest.raises(ValueError) as caught:
        load_vit(path)
    assert str(caught.value) == (
        f"{path}: the stored vit-einops config is invalid: rope_grid[0] must be at most 2**63 - 1 (torch's integers "
        "are int64), got 1000000000000000000000000000000000000000"
    )
    largest = load_vit(raw_model_file(tmp_path / "ok.safetensors", config={"rope_grid": [2**63 - 1, 4]}))
    assert largest.config.rope_grid == (2**63 - 1, 4)


# The attention path is runtime state, not a config field: (value, error type, words in the message).
BAD_ATTN_IMPL = [
    ("flash", ValueError, "unknown attn_impl 'flash'; expected one of 'einsum', 'chunked', 'sdpa'"),
    (["einsum"], ValueError, "attn_impl lists 1 impls for a model of depth 2"),
    (["einsum", "flash"], ValueError, "attn_impl[1] 'flash'"),
    (3, TypeError, "attn_impl must be one of 'einsum', 'chunked', 'sdpa' or a sequence of them"),
    (None, TypeError, "got None of type NoneType"),
]


@pytest.mark.parametrize("value, error, words", BAD_ATTN_IMPL, ids=[repr(c[0]) for c in BAD_ATTN_IMPL])
def test_bad_attn_impl_is_refused_where_it_enters(value, error, words):
    model = ViT(**TINY)
    for enter in (lambda: ViT(**TINY, attn_impl=value), lambda: model.set_attn_impl(value)):
        with pytest.raises(error) as err:
            enter()
        assert words in str(err.value)
    assert model.attn_impl == "einsum"  # a refused impl changes no layer
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'attn_impl'"):  # not architecture
        ViTConfig(**TINY, attn_impl="einsum")


def test_numpy_and_torch_scalars_are_accepted_as_plain_numbers():
    """Sizes that come out of numpy or torch are ints and floats too; the config stores Python numbers, so it
    still goes to JSON."""
    config = ViT(
        **{**TINY, "image_size": np.int64(16), "num_classes": torch.tensor(5).item(), "dropout": np.float32(0.25)}
    ).config
    assert config.image_size == (16, 16) and type(config.image_size[0]) is int and config.dropout == 0.25
    assert json.loads(json.dumps(config.to_dict()))["image_size"] == [16, 16]
    with pytest.raises(TypeError, match=r"depth must be an int, got .*True.* of type bool"):
        ViT(**{**TINY, "depth": np.bool_(True)})


def test_config_from_something_that_is_not_a_mapping():
    with pytest.raises(TypeError, match="a ViTConfig is read from a mapping of its fields, got list"):
        ViTConfig.from_dict([("dim", 32)])
    with pytest.raises(ValueError, match=r"unknown ViTConfig fields \['widht'\]"):
        ViTConfig.from_dict({**TINY, "widht": 3})


@pytest.mark.parametrize(
    "build, error, words",
    [
        (lambda: TransformerEncoderBlock(8), TypeError, "TransformerEncoderBlock takes a ViTConfig"),
        (lambda: ClassificationHead(dict(TINY)), TypeError, "ClassificationHead takes a ViTConfig"),
        (lambda: create_vit("vit_ti_16", layer_norm_eps=NAN), ValueError, "got nan"),
        (lambda: create_vit("vit_ti_16", widht=3), TypeError, "unexpected keyword argument 'widht'"),
        (lambda: create_vit(None), TypeError, "a preset name is a str, got None"),
    ],
)
def test_modules_and_presets_check_their_own_arguments(build, error, words):
    with pytest.raises(error) as err:
        build()
    assert words in str(err.value)


# --- forward --------------------------------------------------------------------------------------------

BAD_INPUT = [
    (
        lambda: torch.rand(2, 3, 16, 16, dtype=torch.float64),
        TypeError,
        "the input is torch.float64 but the model is torch.float32, and casting would round the input; pass x.to(torch.float32)",
    ),
    (
        lambda: torch.zeros(2, 3, 16, 16, dtype=torch.uint8),
        TypeError,
        "expected a floating-point image tensor, got dtype torch.uint8 (for 0..255 pixels pass x.float() / 255",
    ),
    (lambda: torch.zeros(2, 3, 16, 16, dtype=torch.int64), TypeError, "got dtype torch.int64"),
    (lambda: torch.zeros(2, 3, 16, 16, dtype=torch.bool), TypeError, "got dtype torch.bool"),
    (lambda: torch.zeros(2, 3, 16, 16, dtype=torch.complex64), TypeError, "got dtype torch.complex64"),
    (
        lambda: np.zeros((2, 3, 16, 16), dtype=np.float32),
        TypeError,
        "expected a torch.Tensor of shape (b, 3, 16, 16), got ndarray",
    ),
    (lambda: [[0.0]], TypeError, "got list"),
    (lambda: None, TypeError, "got NoneType"),
    (lambda: torch.rand(3, 16, 16), ValueError, "expected a 4-D tensor (b, 3, 16, 16), got 3-D of shape (3, 16, 16)"),
    (lambda: torch.rand(2, 4, 16, 16), ValueError, "expected 3 channels, got 4"),
    (lambda: torch.rand(2, 3, 16, 17), ValueError, "expected height, width (16, 16), got (16, 17)"),
    (lambda: torch.rand(2, 3, 16, 16, device="meta"), ValueError, "the input is on meta but the model is on cpu"),
]


@pytest.mark.parametrize("make, error, words", BAD_INPUT)
def test_bad_input_is_one_clear_error_from_every_entry_point(make, error, words):
    model = ViT(**TINY).eval()
    x = make()
    entries = [
        model,
        model.forward_features,
        lambda t: model.forward_intermediates(t),
        lambda t: model.get_intermediate_layers(t),
    ]
    for entry in entries:
        with pytest.raises(error) as err:
            entry(x)
        assert words in str(err.value)


@pytest.mark.parametrize(
    "input_dtype, model_dtype",
    [(torch.float16, torch.float32), (torch.bfloat16, torch.float32), (torch.float32, torch.float64)],
)
@torch.no_grad()
def test_exact_casts_are_made(input_dtype, model_dtype):
    """Every float16/bfloat16 value is a float32 value (and float32 a float64 one): the cast loses nothing, so
    the result equals feeding the cast batch."""
    model = ViT(**TINY).eval().to(model_dtype)
    x = torch.rand(2, 3, 16, 16).to(input_dtype)
    out = model(x)
    assert out.dtype == model_dtype
    assert torch.equal(out, model(x.to(model_dtype)))


@pytest.mark.parametrize(
    "input_dtype, model_dtype",
    [(torch.float32, torch.float16), (torch.float32, torch.bfloat16), (torch.float16, torch.bfloat16)],
)
def test_rounding_casts_are_refused(input_dtype, model_dtype):
    model = ViT(**TINY).to(model_dtype)
    with pytest.raises(
        TypeError, match=f"the input is {input_dtype} but the model is {model_dtype}, and casting would round"
    ):
        model(torch.rand(1, 3, 16, 16).to(input_dtype))


@torch.no_grad()
def test_the_rule_holds_under_autocast():
    model = ViT(**TINY).eval()
    x = torch.rand(2, 3, 16, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = model(x)
        assert torch.equal(model(x.bfloat16()), model(x.bfloat16().float()))  # exact cast, then autocast's own
        with pytest.raises(TypeError, match="the input is torch.float64 but the model is torch.float32"):
            model(x.double())  # autocast never casts float64: torch would fail deep inside the first conv
    assert expected.shape == (2, 5) and torch.isfinite(expected).all()


@pytest.mark.parametrize("impl", ["einsum", "chunked", "sdpa"])
@torch.no_grad()
def test_non_finite_pixels_are_allowed_and_stay_in_their_image(impl):
    """Documented: pixels are not scanned for nan/inf (a full pass over every batch); a bad image gets
    non-finite logits and the other images of the batch are exactly as if run alone."""
    model = ViT(**TINY, attn_impl=impl).eval()
    x = torch.rand(3, 3, 16, 16)
    x[0, 1, 2, 3] = NAN
    x[1, 0, 0, 0] = INF
    out = model(x)
    assert not torch.isfinite(out[0]).any() and not torch.isfinite(out[1]).any()
    torch.testing.assert_close(out[2:], model(x[2:]), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("impl", ["einsum", "chunked", "sdpa"])
def test_an_empty_batch_gives_empty_logits(impl):
    assert ViT(**TINY, attn_impl=impl)(torch.rand(0, 3, 16, 16)).shape == (0, 5)


# --- the methods' own arguments --------------------------------------------------------------------------

METHOD_CASES = [
    (lambda m: m.reset_classifier(-1), ValueError, "num_classes must be >= 0, got -1"),
    (lambda m: m.reset_classifier(True), TypeError, "num_classes must be an int, got True"),
    (lambda m: m.reset_classifier(2.0), TypeError, "num_classes must be an int, got 2.0"),
    (lambda m: m.reset_classifier(NAN), TypeError, "num_classes must be an int, got nan"),
    (lambda m: m.reset_classifier(3, class_names=["a", "b"]), ValueError, "class_names has 2 names for num_classes 3"),
    (lambda m: m.reset_classifier(3, class_names="abc"), TypeError, "class_names must be a list of str, got str"),
    (
        lambda m: m.reset_classifier(3, class_names=[1, 2, 3]),
        TypeError,
        "class_names must all be str, got 1 of type int",
    ),
    (lambda m: m.reset_classifier(0, class_names=["a"]), ValueError, "class_names has 1 names for num_classes 0"),
    (lambda m: m.reset_classifier(3, "max"), ValueError, "unknown global_pool 'max'; expected one of 'token', 'avg'"),
    (lambda m: m.reset_classifier(3, ["a", "b", "c"]), TypeError, "class names go by keyword: class_names=[...]"),
    (
        lambda m: m.forward_head([0.0]),
        ValueError,
        "forward_head expects the (b, n, 32) tokens of forward_features, got list",
    ),
    (lambda m: m.forward_head(torch.rand(2, 5, 16)), ValueError, "got shape (2, 5, 16)"),
    (lambda m: m.forward_head(torch.rand(2, 3, 16, 16)), ValueError, "got shape (2, 3, 16, 16)"),
    (
        lambda m: m.forward_intermediates(torch.rand(1, 3, 16, 16), 0),
        ValueError,
        "indices (the last n blocks) must be a positive int, got 0",
    ),
    (
        lambda m: m.forward_intermediates(torch.rand(1, 3, 16, 16), 3),
        ValueError,
        "indices 3 asks for the last 3 blocks of a ViT of depth 2",
    ),
    (
        lambda m: m.forward_intermediates(torch.rand(1, 3, 16, 16), [2]),
        ValueError,
        "block index 2 out of range for a ViT of depth 2 (valid: -2..1)",
    ),
    (lambda m: m.forward_intermediates(torch.rand(1, 3, 16, 16), []), ValueError, "indices is empty"),
    (lambda m: m.forward_intermediates(torch.rand(1, 3, 16, 16), "1"), TypeError, "must be an int, got '1'"),
    (
        lambda m: m.forward_intermediates(torch.rand(1, 3, 16, 16), [True]),
        TypeError,
        "block index must be an int, got True",
    ),
    (
        lambda m: m.forward_intermediates(torch.rand(1, 3, 16, 16), output_fmt="NHWC"),
        ValueError,
        "unknown output_fmt 'NHWC'; expected one of 'NCHW', 'NLC'",
    ),
]


@pytest.mark.parametrize("call, error, words", METHOD_CASES)
def test_bad_method_arguments(call, error, words):
    model = ViT(**TINY)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(error) as err:
        call(model)
    assert words in str(err.value)
    assert model.config == ViT(**TINY).config  # a refused call changes nothing
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
