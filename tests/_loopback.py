"""A real HTTP server on 127.0.0.1 for the download tests: it serves files made in the test, and nothing else is
contacted. Each path can be made to misbehave, as a hostile or broken server would:

- ``truncate``: the file's full Content-Length but only its first half, then the connection closes;
- ``stall``: the first half, then ``half_sent`` is set and the rest waits for ``release``;
- ``endless``: after the file's bytes, zeros until the client hangs up (whatever Content-Length says);
- ``length``: the Content-Length sent instead of the file's (None: no Content-Length at all);
- ``drip``: the body one byte every so many seconds; ``drip_headers``: the status line and headers so;
- ``paced``: the body one byte per release of the path's semaphore (the test releases it as the client asks);
- ``status``: a status code and reason phrase (sent as given, control characters included) instead of 200 OK;
- ``redirects``: a 302 to the given Location, with the path's ``headers`` and its file as the 302's body.

``requests`` records each request's method and path, ``request_headers`` its headers, and ``sent`` the body bytes
each path had written to its socket.
"""

from __future__ import annotations

import socket
import socketserver
import threading
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Site:
    url: str
    files: dict[str, bytes] = field(default_factory=dict)  # path (no leading "/") -> body
    headers: dict[str, dict[str, str]] = field(default_factory=dict)  # path -> extra response headers
    truncate: set[str] = field(default_factory=set)
    stall: set[str] = field(default_factory=set)
    endless: set[str] = field(default_factory=set)
    length: dict[str, str | None] = field(default_factory=dict)
    drip: dict[str, float] = field(default_factory=dict)  # path -> seconds between the body's bytes
    drip_headers: dict[str, float] = field(default_factory=dict)  # path -> seconds between the headers' bytes
    paced: dict[str, threading.Semaphore] = field(default_factory=dict)  # path -> one body byte per release
    status: dict[str, tuple[int, str]] = field(default_factory=dict)
    redirects: dict[str, str] = field(default_factory=dict)  # path -> Location
    half_sent: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    closing: threading.Event = field(default_factory=threading.Event)  # the server is shutting down
    requests: list[tuple[str, str]] = field(default_factory=list)  # (method, path) in arrival order
    request_headers: list[dict[str, str]] = field(default_factory=list)
    sent: dict[str, int] = field(default_factory=lambda: defaultdict(int))


class _Server(ThreadingHTTPServer):
    def server_bind(self) -> None:
        # HTTPServer.server_bind looks up the host's fully qualified name, a DNS query that stalls offline.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = "127.0.0.1", self.server_address[1]


@contextmanager
def serve() -> Iterator[Site]:
    site = Site(url="")

    class Handler(BaseHTTPRequestHandler):
        def _write(self, path: str | None, data: bytes) -> bool:
            """Write ``data`` (counted as ``path``'s body when a path is given); False once the client is gone."""
            try:
                self.wfile.write(data)
                self.wfile.flush()
            except OSError:
                return False
            if path is not None:
                site.sent[path] += len(data)
            return True

        def _respond(self, body: bool) -> None:
            path = self.path.split("?", 1)[0].lstrip("/")
            site.requests.append((self.command, path))
            site.request_headers.append(dict(self.headers))
            if path in site.redirects:
                code, reason = 302, "Found"
                headers = {"Location": site.redirects[path]}
                data = site.files.get(path, b"")
            elif path in site.files:
                code, reason = site.status.get(path, (200, "OK"))
                headers, data = {}, site.files[path]
            else:
                self.send_error(404)
                return
            length = site.length.get(path, str(len(data)))
            if length is not None:
                headers["Content-Length"] = length
            headers.update(site.headers.get(path, {}))
            head = f"HTTP/1.0 {code} {reason}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
            self.close_connection = True
            if path in site.drip_headers:
                for byte in head.encode("latin-1"):
                    if site.closing.wait(site.drip_headers[path]) or not self._write(None, bytes([byte])):
                        return
            elif not self._write(None, head.encode("latin-1")):
                return
            if body:
                self._body(path, data)

        def _body(self, path: str, data: bytes) -> None:
            half = len(data) // 2
            if path in site.truncate:
                self._write(path, data[:half])
                return
            if path in site.stall:
                self._write(path, data[:half])
                site.half_sent.set()
                site.release.wait(60)
                self._write(path, data[half:])  # False when the client was killed meanwhile
                return
            if path in site.drip:
                for byte in data:
                    if site.closing.wait(site.drip[path]) or not self._write(path, bytes([byte])):
                        return
            elif path in site.paced:
                for byte in data:
                    while not site.paced[path].acquire(timeout=0.05):  # short: the server's shutdown waits for it
                        if site.closing.is_set():
                            return
                    if not self._write(path, bytes([byte])):
                        return
            elif not self._write(path, data):
                return
            if path in site.endless:
                zeros = bytes(1 << 16)
                while not site.closing.is_set() and self._write(path, zeros):
                    pass

        def do_GET(self) -> None:
            self._respond(body=True)

        def do_HEAD(self) -> None:
            self._respond(body=False)

        def log_message(self, *args: object) -> None:  # keep the test output clean
            pass

    server = _Server(("127.0.0.1", 0), Handler)
    site.url = f"http://127.0.0.1:{server.server_address[1]}"
    # A short poll: shutdown() waits for it, at the end of every test that serves.
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield site
    finally:
        site.closing.set()
        site.release.set()
        server.shutdown()
        server.server_close()


def closed_port_url() -> str:
    """A URL on 127.0.0.1 where nothing listens: connecting is refused at once, as offline."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"
