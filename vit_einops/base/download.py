"""Verified downloads: a URL into a cache file that exists only once every byte has arrived and its hash matches,
with every name, size and encoding the server sends checked by our rules before anything is written.

Two caches are written: torch.hub's (:func:`download`: one file whose name carries the first hex digits of its
sha256) and the Hugging Face hub's (:func:`download_hub_file`: ``blobs/<sha256>``, ``snapshots/<commit>/<file>``
linked to the blob, ``refs/main``; the layout huggingface_hub and timm read and write, so each reuses the other's
files). For every download:

- Size: the caller states the most the file can be (``max_bytes``: its weights' size). A declared size over it is
  refused before a byte is written; the body is read up to its declared size (the cap without one) plus one byte,
  and a body longer or shorter than declared is refused.
- Time: one deadline for the whole download, retries included: :data:`DEADLINE_BASE_S` plus the size at
  :data:`MIN_RATE`, or the time given as ``deadline`` or in ``$VIT_EINOPS_DOWNLOAD_DEADLINE`` (seconds, or "90s",
  "2min", "1h"). A watchdog closes the connection when it passes, so neither a drip of the headers nor of the body
  outlives it; each read also waits at most ``timeout`` seconds (:data:`TIMEOUT_S`), less when less time is left.
  Under the default deadline a body that falls behind :data:`MIN_RATE` once :data:`DEADLINE_BASE_S` have passed is
  given up then: at its average rate so far it would miss the deadline (at a steady rate, these are exactly the
  downloads that would), and a drip of a large file's body ends in about a minute, not at its deadline.
- Encoding: ``Accept-Encoding: identity`` is sent and a body with any other Content-Encoding is refused: nothing is
  ever decompressed.
- Redirects: at most :data:`MAX_REDIRECTS`, to http or https URLs only.
- Retries: a body cut short (the connection closed or reset) is fetched again from its start, at most
  :data:`ATTEMPTS` times in all, under the same deadline and cap; nothing else is retried: a read that waited
  ``timeout`` seconds for a byte (a stalled server), a refused connection, an unknown host and an HTTP error fail at
  once.
- Every string a server sends reaches a message through :func:`vit_einops.base.text.printable`.

The body streams into a temporary beside its target (:func:`vit_einops.base.io.atomic_write_chunks`), hashed as it
comes, and is renamed into place only once it passed every check; the target's output lock
(:func:`vit_einops.base.io.output_lock`) is held from the request to the commit, so a second process fetching the same
file is told so at once, and the temporary of a killed download is removed by the next one.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import re
import socket
import stat
import string
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from email.message import Message
from pathlib import Path
from typing import Any, TypeVar

from .budget import parse_seconds
from .io import atomic_write_bytes, atomic_write_chunks, output_lock, read_regular_file
from .text import printable

CHUNK = 1 << 20
TIMEOUT_S = 60.0  # per blocking read: a stalled connection fails instead of hanging
DEADLINE_BASE_S = 60.0  # the whole download's allowance beside its size: connecting, the headers, a slow start
MIN_RATE = 128 * 1024  # bytes/s (1 Mbit/s): a download that falls behind this rate is given up (module docstring)
DEADLINE_ENV = "VIT_EINOPS_DOWNLOAD_DEADLINE"  # a time that replaces every download's default deadline
ATTEMPTS = 2  # a body cut short is fetched once more, from its start
MAX_REDIRECTS = 5
_REDIRECTS = (301, 302, 303, 307, 308)

# The hub's names, checked before any of them becomes part of a path: a commit, and the sha256 that is the ETag
# of an LFS file (model.safetensors always is one).
_COMMIT = re.compile(r"[0-9a-f]{40}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_SIZE = re.compile(r"[0-9]{1,19}")  # digits only, and below 2**63
_MOST = "the most this file can be (its weights' size)"
_SHOWN = 200  # characters of a string a server sent, at most, in a message

T = TypeVar("T")


class DownloadError(OSError):
    """A download that failed or was refused; the message is one line that names the URL."""


class _CutShort(DownloadError):
    """A body that ended before its declared length: fetched again from its start while attempts are left."""


def download(
    url: str, path: str | Path, *, sha256_prefix: str, max_bytes: int, timeout: float = TIMEOUT_S,
    deadline: float | str | None = None,
) -> Path:
    """Fetch ``url`` into ``path`` (its directory is created), refusing a body over ``max_bytes``, one cut short,
    and one whose sha256 does not start with ``sha256_prefix`` (DownloadError; nothing is written at ``path``).
    ``deadline``: the time the whole download may take (module docstring; None: $VIT_EINOPS_DOWNLOAD_DEADLINE, else
    the default that grows with the size)."""
    if len(sha256_prefix) < 8 or any(c not in "0123456789abcdef" for c in sha256_prefix):
        raise ValueError(f"sha256_prefix must be at least 8 lowercase hex digits, got {sha256_prefix!r}")
    _check_max_bytes(max_bytes)
    allowed = _allowed(deadline)
    path = Path(path)

    def refuse_hash(digest: str) -> str | None:
        if digest.startswith(sha256_prefix):
            return None
        return f"its sha256 {digest[:16]}... does not start with {sha256_prefix}"

    def save(response: http.client.HTTPResponse, _: list[Message], deadline: _Deadline) -> Path:
        length = _content_length(url, response.headers)
        _check_declared(url, length, max_bytes)
        deadline.shorten(length)
        _save(url, response, path, length, max_bytes, deadline, timeout, refuse_hash)
        return path

    with output_lock(path, parents=True):  # and the leftovers of a killed download are removed
        if path.is_file():  # another process finished it while this one waited to be called
            return path
        return _fetch(url, max_bytes, timeout, allowed, save)


def download_hub_file(
    url: str, repo: str | Path, file: str, *, max_bytes: int, timeout: float = TIMEOUT_S,
    deadline: float | str | None = None,
) -> Path:
    """Fetch ``url``, a Hugging Face hub's ``/resolve/`` URL of ``file`` (an LFS file), into ``repo``, the hub cache's
    folder of its repository (``.../models--ORG--NAME``). Returns ``snapshots/<commit>/<file>``, a link to the blob.

    The hub's answer (the last response on the way that names a commit) must give the commit (X-Repo-Commit, 40
    lowercase hex digits), the file's sha256 (X-Linked-Etag, else ETag: 64 lowercase hex digits once its quotes and
    ``W/`` are stripped) and its size (X-Linked-Size, else Content-Length: digits); anything else is refused before a
    byte is written, so no name a server sends reaches a path unchecked. The body's sha256 must equal the ETag.
    A blob already cached under that sha256 is not downloaded again. ``timeout`` and ``deadline`` as
    :func:`download` takes them.
    """
    _check_max_bytes(max_bytes)
    allowed = _allowed(deadline)
    if not file or "/" in file or file in (".", ".."):
        raise ValueError(f"file must be a file name in the repository's root, got {file!r}")
    repo = Path(repo)

    def save(response: http.client.HTTPResponse, seen: list[Message], deadline: _Deadline) -> Path:
        commit, sha256, size = _hub_answer(url, seen, response.headers, max_bytes)
        deadline.shorten(size)
        blob = repo / "blobs" / sha256

        def refuse_hash(digest: str) -> str | None:
            return None if digest == sha256 else f"its sha256 {digest[:16]}... is not {sha256[:16]}..., its ETag"

        with output_lock(blob, parents=True):
            if not _is_regular_file(blob):
                _save(url, response, blob, size, max_bytes, deadline, timeout, refuse_hash)
            return _link_snapshot(url, repo, commit, file, sha256)

    return _fetch(url, max_bytes, timeout, allowed, save)


def cached_hub_file(repo: str | Path, file: str) -> Path | None:
    """``file`` of ``repo``'s main branch in the hub cache (as huggingface_hub or :func:`download_hub_file` left
    it), or None: ``refs/main`` must hold a commit (40 lowercase hex digits), and ``snapshots/<commit>/<file>``
    must resolve to a regular file directly inside ``repo/blobs`` named by a sha256. Returns that snapshot entry."""
    repo = Path(repo)
    commit = _main_commit(repo)
    if commit is None:
        return None
    entry = repo / "snapshots" / commit / file
    blob = Path(os.path.realpath(entry))
    if blob.parent != Path(os.path.realpath(repo / "blobs")) or not _SHA256.fullmatch(blob.name):
        return None
    return entry if _is_regular_file(blob) else None


def _allowed(deadline: float | str | None) -> tuple[float, str] | None:
    """The whole download's time in seconds and what set it, for the message: ``deadline``, else
    $VIT_EINOPS_DOWNLOAD_DEADLINE; None for neither (the default, from the size). A time that is none is a
    ValueError naming it, before any request."""
    if deadline is not None:
        return parse_seconds(deadline, "deadline"), f"deadline={deadline!r}"
    text = os.environ.get(DEADLINE_ENV)
    if text:
        return parse_seconds(text, DEADLINE_ENV), f"{DEADLINE_ENV}={text.strip()}"
    return None


def _check_max_bytes(max_bytes: int) -> None:
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
        raise ValueError(f"max_bytes must be a positive int (the most the file can be), got {max_bytes!r}")


def _is_regular_file(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _link_snapshot(url: str, repo: Path, commit: str, file: str, sha256: str) -> Path:
    """``snapshots/<commit>/<file>`` as a relative link to the blob, and ``refs/main`` naming the commit, as
    huggingface_hub lays them out; returns the link. A link there to another blob is replaced (this commit's file is
    the one just checked); anything else there is left as it is and refused."""
    entry = repo / "snapshots" / commit / file
    target = os.path.join("..", "..", "blobs", sha256)
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        if entry.is_symlink() and os.readlink(entry) != target:
            entry.unlink()
        if not os.path.lexists(entry):
            os.symlink(target, entry)
    except OSError as err:
        raise DownloadError(f"could not download {printable(url)}: linking {entry} to its blob: {err}") from None
    if not entry.is_symlink():
        raise DownloadError(
            f"refused {printable(url)}: {entry} is not a link into {repo / 'blobs'}; it is left as it is: delete it "
            f"to download again"
        )
    if _main_commit(repo) != commit:
        ref = repo / "refs" / "main"
        with output_lock(ref, parents=True):
            atomic_write_bytes(ref, commit.encode("ascii"))
    return entry


def _main_commit(repo: Path) -> str | None:
    """The commit ``refs/main`` names (huggingface_hub writes it without a newline), or None."""
    try:
        commit = read_regular_file(repo / "refs" / "main", max_bytes=64).decode("ascii").strip()
    except (OSError, ValueError):  # absent, not a regular file, not ASCII
        return None
    return commit if _COMMIT.fullmatch(commit) else None


class _Deadline:
    """The time one download may take, its retries included: ``allowed`` (seconds, and what set them), else
    :data:`DEADLINE_BASE_S` plus its size at :data:`MIN_RATE`, the size being the cap until the server declares a
    smaller one. A watchdog thread shuts the current connection's socket down when it passes: a read blocked on a
    drip (a header line, a chunk size, the body) returns at once."""

    def __init__(self, size: int, allowed: tuple[float, str] | None = None) -> None:
        self.start = time.monotonic()
        self.size = size
        self.allowed = allowed
        self.at = self.start + (allowed[0] if allowed else DEADLINE_BASE_S + size / MIN_RATE)
        self._socket: socket.socket | None = None
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._fired = False
        self._arm()

    def __enter__(self) -> _Deadline:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def shorten(self, size: int | None) -> None:
        """The deadline for a body of ``size`` bytes, if earlier than the present one (and no time was given)."""
        if size is not None and self.allowed is None and self.start + DEADLINE_BASE_S + size / MIN_RATE < self.at:
            self.size = size
            self.at = self.start + DEADLINE_BASE_S + size / MIN_RATE
            self._arm()

    def _arm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = threading.Timer(max(0.0, self.at - time.monotonic()), self._expire)
        self._timer.daemon = True
        self._timer.start()

    def _expire(self) -> None:
        with self._lock:
            self._fired = True
            self._shut()

    def _shut(self) -> None:
        if self._socket is not None:
            try:
                self._socket.shutdown(socket.SHUT_RDWR)  # a recv blocked on it returns
            except OSError:
                pass

    def watch(self, sock: socket.socket) -> None:
        """The socket of the connection just opened: the one shut at the deadline."""
        with self._lock:
            self._socket = sock
            if self._fired:
                self._shut()

    def expired(self) -> bool:
        return self._fired or time.monotonic() >= self.at

    def behind(self, received: int) -> bool:
        """Under the default deadline, whether ``received`` bytes are behind :data:`MIN_RATE` after the first
        :data:`DEADLINE_BASE_S` (module docstring)."""
        return self.allowed is None and time.monotonic() - self.start > DEADLINE_BASE_S + received / MIN_RATE

    def slow(self, url: str, received: int) -> DownloadError:
        return DownloadError(
            f"could not download {printable(url)}: {received:,} bytes in {time.monotonic() - self.start:.1f} s, "
            f"behind {MIN_RATE / 1024:g} KiB/s after the first {DEADLINE_BASE_S:g} s: at that rate it would not be "
            f"complete within {self.at - self.start:.1f} s, the time allowed for {self.size:,} bytes ({DEADLINE_ENV} "
            f"sets another)"
        )

    def timeout(self, per_read: float) -> float:
        """The socket timeout of the next operation: ``per_read``, or less if less time is left."""
        return max(0.001, min(per_read, self.at - time.monotonic()))

    def before_read(self, per_read: float) -> None:
        with self._lock:
            if self._socket is not None:
                self._socket.settimeout(self.timeout(per_read))

    def late(self, url: str, received: int | None = None) -> DownloadError:
        got = "" if received is None else f"; {received:,} bytes had arrived"
        if self.allowed is not None:
            allowed = f"the deadline {printable(self.allowed[1])} sets"
        else:
            allowed = (
                f"the time allowed for {self.size:,} bytes ({DEADLINE_BASE_S:g} s and {MIN_RATE / 1024:g} KiB/s; "
                f"{DEADLINE_ENV} sets another)"
            )
        return DownloadError(
            f"could not download {printable(url)}: not complete within {self.at - self.start:.1f} s, {allowed}{got}"
        )


class _Watched:
    """A connection handler whose connections hand their socket to the download's deadline once connected."""

    def __init__(self, deadline: _Deadline) -> None:
        super().__init__()
        self.deadline = deadline

    def do_open(
        self, http_class: type[http.client.HTTPConnection], req: urllib.request.Request, **kwargs: Any
    ) -> http.client.HTTPResponse:
        deadline = self.deadline

        class Connection(http_class):
            def connect(self) -> None:
                super().connect()
                deadline.watch(self.sock)

        return super().do_open(Connection, req, **kwargs)


class _HTTP(_Watched, urllib.request.HTTPHandler):
    pass


class _HTTPS(_Watched, urllib.request.HTTPSHandler):
    pass


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """Redirects come back as HTTPError: :func:`_open` follows them itself, checking each, never reading their
    bodies (urllib's handler reads a redirect's whole body into memory)."""

    def redirect_request(self, *args: object) -> None:
        return None


def _fetch(
    url: str, max_bytes: int, timeout: float, allowed: tuple[float, str] | None, save: Callable[..., T]
) -> T:
    """``save(response, headers of every response on the way, deadline)`` on the answer to a GET of ``url``, again
    from a new request if it raises _CutShort while attempts and time are left."""
    with _Deadline(max_bytes, allowed) as deadline:
        opener = urllib.request.build_opener(_NoRedirects(), _HTTP(deadline), _HTTPS(deadline))
        for attempt in range(1, ATTEMPTS + 1):
            response, seen = _open(opener, url, deadline, timeout)
            with response:
                _check_identity(url, response.headers)
                try:
                    return save(response, seen, deadline)
                except _CutShort as err:
                    if deadline.expired():
                        raise deadline.late(url) from None
                    if attempt == ATTEMPTS:
                        raise DownloadError(str(err)) from None
                    print(f"{err}; fetching it again from its start", file=sys.stderr)
    raise AssertionError("unreachable")


def _open(
    opener: urllib.request.OpenerDirector, url: str, deadline: _Deadline, timeout: float
) -> tuple[http.client.HTTPResponse, list[Message]]:
    """GET ``url`` with ``Accept-Encoding: identity``, following redirects to http and https URLs; returns the final
    response and the headers of every response on the way, the final one's last."""
    seen: list[Message] = []
    where = url
    for _ in range(MAX_REDIRECTS + 1):
        scheme = urllib.parse.urlsplit(where).scheme
        if scheme not in ("http", "https"):
            what = f"it redirects to '{_sent(where)}', which is" if where != url else "it is"
            raise DownloadError(f"could not download {printable(url)}: {what} not an http or https URL")
        request = urllib.request.Request(where, headers={"Accept-Encoding": "identity"})
        try:
            response = opener.open(request, timeout=deadline.timeout(timeout))
        except urllib.error.HTTPError as err:
            err.close()
            at = "" if where == url else f" (from {_sent(where)})"
            if err.code not in _REDIRECTS:
                raise DownloadError(
                    f"could not download {printable(url)}: HTTP {err.code} {_sent(err.reason)}{at}"
                ) from None
            location = err.headers.get("Location")
            if location is None:
                raise DownloadError(f"refused {printable(url)}: HTTP {err.code} without a Location{at}") from None
            seen.append(err.headers)
            where = urllib.parse.urljoin(where, urllib.parse.quote(location, safe=string.punctuation))
        except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as err:
            if deadline.expired():
                raise deadline.late(url) from None
            # ValueError: a URL urllib cannot parse, e.g. from a mistyped $VIT_EINOPS_WEIGHTS_URL
            reason = err.reason if isinstance(err, urllib.error.URLError) else err
            raise DownloadError(f"could not download {printable(url)}: {_sent(reason)}") from None
        else:
            if deadline.expired():  # the watchdog ended the headers early: http.client takes what came as all
                response.close()
                raise deadline.late(url)
            return response, [*seen, response.headers]
    raise DownloadError(f"refused {printable(url)}: more than {MAX_REDIRECTS} redirects")


def _sent(text: object) -> str:
    """A string a server sent, for a message: escaped (:func:`vit_einops.base.text.printable`) and cut to its first
    :data:`_SHOWN` characters."""
    text = str(text)
    return printable(text[:_SHOWN]) + (f"... ({len(text):,} characters)" if len(text) > _SHOWN else "")


def _single(url: str, headers: Message, name: str) -> str | None:
    """The one value of header ``name`` (stripped), None if absent; two different values are refused."""
    values = {value.strip() for value in headers.get_all(name) or ()}
    if len(values) > 1:
        shown = ", ".join(f"'{_sent(v)}'" for v in sorted(values))
        raise DownloadError(f"refused {printable(url)}: it sends {len(values)} different {name} headers ({shown})")
    return values.pop() if values else None


def _byte_count(url: str, value: str | None, name: str) -> int | None:
    if value is None:
        return None
    if not _SIZE.fullmatch(value):
        raise DownloadError(f"refused {printable(url)}: its {name} '{_sent(value)}' is not a number of bytes")
    return int(value)


def _content_length(url: str, headers: Message) -> int | None:
    return _byte_count(url, _single(url, headers, "Content-Length"), "Content-Length")


def _check_declared(url: str, size: int | None, max_bytes: int) -> None:
    if size is not None and size > max_bytes:
        raise DownloadError(
            f"refused {printable(url)}: it declares {size:,} bytes, more than {max_bytes:,}, {_MOST}"
        )


def _check_identity(url: str, headers: Message) -> None:
    """Refuse a body sent compressed (or in any coding but identity): it is never decompressed, so its size and
    hash are those of the bytes that arrive."""
    for coding in headers.get_all("Content-Encoding") or ():
        if coding.strip().lower() not in ("", "identity"):
            raise DownloadError(
                f"refused {printable(url)}: its body has Content-Encoding '{_sent(coding.strip())}'; only "
                f"identity is accepted (nothing is decompressed)"
            )


def _hub_answer(url: str, seen: list[Message], final: Message, max_bytes: int) -> tuple[str, str, int]:
    """The commit, sha256 and size the hub's answer gives, each checked (see :func:`download_hub_file`)."""
    hub = next((headers for headers in reversed(seen) if headers.get("X-Repo-Commit") is not None), None)
    if hub is None:
        raise DownloadError(f"refused {printable(url)}: no X-Repo-Commit header (not a Hugging Face hub's answer)")
    commit = _single(url, hub, "X-Repo-Commit")
    if not _COMMIT.fullmatch(commit):
        raise DownloadError(
            f"refused {printable(url)}: its X-Repo-Commit '{_sent(commit)}' is not a commit (40 lowercase hex "
            f"digits)"
        )
    etag = _single(url, hub, "X-Linked-Etag") or _single(url, hub, "ETag")
    sha256 = (etag or "").removeprefix("W/").removeprefix('"').removesuffix('"')
    if not _SHA256.fullmatch(sha256):
        shown = "no ETag" if etag is None else f"its ETag '{_sent(etag)}' is not a sha256 (64 lowercase hex digits)"
        raise DownloadError(f"refused {printable(url)}: {shown}, as the hub sends for a file stored with LFS")
    declared = _single(url, hub, "X-Linked-Size")
    name = "X-Linked-Size"
    if declared is None and hub is final:  # not redirected: the hub's own response carries the body
        declared, name = _single(url, hub, "Content-Length"), "Content-Length"
    size = _byte_count(url, declared, name)
    if size is None:
        raise DownloadError(f"refused {printable(url)}: no X-Linked-Size header (the file's size)")
    _check_declared(url, size, max_bytes)
    length = _content_length(url, final)
    if length is not None and length != size:
        raise DownloadError(f"refused {printable(url)}: its Content-Length {length:,} is not its {name} {size:,}")
    return commit, sha256, size


def _save(
    url: str,
    response: http.client.HTTPResponse,
    path: Path,
    length: int | None,
    max_bytes: int,
    deadline: _Deadline,
    timeout: float,
    refuse_hash: Callable[[str], str | None],
) -> None:
    """Stream ``response``'s body into ``path`` (atomically), reading at most ``length`` (else ``max_bytes``) plus
    one bytes, each read under the deadline; committed only if no more and (with a ``length``) no fewer bytes came
    and ``refuse_hash`` of their sha256 says nothing."""
    bound = length if length is not None else max_bytes
    digest = hashlib.sha256()
    received = 0

    def chunks() -> Iterator[bytes]:
        nonlocal received
        while True:
            try:
                deadline.before_read(timeout)
                chunk = response.read1(min(CHUNK, bound + 1 - received))
            except (OSError, http.client.HTTPException) as err:  # the connection dropped or stalled
                if deadline.expired():
                    raise deadline.late(url, received) from None
                if isinstance(err, TimeoutError):  # a stalled server: fetching it all again would stall as well
                    raise DownloadError(
                        f"could not download {printable(url)}: no byte came for {timeout:g} s (the per-read timeout) "
                        f"after {received:,} bytes; not retried"
                    ) from None
                raise _CutShort(
                    f"could not download {printable(url)}: {_sent(repr(err))} after {received:,} bytes"
                ) from None
            if not chunk:
                if deadline.expired():
                    raise deadline.late(url, received)
                return
            received += len(chunk)
            if received > bound:
                limit = f"the {length:,} it declared" if length is not None else f"{max_bytes:,}, {_MOST}"
                raise DownloadError(f"refused {printable(url)}: it sent more bytes than {limit}")
            if deadline.behind(received):
                raise deadline.slow(url, received)
            digest.update(chunk)
            yield chunk

    def check() -> None:
        if length is not None and received != length:
            raise _CutShort(f"refused {printable(url)}: received {received:,} of its {length:,} bytes (cut short)")
        refused = refuse_hash(digest.hexdigest())
        if refused is not None:
            raise DownloadError(f"refused {printable(url)}: {refused}")

    print(f"downloading {printable(url)} to {path}", file=sys.stderr)
    try:
        atomic_write_chunks(path, chunks(), check)
    except DownloadError:
        raise
    except OSError as err:  # writing: the disk is full, the folder read-only
        raise DownloadError(f"could not download {printable(url)} to {path}: {err}") from None
