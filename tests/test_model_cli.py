"""`vit-einops summary` and the module entry point."""

from __future__ import annotations

import subprocess
import sys

import pytest

from vit_einops.commands import cli
from vit_einops.commands.cli import main


def test_summary_prints_torchsummary_table_and_true_total(capsys):
    assert main(["summary", "vit_ti_16", "--image-size", "32", "--num-classes", "10"]) == 0
    out = capsys.readouterr().out
    # 3 P^2 D + D + D + N D + L (12 D^2 + 13 D) + 2 D + D K + K at P 16, D 192, L 12, N 5 (32 px), K 10:
    # 3*16*16*192+192 + 192 + 5*192 + 12*(12*192^2+13*192) + 2*192 + 192*10+10
    assert "Total params: 5,489,482" in out
    assert out.rstrip().endswith("vit_ti_16: 5,489,482 parameters")
    assert "ClassToken" in out and "PositionEmbedding" in out and "MultiHeadAttention" in out


def test_summary_table_counts_layer_scale_and_registers(capsys):
    """DINOv2-S with registers at 28 px (2 x 2 patches of 14): torchsummary alone missed LayerScale's 24 gammas.
    3 P^2 D + D (patch projection) + 5 D (class and register tokens) + 4 D (positions, patches only)
    + L (12 D^2 + 13 D + 2 D (two LayerScales)) + 2 D (final LayerNorm), no classifier, at P 14, D 384, L 12."""
    assert main(["summary", "vit_small_patch14_reg4_dinov2", "--image-size", "28"]) == 0
    out = capsys.readouterr().out
    counts = [line.split()[-1] for line in out.splitlines() if line.lstrip().startswith("LayerScale-")]
    assert counts == ["384"] * 24
    assert "Total params: 21,533,184" in out and "Trainable params: 21,533,184" in out
    assert out.rstrip().endswith("vit_small_patch14_reg4_dinov2: 21,533,184 parameters")


def test_summary_table_flags(capsys):
    assert main(["summary", "vit_ti_16", "--image-size", "32", "--no-table"]) == 0
    out = capsys.readouterr().out
    assert "Total params" not in out and "layer table" not in out
    assert out.rstrip().endswith("vit_ti_16: 5,680,552 parameters")  # 1000 classes: + 990 * 193
    assert main(["summary", "vit_tiny_patch16_224", "--image-size", "32", "--table"]) == 0
    assert "Total params: 5,680,552" in capsys.readouterr().out


def test_summary_rejects_unknown_preset(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["summary", "vit_q_16"])
    assert exc.value.code == 2
    assert "invalid choice: 'vit_q_16'" in capsys.readouterr().err


def test_summary_bad_size_is_one_error_line(capsys):
    assert main(["summary", "vit_b_16", "--image-size", "225"]) == 2
    assert capsys.readouterr().err == (
        "vit-einops summary: error: image height 225 is not divisible by patch height 16 "
        "(image_size (225, 225), patch_size (16, 16))\n"
    )


def test_python_dash_m_entry_point():
    result = subprocess.run([sys.executable, "-m", "vit_einops", "--help"], capture_output=True, text=True, check=True)
    assert "summary" in result.stdout and "usage: vit-einops" in result.stdout


@pytest.mark.parametrize("argv", [[sys.executable, "-m", "vit_einops"], [sys.executable, "-m", "vit_einops.commands.cli"]])
def test_no_command_prints_the_help_and_exits_0(argv):
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: vit-einops") and "convert" in result.stdout and result.stderr == ""


def test_main_without_arguments_prints_the_help(capsys):
    assert main([]) == 0
    assert capsys.readouterr().out.startswith("usage: vit-einops")


def test_an_option_without_a_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--verbose"])
    assert exc.value.code == 2
    assert "a command is required" in capsys.readouterr().err


def test_version(capsys):
    from vit_einops import __version__

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out == f"vit-einops {__version__}\n"


HELP_AND_VERSION = [["--help"], ["--version"], []] + [
    [c, "--help"] for c in ("summary", "bench", "train", "inspect", "convert", "predict", "explore")
]


def test_help_and_version_do_not_import_torch():
    """--help must not wait for torch: no command module but the one asked for is imported, and those import
    torch only when they run. One process runs each argv in turn (each start would import Python and the package
    again) and says after each whether torch is imported: the first that imports it is named."""
    code = (
        "import sys\nfrom vit_einops.commands.cli import main\n"
        f"for argv in {HELP_AND_VERSION!r}:\n"
        "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
        "    print('torch imported' if 'torch' in sys.modules else 'no torch', argv, file=sys.stderr)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    said = [line for line in result.stderr.splitlines() if line.startswith(("torch imported", "no torch"))]
    assert said == [f"no torch {argv}" for argv in HELP_AND_VERSION]


def test_importing_the_package_does_not_import_torch_and_a_vit_h_14_summary_allocates_no_weights():
    """One process (each start imports torch again): importing vit_einops does not import torch until a name is used,
    and then `summary vit_h_14` counts ViT-H's 632,045,800 float32 parameters (2.5 GB) in a process that peaks far
    below that, so it never built them (the peak resident size includes torch itself, about 0.3 GB). The timeout
    bounds a hang, it times nothing.

    The peak is the child's own address space's (VmHWM), not getrusage's ru_maxrss: at exec Linux folds the
    high-water mark of the memory the process ran in before into ru_maxrss, and subprocess's vfork child ran in
    the parent's, so ru_maxrss reports the pytest worker's peak (1.19 GB after an earlier test in a full run)."""
    code = (
        "import sys, vit_einops\nprint('torch' in sys.modules)\nvit_einops.ViT\nprint('torch' in sys.modules)\n"
        "print(sorted(set(vit_einops.__all__) - set(dir(vit_einops))))\n"
        "from vit_einops.commands.cli import main\nrc = main(['summary', 'vit_h_14'])\n"
        "print(next(line.split()[1] for line in open('/proc/self/status') if line.startswith('VmHWM:')))\n"
        "sys.exit(rc)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    lines = result.stdout.strip().splitlines()
    assert lines[:3] == ["False", "True", "[]"]
    *_, summary, peak_kb = lines
    assert summary == "vit_h_14: 632,045,800 parameters"
    assert "Total params" not in result.stdout  # the table (a real forward) is opt-in at this size
    assert int(peak_kb) < 1_000_000, f"peak RSS {int(peak_kb) / 1e6:.2f} GB: the weights were allocated"


@pytest.fixture
def fake_commands(tmp_path, monkeypatch):
    """Two commands whose extra is missing: one fails on import, one only when it runs."""
    (tmp_path / "fake_eager_cmd.py").write_text("import not_installed_pkg_xyz\n")
    (tmp_path / "fake_lazy_cmd.py").write_text(
        "def add_arguments(p):\n    p.add_argument('--n', type=int)\n"
        "def run(args):\n    import not_installed_pkg_xyz.sub\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(
        cli,
        "COMMANDS",
        {
            **cli.COMMANDS,
            "eager": ("fake_eager_cmd", "bench", "needs an extra at import"),
            "lazy": ("fake_lazy_cmd", "train", "needs an extra when run"),
        },
    )


@pytest.mark.parametrize("argv, extra", [(["eager", "--smoke", "x"], "bench"), (["lazy", "--n", "3"], "train")])
def test_missing_extra_names_the_package_and_the_extra(fake_commands, capsys, argv, extra):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "'not_installed_pkg_xyz' is not installed" in err
    assert f"pip install 'vit-einops[{extra}]'" in err


def test_other_commands_work_while_one_extra_is_missing(fake_commands, capsys):
    assert cli.main(["summary", "vit_ti_16", "--image-size", "32"]) == 0
    assert "vit_ti_16:" in capsys.readouterr().out


def test_a_missing_module_of_our_own_is_a_bug_not_an_extra(monkeypatch):
    monkeypatch.setattr(cli, "COMMANDS", {"broken": ("vit_einops.commands.no_such_module", "bench", "")})
    with pytest.raises(ModuleNotFoundError, match="vit_einops.commands.no_such_module"):
        cli.main(["broken"])


def test_bad_input_is_one_error_line_not_a_traceback(tmp_path, monkeypatch, capsys):
    (tmp_path / "fake_bad_input_cmd.py").write_text(
        "def add_arguments(p):\n    pass\ndef run(args):\n    raise ValueError('epochs must be a positive int, got 0')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(cli, "COMMANDS", {"bad": ("fake_bad_input_cmd", None, "")})
    monkeypatch.delenv("VIT_EINOPS_TRACEBACK", raising=False)
    assert cli.main(["bad"]) == 2
    assert capsys.readouterr().err == "vit-einops bad: error: epochs must be a positive int, got 0\n"
    monkeypatch.setenv("VIT_EINOPS_TRACEBACK", "1")
    with pytest.raises(ValueError, match="epochs must be a positive int"):
        cli.main(["bad"])


def test_missing_file_is_reported_by_the_dispatcher(capsys, tmp_path):
    assert cli.main(["inspect", "--checkpoint", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vit-einops inspect: error: ") and "nope" in err
