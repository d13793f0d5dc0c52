"""Verified downloads: a URL into a cache file that exists only once every byte has arrived and its hash matches.

The body streams into a temporary beside the target (:func:`vit_einops._io.atomic_write_chunks`), hashed as it
comes; it is renamed into place only if its length equals the server's Content-Length and its sha256 starts with
the expected prefix (torch.hub's convention: the prefix is in the published file's name). A refused, interrupted or
killed download leaves no file under the target's name, so a cache never holds a partial or corrupt copy. A
download holds the target's output lock (:func:`vit_einops._io.output_lock`) from the request to the commit: a
second process fetching the same file at that moment is told so at once, and the temporary of a killed download is
removed by the next one.
"""

from __future__ import annotations

import hashlib
import http.client
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from ._io import atomic_write_chunks, output_lock

CHUNK = 1 << 20
TIMEOUT_S = 60.0  # per blocking read: a stalled connection fails instead of hanging


class DownloadError(OSError):
    """A download that failed or was refused; the message is one line that names the URL."""


def download(url: str, path: str | Path, *, sha256_prefix: str, timeout: float = TIMEOUT_S) -> Path:
    """Fetch ``url`` into ``path`` (its directory is created), refusing a body that is cut short or whose sha256
    does not start with ``sha256_prefix`` (DownloadError; nothing is written at ``path``)."""
    if len(sha256_prefix) < 8 or any(c not in "0123456789abcdef" for c in sha256_prefix):
        raise ValueError(f"sha256_prefix must be at least 8 lowercase hex digits, got {sha256_prefix!r}")
    path = Path(path)
    with output_lock(path, parents=True):  # and the leftovers of a killed download are removed
        if path.is_file():  # another process finished it while this one waited to be called
            return path
        return _download(url, path, sha256_prefix, timeout)


def _download(url: str, path: Path, sha256_prefix: str, timeout: float) -> Path:
    digest = hashlib.sha256()
    received = 0
    try:
        response = urllib.request.urlopen(url, timeout=timeout)
    except urllib.error.HTTPError as err:
        raise DownloadError(f"could not download {url}: HTTP {err.code} {err.reason}") from None
    except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as err:
        # ValueError: a URL urllib cannot parse ("unknown url type"), e.g. from a mistyped $VIT_EINOPS_WEIGHTS_URL
        reason = err.reason if isinstance(err, urllib.error.URLError) else err
        raise DownloadError(f"could not download {url}: {reason}") from None
    length = response.headers.get("Content-Length")
    expected = int(length) if length is not None and length.isdigit() else None

    def chunks() -> Iterator[bytes]:
        nonlocal received
        while chunk := response.read(CHUNK):
            digest.update(chunk)
            received += len(chunk)
            yield chunk

    def check() -> None:
        if expected is not None and received != expected:
            raise DownloadError(f"refused {url}: received {received:,} of its {expected:,} bytes (cut short)")
        if not digest.hexdigest().startswith(sha256_prefix):
            raise DownloadError(
                f"refused {url}: its sha256 {digest.hexdigest()[:16]}... does not start with {sha256_prefix}"
            )

    print(f"downloading {url} to {path}", file=sys.stderr)
    with response:
        try:
            atomic_write_chunks(path, chunks(), check)
        except DownloadError:
            raise
        except (OSError, http.client.HTTPException) as err:  # the connection dropped, timed out, or the disk filled
            raise DownloadError(f"could not download {url}: {err!r} after {received:,} bytes") from None
    return path
