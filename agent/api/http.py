"""A small, strict HTTP/1.1 server on asyncio: keep-alive, pipelining, hard limits.

Why not a framework: the agent answers a handful of routes on loopback, and the request
path must stay a few microseconds over the inference itself (the issue asks for at least
twice the throughput of a FastAPI wrapper). What a framework would give us for free is
written out here on purpose:

* header block limited to ``max_header_bytes``; a client that has not sent its whole
  header block ``header_timeout_s`` after its first byte is cut off with 408 (slowloris);
* ``Content-Length`` checked against ``max_body_bytes`` BEFORE any body byte is read (413);
  the body must then arrive within ``body_timeout_s``; chunked uploads are refused (411);
* an idle keep-alive connection is closed after ``keepalive_timeout_s``;
* a handler error is a 500 for that request only, never the end of the server.

Handlers get a :class:`Request` and a ``respond`` callback, so a cheap route answers inline
and an inference answers later from a thread-pool future without a task per request.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any
from urllib.parse import unquote

from edgesdk.errors import AgentError

log = logging.getLogger("edgesdk.agent.api")

_REASONS = {s.value: s.phrase for s in HTTPStatus}
_MAX_HEADERS = 100


@dataclass(frozen=True)
class HttpLimits:
    max_header_bytes: int = 16 * 1024
    max_body_bytes: int = 16 * 1024 * 1024
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    keepalive_timeout_s: float = 15.0
    max_connections: int = 256


@dataclass
class Request:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes = b""
    keep_alive: bool = True


@dataclass
class Response:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: list[tuple[str, str]] = field(default_factory=list)


Respond = Callable[[Response], None]
Handler = Callable[[Request, Respond], None]


def _encode_response(response: Response, keep_alive: bool) -> bytes:
    reason = _REASONS.get(response.status, "Unknown")
    lines = [
        f"HTTP/1.1 {response.status} {reason}",
        f"Content-Type: {response.content_type}",
        f"Content-Length: {len(response.body)}",
    ]
    lines.extend(f"{name}: {value}" for name, value in response.headers)
    if not keep_alive:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _error(status: int, message: str) -> Response:
    import json

    return Response(status, json.dumps({"error": message}).encode())


class _BadRequest(AgentError):
    """A request this server refuses before any handler sees it (bad framing, over a limit).

    It never leaves this module: the connection answers it with ``status`` and closes. It is
    still an AgentError so that every exception edgesdk defines sits in one tree."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class HttpProtocol(asyncio.Protocol):
    """One connection. States: reading headers → reading body → busy (handler) → headers…"""

    def __init__(self, handler: Handler, limits: HttpLimits, server: HttpServer) -> None:
        self.handler = handler
        self.limits = limits
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.loop = asyncio.get_running_loop()
        self._buffer = bytearray()
        self._pending: Request | None = None  # headers parsed, waiting for the body
        self._body_length = 0
        self._busy = False
        self._closing = False
        self._paused = False
        self._timer: asyncio.TimerHandle | None = None
        self._timer_kind = ""

    # -- connection events --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if len(self.server.connections) >= self.limits.max_connections:
            # Idle sockets cost memory and descriptors: past the limit, refuse at once.
            self.server.refused += 1
            self._send(
                Response(503, b'{"error":"too many connections"}', headers=[("Retry-After", "1")]), keep_alive=False
            )
            return
        self.server.connections.add(self)
        self._arm("idle", self.limits.keepalive_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self._disarm()
        self.server.connections.discard(self)

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if self._busy:
            # Pipelined bytes wait; do not let a client pile up unbounded data meanwhile.
            if len(self._buffer) > self.limits.max_body_bytes + self.limits.max_header_bytes and not self._paused:
                self.transport.pause_reading()  # type: ignore[union-attr]
                self._paused = True
            return
        self._advance()

    # -- timers -------------------------------------------------------------------------------

    def _arm(self, kind: str, seconds: float) -> None:
        self._disarm()
        self._timer_kind = kind
        self._timer = self.loop.call_later(seconds, self._timed_out)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
            self._timer_kind = ""

    def _timed_out(self) -> None:
        self._timer = None
        if self._closing or self.transport is None:
            return
        if self._timer_kind == "idle" and not self._buffer:
            self.transport.close()
            return
        self.server.on_slow_client()
        log.info("client too slow (%s timeout): closing", self._timer_kind or "header")
        self._send(
            _error(408, f"request not received in time ({self._timer_kind or 'header'} timeout)"), keep_alive=False
        )

    # -- parsing ------------------------------------------------------------------------------

    def _advance(self) -> None:
        while not self._busy and not self._closing:
            if self._pending is None:
                if not self._buffer:
                    return
                if self._timer_kind != "header":
                    self._arm("header", self.limits.header_timeout_s)
                end = self._buffer.find(b"\r\n\r\n")
                if end < 0:
                    if len(self._buffer) > self.limits.max_header_bytes:
                        self._send(
                            _error(431, f"header block over {self.limits.max_header_bytes} bytes"), keep_alive=False
                        )
                    return
                if end > self.limits.max_header_bytes:
                    self._send(_error(431, f"header block over {self.limits.max_header_bytes} bytes"), keep_alive=False)
                    return
                head = bytes(self._buffer[:end])
                del self._buffer[: end + 4]
                try:
                    self._pending, self._body_length = self._parse_head(head)
                except _BadRequest as exc:
                    self._send(_error(exc.status, str(exc)), keep_alive=False)
                    return
                if self._body_length:
                    if self._pending.headers.get("expect", "").lower() == "100-continue":
                        self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # type: ignore[union-attr]
                    self._arm("body", self.limits.body_timeout_s)
            request = self._pending
            if len(self._buffer) < self._body_length:
                return
            if self._body_length:
                request.body = bytes(self._buffer[: self._body_length])
                del self._buffer[: self._body_length]
            self._pending = None
            self._body_length = 0
            self._dispatch(request)

    def _parse_head(self, head: bytes) -> tuple[Request, int]:
        try:
            text = head.decode("latin-1")
        except UnicodeDecodeError as exc:  # pragma: no cover - latin-1 decodes every byte
            raise _BadRequest(400, "undecodable header block") from exc
        lines = text.split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise _BadRequest(400, f"malformed request line {lines[0][:80]!r}")
        method, target, version = parts
        if len(lines) - 1 > _MAX_HEADERS:
            raise _BadRequest(431, f"more than {_MAX_HEADERS} header fields")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip():
                raise _BadRequest(400, f"malformed header line {line[:80]!r}")
            key = name.lower()
            value = value.strip()
            if key == "content-length" and key in headers and headers[key] != value:
                raise _BadRequest(400, "conflicting Content-Length headers")
            headers[key] = value
        if "transfer-encoding" in headers:
            raise _BadRequest(411, "chunked or encoded bodies are not accepted; send Content-Length")
        raw_length = headers.get("content-length", "0")
        if not raw_length.isdigit():
            raise _BadRequest(400, f"invalid Content-Length {raw_length!r}")
        length = int(raw_length)
        if length > self.limits.max_body_bytes:
            # Refused before a single body byte is read.
            self.server.on_oversized()
            raise _BadRequest(413, f"body of {length} bytes is over the limit of {self.limits.max_body_bytes} bytes")
        connection = headers.get("connection", "").lower()
        keep_alive = connection != "close" if version == "HTTP/1.1" else connection == "keep-alive"
        path, _, query = target.partition("?")
        return Request(method, unquote(path), query, headers, keep_alive=keep_alive), length

    # -- dispatch -------------------------------------------------------------------------------

    def _dispatch(self, request: Request) -> None:
        self._busy = True
        self._disarm()
        answered = False

        def respond(response: Response) -> None:
            nonlocal answered
            if answered:
                return
            answered = True
            keep = request.keep_alive and not self.server.draining
            self._send(response, keep_alive=keep, head_only=request.method == "HEAD")
            if keep and not self._closing:
                self._busy = False
                if self._paused and self.transport is not None:
                    self._paused = False
                    self.transport.resume_reading()
                if self._buffer:
                    self._advance()
                else:
                    self._arm("idle", self.limits.keepalive_timeout_s)

        try:
            self.handler(request, respond)
        except Exception:  # noqa: BLE001 - one broken request must never take the server down
            log.exception("handler failed on %s %s", request.method, request.path)
            respond(_error(500, "internal error"))

    def _send(self, response: Response, *, keep_alive: bool, head_only: bool = False) -> None:
        transport = self.transport
        if transport is None or self._closing or transport.is_closing():
            return
        head = _encode_response(response, keep_alive)
        transport.writelines((head,) if head_only else (head, response.body))
        if not keep_alive:
            self._closing = True
            self._disarm()
            transport.close()


class HttpServer:
    """The listening sockets (TCP and/or Unix) sharing one handler and one set of limits."""

    def __init__(self, handler: Handler, limits: HttpLimits) -> None:
        self.handler = handler
        self.limits = limits
        self.connections: set[HttpProtocol] = set()
        self.draining = False
        self._servers: list[asyncio.AbstractServer] = []
        self.slow_clients = 0
        self.oversized = 0
        self.refused = 0

    def on_slow_client(self) -> None:
        self.slow_clients += 1

    def on_oversized(self) -> None:
        self.oversized += 1

    def _factory(self) -> HttpProtocol:
        return HttpProtocol(self.handler, self.limits, self)

    async def listen_tcp(self, host: str, port: int) -> int:
        """Start listening; returns the bound port (useful with port 0)."""
        loop = asyncio.get_running_loop()
        server = await loop.create_server(self._factory, host, port, reuse_address=True, backlog=1024)
        self._servers.append(server)
        sock = server.sockets[0]
        return int(sock.getsockname()[1])

    async def listen_unix(self, path: str, mode: int = 0o660) -> None:
        import os

        loop = asyncio.get_running_loop()
        if os.path.exists(path):
            os.unlink(path)  # a socket left by a crashed agent
        server = await loop.create_unix_server(self._factory, path)
        os.chmod(path, mode)
        self._servers.append(server)

    async def stop_listening(self) -> None:
        """Stop accepting; open connections finish their current request, then close."""
        self.draining = True
        for server in self._servers:
            # Not wait_closed(): from Python 3.12 it also waits for every open connection.
            server.close()
        self._servers.clear()

    def close_idle(self) -> None:
        for conn in list(self.connections):
            if not conn._busy and conn.transport is not None:
                conn.transport.close()


def json_response(status: int, payload: Any, headers: list[tuple[str, str]] | None = None) -> Response:
    """A JSON response (the API's default)."""
    import json

    return Response(status, json.dumps(payload).encode(), headers=headers or [])
