"""A real HTTP endpoint for webhook tests (``http.server`` on 127.0.0.1) that keeps every POST
it gets, headers and raw body, for the test to check the signature; and a port nobody listens on."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Receiver:
    """A real HTTP endpoint that keeps every POST it gets (headers and raw body)."""

    server: ThreadingHTTPServer
    got: list[tuple[dict[str, str], bytes]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def wait_for(self, event: str, about: bytes = b"", timeout: float = 60) -> tuple[dict[str, str], bytes]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for headers, body in list(self.got):
                if headers.get("X-Edgesdk-Event") == event and about in body:
                    return headers, body
            time.sleep(0.1)
        raise AssertionError(f"no {event} in {[h.get('X-Edgesdk-Event') for h, _ in self.got]}")


@contextmanager
def running_receiver() -> Iterator[Receiver]:
    """A receiver answering 204 to every POST, for the ``with`` block."""
    got: list[tuple[dict[str, str], bytes]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers["Content-Length"]))
            got.append((dict(self.headers.items()), body))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *_args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield Receiver(server, got)
    server.shutdown()
    server.server_close()


def closed_port() -> int:
    """A local port with nothing listening (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
