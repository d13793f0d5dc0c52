"""`vit-einops summary` and the module entry point."""

from __future__ import annotations

import subprocess
import sys

import pytest

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
