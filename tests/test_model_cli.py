"""`vit-einops summary` and the module entry point."""

from __future__ import annotations

import subprocess
import sys

import pytest

from vit_einops import cli
from vit_einops.cli import main


def test_summary_prints_torchsummary_table_and_true_total(capsys):
    assert main(["summary", "vit_ti_16", "--image-size", "32", "--num-classes", "10"]) == 0
    out = capsys.readouterr().out
    # 3*16*16*192+192 + 192 + 5*192 + 12*(12*192^2+13*192) + 2*192 + 192*10+10 (SPEC.md formula, 32 px, 10 classes)
    assert "Total params: 5,489,482" in out
    assert out.rstrip().endswith("vit_ti_16: 5,489,482 parameters")
    assert "ClassToken" in out and "PositionEmbedding" in out and "MultiHeadAttention" in out


def test_summary_rejects_unknown_preset(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["summary", "vit_q_16"])
    assert exc.value.code == 2
    assert "invalid choice: 'vit_q_16'" in capsys.readouterr().err


def test_python_dash_m_entry_point():
    result = subprocess.run([sys.executable, "-m", "vit_einops", "--help"], capture_output=True, text=True, check=True)
    assert "summary" in result.stdout and "usage: vit-einops" in result.stdout


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
