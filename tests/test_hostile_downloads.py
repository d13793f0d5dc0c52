"""create_vit(pretrained=True) against a hostile server on 127.0.0.1, on both download paths: torchvision's file
(``$VIT_EINOPS_WEIGHTS_URL``, cached under ``$TORCH_HOME``) and timm's on the Hugging Face hub (``$HF_ENDPOINT``,
cached under ``$HF_HUB_CACHE``).

Each test asserts the exact outcome: the DownloadError and its words, nothing written anywhere (no file at the
target, no temporary, no lock, nothing outside the cache), the requests the server saw, and a time bound where a
hang was possible. The served files are a tiny model's, under the stand-in name NAME; the reported cases that
depend on a real name's size use the real name (the cap) with a small body.
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import io
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from _hostile import bounded
from _interop import TINY, perturbed
from _loopback import Site, closed_port_url, serve
from safetensors.torch import save as safetensors_save

from vit_einops import ViT, create_vit
from vit_einops.base import download as _download
from vit_einops import pretrained as pretrained_module
from vit_einops.base.download import DownloadError
from vit_einops.interop import to_timm, to_torchvision
from vit_einops.pretrained import PRETRAINED, PublishedWeights, download_limit
from vit_einops.preprocess import Preprocessing
from vit_einops.presets import PRESETS

NAME = "vit_tiny_test"
TINY_1K = {**TINY, "num_classes": 1000}
COMMIT = "c0ffee" + "0" * 34
ROUTES = ["torchvision", "hub"]


@pytest.fixture(scope="module")
def model():
    return perturbed(ViT(**TINY_1K))


@pytest.fixture(scope="module")
def bodies(model):
    """NAME's weights as each path serves them: torchvision's .pth, timm's model.safetensors."""
    buffer = io.BytesIO()
    torch.save(to_torchvision(model), buffer)
    return {"torchvision": buffer.getvalue(), "hub": safetensors_save(to_timm(model), metadata={"format": "pt"})}


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A server on 127.0.0.1 both hosts point at, both caches in tmp_path, no proxy, and the tiny preset NAME."""
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setitem(PRESETS, NAME, TINY_1K)
    with serve() as served:
        monkeypatch.setenv("VIT_EINOPS_WEIGHTS_URL", served.url)
        monkeypatch.setenv("HF_ENDPOINT", served.url)
        yield served


def publish(site: Site, monkeypatch, route: str, data: bytes, name: str = NAME, sha256: str | None = None) -> str:
    """Serve ``data`` as ``name``'s published file on ``route`` (a hub answer as the real hub's: commit, ETag and
    size headers); returns its path on the server. For a real name, its table entry stays as it is."""
    sha256 = sha256 or hashlib.sha256(data).hexdigest()
    if route == "torchvision":
        if name == NAME:
            published = PublishedWeights("torchvision", f"{NAME}-{sha256[:8]}.pth", 32, 1000,
                                         Preprocessing.torchvision(32, 36))
            monkeypatch.setitem(PRETRAINED, NAME, published)
        path = PRETRAINED[name].file
    else:
        if name == NAME:
            monkeypatch.setitem(PRETRAINED, NAME, PublishedWeights("timm", f"timm/{NAME}.tag", 32, 1000,
                                                                    Preprocessing.timm(32, 0.9)))
        path = f"{PRETRAINED[name].file}/resolve/main/model.safetensors"
        site.headers[path] = {"X-Repo-Commit": COMMIT, "X-Linked-Etag": f'"{sha256}"', "ETag": f'"{sha256}"',
                              "X-Linked-Size": str(len(data))}
    site.files[path] = data
    return path


def written(tmp_path: Path) -> list[str]:
    """Every file and link under tmp_path (the two caches), relative: what a download left."""
    return sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_symlink() or p.is_file())


def refused(name: str = NAME) -> str:
    return rf"^create_vit\('{name}', pretrained=True\) could not fetch http://127\.0\.0\.1:\d+/"


def assert_loads(model, name: str = NAME) -> None:
    loaded = create_vit(name, pretrained=True)
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in model.state_dict().items())


# --- names the hub sends: checked before any becomes part of a path ---


def test_a_hub_etag_that_climbs_out_of_the_cache_writes_nothing(site, monkeypatch, tmp_path):
    """The reported case: the body would have gone to site-packages/x.pth, run by Python at its next start."""
    path = publish(site, monkeypatch, "hub", b"import os; os.system('echo pwned')\n", name="vit_tiny_patch16_224")
    climb = '"../../../site-packages/x.pth"'  # from tmp_path/hf/models--timm--NAME/blobs to tmp_path/site-packages
    site.headers[path].update({"ETag": climb, "X-Linked-Etag": climb})
    with pytest.raises(DownloadError, match=refused("vit_tiny_patch16_224") + r".*: refused .*: its ETag "
                       r"'\"\.\./\.\./\.\./site-packages/x\.pth\"' is not a sha256 \(64 lowercase hex digits\)"):
        create_vit("vit_tiny_patch16_224", pretrained=True)
    assert not (tmp_path / "site-packages").exists() and written(tmp_path) == [] and os.listdir(".") == []
    assert [method for method, _ in site.requests] == ["GET"]


@pytest.mark.parametrize(
    ("header", "value", "message"),
    [
        ("X-Repo-Commit", "../../../x", r"its X-Repo-Commit '\.\./\.\./\.\./x' is not a commit"),
        ("X-Repo-Commit", "C0FFEE" + "0" * 34, r"its X-Repo-Commit 'C0FFEE0+' is not a commit \(40 lowercase hex"),
        ("X-Repo-Commit", None, r"no X-Repo-Commit header \(not a Hugging Face hub's answer\)"),
        ("X-Linked-Etag", '"' + "A" * 64 + '"', r"its ETag '\"A{64}\"' is not a sha256"),
        ("X-Linked-Etag", '"' + "a" * 63 + '"', r"its ETag '\"a{63}\"' is not a sha256"),
        ("X-Linked-Etag", '"\x1b[2J' + "a" * 60 + '"', r"its ETag '\"\\x1b\[2Ja{60}\"' is not a sha256"),
        ("X-Linked-Size", "1e9", r"its X-Linked-Size '1e9' is not a number of bytes"),
        ("X-Linked-Size", "-5", r"its X-Linked-Size '-5' is not a number of bytes"),
        ("Content-Length", "12", r"its Content-Length 12 is not its X-Linked-Size \d+"),
    ],
)
def test_a_hub_answer_is_checked_before_anything_is_written(site, monkeypatch, tmp_path, bodies, header, value,
                                                            message):
    path = publish(site, monkeypatch, "hub", bodies["hub"])
    if header == "Content-Length":
        site.length[path] = value
    elif value is None:
        del site.headers[path][header]
    else:
        site.headers[path][header] = value
        if header == "X-Linked-Etag":
            site.headers[path]["ETag"] = value
    with pytest.raises(DownloadError, match=refused() + ".*: refused .*: " + message) as caught:
        create_vit(NAME, pretrained=True)
    assert "\x1b" not in str(caught.value) and "\n" not in str(caught.value)
    assert written(tmp_path) == []


def test_a_weak_etag_is_the_sha256_and_the_cache_has_huggingface_hubs_layout(site, monkeypatch, tmp_path, bodies,
                                                                            model):
    data = bodies["hub"]
    sha256 = hashlib.sha256(data).hexdigest()
    path = publish(site, monkeypatch, "hub", data)
    site.headers[path]["X-Linked-Etag"] = f'W/"{sha256}"'
    assert_loads(model)
    repo = Path("hf", f"models--timm--{NAME}.tag")
    assert written(tmp_path) == [str(repo / "blobs" / sha256), str(repo / "refs" / "main"),
                                 str(repo / "snapshots" / COMMIT / "model.safetensors")]
    assert os.readlink(tmp_path / repo / "snapshots" / COMMIT / "model.safetensors") == f"../../blobs/{sha256}"
    assert (tmp_path / repo / "refs" / "main").read_text() == COMMIT
    assert_loads(model)
    assert len(site.requests) == 1  # the second call read the cache


def test_a_hub_download_whose_sha256_is_not_its_etag_is_refused(site, monkeypatch, tmp_path, bodies):
    publish(site, monkeypatch, "hub", bodies["hub"], sha256="0" * 64)
    with pytest.raises(DownloadError, match=r"refused .*model.safetensors: its sha256 [0-9a-f]{16}\.\.\. is not "
                       r"0{16}\.\.\., its ETag"):
        create_vit(NAME, pretrained=True)
    assert written(tmp_path) == []


# --- sizes: the architecture's cap, the declared size, the body's length ---


@pytest.mark.parametrize("route", ROUTES)
def test_a_declared_size_over_the_architectures_cap_is_refused_before_a_byte_is_written(site, monkeypatch, tmp_path,
                                                                                      route):
    """The reported Content-Length: 10^15 (it wrote 10 GiB), with the real names' caps: vit_b_16's float32 weights
    and 1 MiB, vit_tiny_patch16_224's likewise."""
    name = "vit_b_16" if route == "torchvision" else "vit_tiny_patch16_224"
    path = publish(site, monkeypatch, route, b"x" * 1000, name=name)
    site.length[path] = str(10**15)
    if route == "hub":
        site.headers[path]["X-Linked-Size"] = str(10**15)
    cap = download_limit(name)
    assert cap == 4 * {"vit_b_16": 86_567_656, "vit_tiny_patch16_224": 5_717_416}[name] + (1 << 20)
    declared = rf".*: refused .*: it declares 1,000,000,000,000,000 bytes, more than {cap:,}, the most this file can be"
    with bounded(2), pytest.raises(DownloadError, match=refused(name) + declared + r" \(its weights' size\)"):
        create_vit(name, pretrained=True)
    assert written(tmp_path) == [] and len(site.requests) == 1


@pytest.mark.parametrize("route", ROUTES)
def test_the_cap_admits_a_file_of_exactly_its_size_and_nothing_more(site, monkeypatch, tmp_path, bodies, model, route):
    data = bodies[route]
    publish(site, monkeypatch, route, data)
    monkeypatch.setattr(pretrained_module, "CONTAINER_MARGIN", 0)
    weights = download_limit(NAME)  # the float32 tensors alone
    monkeypatch.setattr(pretrained_module, "CONTAINER_MARGIN", len(data) - weights - 1)
    with pytest.raises(DownloadError, match=rf"it declares {len(data):,} bytes, more than {len(data) - 1:,}, the most"):
        create_vit(NAME, pretrained=True)
    assert written(tmp_path) == []
    monkeypatch.setattr(pretrained_module, "CONTAINER_MARGIN", pretrained_module.CONTAINER_MARGIN + 1)
    assert download_limit(NAME) == len(data)
    assert_loads(model)


@pytest.mark.parametrize("route", ROUTES)
def test_an_endless_body_after_the_declared_size_is_not_read(site, monkeypatch, tmp_path, bodies, model, route):
    """The reported endless body (7.7 GiB under TORCH_HOME, 5.7 GiB in the HF cache although 22 MB was declared):
    only the declared bytes are read, and here they are the file."""
    path = publish(site, monkeypatch, route, bodies[route])
    site.endless.add(path)
    assert_loads(model)
    cached = [p for p in written(tmp_path) if "refs" not in p and "snapshots" not in p]
    assert len(cached) == 1 and (tmp_path / cached[0]).stat().st_size == len(bodies[route])


def test_an_endless_body_without_a_declared_size_stops_at_the_cap(site, monkeypatch, tmp_path, bodies):
    path = publish(site, monkeypatch, "torchvision", bodies["torchvision"])
    site.length[path] = None
    site.endless.add(path)
    sent_more = rf"refused .*: it sent more bytes than {download_limit(NAME):,}, the most this file can be"
    with bounded(5), pytest.raises(DownloadError, match=sent_more):
        create_vit(NAME, pretrained=True)
    assert written(tmp_path) == []
    assert site.sent[path] < download_limit(NAME) + (64 << 20)  # it stopped: what the socket buffers took, no more


def test_an_endless_hub_body_longer_than_its_linked_size_is_refused(site, monkeypatch, tmp_path, bodies):
    """Redirected to a "CDN" that declares no Content-Length: the X-Linked-Size bounds what is read."""
    path = publish(site, monkeypatch, "hub", bodies["hub"])
    site.files["cdn/blob"] = bodies["hub"]
    site.length["cdn/blob"] = None
    site.endless.add("cdn/blob")
    site.redirects[path] = f"{site.url}/cdn/blob"
    with pytest.raises(DownloadError, match=rf"it sent more bytes than the {len(bodies['hub']):,} it declared"):
        create_vit(NAME, pretrained=True)
    assert written(tmp_path) == []


@pytest.mark.parametrize("route", ROUTES)
def test_a_body_cut_short_is_fetched_once_more_from_its_start_then_refused(site, monkeypatch, tmp_path, bodies, route):
    """The reported hub download that resumed forever: two attempts in all, neither asking for a Range."""
    path = publish(site, monkeypatch, route, bodies[route])
    site.truncate.add(path)
    size = len(bodies[route])
    with pytest.raises(DownloadError, match=rf"refused .*: received {size // 2:,} of its {size:,} bytes \(cut short\)"):
        create_vit(NAME, pretrained=True)
    assert site.requests == [("GET", path)] * 2
    assert not any("Range" in headers for headers in site.request_headers)
    assert written(tmp_path) == []


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("lengths", [("100", "200"), ("0x10",), (" 1_000",)])
def test_a_content_length_that_is_not_one_number_is_refused(site, monkeypatch, tmp_path, bodies, route, lengths):
    path = publish(site, monkeypatch, route, bodies[route])
    site.length[path] = lengths[0]
    if len(lengths) == 2:  # two Content-Length headers that differ
        site.headers.setdefault(path, {})["content-length"] = lengths[1]
        expected = r"it sends 2 different Content-Length headers \('100', '200'\)"
    else:
        expected = rf"its Content-Length '{lengths[0].strip()}' is not a number of bytes"
    with pytest.raises(DownloadError, match=expected):
        create_vit(NAME, pretrained=True)
    assert written(tmp_path) == []


# --- time: one deadline for the whole download ---


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("where", ["body", "headers"])
def test_a_drip_ends_at_the_deadline(site, monkeypatch, tmp_path, bodies, route, where):
    """The reported 1 byte/s drip never ended (the timeout was per read). The deadline is made 0.5 s here; a drip
    of the headers is cut by the watchdog, as a drip of the body is."""
    monkeypatch.setattr(_download, "DEADLINE_BASE_S", 0.5)
    monkeypatch.setattr(_download, "MIN_RATE", 10**12)
    path = publish(site, monkeypatch, route, bodies[route])
    (site.drip if where == "body" else site.drip_headers)[path] = 0.02  # each byte well within the per-read timeout
    late = (r".*: not complete within 0\.5 s, the time allowed for [\d,]+ bytes \(0\.5 s and [\d.e+]+ KiB/s; "
            r"VIT_EINOPS_DOWNLOAD_DEADLINE sets another\)")
    with bounded(2.5), pytest.raises(DownloadError, match=refused() + late):
        create_vit(NAME, pretrained=True)
    assert written(tmp_path) == [] and len(site.requests) == 1  # no retry once the time is up


class FakeClock:
    """time.monotonic and threading.Timer for vit_einops.base.download on a clock that moves only by advance():
    the deadline's watchdog fires when the clock reaches it, in the thread that advances it, whatever the load."""

    def __init__(self) -> None:
        self.now = 0.0
        self.timers: list[FakeClock.Timer] = []

    def monotonic(self) -> float:
        return self.now

    def advance(self, seconds: float) -> bool:
        """Move on by ``seconds`` and run each timer that falls due; whether any did."""
        self.now += seconds
        due = [t for t in self.timers if t.due <= self.now]
        for timer in due:
            self.timers.remove(timer)
            timer.function()
        return bool(due)

    def timer(self, interval: float, function) -> FakeClock.Timer:
        return FakeClock.Timer(self, interval, function)

    class Timer:
        def __init__(self, clock: FakeClock, interval: float, function) -> None:
            self.clock, self.interval, self.function, self.due, self.daemon = clock, interval, function, None, False

        def start(self) -> None:
            self.due = self.clock.now + self.interval
            self.clock.timers.append(self)

        def cancel(self) -> None:
            if self in self.clock.timers:
                self.clock.timers.remove(self)


@pytest.fixture
def clock(monkeypatch):
    """The download module's clock and watchdog on a FakeClock."""
    clock = FakeClock()
    monkeypatch.setattr(_download, "time", SimpleNamespace(monotonic=clock.monotonic))
    monkeypatch.setattr(_download, "threading", SimpleNamespace(Lock=threading.Lock, Timer=clock.timer))
    return clock


def pace(site: Site, monkeypatch, clock: FakeClock, path: str, seconds: float) -> None:
    """A drip of ``path``'s body that no load can stretch: the server sends one byte per read of the client, and
    each read first lets ``seconds`` pass on ``clock``; none once the clock has fired the deadline's watchdog (it
    has shut the connection). ``del site.paced[path]`` ends it."""
    site.paced[path] = threading.Semaphore(0)
    read1 = http.client.HTTPResponse.read1

    def paced_read1(response, *args):
        if path in site.paced and not clock.advance(seconds):
            site.paced[path].release()
        return read1(response, *args)

    monkeypatch.setattr(http.client.HTTPResponse, "read1", paced_read1)


@pytest.mark.parametrize("route", ROUTES)
def test_a_drip_ends_at_the_deadline_the_environment_sets_and_leaves_nothing(site, monkeypatch, tmp_path, bodies,
                                                                            model, clock, route):
    """The reported drip hung: its default deadline grows with the file's size (45 minutes for vit_b_16).
    $VIT_EINOPS_DOWNLOAD_DEADLINE sets another, here 1 s against a byte every 0.2 s (on the test's clock: bytes
    arrive at 0.2, 0.4, 0.6 and 0.8 s, and the fifth read finds the deadline passed); the temporary goes, and a
    later download under the same deadline loads."""
    monkeypatch.setenv("VIT_EINOPS_DOWNLOAD_DEADLINE", "1")
    path = publish(site, monkeypatch, route, bodies[route])
    pace(site, monkeypatch, clock, path, 0.2)
    late = (r".*: not complete within 1\.0 s, the deadline VIT_EINOPS_DOWNLOAD_DEADLINE=1 sets; 4 bytes had "
            r"arrived\. Without network")
    with bounded(10), pytest.raises(DownloadError, match=refused() + late):  # a guard against hangs: no time passes
        create_vit(NAME, pretrained=True)
    assert clock.now == pytest.approx(1.0) and clock.timers == []
    assert written(tmp_path) == [] and len(site.requests) == 1
    del site.paced[path]
    assert_loads(model)


@pytest.mark.parametrize("route", ROUTES)
def test_a_drip_under_the_default_deadline_ends_once_it_falls_behind_the_minimum_rate(site, monkeypatch, tmp_path,
                                                                                    bodies, clock, route):
    """The reported drip of a real name's file would have run to its deadline, 45 minutes for vit_b_16. Here the
    base is 0.5 s and the rate 1 KiB/s, so the file's deadline is minutes away: the drip of a byte every 0.2 s (on
    the test's clock) ends once it falls behind, with its third byte at 0.6 s."""
    monkeypatch.setattr(_download, "DEADLINE_BASE_S", 0.5)
    monkeypatch.setattr(_download, "MIN_RATE", 1024)
    path = publish(site, monkeypatch, route, bodies[route])
    pace(site, monkeypatch, clock, path, 0.2)
    size = len(bodies[route])
    slow = (rf".*: 3 bytes in 0\.6 s, behind 1 KiB/s after the first 0\.5 s: at that rate it would not be "
            rf"complete within {0.5 + size / 1024:.1f} s, the time allowed for {size:,} bytes "
            r"\(VIT_EINOPS_DOWNLOAD_DEADLINE sets another\)\. Without network")
    with bounded(10), pytest.raises(DownloadError, match=refused() + slow):  # a guard against hangs: no time passes
        create_vit(NAME, pretrained=True)
    assert written(tmp_path) == [] and len(site.requests) == 1


@pytest.mark.parametrize("deadline", ["0", "abc", "inf", "2 years"])
def test_a_deadline_that_is_no_time_is_refused_before_any_request(site, monkeypatch, tmp_path, bodies, deadline):
    monkeypatch.setenv("VIT_EINOPS_DOWNLOAD_DEADLINE", deadline)
    publish(site, monkeypatch, "torchvision", bodies["torchvision"])
    with pytest.raises(ValueError) as caught:
        create_vit(NAME, pretrained=True)
    assert str(caught.value) == (
        "VIT_EINOPS_DOWNLOAD_DEADLINE must be a time from 1 ms to 1 year such as 30, 30s, 2min or 1.5h (seconds "
        f"unless a unit is given), got {deadline!r}"
    )
    assert site.requests == [] and written(tmp_path) == []


@pytest.mark.parametrize("route", ROUTES)
def test_a_stalled_download_is_not_fetched_again_and_leaves_nothing(site, monkeypatch, tmp_path, bodies, model, route):
    """The reported stall fetched the file again from its start at the per-read timeout, for over 100 s in all,
    leaving a .tmp: a read that waits its timeout for a byte fails at once, the temporary removed. The deadline
    parameter bounds the whole (here 5 s, which the 0.5 s timeout ends first)."""
    path = publish(site, monkeypatch, route, bodies[route])
    site.stall.add(path)
    url = f"{site.url}/{path}"
    folder = tmp_path / "cache"
    fetch = {
        "torchvision": lambda: _download.download(url, folder / "f.pth", sha256_prefix="0" * 8,
                                                  max_bytes=download_limit(NAME), timeout=0.5, deadline=5),
        "hub": lambda: _download.download_hub_file(url, folder, "model.safetensors", max_bytes=download_limit(NAME),
                                                   timeout=0.5, deadline="5s"),
    }[route]
    stalled = (rf"^could not download {url}: no byte came for 0\.5 s \(the per-read timeout\) after "
               rf"{len(bodies[route]) // 2:,} bytes; not retried$")
    with bounded(3), pytest.raises(DownloadError, match=stalled):
        fetch()
    assert written(tmp_path) == [] and len(site.requests) == 1


def test_the_deadline_parameter_ends_a_drip(site, monkeypatch, tmp_path, bodies):
    path = publish(site, monkeypatch, "torchvision", bodies["torchvision"])
    site.drip[path] = 0.2
    url = f"{site.url}/{path}"
    late = (rf"^could not download {url}: not complete within 0\.5 s, the deadline deadline=0\.5 sets; [1-3] bytes "
            r"had arrived$")
    with bounded(2), pytest.raises(DownloadError, match=late):
        _download.download(url, tmp_path / "f.pth", sha256_prefix="0" * 8, max_bytes=10**6, deadline=0.5)
    assert written(tmp_path) == []


def test_the_deadline_grows_with_the_size(monkeypatch):
    """60 s and 128 KiB/s: vit_b_16's 347 MB may take 45 minutes, a server declaring 1 KB gets 60 s."""
    with _download._Deadline(download_limit("vit_b_16")) as deadline:
        assert deadline.at - deadline.start == pytest.approx(60 + download_limit("vit_b_16") / (128 * 1024))
        deadline.shorten(1000)
        assert deadline.at - deadline.start == pytest.approx(60 + 1000 / (128 * 1024))
        deadline.shorten(10**15)  # never later
        assert deadline.at - deadline.start == pytest.approx(60 + 1000 / (128 * 1024))


# --- encodings, redirects, status lines ---


@pytest.mark.parametrize("route", ROUTES)
def test_a_compressed_body_is_refused_never_inflated(site, monkeypatch, tmp_path, route):
    """The reported gzip bomb inflated to 1 GiB before the size check: 16 MiB of zeros in 16 KB, refused unread."""
    bomb = gzip.compress(bytes(16 << 20))
    path = publish(site, monkeypatch, route, bomb)
    site.headers[path] = {**site.headers.get(path, {}), "Content-Encoding": "gzip"}
    with pytest.raises(DownloadError, match=r"its body has Content-Encoding 'gzip'; only identity is accepted"):
        create_vit(NAME, pretrained=True)
    assert site.request_headers[0]["Accept-Encoding"] == "identity"
    assert written(tmp_path) == []


@pytest.mark.parametrize("route", ROUTES)
def test_a_reason_phrase_with_control_characters_is_escaped(site, monkeypatch, tmp_path, bodies, route):
    path = publish(site, monkeypatch, route, bodies[route])
    site.status[path] = (403, "Forbidden\x1b[2J\x07\x9b")
    with pytest.raises(DownloadError) as caught:
        create_vit(NAME, pretrained=True)
    assert r": HTTP 403 Forbidden\x1b[2J\x07\x9b. Without network" in str(caught.value)
    assert not any(c in str(caught.value) for c in "\x1b\x07\x9b")
    assert len(site.requests) == 1 and written(tmp_path) == []  # a 4xx is not retried


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize(
    ("location", "message"),
    [
        ("file:///etc/passwd", r"it redirects to 'file:///etc/passwd', which is not an http or https URL"),
        ("ftp://127.0.0.1/x", r"it redirects to 'ftp://127.0.0.1/x', which is not an http or https URL"),
        ("/loop", r"more than 5 redirects"),
    ],
)
def test_redirects_go_to_http_or_https_only_and_not_forever(site, monkeypatch, tmp_path, bodies, route, location,
                                                           message):
    path = publish(site, monkeypatch, route, bodies[route])
    site.redirects[path] = location
    site.redirects["loop"] = "/loop"
    with pytest.raises(DownloadError, match=message):
        create_vit(NAME, pretrained=True)
    assert written(tmp_path) == []


@pytest.mark.parametrize("route", ROUTES)
def test_a_redirect_to_a_cdn_loads_and_its_own_body_is_never_read(site, monkeypatch, tmp_path, bodies, model, route):
    """As the real hub answers: a 302 carrying the commit, ETag and size, to a CDN that serves the bytes with none
    of them. The 302's own body is endless and never read."""
    path = publish(site, monkeypatch, route, bodies[route])
    site.files["cdn/file"] = bodies[route]
    site.files[path] = b""
    site.endless.add(path)
    site.redirects[path] = f"{site.url}/cdn/file"
    assert_loads(model)
    assert [p for _, p in site.requests] == [path, "cdn/file"]


# --- offline, and what is retried ---


@pytest.mark.parametrize("route", ROUTES)
def test_offline_is_the_one_line_hint_in_well_under_two_seconds(site, monkeypatch, tmp_path, route):
    """The reported offline error took 23.5 s of retries: a refused connection is not retried."""
    monkeypatch.setenv("VIT_EINOPS_WEIGHTS_URL", url := closed_port_url())
    monkeypatch.setenv("HF_ENDPOINT", url)
    name = "vit_b_16" if route == "torchvision" else "vit_tiny_patch16_224"
    file = "vit_b_16-c867db91.pth" if route == "torchvision" else "model.safetensors"
    with bounded(2), pytest.raises(DownloadError) as caught:
        create_vit(name, pretrained=True)
    message = str(caught.value)
    assert message.startswith(f"create_vit('{name}', pretrained=True) could not fetch {url}/")
    assert "refused" in message.lower() and f"create_vit('{name}', weights='{file}')" in message
    assert "\n" not in message and written(tmp_path) == []


def test_hf_hub_offline_reads_the_cache_only(site, monkeypatch, tmp_path, bodies, model):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    publish(site, monkeypatch, "hub", bodies["hub"])
    offline = rf".*: HF_HUB_OFFLINE is set and the file is not in the hub cache \({tmp_path}/hf/models--timm--{NAME}"
    with bounded(0.5), pytest.raises(DownloadError, match=refused() + offline + r"\.tag\)\. Without network"):
        create_vit(NAME, pretrained=True)
    assert site.requests == []
    monkeypatch.delenv("HF_HUB_OFFLINE")
    assert_loads(model)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert_loads(model)  # cached: no request
    assert len(site.requests) == 1


@pytest.mark.parametrize("route", ROUTES)
def test_a_server_error_is_not_retried(site, monkeypatch, tmp_path, bodies, route):
    path = publish(site, monkeypatch, route, bodies[route])
    site.status[path] = (503, "Service Unavailable")
    with pytest.raises(DownloadError, match=r": HTTP 503 Service Unavailable\. Without network"):
        create_vit(NAME, pretrained=True)
    assert len(site.requests) == 1 and written(tmp_path) == []


# --- the hub cache: names read from it are checked too ---


def _hub_cache(tmp_path: Path, data: bytes, *, link: str | None = None, ref: str = COMMIT) -> Path:
    """NAME's repo in the hub cache as huggingface_hub lays it out, with ``link`` as the snapshot's link target."""
    repo = tmp_path / "hf" / f"models--timm--{NAME}.tag"
    sha256 = hashlib.sha256(data).hexdigest()
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs" / sha256).write_bytes(data)
    (repo / "snapshots" / COMMIT).mkdir(parents=True)
    (repo / "snapshots" / COMMIT / "model.safetensors").symlink_to(link or f"../../blobs/{sha256}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(ref)
    return repo


def test_a_file_huggingface_hub_cached_is_used_without_a_request(site, monkeypatch, tmp_path, bodies, model):
    publish(site, monkeypatch, "hub", bodies["hub"])
    _hub_cache(tmp_path, bodies["hub"])
    assert_loads(model)
    assert site.requests == []


@pytest.mark.parametrize(
    ("link", "ref"),
    [
        ("../../../../outside.safetensors", COMMIT),  # a link out of the cache
        (f"../../blobs/{'0' * 64}/../../../../outside.safetensors", COMMIT),
        (None, "../../../../x"),  # a ref that is no commit
        (None, "0" * 40),  # a ref to a commit not in the snapshots
    ],
)
def test_a_hub_cache_entry_that_leads_outside_its_blobs_is_not_used(site, monkeypatch, tmp_path, bodies, link, ref):
    publish(site, monkeypatch, "hub", bodies["hub"])
    (tmp_path / "outside.safetensors").write_bytes(bodies["hub"])
    _hub_cache(tmp_path, bodies["hub"], link=link, ref=ref)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DownloadError, match=r"HF_HUB_OFFLINE is set and the file is not in the hub cache"):
        create_vit(NAME, pretrained=True)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    create_vit(NAME, pretrained=True)  # fetched, and the entry made right
    repo = tmp_path / "hf" / f"models--timm--{NAME}.tag"
    sha256 = hashlib.sha256(bodies["hub"]).hexdigest()
    assert os.readlink(repo / "snapshots" / COMMIT / "model.safetensors") == f"../../blobs/{sha256}"
    assert (repo / "refs" / "main").read_text() == COMMIT and len(site.requests) == 1


def test_a_damaged_hub_blob_says_to_delete_it(site, monkeypatch, tmp_path, bodies):
    repo = _hub_cache(tmp_path, bodies["hub"])
    blob = next((repo / "blobs").iterdir())
    blob.write_bytes(bodies["hub"][:100])
    publish(site, monkeypatch, "hub", bodies["hub"])
    with pytest.raises(ValueError, match=rf"{blob}: the cached download of these weights is damaged .* delete it"):
        create_vit(NAME, pretrained=True)


# --- a download killed midway ---

_KILLED = {
    "torchvision": "from vit_einops.base.download import download; download({url!r}, {target!r}, "
                   "sha256_prefix={sha256!r}, max_bytes={cap})",
    "hub": "from vit_einops.base.download import download_hub_file; download_hub_file({url!r}, {target!r}, "
           "'model.safetensors', max_bytes={cap})",
}


@pytest.mark.parametrize("route", ROUTES)
def test_a_killed_download_leaves_only_its_temporary_and_the_next_removes_it(site, monkeypatch, tmp_path, bodies,
                                                                            model, route):
    """The reported three killed downloads left 49 GB: each left temporary is at most the cap, and the next download
    of the same file removes it. The killed process runs the download alone (no torch import: fast)."""
    data = bodies[route]
    path = publish(site, monkeypatch, route, data)
    site.stall.add(path)
    sha256 = hashlib.sha256(data).hexdigest()
    if route == "torchvision":
        folder = tmp_path / "torch" / "hub" / "checkpoints"
        target = folder / PRETRAINED[NAME].file
    else:
        target = tmp_path / "hf" / f"models--timm--{NAME}.tag"
        folder = target / "blobs"
    code = _KILLED[route].format(url=f"{site.url}/{path}", target=str(target), sha256=sha256[:8],
                                 cap=download_limit(NAME))
    process = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.DEVNULL)
    try:
        assert site.half_sent.wait(60)
        deadline = time.monotonic() + 30
        while not any(p.stat().st_size for p in folder.glob(".*.tmp")) and time.monotonic() < deadline:
            time.sleep(0.02)  # until the first bytes are on disk
    finally:
        process.kill()
        process.wait()
    temporaries = list(folder.glob(".*.tmp"))
    assert len(temporaries) == 1 and 0 < temporaries[0].stat().st_size <= download_limit(NAME)
    assert not (folder / (target.name if route == "torchvision" else sha256)).exists()
    site.stall.clear()
    assert_loads(model)
    assert not [p for p in written(tmp_path) if p.endswith((".tmp", ".lock"))]
    assert len([p for p in written(tmp_path) if "refs" not in p and "snapshots" not in p]) == 1


@pytest.mark.parametrize("max_bytes", [0, -1, True, 1.5, None])
def test_a_download_states_its_cap(tmp_path, max_bytes):
    with pytest.raises(ValueError, match=rf"max_bytes must be a positive int \(the most the file can be\), got "
                       rf"{max_bytes!r}"):
        _download.download("http://127.0.0.1:1/x", tmp_path / "x", sha256_prefix="0" * 8, max_bytes=max_bytes)
    with pytest.raises(ValueError, match=r"file must be a file name in the repository's root, got '\.\./x'"):
        _download.download_hub_file("http://127.0.0.1:1/x", tmp_path, "../x", max_bytes=1)
    assert list(tmp_path.iterdir()) == []


def test_a_long_reason_phrase_is_cut(site, monkeypatch, bodies):
    path = publish(site, monkeypatch, "torchvision", bodies["torchvision"])
    site.status[path] = (404, "x" * 5000)
    with pytest.raises(DownloadError, match=r": HTTP 404 x{200}\.\.\. \(5,000 characters\)\. Without network"):
        create_vit(NAME, pretrained=True)
