"""Sizes that multiply: each refused before anything is allocated or built, in one line naming the estimate and
the limit, and well within a time bound (a model of depth 10^9 used to be built for minutes before any check).

Every case runs under a known limit (``max_memory`` or ``--max-memory``) so its message is exact on any machine;
the bound is generous (seconds) because the point is that nothing of the asked-for size is built.
"""

from __future__ import annotations

import json
import re
from contextlib import contextmanager

import pytest
import torch
from _hostile import bounded
from _tiny import TINY_RGB, tiny_vit
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image
from safetensors import safe_open
from safetensors.torch import save_file

from vit_einops import Preprocessing, ViT, ViTConfig, max_memory, parameter_count, save_vit
from vit_einops.commands import cli
from vit_einops.base.budget import ENV_VAR, available_memory, memory_limit, parse_bytes
from vit_einops.base.threads import check_threads
from vit_einops.base.json import MAX_DEPTH, loads, read_json
from vit_einops.bench.budget import check_grid_memory
from vit_einops.bench.runner import with_overrides
from vit_einops.interop import load_hf, resample_pos_embed, resample_vit, save_hf
from vit_einops.modelfile import load_vit
from vit_einops.sources import load_model
from vit_einops.summary import count_parameters

BOUND_S = 5  # generous: each refusal is arithmetic on the sizes; building what they ask for takes minutes
CLI_BOUND_S = 20  # a command in-process imports its tools (scikit-learn, matplotlib) first: seconds when busy
GIB = "over the max-memory limit of 1.0 GiB"


@pytest.fixture(autouse=True)
def _no_env_limit(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)


@contextmanager
def refused(match: str, *, error: type[Exception] = ValueError, limit: str | None = "1GiB"):
    """The block raises ``error`` matching ``match`` (an exact message when escaped), within BOUND_S, under
    ``limit``."""
    with bounded(BOUND_S), max_memory(limit), pytest.raises(error, match=match):
        yield


def allow(size: str) -> str:
    return re.escape(f"; pass --max-memory {size} to allow it (in Python: {ENV_VAR}={size}, or with "
                     f"vit_einops.max_memory('{size}'))")  # fmt: skip


def run_cli(capsys, *argv: str) -> tuple[int, str]:
    """The command line in-process: (exit status, stderr); stdout must stay empty (nothing was done)."""
    with bounded(CLI_BOUND_S):
        code = cli.main(list(argv))
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return code, captured.err


# --- the estimates themselves ---------------------------------------------------------------------------------


@given(
    dim_per_head=st.integers(1, 8),
    heads=st.integers(1, 4),
    depth=st.integers(1, 3),
    mlp_dim=st.integers(1, 40),
    grid=st.tuples(st.integers(1, 4), st.integers(1, 4)),
    patch=st.tuples(st.integers(1, 4), st.integers(1, 4)),
    in_channels=st.sampled_from([1, 3]),
    num_classes=st.integers(0, 7),
    representation_size=st.none() | st.integers(1, 9),
    fc_norm=st.booleans(),
    patchify=st.sampled_from(["conv", "linear"]),
)
def test_parameter_count_from_the_config_equals_the_built_models(
    dim_per_head, heads, depth, mlp_dim, grid, patch, in_channels, num_classes, representation_size, fc_norm,
    patchify,
):  # fmt: skip
    config = ViTConfig(
        image_size=(grid[0] * patch[0], grid[1] * patch[1]), patch_size=patch, in_channels=in_channels,
        num_classes=num_classes, dim=dim_per_head * heads, depth=depth, heads=heads, mlp_dim=mlp_dim,
        representation_size=representation_size, fc_norm=fc_norm, patchify=patchify,
    )  # fmt: skip
    with torch.device("meta"):
        model = ViT.from_config(config)
    assert parameter_count(config) == count_parameters(model)


def test_the_limit_is_the_innermost_setting(monkeypatch):
    assert memory_limit() == (available_memory(), "this machine has available")
    with open("/proc/meminfo") as f:  # MemAvailable moves with every other process; it never passes MemTotal
        total_kb = next(int(line.split()[1]) for line in f if line.startswith("MemTotal:"))
    assert 0 < available_memory() <= total_kb * 1024
    monkeypatch.setenv(ENV_VAR, "3GiB")
    assert memory_limit() == (3 * 2**30, f"the {ENV_VAR} limit")
    with max_memory("500MB"):
        assert memory_limit() == (500 * 10**6, "the max-memory limit")
        with max_memory(None):  # None keeps the outer setting
            assert memory_limit()[0] == 500 * 10**6
    assert memory_limit()[0] == 3 * 2**30


@pytest.mark.parametrize(
    "text, size", [("64GiB", 64 * 2**30), ("500MB", 5 * 10**8), ("1.5G", 15 * 10**8), ("1000", 1000), (4096, 4096)]
)
def test_sizes_are_read_in_both_units(text, size):
    assert parse_bytes(text) == size


@pytest.mark.parametrize("text", ["lots", "-1GiB", "0", "1 parsec", "nan", "1e9999", True, 2.5, 2**70])
def test_bad_sizes_are_refused(text):
    with pytest.raises(ValueError, match=r"^max_memory must be a (positive )?size"):
        with max_memory(text):
            pass


def test_a_bad_max_memory_flag_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["summary", "vit_ti_16", "--max-memory", "lots"])
    assert exit_info.value.code == 2
    accepted = "argument --max-memory: --max-memory must be a size from 1 byte to 2**63 - 1 bytes (8 EiB less one byte)"
    assert accepted in capsys.readouterr().err


# --- depth and width -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(depth=1000), "building this ViT (depth 1000, dim 768, 7,089,385,192 parameters) needs about 26.5 GiB, "
                           f"{GIB}; pass --max-memory 30GiB to allow it"),
        (dict(dim=2**14, heads=16, mlp_dim=2**16), "building this ViT (depth 12, dim 16384, 38,689,522,664 "
                                                   f"parameters) needs about 144.1 GiB, {GIB}"),
        (dict(depth=10**9, dim=8, heads=1, mlp_dim=8), "building this ViT (depth 1000000000, dim 8, "
                                                       "464,000,016,752 parameters) needs about 61.3 TiB"),
    ],
)  # fmt: skip
def test_a_config_past_the_budget_is_refused_before_any_module_is_built(overrides, message):
    with refused(re.escape(message)):
        ViT(**overrides)


def test_the_machine_default_limit_refuses_a_model_no_machine_holds():
    with refused(r"needs about 2\.6 TiB, over the [\d.]+ [GMT]iB this machine has available; pass --max-memory "
                 r"3TiB to allow it", limit=None):  # fmt: skip
        ViT(depth=100_000)


def test_raising_the_limit_allows_what_it_refused():
    with refused("building this ViT", limit="1MiB"):
        tiny_vit(TINY_RGB, depth=40)
    with max_memory("1GiB"):
        assert tiny_vit(TINY_RGB, depth=40).config.depth == 40


def test_the_env_var_is_a_limit_too(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "1MiB")
    with refused(f"over the {ENV_VAR} limit of 1.0 MiB; pass --max-memory 6MiB", limit=None):
        tiny_vit(TINY_RGB, depth=40)


def _retitled(path, tmp_path, **config_changes):
    """A copy of model file ``path`` whose stored config says ``config_changes`` (the tensors stay)."""
    with safe_open(path, framework="pt") as f:
        metadata, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    config = {**json.loads(metadata["vit_einops_config"]), **config_changes}
    out = tmp_path / "claims.safetensors"
    save_file(tensors, out, metadata={**metadata, "vit_einops_config": json.dumps(config)})
    return out


@pytest.mark.parametrize(
    "changes, count",
    [(dict(depth=10**9), "18,960,000,010,469"), (dict(depth=100_000), "1,896,010,469"),
     (dict(dim=2**16, heads=4, mlp_dim=4), "34,376,253,453")],
)  # fmt: skip
def test_a_small_model_file_claiming_a_huge_model_is_refused_at_once(tmp_path, changes, count):
    path = save_vit(tiny_vit(TINY_RGB), tmp_path / "m.safetensors")
    claims = _retitled(path, tmp_path, **changes)
    size = claims.stat().st_size
    assert size < 200_000  # the ~100 KB file the hostile run used
    with refused(re.escape(f"{claims}: its config describes {count} parameters"), limit=None):
        load_vit(claims)
    with refused(r"the file holds \d+\.\d KiB: the config does not match the weights", limit=None):
        load_model(claims)


def test_a_model_file_past_the_budget_is_refused_before_its_tensors_are_read(tmp_path):
    path = save_vit(tiny_vit(TINY_RGB), tmp_path / "m.safetensors")
    with refused(re.escape("loading this ViT (depth 2, dim 48, 48,389 parameters, 2 copies while loading) needs "
                           "about 506.0 KiB, over the max-memory limit of 100.0 KiB"), limit="100KiB"):  # fmt: skip
        load_vit(path)


def test_the_command_line_refuses_with_one_line_and_max_memory_allows(tmp_path, capsys):
    path = save_vit(tiny_vit(TINY_RGB), tmp_path / "m.safetensors")
    image = tmp_path / "img.png"
    Image.new("RGB", (32, 32)).save(image)
    code, err = run_cli(capsys, "predict", str(path), str(image), "--preprocessing", "plain", "--max-memory", "100KiB")
    assert code == 2
    assert err.count("\n") == 1
    assert err.startswith("vit-einops predict: error: loading this ViT (depth 2, dim 48, 48,389 parameters")
    assert "over the max-memory limit of 100.0 KiB; pass --max-memory 1MiB to allow it" in err
    assert cli.main(["predict", str(path), str(image), "--preprocessing", "plain", "--max-memory", "1MiB"]) == 0
    assert "img.png" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["vit_ti_16", "--image-size", "4000"], "a forward pass of 2 images at 62501 tokens needs about 176.0 GiB"),
        (["vit_b_16", "--image-size", "8000", "--table"], "building this ViT (depth 12, dim 768, 250,001 tokens from "
                                                          "image_size (8000, 8000) and patch_size (16, 16), "
                                                          "278,417,128 parameters) needs about 1.0 GiB"),
        (["vit_h_14", "--table"], "building this ViT (depth 32, dim 1280, 632,045,800 parameters) needs about 2.4 "
                                  "GiB"),
    ],
)  # fmt: skip
def test_summary_refuses_a_layer_table_past_the_budget(capsys, argv, message):
    code, err = run_cli(capsys, "summary", *argv, "--max-memory", "1GiB")
    assert (code, err.count("\n")) == (2, 1), err
    assert err.startswith(f"vit-einops summary: error: {message}, over the max-memory limit of 1.0 GiB")


# --- Hugging Face config.json: num_hidden_layers, hidden_size, image_size --------------------------------------


@pytest.mark.parametrize(
    "changes, words",
    [
        (dict(num_hidden_layers=10**8), "depth 100000000, dim 48"),
        (dict(hidden_size=2**20, num_attention_heads=4), "depth 2, dim 1048576"),
        (dict(image_size=2**16), "depth 2, dim 48, 67,108,865 tokens from image_size (65536, 65536) and patch_size "
                                 "(8, 8)"),
    ],
)
def test_a_huge_hf_config_is_refused_before_the_weights_are_read(tmp_path, changes, words):
    save_hf(tiny_vit(TINY_RGB), tmp_path / "hf")
    config = tmp_path / "hf" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), **changes}))
    with refused(re.escape(f"{tmp_path / 'hf' / 'model.safetensors'}: its config describes ") + r"[\d,]+ parameters "
                 + re.escape(f"({words})") + r", at least .* but the file holds", limit=None):  # fmt: skip
        load_hf(tmp_path / "hf")


# --- tokens: forward passes that record every layer's attention ------------------------------------------------


@pytest.mark.parametrize(
    "command, extra, images",
    [("inspect", [], 2), ("explore", ["--out", "e.html"], 2), ("inspect", ["--image", "IMG"] * 3, 3)],
)
def test_inspect_and_explore_refuse_a_forward_past_the_budget(tmp_path, capsys, command, extra, images):
    # 1025 tokens in a model of 90k parameters: loading it fits in 8 MiB, every layer's attention of an image not.
    path = save_vit(tiny_vit(TINY_RGB, image_size=64, patch_size=2), tmp_path / "m.safetensors")
    image = tmp_path / "img.png"
    Image.new("RGB", (64, 64)).save(image)
    extra = [str(image) if e == "IMG" else str(tmp_path / e) if e.endswith(".html") else e for e in extra]
    code, err = run_cli(capsys, command, str(path), *extra, "--preprocessing", "plain", "--max-memory", "8MiB")
    assert (code, err.count("\n")) == (2, 1), err
    # The whole run is refused at its peak, before any forward pass: every layer's attention, the arrays, the page.
    what = "inspect of" if command == "inspect" else "an explorer page of 1 model on"
    assert f"error: {what} {images} images at 1,025 tokens, with the " in err and "this process holds now, needs" in err
    assert "over the max-memory limit of 8.0 MiB" in err
    assert list(tmp_path.iterdir()) == [path, image] or sorted(tmp_path.iterdir()) == sorted([path, image])


def test_tokens_past_the_budget_are_refused_where_the_model_is_built():
    with refused(re.escape("building this ViT (depth 12, dim 768, 67,108,865 tokens from image_size (16384, 16384) and "
                           "patch_size (2, 2), 51,625,444,072 parameters) needs about 192.3 GiB")):  # fmt: skip
        ViT(image_size=2**14, patch_size=2)


# --- resized images: the pixel cap applies after resizing --------------------------------------------------------


@pytest.mark.parametrize(
    "preprocessing, size, message",
    [
        (Preprocessing.torchvision(), (1, 60000), "resizing a 1x60000 image's shorter side to 256 makes it 256x15360000"
                                                  " (3,932,160,000 pixels), over the limit of 134,217,728"),
        (Preprocessing.timm(), (60000, 1), "resizing a 60000x1 image's shorter side to 248 makes it 14880000x248 "
                                          "(3,690,240,000 pixels), over the limit of 134,217,728"),
        (Preprocessing(resize=1000, backend="torch"), (200, 1), "resizing a 200x1 image's shorter side to 1000 "
                                                               "makes it 200000x1000 (200,000,000 pixels)"),
    ],
)  # fmt: skip
def test_an_image_whose_resize_is_past_the_pixel_cap_is_refused(preprocessing, size, message):
    with refused(re.escape(message + ", over the limit of 134,217,728; crop it to a less extreme aspect ratio first")
                 if "limit" not in message else re.escape(message)):  # fmt: skip
        preprocessing(Image.new("RGB", size))


def test_the_316_byte_png_is_refused_on_the_command_line(tmp_path, capsys):
    """The hostile run's case: a 1x60000 PNG, a few hundred bytes, under torchvision's preprocessing."""
    png = tmp_path / "thin.png"
    Image.new("RGB", (1, 60000)).save(png, optimize=True)
    assert png.stat().st_size < 1000
    # A model at torchvision's 224 (in 7x7 patches of 32, to stay tiny): its preprocessing resizes to 256.
    path = save_vit(tiny_vit(TINY_RGB, image_size=224, patch_size=32), tmp_path / "m.safetensors")
    code, err = run_cli(capsys, "predict", str(path), str(png), "--preprocessing", "torchvision")
    assert code == 2
    assert "makes it 256x15360000 (3,932,160,000 pixels), over the limit of 134,217,728" in err


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(resize=(100000, 100000)), "resize 100000x100000 makes images of at least 10000000000 pixels"),
        (dict(resize=50000), "resize 50000x50000 makes images of at least 2500000000 pixels"),
        (dict(resize=224, crop=(1, 200_000_000)), "crop 1x200000000 makes images of at least 200000000 pixels"),
    ],
)
def test_a_preprocessing_that_makes_images_past_the_cap_is_refused_when_made(fields, message):
    with refused(re.escape(message + ", over the limit of 134,217,728")):
        Preprocessing(**fields)


# --- resampling --------------------------------------------------------------------------------------------------


def test_resampling_past_the_budget_is_refused_before_interpolating():
    with refused(re.escape("resampling the position embedding to a 10000x10000 grid (100,000,000 rows of 16) needs "
                           f"about 17.9 GiB, {GIB}") + allow("20GiB")):  # fmt: skip
        resample_pos_embed(torch.zeros(1, 17, 16), 10000)


def test_resample_vit_past_the_budget_is_refused():
    with refused(re.escape("resampling the position embedding to a 4096x4096 grid (16,777,216 rows of 48) needs "
                           f"about 9.0 GiB, {GIB}")):  # fmt: skip
        resample_vit(tiny_vit(TINY_RGB), 4096 * 8)


def test_convert_resample_to_past_the_budget_is_one_line(tmp_path, capsys):
    path = save_vit(tiny_vit(TINY_RGB), tmp_path / "m.safetensors")
    code, err = run_cli(capsys, "convert", str(path), str(tmp_path / "big.safetensors"), "--resample-to", "800000")
    assert code == 2 and err.count("\n") == 1
    assert "resampling the position embedding to a 100000x100000 grid (10,000,000,000 rows of 48) needs about" in err
    assert "this machine has available; pass --max-memory" in err
    assert not (tmp_path / "big.safetensors").exists()


# --- bench grids -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "grid, overrides, message",
    [
        ("default", dict(batches=(64,), tokens=(16384,)), "the attention grid point batch 64, heads 12, tokens 16384, "
                                                          "head dim 64 (forward_backward) needs about 3.0 TiB"),
        ("smoke", dict(heads=(1024,), head_dims=(4096,), tokens=(4096,)), "the attention grid point batch 2, heads "
                                                                         "1024, tokens 4096, head dim 4096"),
        ("smoke", dict(models=("vit_h_14",), image_size=4088, model_batch=64), "vit_h_14 at batch 64, image size "
                                                                               "4088 (a training step) needs about"),
    ],
)  # fmt: skip
def test_a_bench_grid_past_the_budget_is_refused(grid, overrides, message):
    with refused(re.escape(message)):
        check_grid_memory(with_overrides(grid, **overrides))


def test_bench_refuses_the_grid_on_the_command_line_before_measuring(tmp_path, capsys):
    code, err = run_cli(capsys, "bench", "--batches", "64", "--tokens", "16384", "--out", str(tmp_path / "b"))
    assert code == 2 and err.count("\n") == 1
    assert "the attention grid point batch 64, heads 12, tokens 16384, head dim 64 (forward_backward) needs about " \
           "3.0 TiB, over the" in err  # fmt: skip
    assert not (tmp_path / "b").exists()


def test_the_smoke_grid_fits(capsys):
    check_grid_memory(with_overrides("smoke"))  # no error: the budget refuses sizes, not the grids the package ships


# --- threads and shifts ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, 10**6, -3])
def test_threads_are_capped_at_the_cpu_count(value):
    import os

    with refused(re.escape(f"--threads {value} is out of range: expected 1 to {os.cpu_count()} (this machine's CPUs)"),
                 limit=None):  # fmt: skip
        check_threads("--threads", value)


@pytest.mark.parametrize("command", [["bench", "--smoke"], ["train", "--epochs", "1"]])
def test_commands_refuse_thousands_of_threads(tmp_path, capsys, command):
    import os

    argv = [*command, "--threads", "100000", *(["--out", str(tmp_path / "o")])]
    try:
        code, err = run_cli(capsys, *argv)
    except SystemExit as exit_info:  # bench checks it in argparse
        code, err = exit_info.code, capsys.readouterr().err
    assert code == 2
    assert f"threads 100000 is out of range: expected 1 to {os.cpu_count()}" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "shift, padded", [(10**6, "2000008x2000008"), (50_000, "100008x100008"), (8000, "16008x16008")]
)
def test_train_refuses_a_shift_past_the_budget(tmp_path, capsys, shift, padded):
    code, err = run_cli(capsys, "train", "--shift", str(shift), "--out", str(tmp_path / "run"), "--max-memory", "1GiB")
    assert code == 2 and err.count("\n") == 1
    assert f"--shift {shift} (batches of 64 padded to {padded}) needs about" in err
    assert not (tmp_path / "run").exists()


# --- JSON: one reader, its size and nesting capped ---------------------------------------------------------------


def deep(levels: int) -> str:
    return "[" * levels + "]" * levels


@pytest.mark.parametrize(
    "text, message",
    [
        (deep(100_000), f"x nests JSON 100000 levels deep, over the {MAX_DEPTH} this reader accepts"),
        ('{"a": ' * 40 + "1" + "}" * 40, f"x nests JSON 40 levels deep, over the {MAX_DEPTH} this reader accepts"),
        ("[" * 1000, f"x nests JSON 1000 levels deep, over the {MAX_DEPTH} this reader accepts"),
        (" " * (17 << 20), "x is 17,825,792 bytes of JSON, over the 16,777,216 this reader accepts"),
        (b"\xff[]", "x is not valid JSON (not UTF-8"),
    ],
)
def test_json_past_the_caps_is_refused_before_parsing(text, message):
    with refused(re.escape(message), limit=None):
        loads(text, "x")


def test_brackets_inside_strings_are_not_nesting():
    text = json.dumps({"names": ["[" * 500, "{" * 500, '\\"[[[' * 10]})
    assert loads(text, "x") == json.loads(text)


def test_our_own_files_nest_well_inside_the_cap(tmp_path):
    """A real checkpoint (optimizer state included) is the deepest JSON the package writes."""
    from vit_einops.base.json import nesting_depth
    from vit_einops.train.checkpoint import save_checkpoint

    model = tiny_vit()
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.zeros(1, 1, 8, 8)).sum().backward()
    optimizer.step()
    meta = save_checkpoint(tmp_path / "ckpt", model, optimizer=optimizer,
                           scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda e: 1.0))  # fmt: skip
    assert nesting_depth(meta.read_text()) <= MAX_DEPTH // 2


@pytest.mark.parametrize("where", ["vit_einops_config", "class_names", "source", "preprocessing"])
def test_deep_model_file_metadata_is_refused(tmp_path, where):
    path = save_vit(tiny_vit(TINY_RGB), tmp_path / "m.safetensors")
    with safe_open(path, framework="pt") as f:
        metadata, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    save_file(tensors, path, metadata={**metadata, where: deep(50_000)})
    message = f"{path}: metadata {where!r} nests JSON 50000 levels deep, over the 32"
    with refused("^" + re.escape(message), limit=None):  # named once, by the reader (no second path prefix)
        load_vit(path)


@pytest.mark.parametrize("name", ["config.json", "preprocessor_config.json"])
def test_deep_hf_json_is_refused(tmp_path, name):
    save_hf(tiny_vit(TINY_RGB), tmp_path / "hf")
    (tmp_path / "hf" / name).write_text('{"a": ' + deep(50_000) + "}")
    with refused(re.escape(f"{tmp_path / 'hf' / name} nests JSON 50001 levels deep, over the 32"), limit=None):
        load_hf(tmp_path / "hf")


def test_deep_checkpoint_json_is_refused(tmp_path):
    from vit_einops.train.checkpoint import CheckpointError, save_checkpoint

    meta = save_checkpoint(tmp_path / "ckpt", tiny_vit())
    meta.write_text(deep(50_000))
    with refused(re.escape(f"{meta} is corrupt or truncated: checkpoint.json nests JSON 50000 levels deep"),
                 error=CheckpointError, limit=None):  # fmt: skip
        load_model(tmp_path / "ckpt")


def test_read_json_names_a_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=re.escape(f"{tmp_path / 'no.json'}: no such JSON file")):
        read_json(tmp_path / "no.json")
