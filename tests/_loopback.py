"""A real HTTP server on 127.0.0.1 for the download tests: it serves files made in the test, and nothing else is
contacted. ``truncate`` sends a file's full Content-Length but only its first half, then closes the connection;
``stall`` sends the first half, sets ``half_sent``, and waits for ``release`` before the rest."""

from __future__ import annotations

import socket
import socketserver
import threading
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
    half_sent: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    requests: list[tuple[str, str]] = field(default_factory=list)  # (method, path) in arrival order


class _Server(ThreadingHTTPServer):
    def server_bind(self) -> None:
        # HTTPServer.server_bind looks up the host's fully qualified name, a DNS query that stalls offline.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = "127.0.0.1", self.server_address[1]


@contextmanager
def serve() -> Iterator[Site]:
    site = Site(url="")

    class Handler(BaseHTTPRequestHandler):
        def _respond(self, body: bool) -> None:
            path = self.path.split("?", 1)[0].lstrip("/")
            site.requests.append((self.command, path))
            data = site.files.get(path)
            if data is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            for key, value in site.headers.get(path, {}).items():
                self.send_header(key, value)
            self.end_headers()
            if not body:
                return
            self.close_connection = True
            half = len(data) // 2
            if path in site.truncate:
                self.wfile.write(data[:half])
            elif path in site.stall:
                self.wfile.write(data[:half])
                self.wfile.flush()
                site.half_sent.set()
                site.release.wait(60)
                try:
                    self.wfile.write(data[half:])
                except OSError:  # the client was killed meanwhile
                    pass
            else:
                self.wfile.write(data)

        def do_GET(self) -> None:
            self._respond(body=True)

        def do_HEAD(self) -> None:
            self._respond(body=False)

        def log_message(self, *args: object) -> None:  # keep the test output clean
            pass

    server = _Server(("127.0.0.1", 0), Handler)
    site.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield site
    finally:
        site.release.set()
        server.shutdown()
        server.server_close()


def closed_port_url() -> str:
    """A URL on 127.0.0.1 where nothing listens: connecting is refused at once, as offline."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"
