"""AttnLRP and CP-LRP (vit_einops.inspect.lrp) against lxt 2.1 with zennit 0.5.1's Gamma rule, on a torchvision
twin of a tiny random-weight model of ours (``to_torchvision``: the same weights in torchvision's
``VisionTransformer``), our side on the einsum, chunked and sdpa paths, for several gamma pairs.

lxt patches torchvision's and zennit's classes for the whole process, so it runs in a process of its own
(tests/_lxt_reference.py, the interop venv's python, one process per rule), which loads only lxt's rules, patches,
zennit_patches and models/vit_torch modules (its package inits import transformers' language models; that file's
docstring says how). CP-LRP is lxt's own patch map for torchvision's ViT; lxt ships none for AttnLRP on torchvision,
so that reference is built from lxt's rule functions: the map's GELU and LayerNorm patches and an eager attention
over torchvision's MultiheadAttention weights wrapped in lxt's ``wrap_attention_forward`` (q's and k's gradients
divided by 4, v's by 2). Both register zennit's ``Gamma`` on every Conv2d and Linear, as lxt's ViT example does.

The pixels' relevance (input times gradient, before our sum over each patch) is compared in float64 within 1e-10 of
the largest |relevance|, and in float32 within 2e-5 (see TOLERANCES).
"""

from __future__ import annotations

import subprocess
import sys
from copy import deepcopy as copy_model
from pathlib import Path

import pytest
import torch
from _interop import TINY, interop_library, perturbed, report_diffs
from _tiny import tiny_vit

from vit_einops.interop import to_torchvision, torchvision_kwargs
from vit_einops.inspect.lrp import lrp

interop_library("torchvision")
interop_library("zennit")
interop_library("lxt")

IMPLS = ("einsum", "chunked", "sdpa")
DTYPES = (torch.float64, torch.float32)
GAMMAS = [(0.25, 0.1), (0.0, 0.0), (100.0, 1.0)]  # our defaults, LRP-epsilon, and lxt's example's largest
# Of the largest |relevance|. float64: the rules are the same arithmetic (measured 1e-14). float32: 2e-5, measured
# up to 9.3e-6 at gammas 0, where LRP-epsilon divides by outputs near 0 and their rounding shows.
TOLERANCES = {torch.float64: 1e-10, torch.float32: 2e-5}
REFERENCE = Path(__file__).with_name("_lxt_reference.py")
DIFFS: dict[str, float] = {}
pytestmark = pytest.mark.usefixtures("one_thread")  # as the reference process runs: one order of every sum


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    """{dtype: (our tiny RGB model with noise on every parameter, two images, their predicted classes)}, and
    {(rule, dtype): lxt's relevance per pair of GAMMAS}, one reference process per rule; the measured differences
    go to the interop report afterwards."""
    torch.manual_seed(0)
    model = perturbed(tiny_vit(TINY), std=0.2).double()
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    ours = {}
    for dtype in DTYPES:
        copy = copy_model(model).to(dtype)
        ours[dtype] = (copy, x.to(dtype), copy(x.to(dtype)).argmax(-1))
    jobs = [dict(kwargs=torchvision_kwargs(m.config), state=to_torchvision(m), x=xs, classes=classes, gammas=GAMMAS)
            for m, xs, classes in ours.values()]  # fmt: skip
    folder = tmp_path_factory.mktemp("lxt")
    torch.save(jobs, folder / "jobs.pt")
    theirs = {}
    for rule in ("attnlrp", "cp-lrp"):
        out = folder / f"{rule}.pt"
        done = subprocess.run([sys.executable, str(REFERENCE), rule, str(folder / "jobs.pt"), str(out)],
                              capture_output=True, text=True, timeout=300)  # fmt: skip
        assert done.returncode == 0, done.stderr[-4000:]
        theirs.update({(rule, dtype): result for dtype, result in zip(DTYPES, torch.load(out), strict=True)})
    yield ours, theirs
    report_diffs(DIFFS)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rule", ["attnlrp", "cp-lrp"])
def test_equals_lxt_on_a_torchvision_twin(twins, rule, dtype):
    ours, theirs = twins
    model, x, classes = ours[dtype]
    for (patch_gamma, linear_gamma), expected in zip(GAMMAS, theirs[rule, dtype], strict=True):
        scale = expected.abs().max()
        assert scale > 0
        for impl in IMPLS:
            model.set_attn_impl(impl)
            got = lrp(model, x, classes, rule=rule, patch_gamma=patch_gamma, linear_gamma=linear_gamma,
                      preprocessed=True)  # fmt: skip
            diff = ((got - expected).abs().max() / scale).item()
            name = f"lrp {rule} gammas {patch_gamma:g},{linear_gamma:g} {impl} {str(dtype)[6:]} (of max |R|)"
            DIFFS[name] = diff
            assert diff <= TOLERANCES[dtype], name
        model.set_attn_impl("einsum")
