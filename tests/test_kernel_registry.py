"""Adding an attention kernel is one file plus its entry: a kernel registered here, with no other edit, is taken by
the config, run by Attend, listed by the bench and counted by the memory estimate; and a kernel is refused where a
device or dtype it does not run on enters (construction, set_attn_impl, a move, a load)."""

from __future__ import annotations

import math

import pytest
import torch
from _tiny import tiny_vit

from vit_einops import ATTN_IMPLS, max_memory
from vit_einops.bench.names import core_paths, layer_paths, model_paths
from vit_einops.bench.runner import with_overrides
from vit_einops.commands.cli import build_parser
from vit_einops.network.kernels import KERNELS, Kernel, register_kernel, unregister_kernel
from vit_einops.network.sizes import check_model_forward
from vit_einops.statedict import build_vit

CALLS: list[tuple[int, ...]] = []  # the shapes of q the toy kernel was called with


def toy_attention(attend, q, k, v, mask):
    """softmax(q k^T / sqrt(d)) v in plain torch: the whole of a kernel (no mask, no dropout: an eval-only toy)."""
    CALLS.append(tuple(q.shape))
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1) @ v


@pytest.fixture
def toy():
    """The toy kernel registered for one test, on CPUs in float32 and float64 only; unregistered afterwards."""
    kernel = register_kernel(Kernel("toy", "test_kernel_registry:toy_attention", True, ("cpu",),
                                    ("float32", "float64"), "softmax(q k^T / sqrt(d)) v, written plainly"))  # fmt: skip
    CALLS.clear()
    yield kernel
    unregister_kernel("toy")
    assert "toy" not in KERNELS and "toy" not in ATTN_IMPLS


def test_a_registered_kernel_is_chosen_run_listed_and_counted(toy):
    torch.manual_seed(0)
    reference = tiny_vit()
    model = tiny_vit(attn_impl="toy")  # the config takes it
    model.load_state_dict(reference.state_dict())
    x = torch.randn(3, 1, 8, 8)
    with torch.no_grad():
        out, expected = model(x), reference(x)
    assert model.attn_impl == "toy" and CALLS == [(3, 2, 17, 8)] * 2  # Attend ran it, once per layer
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)  # the einsum kernel's values
    # every list of kernels names it
    assert ATTN_IMPLS == ("einsum", "chunked", "sdpa", "toy")
    assert "toy" in core_paths() and "toy" in model_paths() and "mha_toy" not in layer_paths()  # it forms A
    assert "toy" in with_overrides("smoke").core_paths
    assert build_parser("train").parse_args(["train", "--attn-impl", "toy"]).attn_impl == "toy"
    # the memory estimate counts its A as the einsum kernel's: 4097 tokens need 129.2 MiB with A, less without
    wide = tiny_vit(image_size=128, patch_size=2, dim=8, heads=1, mlp_dim=8, depth=2, in_channels=3)
    image = torch.zeros(1, 3, 128, 128)
    with torch.no_grad(), max_memory("64MiB"):
        check_model_forward(wide.set_attn_impl("sdpa"), image)
        with pytest.raises(ValueError, match="a forward pass of 1 image at 4097 tokens needs about 129.2 MiB"):
            check_model_forward(wide.set_attn_impl(("sdpa", "toy")), image)


def test_an_unregistered_kernel_is_refused_again(toy):
    unregister_kernel("toy")
    with pytest.raises(ValueError, match="unknown attn_impl 'toy'; expected one of 'einsum', 'chunked', 'sdpa'$"):
        tiny_vit(attn_impl="toy")
    assert "toy" not in core_paths()
    register_kernel(toy)  # for the fixture's cleanup


def test_a_kernel_is_refused_on_a_dtype_it_does_not_run_in(toy):
    model = tiny_vit(attn_impl="toy")
    words = (r"attention kernel 'toy' does not run in float16 \(it runs on cpu in float32, float64\); on cpu in "
             r"float16, the kernels that do: 'einsum', 'chunked', 'sdpa'")  # fmt: skip
    for move in (lambda m: m.to(torch.float16), lambda m: m.half(), lambda m: m.blocks[1].attn.mha.half()):
        with pytest.raises(ValueError, match=words):
            move(model)
        # refused before any tensor moved: the whole model is as it was
        assert {p.dtype for p in model.parameters()} == {torch.float32} and model.attn_impl == "toy"
    half = tiny_vit().half()
    with pytest.raises(ValueError, match=words):
        half.set_attn_impl(("einsum", "toy"))
    assert half.attn_impl == "einsum"  # no layer changed
    with pytest.raises(ValueError, match=words):
        build_vit(half.config, half.state_dict(), "toy")  # a load puts the weights there without a move
    assert model.to(torch.float64).attn_impl == "toy"  # a dtype it runs in


def test_a_kernel_is_refused_on_a_device_it_does_not_run_on(toy):
    register_kernel(Kernel("gpu_only", toy_attention, False, ("cuda",), ("float16",), "a kernel for GPUs only"))
    try:
        with pytest.raises(ValueError, match=r"attention kernel 'gpu_only' does not run on cpu \(it runs on cuda in "
                                             r"float16\); on cpu in float32, the kernels that do: 'einsum', 'chunked', "
                                             r"'sdpa', 'toy'"):  # fmt: skip
            tiny_vit(attn_impl="gpu_only")
        # the bench lists it, but a run on this CPU leaves it out of its default rows and refuses it by name
        assert "gpu_only" in core_paths() and "mha_gpu_only" in layer_paths()
        options = with_overrides("smoke")
        assert "gpu_only" not in options.core_paths + options.model_paths and "mha_toy" not in options.layer_paths
        with pytest.raises(ValueError, match="attention kernel 'gpu_only' does not run on cpu"):
            with_overrides("smoke", layer_paths=("mha_gpu_only",))
        with torch.device("meta"):  # shapes only: every kernel is taken there (the loaders build on it)
            assert tiny_vit(attn_impl="gpu_only").attn_impl == "gpu_only"
    finally:
        unregister_kernel("gpu_only")


def test_registration_refuses_what_it_cannot_keep(toy):
    with pytest.raises(ValueError, match="a kernel named 'toy' is registered already"):
        register_kernel(toy)
    with pytest.raises(ValueError, match="kernel 'einsum' is one of the package's own"):
        unregister_kernel("einsum")
    with pytest.raises(ValueError, match="no kernel 'flash' is registered"):
        unregister_kernel("flash")
    with pytest.raises(ValueError, match=r"kernel 'x': dtypes \('float8',\); expected a tuple of some of float16, "):
        Kernel("x", toy_attention, True, ("cpu",), ("float8",), "")
    with pytest.raises(TypeError, match="register_kernel takes a Kernel"):
        register_kernel(toy_attention)


def test_the_package_kernels_run_on_every_device_type_a_listed_one_only_where_it_says():
    # einsum, chunked and sdpa are plain torch ops: a device nobody listed (xpu, hpu, a privateuse1 backend) is not
    # refused, while a kernel that lists its devices is refused elsewhere, naming what it runs on
    from vit_einops.network.kernels import KERNELS, check_kernel_runs

    for name in ("einsum", "chunked", "sdpa"):
        assert KERNELS[name].runs_on("xpu", "bfloat16") and check_kernel_runs(name, "hpu", "float32") == name
    register_kernel(Kernel("gpu_only", toy_attention, False, ("cuda",), ("float16",), "a kernel for GPUs only"))
    try:
        assert not KERNELS["gpu_only"].runs_on("xpu", "float16")
        with pytest.raises(ValueError, match=r"'gpu_only' does not run on xpu \(it runs on cuda in float16\); on xpu "
                                             r"in float16, the kernels that do: 'einsum', 'chunked', 'sdpa'$"):
            check_kernel_runs("gpu_only", "xpu", "float16")
    finally:
        unregister_kernel("gpu_only")
