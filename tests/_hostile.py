"""What every hostile test of the command line shares: run ``vit-einops`` in this process, and the one outcome a
bad input may have (exit status 2, one line naming the problem, never a traceback nor the internal-error path)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from io import StringIO
from pathlib import Path
from unittest import mock

from _tiny import TINY_DIGITS

from vit_einops import ViT
from vit_einops.commands.cli import main
from vit_einops.modelfile import model_metadata
from vit_einops.preprocess import Preprocessing
from vit_einops.statedict import safetensors_bytes


def run_cli(*argv) -> subprocess.CompletedProcess:
    """`vit-einops ARGV` through main() in this process, as a user sees it (VIT_EINOPS_TRACEBACK unset): exit
    status, stdout and stderr."""
    out, err = StringIO(), StringIO()
    env = {k: v for k, v in os.environ.items() if k != "VIT_EINOPS_TRACEBACK"}
    with mock.patch.dict(os.environ, env, clear=True), redirect_stdout(out), redirect_stderr(err):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exit_:  # argparse's own errors
            code = exit_.code
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def assert_user_error(result: subprocess.CompletedProcess, message: str) -> None:
    """Exit status 2 and exactly one stderr line, "vit-einops CMD: error: ..." matching the regex ``message``;
    nothing on stdout, no traceback, not the internal-error path."""
    command = result.args[0]
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr, result.stderr
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"vit-einops {command}: error: "), lines[0]
    assert re.search(message, lines[0]), lines[0]


def tiny_model(**attributes) -> ViT:
    """The digits-sized model, seeded, with plain preprocessing (what train records) and ``attributes`` set."""
    import torch

    torch.manual_seed(0)
    model = ViT(**TINY_DIGITS).eval()
    model.preprocessing = Preprocessing.plain(8, 1)
    for name, value in attributes.items():
        setattr(model, name, value)
    return model


def raw_model_file(path: Path, *, metadata: dict | None = None, config: dict | None = None, dtype=None) -> Path:
    """A model file written byte by byte, as a hostile one would be: the tiny model's metadata with ``metadata``
    replacing entries, ``config`` replacing config fields, and its tensors cast to ``dtype``."""
    model = tiny_model()
    meta = model_metadata(model)
    if config:
        meta["vit_einops_config"] = json.dumps({**json.loads(meta["vit_einops_config"]), **config})
    meta.update(metadata or {})
    tensors = {k: v if dtype is None else v.to(dtype) for k, v in model.state_dict().items()}
    path.write_bytes(safetensors_bytes(tensors, meta))
    return path


def grey_png(path: Path) -> Path:
    """An 8x8 grey ramp: a digits model's input."""
    import numpy as np
    from PIL import Image

    Image.fromarray((np.arange(64, dtype=np.uint8) * 4).reshape(8, 8)).save(path)
    return path


class StillRunning(BaseException):
    """Raised by :func:`bounded`: a BaseException, so that no ``except OSError`` or ``except Exception`` of the code
    under test can take it for an error of its own (TimeoutError is an OSError, which a download turns into its
    own error)."""


@contextmanager
def bounded(seconds):
    """Fail (StillRunning) once ``seconds`` have passed, instead of hanging: SIGALRM interrupts a blocking open() of
    a FIFO, a read from a stalled server, or work a check should have refused. A guard against hangs; it times
    nothing."""

    def expire(signum, frame):
        raise StillRunning(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
