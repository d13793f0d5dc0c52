"""No traceback for any input: each kind of exception a hostile input used to raise through the command line, with
three or more inputs each, now gives one line (exit status 2) naming the problem (float8 weights, which torch cannot
check, are read exactly instead), and never reaches the internal-error path. A bug of ours (any other exception) is "internal error: ..." (exit status 1), and --debug or
VIT_EINOPS_TRACEBACK=1 shows its traceback."""

from __future__ import annotations

import json
import re

import pytest
import torch
from _hostile import assert_user_error, grey_png, raw_model_file, run_cli, tiny_model

from vit_einops.commands import cli
from vit_einops.interop import save_hf
from vit_einops.modelfile import save_vit

DEEP = "[" * 100_000 + "]" * 100_000  # past Python's recursion limit for json.loads


@pytest.fixture
def image(tmp_path):
    return grey_png(tmp_path / "digit.png")


def hf_directory(tmp_path, **config_changes):
    """The tiny model saved as a Hugging Face directory, its config.json then changed (a raw JSON text replaces
    the whole value)."""
    directory = tmp_path / "hf"
    save_hf(tiny_model(class_names=[f"digit {i}" for i in range(10)]), directory)
    text = (directory / "config.json").read_text()
    config = json.loads(text)
    for key, value in config_changes.items():
        config[key] = "@@" if isinstance(value, str) and value is DEEP else value
    (directory / "config.json").write_text(json.dumps(config).replace('"@@"', DEEP))
    return directory


# --- RecursionError: JSON nested past the recursion limit ------------------------------------------------------
@pytest.mark.parametrize("key", ["class_names", "vit_einops_config", "preprocessing", "source"])
def test_deeply_nested_json_in_model_file_metadata_is_one_line(tmp_path, image, key):
    model = raw_model_file(tmp_path / "m.safetensors", metadata={key: DEEP})
    assert_user_error(run_cli("predict", model, image), rf"metadata '{key}' nests JSON 100000 levels deep, over the 32")


def test_deeply_nested_json_in_hf_config_is_one_line(tmp_path, image):
    directory = hf_directory(tmp_path, id2label=DEEP)
    assert_user_error(
        run_cli("predict", "--from", "hf", directory, image), r"config.json nests JSON \d+ levels deep, over the 32"
    )


# --- AttributeError: id2label of the wrong type -------------------------------------------------------------------
@pytest.mark.parametrize(
    "labels, kind", [(["a"] * 10, "list"), ("digits", "str"), (10, "int"), ([[0, "a"]], "list")], ids=str
)
def test_id2label_that_is_no_object_is_one_line(tmp_path, image, labels, kind):
    directory = hf_directory(tmp_path, id2label=labels)
    assert_user_error(
        run_cli("predict", "--from", "hf", directory, image),
        rf"config.json id2label must be a JSON object of index to name, got a {kind}$",
    )


# --- A config no tensor can hold (torch's "Storage size calculation overflowed" if it were built): refused from the
# sizes alone, before anything is built, since the file cannot hold what its config claims ------------------------
@pytest.mark.parametrize(
    "config, sizes",
    [
        (dict(dim=2**40, heads=1, mlp_dim=2**40), "dim 1099511627776, mlp_dim 1099511627776"),
        (dict(dim=2**62, heads=1), "dim 4611686018427387904, mlp_dim 32"),
        (dict(mlp_dim=2**61), "dim 16, mlp_dim 2305843009213693952"),
    ],
)
def test_config_too_large_for_any_tensor_is_one_line(tmp_path, image, config, sizes):
    model = raw_model_file(tmp_path / "m.safetensors", config=config)
    assert_user_error(
        run_cli("predict", model, image),
        rf"m.safetensors: its config describes [\d,]+ parameters \(depth 2, {sizes.split(',')[0]}\), at least .* of "
        r"weights, but the file holds .*KiB",
    )


# --- NotImplementedError: float8 weights (torch has no isfinite, layer norm or softmax for them) ---------------------
FLOAT8 = [torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz]


@pytest.mark.parametrize("dtype", FLOAT8)
def test_float8_weights_are_cast_exactly_or_refused_naming_the_dtype(tmp_path, image, dtype):
    """float8 is a storage format: its weights load cast to float32 (exactly: every float8 value is a float32), and
    keeping the file's dtype (dtype=None), which no model runs in, is refused naming it."""
    from safetensors.torch import load_file

    from vit_einops.modelfile import load_vit

    path = raw_model_file(tmp_path / "m.safetensors", dtype=dtype)
    stored = load_file(path)
    model = load_vit(path)
    for key, value in model.state_dict().items():
        assert value.dtype == torch.float32 and torch.equal(value, stored[key].float()), key
    result = run_cli("predict", path, image, "--top-k", "1")
    # stderr: the thread count only (conftest fixes it); stdout: the predictions
    assert result.returncode == 0 and result.stderr == "threads: 1 (VIT_EINOPS_THREADS)\n", result.stderr
    assert re.fullmatch(r".*digit\.png\n +\d+\.\d\d%  class \d\n", result.stdout)
    with pytest.raises(ValueError, match=rf"m.safetensors: \d+ tensors are {dtype} \(e.g. '[\w.]+'\), which no model "):
        load_vit(path, dtype=None)


# --- OverflowError: sizes past a C long reached PIL ------------------------------------------------------------------
@pytest.mark.parametrize(
    "flags, message",
    [
        (["--resize", str(10**9)], r"resize 1000000000x1000000000 makes images of at least 1.00e\+18 pixels"),
        (["--resize", f"{2**40}x8"], r"resize 1.10e\+12x8 makes images of at least 8.80e\+12 pixels"),
        (["--crop", str(10**9), "--resize", "8"], r"crop 1000000000x1000000000 makes images of at least 1.00e\+18"),
    ],
)
def test_sizes_past_the_pixel_cap_are_refused_before_resizing(tmp_path, image, flags, message):
    model = tiny_model()
    save_vit(model, tmp_path / "m.safetensors")
    assert_user_error(
        run_cli("predict", tmp_path / "m.safetensors", image, *flags), message + r".*, over the limit of 134,217,728$"
    )


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--resize", str(10**20)], "resize must be at most 2**63 - 1 (torch's integers are int64), got "
                                    "100000000000000000000"),
        (["--crop-pct", "1e-300"], "resize must be at most 2**63 - 1 (torch's integers are int64), got an int of 1,000 "
                                   "bits"),
        (["--crop", str(10**20), "--resize", "8"], "crop[0] must be at most 2**63 - 1 (torch's integers are int64), "
                                                   "got 100000000000000000000"),
    ],
)  # fmt: skip
def test_sizes_past_int64_are_refused_by_name_before_resizing(tmp_path, image, flags, message):
    model = tiny_model()
    save_vit(model, tmp_path / "m.safetensors")
    assert_user_error(run_cli("predict", tmp_path / "m.safetensors", image, *flags), re.escape(message) + "$")


# --- MemoryError and torch's allocation failures: the input asks for more than the machine has ------------------------
@pytest.fixture
def raising_command(tmp_path, monkeypatch):
    """A command `raise` whose run raises the exception its argument names (the source of one, in Python)."""
    (tmp_path / "fake_raising_cmd.py").write_text(
        "import sys, torch\n"
        "def add_arguments(p):\n    p.add_argument('error')\n"
        "def run(args):\n    raise eval(args.error)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(cli, "COMMANDS", {"raise": ("fake_raising_cmd", None, "")})


@pytest.mark.parametrize(
    "error, message",
    [
        ("MemoryError()", r"not enough memory for this input \(MemoryError: no details\)$"),
        ("MemoryError('huge list')", r"not enough memory for this input \(MemoryError: huge list\)$"),
        (
            "RuntimeError('[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can\\'t allocate memory')",
            r"not enough memory for this input \(RuntimeError: .*DefaultCPUAllocator: can't allocate memory\)$",
        ),
        (
            "torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 20.00 GiB')",
            r"not enough memory for this input \(OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB\)$",
        ),
    ],
)
def test_exhausted_memory_is_one_line(raising_command, error, message):
    assert_user_error(run_cli("raise", error), message)


# --- anything else is a bug of ours: one line too, that says so and how to see more ---------------------------------
@pytest.mark.parametrize(
    "error, shown",
    [
        ("KeyError('blocks')", "KeyError: 'blocks'"),
        ("RuntimeError('mat1 and mat2 shapes cannot be multiplied')", "RuntimeError: mat1 and mat2 shapes"),
        ("ZeroDivisionError('division by zero')", "ZeroDivisionError: division by zero"),
        ("AttributeError('x\\x1b[2J')", "AttributeError: x\\\\x1b\\[2J"),
    ],
)
def test_a_bug_is_an_internal_error_line_and_debug_shows_the_traceback(raising_command, monkeypatch, error, shown):
    result = run_cli("raise", error)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith(f"vit-einops raise: internal error: {shown.replace(chr(92) * 2, chr(92))}"[:40])
    assert result.stderr.endswith(" (run with --debug for the traceback)\n")
    exception = type(eval(error))
    for argv in (["--debug", "raise", error], ["raise", error, "--debug"]):
        with pytest.raises(exception):
            cli.main(argv)
    monkeypatch.setenv("VIT_EINOPS_TRACEBACK", "1")
    with pytest.raises(exception):
        cli.main(["raise", error])


def test_user_errors_raise_under_debug_too(raising_command):
    assert_user_error(run_cli("raise", "ValueError('epochs must be a positive int, got 0')"), "got 0$")
    with pytest.raises(ValueError, match="epochs must be a positive int, got 0"):
        cli.main(["--debug", "raise", "ValueError('epochs must be a positive int, got 0')"])
