"""Strings from files are data: class names, file names and labels reach the terminal with control characters
escaped, reach matplotlib as literal text (never mathtext), and HF id2label values must be strings."""

from __future__ import annotations

import io
import json
import re

import pytest
import torch
from _hostile import assert_user_error, grey_png, run_cli, tiny_model
from hypothesis import given
from hypothesis import strategies as st

from vit_einops.base.text import printable
from vit_einops.inspect import plot_attention_overlays, show_attention
from vit_einops.interop import load_hf, save_hf
from vit_einops.interop.hf import hf_config
from vit_einops.modelfile import save_vit

UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


# --- the terminal ----------------------------------------------------------------------------------------------------
@given(st.text())
def test_printable_leaves_no_control_character_and_keeps_the_rest(text):
    shown = printable(text)
    assert not UNSAFE.search(shown)
    safe = UNSAFE.sub("", text)
    assert UNSAFE.sub("", text) == text or shown != text
    if safe == text:
        assert shown == text  # letters of any script, quotes and backslashes are kept as they are


@pytest.mark.parametrize(
    "text, shown",
    [
        ("cat\n  99.00%  dog", "cat\\n  99.00%  dog"),
        ("\x1b[2J", "\\x1b[2J"),
        ("ok\rfake", "ok\\rfake"),
        ("\u202egpj.exe", "\\u202egpj.exe"),
        ("\u2066x\u2069", "\\u2066x\\u2069"),
        ("a\x00b\x7fc\x85d\x9b", "a\\x00b\\x7fc\\x85d\\x9b"),
        ("Ägypten 猫 \\x1b", "Ägypten 猫 \\x1b"),
    ],
)
def test_printable_escapes_each_kind(text, shown):
    assert printable(text) == shown


@pytest.mark.parametrize(
    "name, shown",
    [
        ("cat\n  99.00%  dog", "cat\\n  99.00%  dog"),
        ("\x1b[2J\x1b[31mwolf", "\\x1b[2J\\x1b[31mwolf"),
        ("\rtiger", "\\rtiger"),
        ("\u202etac", "\\u202etac"),
    ],
)
def test_predict_prints_hostile_class_names_escaped_one_line_each(tmp_path, name, shown):
    names = [name] + [f"digit {i}" for i in range(1, 10)]
    model = tiny_model(class_names=names)
    save_vit(model, tmp_path / "m.safetensors")
    image = grey_png(tmp_path / "x.png")
    result = run_cli("predict", tmp_path / "m.safetensors", image, "--top-k", "10")
    assert result.returncode == 0 and result.stderr == "threads: 1 (VIT_EINOPS_THREADS)\n"  # conftest fixes it
    lines = result.stdout.splitlines()
    assert len(lines) == 11  # the image, then one line per class: no name adds a line of its own
    assert lines[0] == str(image)
    rows = [re.fullmatch(r"  +(\d+\.\d\d)%  (.*)  \((\d)\)", line) for line in lines[1:]]
    assert all(rows), lines
    assert sorted(int(r[3]) for r in rows) == list(range(10))
    assert {r[2] for r in rows} == {shown, *names[1:]}
    assert not UNSAFE.search(result.stdout.replace("\n", ""))


def test_predict_escapes_hostile_file_names_in_its_output_and_errors(tmp_path):
    model = tiny_model()
    save_vit(model, tmp_path / "m.safetensors")
    image = grey_png(tmp_path / "\x1b[31mred\r.png")
    result = run_cli("predict", tmp_path / "m.safetensors", image)
    assert result.returncode == 0
    assert result.stdout.splitlines()[0] == str(tmp_path / "\\x1b[31mred\\r.png")
    assert "\x1b" not in result.stdout and "\r" not in result.stdout
    result = run_cli("predict", tmp_path / "\x1b]0;title\x07.safetensors", image)
    assert_user_error(result, r"\\x1b\]0;title\\x07\.safetensors")
    assert "\x1b" not in result.stderr and "\x07" not in result.stderr


def test_summary_escapes_class_names(tmp_path):
    save_vit(tiny_model(class_names=["\x1b[2J"] + [f"d{i}\n" for i in range(1, 10)]), tmp_path / "m.safetensors")
    result = run_cli("summary", "--model", tmp_path / "m.safetensors", "--no-table")
    assert result.returncode == 0, result.stderr
    assert "  class names   \\x1b[2J, d1\\n, d2\\n, d3\\n, d4\\n ... (10)\n" in result.stdout
    assert "\x1b" not in result.stdout


# --- matplotlib ------------------------------------------------------------------------------------------------------
HOSTILE_TITLES = ["$\\frac{", "$x^{2$", "$\\sqrt{$ and $}$", "$\\frac{1}{2}$"]


def _texts(fig):
    from matplotlib.text import Text

    return [t for t in fig.findobj(Text) if t.get_text()]


@pytest.mark.parametrize("title", HOSTILE_TITLES)
def test_attention_figure_draws_titles_as_literal_text(title):
    images = torch.rand(1, 1, 8, 8)
    fig = plot_attention_overlays(images, torch.rand(1, 2, 4, 4), torch.rand(1, 4, 4), [title], layer=0)
    fig.savefig(io.BytesIO(), format="png")  # a ParseException would come from drawing
    (shown,) = [t for t in _texts(fig) if t.get_text() == title]
    assert shown.get_parse_math() is False


@pytest.mark.parametrize("name", HOSTILE_TITLES[:3])
def test_show_attention_draws_a_hostile_class_name_literally(name):
    model = tiny_model(class_names=[name] * 10)
    fig = show_attention(model, torch.rand(1, 8, 8))
    fig.savefig(io.BytesIO(), format="png")
    (title,) = [t for t in _texts(fig) if name in t.get_text()]
    assert title.get_parse_math() is False and f"predicted {name} (p " in title.get_text()


def test_inspect_with_mathtext_in_class_and_file_names_writes_its_figures(tmp_path):
    names = ["$x^{2$", "$\\sqrt{$", "$}$"] + [f"$\\frac{{{i}}}{{2}}$" for i in range(3, 10)]
    save_vit(tiny_model(class_names=names), tmp_path / "m.safetensors")
    image = grey_png(tmp_path / "$\\frac{.png")
    result = run_cli("inspect", tmp_path / "m.safetensors", "--image", image, "--out", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out" / "attention.png").stat().st_size > 0


# --- Hugging Face id2label -------------------------------------------------------------------------------------------
def hf_dir(tmp_path, id2label):
    directory = tmp_path / "hf"
    save_hf(tiny_model(class_names=[f"digit {i}" for i in range(10)]), directory)
    config = json.loads((directory / "config.json").read_text())
    config["id2label"] = id2label
    (directory / "config.json").write_text(json.dumps(config))
    return directory


LABELS = {str(i): f"digit {i}" for i in range(10)}


@pytest.mark.parametrize(
    "value, got",
    [(5, "5 (a number)"), (None, "null"), ({"x": 1}, '{"x": 1} (an object)'), (True, "true (a boolean)"),
     (["a"], '["a"] (an array)'), (2.5, "2.5 (a number)")],
    ids=str,
)  # fmt: skip
def test_id2label_values_must_be_strings(tmp_path, value, got):
    directory = hf_dir(tmp_path, {**LABELS, "3": value})
    message = rf"config.json id2label\['3'\] must be a string \(a class name\), got {re.escape(got)}$"
    with pytest.raises(ValueError, match=message):
        load_hf(directory)
    assert_user_error(run_cli("predict", "--from", "hf", directory, grey_png(tmp_path / "x.png")), message)


@pytest.mark.parametrize(
    "keys, shown",
    [(["0", "1", "7"], "'0', '1', '7'"), (["1", "2", "3"], "'1', '2', '3'"), (["a", "b"], "'a', 'b'"),
     ([str(i) for i in range(1, 8)], "'1', '2', '3', '4', '5', ...")],
)  # fmt: skip
def test_id2label_keys_must_be_the_indices(keys, shown):
    with pytest.raises(ValueError, match=rf"id2label keys must be the indices 0..{len(keys) - 1}, got {shown}$"):
        hf_config({"id2label": dict.fromkeys(keys, "x")})


def test_id2label_of_strings_becomes_the_class_names_and_int_keys_are_read(tmp_path):
    model = load_hf(hf_dir(tmp_path, dict(reversed(LABELS.items()))))  # any key order
    assert model.class_names == [f"digit {i}" for i in range(10)]
    assert hf_config({"id2label": {i: f"c{i}" for i in range(3)}}).num_classes == 3  # transformers' to_dict()
    assert load_hf(hf_dir(tmp_path / "b", {str(i): f"LABEL_{i}" for i in range(10)})).class_names is None


def test_state_dict_keys_from_a_file_cannot_start_a_line_of_the_error(tmp_path):
    """The one error of several lines (a state dict's mismatch, a line per kind) escapes the keys it quotes."""
    from vit_einops.modelfile import model_metadata
    from vit_einops.statedict import safetensors_bytes

    model = tiny_model()
    state = {**model.state_dict(), "x\n  missing keys (0): \x1b[2J": torch.zeros(1)}
    (tmp_path / "m.safetensors").write_bytes(safetensors_bytes(state, model_metadata(model)))
    result = run_cli("predict", tmp_path / "m.safetensors", grey_png(tmp_path / "x.png"))
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [
        f"vit-einops predict: error: {tmp_path / 'm.safetensors'} state dict does not match the expected layout:",
        "  unexpected keys (1): x\\n  missing keys (0): \\x1b[2J",
    ]
