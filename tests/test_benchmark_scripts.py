"""benchmarks/chunked.py in a smoke mode (tiny shapes, one short round), so the script cannot rot unseen.

What is asserted: every grid point gets a row with finite ratios to SDPA (medians and fastest blocks), the floor's
parts, the forward rows' loop; the JSON is written once and an existing file is kept unless --force.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "chunked.py"
TINY = [
    "--batches",
    "2",
    "--tokens",
    "9",
    "--heads",
    "3",
    "--head-dim",
    "4",
    "--rounds",
    "1",
    "--min-run-time",
    "0.001",
]


def load_script():
    spec = importlib.util.spec_from_file_location("chunked_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_chunked_benchmark_smoke_writes_every_row(tmp_path, capsys, restore_threads):
    out = tmp_path / "chunked.json"
    assert load_script().main([*TINY, "--threads", "1", "--budgets", "30", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["mode"], r["batch"], r["tokens"]) for r in rows] == [("forward", 2, 9), ("forward_backward", 2, 9)]
    for r in rows:
        for key in ("chunked_ratio", "chunked_min_ratio", "chunked@30_ratio", "floor_ratio", "floor_min_ratio"):
            assert math.isfinite(r[key]) and r[key] > 0, key
        assert set(r["floor_parts_ms"]) >= {"qk", "softmax", "av"}
    assert math.isfinite(rows[0]["loop_ratio"]) and "loop_ratio" not in rows[1]  # the loop is forward only
    assert {"dv", "dp", "ds", "dq", "dk", "delta"} <= set(rows[1]["floor_parts_ms"])
    assert capsys.readouterr().out.count(" forward") == 2


def test_chunked_benchmark_keeps_an_existing_out_file_unless_forced(tmp_path, capsys, restore_threads):
    out = tmp_path / "chunked.json"
    out.write_text("mine\n")
    with pytest.raises(SystemExit) as exit_info:
        load_script().main([*TINY, "--threads", "1", "--modes", "forward", "--out", str(out)])
    assert exit_info.value.code == 2
    assert "already exists; pass --force" in capsys.readouterr().err
    assert out.read_text() == "mine\n"
    assert load_script().main([*TINY, "--threads", "1", "--modes", "forward", "--out", str(out), "--force"]) == 0
    assert json.loads(out.read_text())["rows"][0]["mode"] == "forward"
