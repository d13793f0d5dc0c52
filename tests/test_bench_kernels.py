"""torch's attention kernels as bench paths: each computes attention, names the kernel the profiler saw, and a
path torch refuses at a point is a row with the reason, never a timing or a silent fallback."""

from __future__ import annotations

import pytest
import torch

from vit_einops.bench.attention import CompiledPath, Point, measure_point
from vit_einops.bench.kernels import SDPA_BACKENDS, kernel_ran, refusal, sdpa_backend_call
from vit_einops.network.attention import Attend

POINT = Point(batch=2, heads=2, tokens=17, head_dim=8)
CUDA_ONLY = ("sdpa_efficient", "sdpa_cudnn")
# Each backend's own aten op on a CPU: fused flash is one op; math is its composite op over bmm and softmax.
CPU_KERNELS = {
    "sdpa_math": "aten::_scaled_dot_product_attention_math",
    "sdpa_flash": "aten::_scaled_dot_product_flash_attention_for_cpu",
}


def qkv(seed=0, head_dims=(8, 8, 8), heads=(2, 2, 2)):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, h, 17, d, generator=g) for h, d in zip(heads, head_dims, strict=True)]


def measure(paths, mode="forward", compiled=None):
    rows = measure_point(POINT, mode, torch.float32, {"core": paths}, compiled or {}, rounds=1, min_run_time=1e-3)
    return {r["path"]: r for r in rows}


@pytest.mark.parametrize("mode", ["forward", "forward_backward"])
def test_the_profiler_names_the_math_and_flash_kernels_apart(mode):
    rows = measure(("sdpa", "sdpa_math", "sdpa_flash"), mode)
    for path, op in CPU_KERNELS.items():
        assert rows[path]["kernel"].split(" + ")[0] == op, rows[path]
    assert rows["sdpa_math"]["kernel"] != rows["sdpa_flash"]["kernel"]
    # The math backend never reaches a fused kernel, forward or backward: no silent upgrade either way.
    assert "flash" not in rows["sdpa_math"]["kernel"]
    if mode == "forward_backward":
        assert rows["sdpa_flash"]["kernel"] == f"{CPU_KERNELS['sdpa_flash']} + {CPU_KERNELS['sdpa_flash']}_backward"
    # Our sdpa path leaves the choice to torch; whatever it picked is named, and it is one of torch's SDPA ops.
    assert rows["sdpa"]["kernel"].startswith("aten::_scaled_dot_product_")


def test_the_einsum_path_is_named_by_its_matmuls_and_softmax():
    q, k, v = qkv()
    attend = Attend(8, impl="einsum")
    assert kernel_ran(lambda: attend(q, k, v)) == "aten::bmm + aten::_softmax"


@pytest.mark.skipif(torch.cuda.is_available(), reason="efficient and cuDNN attention run on CUDA")
def test_a_cuda_only_backend_is_a_row_with_a_reason_not_a_timing():
    rows = measure(("sdpa", *CUDA_ONLY))
    for path in CUDA_ONLY:
        row = rows[path]
        assert "median_s" not in row and "kernel" not in row and "time_ratio" not in row
        assert row["unavailable"].startswith(f"{SDPA_BACKENDS[path].name} on cpu: a CUDA-only backend; torch: ")
    assert rows["sdpa"]["median_s"] > 0  # the refused paths do not take the others down with them


def test_flash_refusing_a_shape_says_why_and_math_takes_it():
    q, k, v = qkv(head_dims=(8, 8, 8), heads=(2, 1, 1))  # grouped k, v: the fused kernels want equal heads
    reason = refusal("sdpa_flash", sdpa_backend_call("sdpa_flash", q, k, v), q.device)
    assert reason.startswith("FLASH_ATTENTION on cpu: torch: No available kernel; ") and "num_heads" in reason
    # The math backend broadcasts the heads: the same inputs run there, so the refusal is flash's own.
    assert refusal("sdpa_math", sdpa_backend_call("sdpa_math", q, k, v), q.device) is None


def test_a_skipped_compile_is_a_row_with_the_reason():
    compiled = {p: CompiledPath(p, 8, torch.float32, "skipped: not in this test") for p in ("flex_compiled",)}
    rows = measure(("sdpa", "flex_compiled", "einsum_compiled"), compiled=compiled)
    assert rows["flex_compiled"]["unavailable"] == "skipped: not in this test"
    assert rows["einsum_compiled"]["unavailable"] == "not compiled"  # asked for, never built: said, not dropped


def test_unknown_backend_and_compiled_path_names_are_refused_by_name():
    with pytest.raises(ValueError, match="'sdpa_magic' is not one of sdpa_math"):
        sdpa_backend_call("sdpa_magic", *qkv())
    with pytest.raises(ValueError, match="'einsum' is not one of einsum_compiled, flex_compiled"):
        CompiledPath("einsum", 8, torch.float32)


def test_every_backend_computes_the_einsum_path_within_1e_5():
    """Every SDPA backend this machine takes equals our einsum Attend (an independent implementation: explicit
    q k^T, softmax, A v) within 1e-5 in float32, forward and in the gradients."""
    q, k, v = (t.requires_grad_() for t in qkv(seed=1))
    expected = Attend(8, impl="einsum")(q, k, v)
    expected_grads = torch.autograd.grad(expected.sum(), (q, k, v))
    ran = []
    for path in SDPA_BACKENDS:
        call = sdpa_backend_call(path, q, k, v)
        if refusal(path, call, q.device) is not None:
            continue
        out = call()
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)
        for grad, want in zip(torch.autograd.grad(out.sum(), (q, k, v)), expected_grads, strict=True):
            torch.testing.assert_close(grad, want, atol=1e-5, rtol=0)
        ran.append(path)
    assert {"sdpa_math", "sdpa_flash"} <= set(ran)


@pytest.fixture(scope="module")
def flex():
    """flex_attention compiled by the bench's own CompiledPath, and the bench's forward rows at POINT: the one
    compile of this module happens in their first call (under inference_mode, as every later call here runs, so
    none recompiles). Two inductor options, neither of which changes the code it generates, cut the compile's cost:
    one compile thread (no pool of worker processes to start beside the test) and the vector ISA taken from torch's
    own CPU detection (cpp.vec_isa_ok) instead of building and loading a probe program per ISA in a child process.
    """
    path = CompiledPath("flex_compiled", POINT.head_dim, torch.float32)
    with torch._inductor.config.patch({"compile_threads": 1, "cpp.vec_isa_ok": True}):
        forward = measure(("sdpa", "flex_compiled"), "forward", compiled={"flex_compiled": path})
    return path, forward


def test_compiled_flex_attention_computes_the_einsum_path_within_1e_5(flex):
    path, _ = flex
    q, k, v = qkv(seed=2)
    expected = Attend(8, impl="einsum")(q, k, v)
    with torch.inference_mode():
        torch.testing.assert_close(path.fn(q, k, v), expected, atol=1e-5, rtol=0)


def test_flex_rows_time_the_forward_and_say_why_where_torch_declines(flex):
    flex, rows = flex
    forward = rows["flex_compiled"]
    assert forward["median_s"] > 0 and forward["first_call_s"] > 0
    assert forward["kernel"].startswith("inductor")  # a compiled graph, not the eager reference's bmm and softmax
    backward = measure(("sdpa", "flex_compiled"), "forward_backward", compiled={"flex_compiled": flex})
    row = backward["flex_compiled"]
    if "unavailable" in row:  # torch 2.13 on a CPU: flex_attention has no backward there
        assert row["unavailable"].startswith("torch: ") and "backward" in row["unavailable"]
        # Declining one mode is this point's reason, not a broken compile: the forward is still timed after it.
        assert flex.skip_reason is None
        # and at a new shape it is compiled again, not torch's eager reference (bmm and softmax) in its place.
        wider = Point(POINT.batch, POINT.heads, 33, POINT.head_dim)
        rows = measure_point(wider, "forward", torch.float32, {"core": ("sdpa", "flex_compiled")},
                             {"flex_compiled": flex}, rounds=1, min_run_time=1e-3)  # fmt: skip
        assert [r["kernel"] for r in rows if r["path"] == "flex_compiled"] == ["inductor"]
    else:
        assert row["median_s"] > 0 and row["kernel"].startswith("inductor")
