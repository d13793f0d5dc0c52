"""The same `vit-einops train` under torchrun: two gloo processes on CPU end with identical weights."""

import json
import os
import subprocess
import sys

import pytest
import torch.distributed as dist


@pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(), reason="this torch build has no gloo backend"
)
def test_two_process_torchrun_gives_identical_weights_on_both_ranks(tmp_path):
    out = tmp_path / "ddp"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
        "-m", "vit_einops", "train",
        "--limit", "64", "--epochs", "1", "--batch-size", "16", "--dim", "16", "--depth", "1", "--heads", "2",
        "--mlp-dim", "16", "--out", str(out), "--no-progress",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2
    # Each rank hashed its own weights after training; rank 0 gathered the hashes (and checked they agree).
    hashes = summary["weights_sha256"]
    assert len(hashes) == 2 and hashes[0] == hashes[1]
    checkpoint = json.loads((out / "checkpoint" / "checkpoint.json").read_text())
    assert checkpoint["files"]["model"]["sha256"] == hashes[0]  # rank 0 saved exactly those weights
    assert checkpoint["train_state"]["world_size"] == 2
    assert [r["epoch"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())] == [1]
