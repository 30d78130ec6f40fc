"""The API's HTTP server: uvicorn in a thread of the service process, on a socket bound
before it starts (so an ephemeral port is known at once and a taken port fails start-up)."""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Any

from edgesdk.errors import UsageError

log = logging.getLogger(__name__)


def parse_bind(text: str, option: str = "--api") -> tuple[str, int]:
    """``HOST:PORT`` (``:PORT`` = 127.0.0.1); UsageError naming the value otherwise."""
    host, _, port = text.rpartition(":")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise UsageError(f"bad {option} {text!r}: expected HOST:PORT, e.g. 127.0.0.1:8080")
    return host.strip("[]") or "127.0.0.1", int(port)


class ApiServer:
    """``start()`` binds and serves ``app``; ``port`` is the bound port; ``stop()`` ends it."""

    def __init__(self, app: Any, bind: str, *, option: str = "--api") -> None:
        self.app = app
        self.option = option
        self.host, self.requested_port = parse_bind(bind, option)
        self.port = 0
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def start(self) -> ApiServer:
        import uvicorn

        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.requested_port))
        except OSError as exc:
            sock.close()
            raise UsageError(f"cannot listen on {self.host}:{self.requested_port}: {exc.strerror or exc}") from exc
        sock.listen(128)
        self.port = int(sock.getsockname()[1])
        config = uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="fleet-api", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started and time.monotonic() < deadline and self._thread.is_alive():
            time.sleep(0.02)
        log.info("%s listening on http://%s:%d", "API" if self.option == "--api" else self.option, self.host, self.port)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(10)
