"""Budgets before work proportional to an untrusted count: sizes are arithmetic on the config (never one object per
register token), a model's construction has a time budget as well as a memory one, every forward entry point (the
commands' and the Python API's) checks its activations before running, and config values past float32 or int64 are
refused by name where they enter.

Each refusal is arithmetic, so its bound is one second (``bounded(1)``); the work refused would take minutes or tens
of GiB. Where an allocation is the harm, the process's peak memory is held to grow by less than 256 MiB.
"""

from __future__ import annotations

import json
import re
import resource
from contextlib import contextmanager

import pytest
import torch
from _hostile import assert_user_error, bounded, raw_model_file, run_cli
from _tiny import TINY_RGB16
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image

from vit_einops import ViT, ViTConfig, max_build_time, max_memory, predict, save_vit
from vit_einops.base.budget import ENV_VAR, TIME_ENV_VAR, parse_bytes, parse_seconds
from vit_einops.inspect import attention_relevance, record_attention, show_attention
from vit_einops.interop import load_hf, save_hf
from vit_einops.network.sizes import check_model_build_time, check_model_forward, module_count
from vit_einops.sources import load_model


@pytest.fixture(autouse=True)
def _no_env_limits(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.delenv(TIME_ENV_VAR, raising=False)


@contextmanager
def refused_at_once(match: str, *, error: type[Exception] = ValueError):
    """The block raises ``error`` matching ``match`` within a second, and the process's peak memory grows by less
    than 256 MiB meanwhile (nothing of the refused size was allocated)."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    with bounded(1), pytest.raises(error, match=match):
        yield
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 256 * 1024


def allow_time(limit: str) -> str:
    return re.escape(f"; pass --max-build-time {limit} to allow it (in Python: {TIME_ENV_VAR}={limit}, or with "
                     f"vit_einops.max_build_time('{limit}'))")  # fmt: skip


# --- counts are arithmetic ---------------------------------------------------------------------------------------


def test_a_billion_registers_are_counted_not_named():
    with bounded(1):
        config = ViTConfig(register_tokens=10**9)
        assert (config.num_prefix_tokens, config.num_tokens, config.num_pos_tokens) == (
            10**9 + 1, 10**9 + 197, 10**9 + 197
        )  # fmt: skip


@given(
    depth=st.integers(1, 3),
    layer_scale=st.none() | st.just(0.1),
    qk_norm=st.booleans(),
    pre_norm=st.booleans(),
    patch_bias=st.booleans(),
    register_tokens=st.integers(0, 2),
    head=st.sampled_from(["cls", "mean", "map", "distilled", "siglip", "pooler", "pooled features"]),
    patchify=st.sampled_from(["conv", "linear"]),
)
def test_module_count_from_the_config_equals_the_built_models(
    depth, layer_scale, qk_norm, pre_norm, patch_bias, register_tokens, head, patchify
):
    heads = {
        "cls": {}, "mean": dict(pool="mean", fc_norm=True), "map": dict(class_token=False, pool="map"),
        "distilled": dict(distill_token=True), "siglip": dict(class_token=False, pool="mean"),
        "pooler": dict(representation_size=6, num_classes=0), "pooled features": dict(num_classes=0),
    }  # fmt: skip
    config = ViTConfig(
        **{**TINY_RGB16, "depth": depth, **heads[head]}, layer_scale=layer_scale, qk_norm=qk_norm, pre_norm=pre_norm,
        patch_bias=patch_bias, register_tokens=register_tokens, patchify=patchify,
    )  # fmt: skip
    with torch.device("meta"):
        model = ViT.from_config(config)
    assert module_count(config) == len(list(model.modules()))


# --- construction: memory and time, checked before anything is built ------------------------------------------


def test_ten_million_registers_are_refused_before_building():
    with max_memory("1GiB"), refused_at_once(re.escape(
        "building this ViT (depth 12, dim 768, 10,000,197 tokens from image_size (224, 224), patch_size (16, 16) and "
        "register_tokens 10000000, 15,446,567,656 parameters) needs about 57.5 GiB, over the max-memory limit of "
        "1.0 GiB; pass --max-memory 64GiB to allow it"
    )):  # fmt: skip
        ViT(register_tokens=10**7)


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(num_classes=10**18), "building this ViT (depth 12, dim 768, num_classes 1000000000000000000, "
                                   "769,000,000,000,085,798,656 parameters) needs about 2.7e+03 EiB"),
        (dict(representation_size=2**62), "building this ViT (depth 12, dim 768, representation_size "
                                          "4611686018427387904, num_classes 1000, 8,158,072,566,598,135,001,832 "
                                          "parameters) needs about 2.8e+04 EiB"),
        (dict(dim=2**40, heads=1), "building this ViT (depth 12, dim 1099511627776, "
                                   "58,028,439,424,850,679,329,493,992 parameters) needs about 2.0e+08 EiB"),
    ],
)  # fmt: skip
def test_a_size_no_limit_allows_names_its_field_and_suggests_no_limit(fields, message):
    with max_memory("1GiB"), refused_at_once(re.escape(
        f"{message}, over the max-memory limit of 1.0 GiB; no limit allows it (--max-memory takes at most 2**63 - 1 "
        "bytes)"
    )):  # fmt: skip
        ViT(**fields)


def test_depth_50000_is_refused_by_the_time_budget_before_building():
    # 2 MiB of weights and 3 GiB of modules: within this machine's memory, but 60 s of Python at MODULE_SECONDS.
    with max_memory("1TiB"), refused_at_once(re.escape(
        "building this ViT (depth 50000, dim 8: 1,000,012 modules) takes about 60 s, over the default build-time limit "
        "of 10 s") + allow_time("67s")):  # fmt: skip
        ViT(depth=50000, dim=8, heads=1, mlp_dim=8)


def test_the_time_limit_is_set_like_the_memory_limit(monkeypatch):
    config = ViTConfig(depth=5000, dim=8, heads=1, mlp_dim=8)  # 6.0 s of modules: within the default 10 s
    check_model_build_time(config)
    with max_build_time("2s"), refused_at_once(re.escape(
        "(depth 5000, dim 8: 100,012 modules) takes about 6.0 s, over the max-build-time limit of 2.0 s"
    ) + allow_time("7s")):  # fmt: skip
        check_model_build_time(config)
    monkeypatch.setenv(TIME_ENV_VAR, "1s")
    with refused_at_once(re.escape(f"over the {TIME_ENV_VAR} limit of 1.0 s") + allow_time("7s")):
        check_model_build_time(config)
    with max_build_time("8s"):  # the innermost setting wins
        check_model_build_time(config)


def test_a_build_time_no_limit_allows_suggests_no_limit():
    config = ViTConfig(depth=10**12, dim=8, heads=1, mlp_dim=8)
    with max_build_time("1h"), refused_at_once(re.escape(
        "building this ViT (depth 10000000, dim 8: 200,000,012 modules) takes about 200 min, over the max-build-time "
        "limit of 60 min") + allow_time("221min")):  # fmt: skip
        check_model_build_time(ViTConfig(depth=10**7, dim=8, heads=1, mlp_dim=8))
    with refused_at_once(re.escape("takes about 333333.3 h, over the default build-time limit of 10 s; no limit allows "
                                   "it (--max-build-time takes at most 1 year)")):  # fmt: skip
        check_model_build_time(config)


def test_train_refuses_a_deep_model_in_one_line_before_reading_data(tmp_path):
    with bounded(20):  # the command imports its tools first
        result = run_cli("train", "--depth", "50000", "--out", tmp_path / "run")
    assert_user_error(result, re.escape("building this ViT (depth 50000, dim 64: 1,000,012 modules) takes about 60 s, "
                                        "over the default build-time limit of 10 s") + allow_time("67s"))  # fmt: skip
    assert not (tmp_path / "run").exists()
    with bounded(20):
        result = run_cli("train", "--depth", "50000", "--out", tmp_path / "run", "--max-build-time", "1min")
    assert_user_error(result, re.escape("takes about 60 s, over the max-build-time limit of 60 s") + allow_time("67s"))


def test_every_real_model_builds_its_modules_well_within_the_default():
    from vit_einops.presets import PRESETS, TIMM_ARCHS, preset_config

    configs = [ViTConfig(**preset_config(name)) for name in [*PRESETS, *TIMM_ARCHS]]
    configs.append(ViTConfig(**preset_config("vit_h_14", image_size=518)))
    for config in configs:
        check_model_build_time(config)
    assert max(module_count(c) for c in configs) == 652  # ViT-H/14's 32 blocks: 0.04 s at MODULE_SECONDS


# --- forward passes: one budget before every entry point runs ---------------------------------------------------


@pytest.fixture(scope="module")
def many_registers():
    """60,000 registers of width 8 (2 MiB of weights): one image's attention matrix alone is 13.4 GiB."""
    torch.manual_seed(0)
    return ViT(image_size=16, patch_size=8, dim=8, heads=1, mlp_dim=8, depth=1, num_classes=3,
               register_tokens=60_000).eval()  # fmt: skip


FORWARD = re.escape("a forward pass of 1 image at 60005 tokens")
OVER = re.escape(", over the max-memory limit of 1.0 GiB; pass --max-memory")


@pytest.mark.parametrize(
    "entry, message",
    [
        (lambda m, x: predict(m, x, preprocessed=True), FORWARD + " needs about 26.8 GiB" + OVER),
        (lambda m, x: check_model_forward(m, x), FORWARD + " with gradients needs about 26.8 GiB" + OVER),
        (lambda m, x: record_attention(m, x, preprocessed=True),
         FORWARD + " keeping every layer's attention needs about 40.3 GiB" + OVER),
        (lambda m, x: show_attention(m, x, preprocessed=True),
         FORWARD + " keeping every layer's attention needs about 40.3 GiB" + OVER),
        (lambda m, x: attention_relevance(m, x, preprocessed=True),
         FORWARD + " keeping every layer's attention with gradients needs about 53.7 GiB" + OVER),
    ],
)  # fmt: skip
def test_every_python_entry_point_budgets_its_forward(many_registers, entry, message):
    with max_memory("1GiB"), refused_at_once(message):
        entry(many_registers, torch.zeros(1, 3, 16, 16))


def test_the_forward_pass_itself_checks_no_budget():
    """model(x) computes the model and nothing else: the budget is the entry points' (above), so a forward whose
    estimate is past the limit still runs when called directly (this one needs well under the estimate's 1 MiB)."""
    model = ViT(image_size=16, patch_size=8, dim=8, heads=1, mlp_dim=8, depth=1, num_classes=3)
    x = torch.zeros(1, 3, 16, 16)
    with max_memory("1B"):
        with refused_at_once(re.escape("a forward pass of 1 image at 5 tokens with gradients needs about")):
            check_model_forward(model, x)
        assert model(x).shape == model.forward_features(x).shape[:1] + (3,)


@pytest.mark.parametrize(
    "command, extra, words",
    [
        ("predict", [], FORWARD + re.escape(" needs about")),
        # inspect refuses its whole run (every layer's attention kept, the arrays, the figures) at its peak.
        ("inspect", ["--out", "report"], r"inspect of 1 image at 60,005 tokens, with the [\d.]+ [MG]iB this process holds "
         r"now, needs about"),
    ],
)  # fmt: skip
def test_predict_and_inspect_refuse_the_same_forward_alike(tmp_path, many_registers, command, extra, words):
    path = save_vit(many_registers, tmp_path / "m.safetensors")
    Image.new("RGB", (16, 16)).save(tmp_path / "img.png")
    if command == "inspect":
        extra = ["--image", str(tmp_path / "img.png"), "--out", str(tmp_path / "report")]
    else:
        extra = [str(tmp_path / "img.png")]
    with bounded(20):
        result = run_cli(command, path, *extra, "--preprocessing", "plain", "--max-memory", "1GiB")
    assert_user_error(result, words + r" [\d.]+ GiB" + OVER)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["img.png", "m.safetensors"]


def test_the_budget_counts_the_attention_path_each_layer_runs():
    # 4097 tokens, one head: the einsum path holds two (n, n) matrices, 128 MiB; the chunked path one block of them
    # at a time, at most 2**22 scores (chunk_plan.chunk_elements() on any machine), 32 MiB for two.
    model = ViT(image_size=128, patch_size=2, dim=8, heads=1, mlp_dim=8, depth=1, num_classes=5)
    x = torch.zeros(1, 3, 128, 128)
    with torch.no_grad(), max_memory("64MiB"):
        with refused_at_once(re.escape("a forward pass of 1 image at 4097 tokens needs about 129.2 MiB")):
            check_model_forward(model, x)
        check_model_forward(model.set_attn_impl("chunked"), x)


def test_train_budgets_its_first_step_before_reading_data(tmp_path):
    with bounded(20):
        result = run_cli("train", "--batch-size", "100000", "--image-size", "64", "--patch-size", "2",
                         "--out", tmp_path / "run", "--max-memory", "8GiB")  # fmt: skip
    assert_user_error(result, re.escape("a forward pass of 100000 images at 1025 tokens with gradients needs about "
                                        "13.3 TiB, over the max-memory limit of 8.0 GiB"))  # fmt: skip
    assert not (tmp_path / "run").exists()


# --- a 1 KB config.json --------------------------------------------------------------------------------------


@pytest.fixture
def dinov2_registers(tmp_path):
    """A Hugging Face Dinov2WithRegistersModel directory of a tiny model; its config.json is about 500 bytes."""
    model = ViT(image_size=28, patch_size=14, dim=32, depth=2, heads=2, mlp_dim=128, num_classes=0, layer_scale=1.0,
                register_tokens=4, pos_embed_prefix=False)  # fmt: skip
    return save_hf(model, tmp_path / "hf")


def _with(directory, **changes):
    path = directory / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
    assert path.stat().st_size < 1024
    return directory


def test_a_billion_registers_in_config_json_are_refused_at_once(dinov2_registers):
    hf = _with(dinov2_registers, num_register_tokens=10**9)
    message = re.escape(
        "its config describes 32,000,044,608 parameters (depth 2, dim 32, 1,000,000,005 tokens from image_size "
        "(28, 28), patch_size (14, 14) and register_tokens 1000000000), at least 14.9 GiB of weights, but the file "
        "holds "
    ) + r"[\d.]+ KiB" + re.escape(": the config does not match the weights (config.json's image_size, "
                                 "patch_size, hidden_size, num_hidden_layers, num_register_tokens)")  # fmt: skip
    for load in (load_hf, load_model):
        with refused_at_once(message):
            load(hf)
    with bounded(20):
        result = run_cli("inspect", hf, "--out", hf.parent / "report")
    assert_user_error(result, message)


@pytest.mark.parametrize("config", [dict(register_tokens=10**9), dict(depth=10**9)])
def test_a_model_file_claiming_a_billion_of_anything_is_refused_at_once(tmp_path, config):
    # attn_impl: files written while it was a config field hold one impl, once, not one per claimed layer
    path = raw_model_file(tmp_path / "m.safetensors", config=config)
    field = next(iter(config))
    with refused_at_once(rf"{re.escape(str(path))}: its config describes [\d,]+ parameters \(.*{field} 1000000000\b"):
        load_model(path)


@pytest.mark.parametrize(
    "changes, error, message",
    [
        (dict(mlp_ratio=1e308), ValueError, "config.json mlp_ratio 1e+308 times hidden_size 32 is too large an MLP: "
                                            "torch's sizes are int64, at most 2**63 - 1"),
        (dict(mlp_ratio=float("inf")), ValueError, "config.json mlp_ratio must be a positive finite number, got inf"),
        (dict(mlp_ratio=float("nan")), ValueError, "config.json mlp_ratio must be a positive finite number, got nan"),
        (dict(layerscale_value=1e39), ValueError, "layer_scale 1e+39 is outside float32's range, the weights' dtype: "
                                                  "expected a positive float from 1.401e-45 to 3.403e+38 "
                                                  "(config.json's layerscale_value)"),
        (dict(layer_norm_eps=1e-50), ValueError, "layer_norm_eps 1e-50 is outside float32's range"),
        (dict(num_hidden_layers=10**30), ValueError, "depth must be at most 2**63 - 1 (torch's integers are "
                                                     "int64), got 1000000000000000000000000000000 (config.json's "
                                                     "num_hidden_layers)"),
        (dict(hidden_size=2**63, mlp_ratio=4.0), ValueError, "config.json mlp_ratio 4.0 times hidden_size "
                                                             "9223372036854775808 is too large an MLP"),
        (dict(head_dim="x", num_attention_heads=10**12), TypeError, "config.json head_dim must be int, got 'x' (str)"),
    ],
)  # fmt: skip
def test_config_json_values_that_overflow_are_refused_by_name(dinov2_registers, changes, error, message):
    with refused_at_once(re.escape(message), error=error):
        load_hf(_with(dinov2_registers, **changes))


# --- config values past float32 and int64 ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "fields, error, message",
    [
        (dict(layer_scale=1e39), ValueError, "layer_scale 1e+39 is outside float32's range, the weights' dtype: "
                                             "expected a positive float from 1.401e-45 to 3.403e+38"),
        (dict(layer_scale=1e-46), ValueError, "layer_scale 1e-46 is outside float32's range"),
        (dict(layer_scale=float("inf")), ValueError, "layer_scale must be a positive finite float, got inf"),
        (dict(layer_norm_eps=float("nan")), ValueError, "layer_norm_eps must be a positive finite float, got nan"),
        (dict(layer_norm_eps=1e300), ValueError, "layer_norm_eps 1e+300 is outside float32's range"),
        (dict(depth=2**63), ValueError, "depth must be at most 2**63 - 1 (torch's integers are int64), got "
                                        "9223372036854775808"),
        (dict(num_classes=10**5000), ValueError, "num_classes must be at most 2**63 - 1 (torch's integers are int64), "
                                                 "got an int of 16,610 bits"),
        (dict(image_size=(2**62, 2**62), patch_size=1), ValueError, "the tokens must be at most 2**63 - 1 (torch's "
                                                                    "sizes are int64), got "
                                                                    "21267647932558653966460912964485513217 from "
                                                                    "image_size (4611686018427387904, "
                                                                    "4611686018427387904)"),
        (dict(register_tokens=2**63), ValueError, "register_tokens must be at most 2**63 - 1"),
        (dict(representation_size=2**64), ValueError, "representation_size must be at most 2**63 - 1"),
    ],
)  # fmt: skip
def test_config_values_past_their_dtype_are_refused_by_name(fields, error, message):
    for build in (ViTConfig, ViT):
        with refused_at_once(re.escape(message), error=error):
            build(**fields)


# --- the limits' own text ------------------------------------------------------------------------------------------

ACCEPTED = ("a size from 1 byte to 2**63 - 1 bytes (8 EiB less one byte) such as 64GiB, 500MB, 1.5G or 1000000 "
            "(bytes; k/M/G/T are powers of 1000, KiB/MiB/GiB/TiB powers of 1024)")  # fmt: skip


@pytest.mark.parametrize("text", ["0.5", "0", "-1", "nan", "inf", "1e9", "1.5 parsecs", "", "9" * 5000])
def test_a_max_memory_that_is_no_size_is_named_as_given(text):
    result = run_cli("summary", "vit_ti_16", f"--max-memory={text}")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines()[-1] == (
        f"vit-einops summary: error: argument --max-memory: --max-memory must be {ACCEPTED}, got {text!r}"
    )


@pytest.mark.parametrize("text, size", [("1.5GiB", 3 * 2**29), ("1", 1), ("1.9", 1), (" 2 kib ", 2048)])
def test_sizes_round_down_to_whole_bytes(text, size):
    assert parse_bytes(text) == size


@pytest.mark.parametrize(
    "text, size", [("9223372036854775807", 2**63 - 1), (2**63 - 1, 2**63 - 1), ("8388607.99999TiB", 2**63 - 10995117)]
)
def test_the_largest_max_memory_is_read_exactly_and_taken(text, size):
    """The reported 9223372036854775807 was refused although the message promised 8 EiB: it was read as a float,
    which rounds it up to 2**63."""
    assert parse_bytes(text) == size
    result = run_cli("summary", "vit_ti_16", f"--max-memory={text}")
    assert result.returncode == 0 and result.stderr == "", result.stderr


@pytest.mark.parametrize("text", ["9223372036854775808", 2**63, "8388608TiB", "8388607.9999999999999999999TiB"])
def test_one_byte_past_the_largest_max_memory_is_refused_naming_the_limit(text):
    with pytest.raises(ValueError) as caught:
        parse_bytes(text)
    assert str(caught.value) == f"max_memory must be {ACCEPTED}, got {text!r}"
    assert "2**63 - 1 bytes" in ACCEPTED
    result = run_cli("summary", "vit_ti_16", f"--max-memory={text}")
    assert result.returncode == 2 and result.stderr.splitlines()[-1] == (
        f"vit-einops summary: error: argument --max-memory: --max-memory must be {ACCEPTED}, got {str(text)!r}"
    )


@pytest.mark.parametrize("text", ["0", "0.0001", "-1s", "nan", "2 years", "400000h", "1e3"])
def test_a_build_time_that_is_no_time_is_named_as_given(text):
    result = run_cli("summary", "vit_ti_16", f"--max-build-time={text}")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines()[-1] == (
        "vit-einops summary: error: argument --max-build-time: --max-build-time must be a time from 1 ms to 1 year "
        f"such as 30, 30s, 2min or 1.5h (seconds unless a unit is given), got {text!r}"
    )


@pytest.mark.parametrize(
    "text, seconds", [("30", 30), ("0.5s", 0.5), ("2min", 120), ("1.5h", 5400), (7, 7), (60.0, 60)]
)
def test_times_are_read_in_seconds_minutes_and_hours(text, seconds):
    assert parse_seconds(text) == seconds
