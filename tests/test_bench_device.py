"""The bench's device: CUDA refused where there is none (saying what is missing), each dtype checked for the device,
the clock and cache flush a CUDA run times with (driven here by a fake device clock), and, where a GPU is lent, the
CUDA run itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from vit_einops.base.device import cuda_missing, resolve_device
from vit_einops.bench.device import (
    FALLBACK_FLUSH_BYTES, EventClock, Meter, check_device, check_dtype, cuda_peak_bytes, l2_flush_bytes,
)  # fmt: skip
from vit_einops.bench.kernels import SDPA_BACKENDS
from vit_einops.bench.measure import time_interleaved
from vit_einops.bench.paired import paired_ratios
from vit_einops.commands import cli

NO_CUDA = "needs a CUDA device: this machine has none"
MIB = 2**20


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for a machine without CUDA")
def test_device_cuda_without_cuda_is_one_line_naming_what_is_missing(capsys):
    assert cli.main(["bench", "--smoke", "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert err == f"vit-einops bench: error: device 'cuda' asked for CUDA, but {cuda_missing()}\n"
    assert not Path("bench-results").exists()  # refused before anything was created


def test_what_is_missing_names_the_build_or_the_device(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    assert cuda_missing() == f"this torch {torch.__version__} was built without CUDA"
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert cuda_missing() == (
        f"torch {torch.__version__} (CUDA 12.4) sees no CUDA device (no GPU or driver, CUDA_VISIBLE_DEVICES='')"
    )
    with pytest.raises(ValueError, match=r"^device 'cuda:1' asked for CUDA, but torch .* sees no CUDA device"):
        resolve_device("cuda:1")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match=r"^device 'cuda:1': torch sees 1 CUDA device\(s\), numbered 0 to 0$"):
        resolve_device("cuda:1")


@pytest.mark.parametrize(
    ("device", "message"),
    [
        ("tpu", "unknown device 'tpu'; expected 'auto', 'cpu', 'cuda' or 'cuda:N'"),
        ("meta", "device 'meta' is not supported; expected 'auto', 'cpu', 'cuda' or 'cuda:N'"),
        ("auto", "device 'auto' is not a bench device; expected 'cpu', 'cuda' or 'cuda:N'"),
    ],
)
def test_a_device_the_bench_cannot_use_is_refused_by_name(device, message, capsys):
    assert cli.main(["bench", "--smoke", "--device", device]) == 2
    assert capsys.readouterr().err == f"vit-einops bench: error: {message}\n"
    assert check_device("cpu") == torch.device("cpu")


FP16 = ("avx512_fp16", "amx_fp16")


@pytest.mark.parametrize(
    ("dtype", "flags", "slowdown", "refusal"),
    [
        ("float32", (), None, None),
        ("float16", ("avx2",), None, "this CPU has none of avx512_fp16, amx_fp16: torch emulates float16"),
        ("float16", ("avx512_fp16",), 2.04, "a 512x512 float16 matmul measured 2.0x slower than float32 here"),
        ("float16", ("amx_fp16",), 0.5, None),
        ("bfloat16", FP16, None, "this CPU has none of avx512_bf16, amx_bf16: torch emulates bfloat16"),
        ("bfloat16", ("amx_bf16",), 0.8, None),
    ],
)
def test_a_half_dtype_runs_on_a_cpu_only_with_its_hardware_and_no_slower(dtype, flags, slowdown, refusal):
    """float16 on a CPU follows bfloat16's rule: that dtype's matmul flags, and a matmul measured no slower than
    float32 (the measurement stands in here; without the flags it is never taken)."""
    measured = []

    def slower(dt):
        measured.append(dt)
        return slowdown

    cpu = torch.device("cpu")
    if refusal is None:
        assert check_dtype(dtype, cpu, flags, slower) == dtype
    else:
        with pytest.raises(ValueError, match=rf"^not running {dtype} on cpu: {refusal}.*; use --dtype float32$"):
            check_dtype(dtype, cpu, flags, slower)
    assert measured == ([] if slowdown is None else [getattr(torch, dtype)])
    with pytest.raises(ValueError, match="dtype 'float64' is not one of float32, float16, bfloat16"):
        check_dtype("float64", cpu)


def test_the_l2_flush_writes_twice_the_cache_or_the_fallback_when_unknown():
    assert l2_flush_bytes(50 * MIB) == 100 * MIB  # an H100's L2
    assert l2_flush_bytes(40 * MIB) == 80 * MIB  # an A100's
    assert l2_flush_bytes(0) == FALLBACK_FLUSH_BYTES == 256 * MIB
    for bad in (-1, 1.5, True, "50MB"):
        with pytest.raises(ValueError, match="is not a whole number of bytes >= 0"):
            l2_flush_bytes(bad)


class FakeDevice:
    """A device whose clock only kernels move: each launched call adds its milliseconds (times ``slow`` in a slow
    round), whatever the host's clock does. Its events read that clock when recorded and give the milliseconds
    between two of them as a float32, as CUDA's do."""

    def __init__(self, paths: int, slow_round: int, slow: float) -> None:
        self.ms, self.flushes = 0.0, 0
        self.paths, self.slow_round, self.slow = paths, slow_round, slow

    def kernel(self, ms: float):
        def launch():
            self.ms += ms * (self.slow if (self.flushes - 1) // self.paths == self.slow_round else 1.0)

        return launch

    def flush(self) -> None:
        self.flushes += 1

    def event(self):
        device = self

        class Event:
            def record(self):
                self.ms = device.ms

            def synchronize(self):
                pass

            def elapsed_time(self, end):
                return torch.tensor(end.ms - self.ms, dtype=torch.float32).item()

        return Event()


def test_time_interleaved_on_an_event_clock_gets_the_device_times_and_paired_ratios():
    """On a fake device where path a takes 2 ms and b 3 ms, and round 1 runs both 4x slower: every round's time is
    the device's own (the host's clock never enters), the cache is flushed before each path's round, and b's paired
    ratio is exactly 1.5 in every round, the slow one included."""
    gpu = FakeDevice(paths=2, slow_round=1, slow=4.0)
    timings = time_interleaved(
        {"a": gpu.kernel(2.0), "b": gpu.kernel(3.0)},
        rounds=3,
        min_run_time=0.02,
        clock=EventClock(gpu.event),
        flush=gpu.flush,
    )
    assert gpu.flushes == 3 * 2
    assert timings["a"].round_s == pytest.approx((0.002, 0.008, 0.002), rel=1e-9)
    assert timings["b"].round_s == pytest.approx((0.003, 0.012, 0.003), rel=1e-9)
    assert timings["a"].min_s == pytest.approx(0.002, rel=1e-9)
    ratio = paired_ratios({p: t.round_s for p, t in timings.items()}, "a")["b"]
    assert (ratio.ratio, ratio.low, ratio.high) == pytest.approx((1.5, 1.5, 1.5), rel=1e-9)


def test_the_event_clock_adds_intervals_so_late_readings_keep_their_resolution():
    """Each reading adds the interval since the last event: measured from the first event instead, in float32
    milliseconds, a 1 us step 10^4 s in would round to 0 or 1 ms."""
    gpu = FakeDevice(paths=1, slow_round=-1, slow=1.0)
    clock = EventClock(gpu.event)
    assert clock() == 0.0
    gpu.kernel(1e7)()  # 10^4 s
    start = clock()
    gpu.kernel(1e-3)()  # 1 us
    assert clock() - start == pytest.approx(1e-6, rel=1e-6)


def test_the_cpu_meter_keeps_the_benchmark_timer_and_no_flush():
    meter = Meter("cpu")
    assert (meter.clock, meter.flush, meter.describe()) == (None, None, {"device": "cpu"})


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)


@cuda
def test_cuda_peak_memory_counts_what_a_call_holds_at_most():
    def keep():
        return torch.empty(4 * MIB, dtype=torch.uint8, device="cuda")

    def twice():
        for _ in range(2):
            torch.empty(MIB, dtype=torch.uint8, device="cuda").fill_(1)

    peaks = cuda_peak_bytes({"keep": keep, "twice": twice}, torch.device("cuda"))
    assert peaks == {"keep": 4 * MIB, "twice": MIB}


@cuda
def test_cuda_events_time_what_a_synchronised_host_clock_times():
    """A long matmul chain: the event clock and perf_counter around a synchronize agree within 10%."""
    import time

    a = torch.randn(4096, 4096, device="cuda")
    meter = Meter("cuda")
    assert meter.flush.buffer.numel() == l2_flush_bytes(torch.cuda.get_device_properties(0).L2_cache_size)

    def chain():
        for _ in range(20):
            torch.mm(a, a)

    chain()
    torch.cuda.synchronize()
    start, host = meter.clock(), time.perf_counter()
    chain()
    device_s = meter.clock() - start
    host_s = time.perf_counter() - host
    assert device_s == pytest.approx(host_s, rel=0.1)


@cuda
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_cuda_smoke_run_times_every_backend_or_says_why(dtype, tmp_path):
    """--device cuda in half precision: every SDPA backend is a timed row or a row with torch's reason; the header
    names the GPU; peak memory comes from the CUDA allocator (positive for every timed row)."""
    out = tmp_path / "out"
    code = cli.main(["bench", "--smoke", "--device", "cuda", "--dtype", dtype, "--out", str(out)])
    if dtype == "bfloat16" and torch.cuda.get_device_capability()[0] < 8:
        assert code == 2
        return
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    assert results["meta"]["device"].startswith("cuda") and results["meta"]["gpu"]
    core = [r for r in results["attention"] + results["attention_unavailable"] if r["section"] == "core"]
    for path in SDPA_BACKENDS:
        rows = [r for r in core if r["path"] == path]
        assert rows and all(("median_s" in r) != bool(r.get("unavailable")) for r in rows), path
    timed = results["attention"]
    assert timed and all(r["peak_bytes"] > 0 and r["dtype"] == dtype for r in timed)
    assert "timed with CUDA events" in (out / "table.txt").read_text()
