"""A small, strict HTTP/1.1 server on asyncio: keep-alive, pipelining, hard limits.

Parsing is httptools (Node's llhttp, in C); the event loop is uvloop when the daemon finds it.
Why not a framework: the agent answers a handful of routes on loopback, and the request path
must stay a few microseconds over the inference itself. What a framework would give us for
free is written out here on purpose, around the C parser:

* header block limited to ``max_header_bytes`` (431); a client that has not sent its whole
  header block ``header_timeout_s`` after its first byte is cut off with 408 (slowloris);
* ``Content-Length`` checked against ``max_body_bytes`` BEFORE any body byte is read (413),
  and against the memory budget all connections share (``max_inflight_bytes``: bodies being
  read or waiting, plus the arrays decoded from them; 503 with Retry-After when it is full);
  the body must then arrive within ``body_timeout_s``; chunked uploads are refused (411),
  because their size is only known once they have been read;
* a body is charged to that budget by the bytes that have ARRIVED, not by the bytes it
  declares: a client that declares 16 MB and sends a byte a second holds a byte of it, not
  16 MB (issue 37, finding 6: nine such clients used to hold the whole budget, and every
  other request got 503). A read that does not fit the budget any more is a 503 then;
* a header block and a body must each keep arriving at ``min_rate_bytes_s`` on average,
  counted from their first byte after ``min_rate_grace_s`` (Apache's mod_reqtimeout MinRate):
  a byte a second is cut off with 408 after a few seconds, not after the whole timeout;
* at ``max_connections``, a new connection is still admitted while an old one can make room:
  the oldest connection inside an unfinished header block goes first, else the one idle the
  longest (nothing asked yet, or between keep-alive requests); only when every connection is
  reading a body or being answered is the new one refused with 503. A slowloris crowd can no
  longer lock the door: each client that comes in pushes one of them out. Connections from
  one address other than loopback are capped at ``max_connections_per_client`` (503 beyond);
  loopback and the Unix socket are not, since every local client shares one address there;
* anything llhttp rejects (a TLS ClientHello on the plain port, a bad or overflowing
  Content-Length, request smuggling shapes) is a 400 and the connection closes;
* an idle keep-alive connection is closed after ``keepalive_timeout_s``;
* a read that holds exactly a header block the server has parsed before and its body (a
  keep-alive client repeating its request) is answered without the parser's callbacks, from
  what the parser made of that block the first time (``KnownHead``), and, when the handler has
  given that block an inline route (``InlineRoute``), without a Request or Response at all;
* a client that half-closes its sending side still gets the answers it asked for;
* a handler error is a 500 for that request only, never the end of the server.

Handlers get a :class:`Request` and a ``respond`` callback, so a cheap route answers inline
and an inference answers later from a thread-pool future without a task per request.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import logging
import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Protocol
from urllib.parse import unquote

import httptools
import orjson
from edgesdk.agent.api.answer import AnswerFields, dumps
from edgesdk.agent.api.budget import Allowance, BudgetRefused, InflightBytesBudget

from edgesdk.errors import AgentError

log = logging.getLogger("edgesdk.agent.api")

_REASONS = {s.value: s.phrase for s in HTTPStatus}
_MAX_HEADERS = 100
#: Below this a response goes out as one buffer (one send); above, head and body separately.
_COALESCE_BYTES = 64 * 1024

_CLOSE = "Connection: close\r\n"

#: Header names as sent → lower-case str. Clients send the same few names with every request;
#: bounded, since names are the client's to choose.
_HEADER_NAMES: dict[bytes, str] = {}
_HEADER_NAMES_MAX = 512

# Where the parser is within the current message.
_IDLE, _HEAD, _BODY = 0, 1, 2

#: Header blocks remembered per server (see ``KnownHead``), and the longest one remembered.
_KNOWN_HEADS_MAX = 64
_KNOWN_HEAD_BYTES = 2048


@dataclass(frozen=True)
class HttpLimits:
    max_header_bytes: int = 16 * 1024
    max_body_bytes: int = 16 * 1024 * 1024
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    keepalive_timeout_s: float = 15.0
    max_connections: int = 256
    #: Bodies in flight plus their decoded arrays, all connections together (None: 8 bodies).
    max_inflight_bytes: int | None = None
    #: Arrays one request may decode to (None: ``max_body_bytes``, what raw tensors could carry).
    max_decoded_bytes: int | None = None
    #: A header block and a body must each arrive at least this fast on average (0: no minimum).
    min_rate_bytes_s: int = 1024
    #: ... counted after this long from their first byte.
    min_rate_grace_s: float = 2.0
    #: Open connections from one address (loopback and the Unix socket are not counted).
    max_connections_per_client: int = 64

    @property
    def inflight_bytes(self) -> int:
        return self.max_inflight_bytes if self.max_inflight_bytes is not None else 8 * self.max_body_bytes

    @property
    def decoded_bytes(self) -> int:
        return self.max_decoded_bytes if self.max_decoded_bytes is not None else self.max_body_bytes


@dataclass(slots=True)
class Request:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    #: bytes when it arrived in one read, a bytearray when it was gathered from several.
    body: bytes | bytearray = b""
    keep_alive: bool = True
    #: Its share of the server's memory budget (None: no body); released once it is answered.
    allowance: Allowance | None = None
    #: The remembered header block it came with, when it has one (see KnownHead.route).
    known: KnownHead | None = None


@dataclass(slots=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: list[tuple[str, str]] = field(default_factory=list)
    #: More header lines, formatted already (``Name: value\r\n`` each), sent after ``headers``:
    #: for answers whose headers repeat (a prepared route's), formatted once, not per answer.
    head_lines: str = ""


@dataclass(slots=True)
class KnownHead:
    """What llhttp made of one exact header block, which the server accepted whole.

    A client on a keep-alive connection sends the same header block with every request
    (same method, path, headers, Content-Length): wrk, tritonclient and requests all do. When a
    read holds exactly such a block and its body, nothing in the block can parse differently
    the second time (llhttp is between messages, the limits are the server's), so the request
    is built from this without the parser's eight callbacks into Python, which cost more than
    the rest of a tiny model's HTTP handling. Only what depends on the moment is done again:
    the body's share of the memory budget, the timers, the answer.

    ``route`` and ``settled`` are the server's handler's, never set here: the route it
    prepared for every request with this block (agent/api/prepared.py), which answers such
    requests before any Request is made, and whether it has decided (a block may have no route
    for good). The fields above them never change once the block is remembered."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    length: int
    keep_alive: bool
    #: The block's bytes, and the length of a read that holds it and its body.
    block: bytes = b""
    read: int = 0
    route: InlineRoute | None = None
    settled: bool = False


class InlineRoute(Protocol):
    """What a handler prepares for one known header block (``KnownHead.route``): it answers a
    request of that block from its body alone, on the spot, or declines.

    Why: a tiny model's inference takes tens of microseconds, and the Request, its memory
    allowance, the ``respond`` callback, the Response and its head formatting cost several more
    on every answer (BENCHMARKS.md, issue 15, seventh session). A route that knows its answer's
    status (200), content type and most of its header lines hands back only what changes."""

    #: The answer's head up to the Content-Length value (``head_start(200, content type)``).
    head: str

    def answer(self, body: bytes) -> tuple[bytes, AnswerFields] | None:
        """The 200 answer's body and its further fields (written as header lines by
        ``field_lines``), or None: then the request goes to the server's handler as any other,
        which answers it (errors included) the way it always does."""
        ...

    def answered(self) -> None:
        """Called once the answer ``answer`` gave is written (never after a None): bookkeeping
        the client need not wait for (a tiny model's client at concurrency 1 waits for nothing
        else)."""
        ...

    #: Whether the route may take requests to answer later (``later``): set once, when prepared.
    batching: bool

    def later(self, body: bytes, reply: Callable[[tuple[bytes, AnswerFields] | None], None]) -> bool:
        """Take the request to answer after the loop's other reads of this wake-up (in one batch
        with them): ``reply`` is called once with what ``answer`` would have given (None: the
        route declined after all, the server's handler answers it); or False: ask ``answer`` now."""
        ...


Respond = Callable[[Response], None]
Handler = Callable[[Request, Respond], None]


def field_lines(fields: AnswerFields | None) -> str:
    """An answer's fields as HTTP header lines (``Name: value\r\n`` each): the only place they
    get HTTP names. Remembered for lasting fields (a plan's: the same few objects on every answer
    of a model), so a tiny model's answer formats nothing."""
    if fields is None:
        return ""
    lines = _FIELD_LINES.get(fields)
    if lines is not None:
        return lines
    lines = f"X-Model-Variant: {fields.variant}\r\n"
    if fields.tensors is not None:
        lines = f"X-Tensors: {fields.tensors}\r\n{lines}"
    if fields.json_length is not None:
        lines += f"Inference-Header-Content-Length: {fields.json_length}\r\n"
    if fields.lasting and len(_FIELD_LINES) < _FIELD_LINES_MAX:
        _FIELD_LINES[fields] = lines
    return lines


#: Lasting fields → their header lines (``field_lines``): variants × output layouts of the plans.
_FIELD_LINES: dict[AnswerFields, str] = {}
_FIELD_LINES_MAX = 1024


def _encode_head(response: Response, keep_alive: bool) -> bytes:
    headers = response.headers
    if not headers:
        extra = response.head_lines
    elif len(headers) == 1:  # an inference's X-Model-Variant: no list comprehension (a call) to build
        name, value = headers[0]
        extra = f"{name}: {value}\r\n{response.head_lines}"
    else:
        extra = "".join([f"{name}: {value}\r\n" for name, value in headers]) + response.head_lines
    start = _HEAD_STARTS.get((response.status, response.content_type))
    if start is None:
        start = _head_start(response.status, response.content_type)
    return f"{start}{len(response.body)}\r\n{extra}{'' if keep_alive else _CLOSE}\r\n".encode("latin-1")


#: (status, content type) → the head up to the Content-Length value; a handful of pairs.
_HEAD_STARTS: dict[tuple[int, str], str] = {}


def head_start(status: int, content_type: str) -> str:
    """The head of an answer with this status and content type, up to the Content-Length value."""
    return _HEAD_STARTS.get((status, content_type)) or _head_start(status, content_type)


def _head_start(status: int, content_type: str) -> str:
    start = f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}\r\nContent-Type: {content_type}\r\nContent-Length: "
    if len(_HEAD_STARTS) < 256:  # content types come from our own code, but stay bounded anyway
        _HEAD_STARTS[(status, content_type)] = start
    return start


#: The error counter's kind of each refusal this server makes before a handler sees the request:
#: the handler counts the same refusals found later alike (``BudgetRefused.kind_of``); a client
#: too slow to send its request (408) is its own kind. Anything else (400, 411, 413, 431) is a
#: bad_request.
_REFUSAL_KINDS = {408: "slow_client", 503: BudgetRefused.kind_of(503)}


def _error(status: int, message: str, headers: list[tuple[str, str]] | None = None) -> Response:
    return Response(status, orjson.dumps({"error": message}), headers=headers or [])


class _BadRequest(AgentError):
    """A request this server refuses before any handler sees it (bad framing, over a limit).

    It never leaves this module: the connection answers it with ``status`` and closes. It is
    still an AgentError so that every exception edgesdk defines sits in one tree."""

    def __init__(self, status: int, message: str, headers: list[tuple[str, str]] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers or []


class HttpProtocol(asyncio.Protocol):
    """One connection: httptools parses what arrives into complete requests, which wait in a
    queue and are handed to the handler one at a time (answers go out in request order)."""

    def __init__(self, handler: Handler, limits: HttpLimits, server: HttpServer) -> None:
        self.handler = handler
        self.limits = limits
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.loop = asyncio.get_running_loop()
        self._parser = httptools.HttpRequestParser(self)
        self._phase = _IDLE
        self._messages = 0  # messages begun, to tell whose bytes a header budget counts
        self._head_bytes = 0
        self._url = b""
        self._headers: dict[str, str] = {}
        self._header_count = 0
        # The body: the parser's one chunk when it came whole (no copy), else a buffer of its
        # Content-Length filled in place (a list of chunks joined at the end held each large
        # body twice, and left the allocator fragments of every chunk).
        self._body: bytes | bytearray = b""
        self._body_length = 0
        self._body_filled = 0
        self._rejected: _BadRequest | None = None  # raised in a parser callback
        self._allowance: Allowance | None = None  # the body being read holds this much budget
        # Complete requests (or a final error answer) waiting for the ones before them.
        self._queue: deque[Request | Response] = deque()
        self._queued_bytes = 0
        self._busy = False
        self._draining_queue = False
        self._closing = False
        self._paused = False
        self._eof = False
        self._timer: asyncio.TimerHandle | None = None
        self._stalled = False  # the last tick came late and judged nothing (_timed_out)
        #: When the pending tick is due (not the handle's when(): uvloop hands back a plain
        #: Handle, without one, for a time under a millisecond ahead).
        self._tick_due = 0.0
        self._timer_kind = ""
        self._deadline = 0.0
        self._header_timeout_s = limits.header_timeout_s
        # When the header block or the body being read began (for the minimum rate).
        self._phase_start = 0.0
        # The peer's address when it is counted per client (not loopback, not a Unix socket).
        self._client: str | None = None
        # The header block (and the read's length) of a read that began a message: remembered
        # as a KnownHead if that read held exactly that one request (see data_received).
        self._candidate: tuple[bytes, int] | None = None
        self._fresh: tuple[bytes, int] | None = None
        self._last_known: KnownHead | None = None  # the known block this connection sent last

    # -- connection events --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        server = self.server
        client = _counted_client(transport.get_extra_info("peername"))
        if client is not None:
            if server.per_client.get(client, 0) >= self.limits.max_connections_per_client:
                server.refused += 1
                self._send(
                    _error(
                        503,
                        f"too many connections from {client} (api.max_connections_per_client)",
                        [("Retry-After", "1")],
                    ),
                    keep_alive=False,
                )
                return
            server.per_client[client] = server.per_client.get(client, 0) + 1
            self._client = client
        if len(server.connections) >= self.limits.max_connections and not server.make_room():
            # Idle sockets cost memory and descriptors: past the limit, refuse at once.
            server.refused += 1
            self._send(
                Response(503, b'{"error":"too many connections"}', headers=[("Retry-After", "1")]), keep_alive=False
            )
            self._forget_client()
            return
        server.connections.add(self)
        self._arm("idle", self.limits.keepalive_timeout_s)

    def _forget_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            left = self.server.per_client.pop(client, 1) - 1
            if left > 0:
                self.server.per_client[client] = left

    def eviction_rank(self) -> tuple[int, float] | None:
        """Where this connection stands to make room for a new one (lowest first), or None when
        it must not: it is reading a body, or a request of it is being answered or waiting.
        A client inside an unfinished header block first, then one with nothing to say; the
        oldest of each first (their deadlines lie the same time after their start)."""
        if self._busy or self._queue or self._closing or self._paused:
            return None
        if self._phase == _HEAD:
            return (0, self._deadline)
        if self._phase == _IDLE:
            return (1, self._deadline)
        return None

    def evict(self) -> None:
        """Close to make room for a new connection (``HttpServer.make_room``)."""
        self.server.evicted += 1
        self.server.connections.discard(self)
        if self._phase == _HEAD:
            self._fail(_error(408, "request not received in time: connection closed for another (api.max_connections)"))
        else:
            self._closing = True
            self._stop_timer()
            self.transport.close()  # type: ignore[union-attr]

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self._stop_timer()
        self.server.connections.discard(self)
        self._forget_client()
        # Bodies nobody will answer any more give their budget back (the one being answered
        # gives it back when its answer comes, even to a closed connection).
        if self._allowance is not None:
            self._allowance.release()
            self._allowance = None
        for item in self._queue:
            if isinstance(item, Request) and item.allowance is not None:
                item.allowance.release()

    def eof_received(self) -> bool:
        """The client half-closed (``shutdown(SHUT_WR)``): answer what it asked, then close."""
        self._eof = True
        if self._busy or self._queue:
            return True  # keep our sending side open; the last answer closes the connection
        return False  # nothing to answer (a truncated request cannot complete): close now

    def data_received(self, data: bytes) -> None:
        if self._closing or self._eof:
            return
        if self._phase == _IDLE and not self._busy and not self._queue:
            # The block this connection sent last, again (a keep-alive client repeats it): one
            # compare of its bytes; no search for its end, no copy of it, no hash of it.
            known = self._last_known
            if known is not None and len(data) == known.read and data.startswith(known.block):
                self._answer_known(known, data[len(known.block) :])
                return
            end = data.find(b"\r\n\r\n") + 4
            if 4 <= end <= _KNOWN_HEAD_BYTES:
                head = data[:end]
                known = self.server.known_heads.get(head)
                if known is not None and len(data) - end == known.length:
                    self._last_known = known
                    self._answer_known(known, data[end:])  # b"" when the block has no body
                    return
                self._candidate = (head, len(data))
        try:
            while data:
                budget = self.limits.max_header_bytes - self._head_bytes
                if self._phase == _BODY or len(data) <= budget:
                    self._feed(data)
                    break
                # A header block is fed no further than its budget, so a huge one is refused
                # after max_header_bytes whatever the read size; the rest follows.
                self._feed(data[:budget])
                data = data[budget:]
        except _BadRequest as exc:
            self._fail(_error(exc.status, str(exc), exc.headers))
        except httptools.HttpParserUpgrade:
            # Upgrade (h2c, websocket) and CONNECT are not spoken here: the request that asked
            # is answered as plain HTTP, then the connection closes (nothing after it is parsed).
            if self._queue and isinstance(self._queue[-1], Request):
                self._queue[-1].keep_alive = False
            self._eof = True
        except httptools.HttpParserError as exc:
            rejected, self._rejected = self._rejected, None
            if rejected is not None:
                self._fail(_error(rejected.status, str(rejected), rejected.headers))
            else:
                self._fail(_error(400, f"malformed request: {exc}"))
        self._candidate = None
        if self._busy:
            # Pipelined requests wait; do not let a client pile up unbounded data meanwhile.
            if self._queued_bytes > self.limits.max_body_bytes + self.limits.max_header_bytes and not self._paused:
                self._pause()
            return
        self._drain()

    def _feed(self, data: bytes) -> None:
        counting = self._phase != _BODY
        before = self._messages + (self._phase == _IDLE)
        self._parser.feed_data(data)
        # Still inside the same header block: all of these bytes were header bytes.
        if counting and self._phase == _HEAD and self._messages <= before:
            self._head_bytes += len(data)
            if self._head_bytes >= self.limits.max_header_bytes:
                raise _BadRequest(431, f"header block over {self.limits.max_header_bytes} bytes")

    # -- httptools callbacks --------------------------------------------------------------------

    def on_message_begin(self) -> None:
        # Only the first message a read begins can be the whole read.
        self._fresh, self._candidate = self._candidate, None
        self._messages += 1
        self._phase = _HEAD
        self._head_bytes = 0
        self._url = b""
        self._headers = {}
        self._header_count = 0
        self._body = b""
        self._body_length = 0
        self._body_filled = 0
        # _arm("header", ...) written out: this runs for every request.
        self._timer_kind = "header"
        now = self.loop.time()
        self._phase_start = now
        self._deadline = now + self._header_timeout_s
        if self._timer is None:
            self._tick_at(now + self.server.timer_period_s)

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        if self._header_count > _MAX_HEADERS:
            self._reject(431, f"more than {_MAX_HEADERS} header fields")
        key = _HEADER_NAMES.get(name)
        if key is None:
            key = name.decode("latin-1").lower()
            if len(_HEADER_NAMES) < _HEADER_NAMES_MAX:
                _HEADER_NAMES[name] = key
        self._headers[key] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self._phase = _BODY
        headers = self._headers
        if "transfer-encoding" in headers:
            self._reject(411, "chunked or encoded bodies are not accepted; send Content-Length")
        raw_length = headers.get("content-length")
        length = int(raw_length) if raw_length else 0  # llhttp has checked the digits and the range
        self._body_length = length
        if length > self.limits.max_body_bytes:
            # Refused before a single body byte is read.
            self.server.on_oversized()
            self._reject(413, f"body of {length} bytes is over the limit of {self.limits.max_body_bytes} bytes")
        if length:
            if not self.server.budget.fits(length):
                # Refused before it is read, like an oversized body; unlike one, it fits later.
                self.server.on_over_budget()
                self._reject(503, self.server.over_budget_message(length), [("Retry-After", "1")])
            # Nothing is held yet: the body is charged as its bytes arrive (on_body), so a
            # client that declares much and sends little holds little.
            self._allowance = Allowance(self.server.budget, self.server.decoded_bytes)
            if "expect" in headers:
                self._fresh = None  # its answer depends on when the body comes: never remembered
                if headers["expect"].lower() == "100-continue":
                    self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # type: ignore[union-attr]
            self._phase_start = self.loop.time()
            self._arm("body", self.limits.body_timeout_s)

    def on_body(self, body: bytes) -> None:
        # llhttp never hands over more than Content-Length, so the chunks fit the declared size.
        allowance = self._allowance
        if allowance is not None and not allowance.take_body(len(body)):
            # The bytes that arrived do not fit what requests hold now: this body goes, and
            # what it held is given back at once (not when the connection is finally closed).
            allowance.release()
            self._allowance = None
            self.server.on_over_budget()
            self._reject(503, self.server.over_budget_message(self._body_length), [("Retry-After", "1")])
        filled = self._body_filled
        if filled == 0 and len(body) == self._body_length:
            self._body = body
        else:
            # Grown as it arrives, never allocated at the declared size: memory follows what
            # was sent (a large bytearray grows in place, by mremap, without copies).
            if filled == 0:
                self._body = bytearray(body)
            else:
                self._body += body  # type: ignore[operator]
        self._body_filled = filled + len(body)

    def on_message_complete(self) -> None:
        self._phase = _IDLE
        self._disarm()
        body, self._body = self._body, b""
        path, _, query = self._url.partition(b"?")
        request = Request(
            self._parser.get_method().decode("latin-1"),
            unquote(path.decode("latin-1")) if b"%" in path else path.decode("latin-1"),
            query.decode("latin-1"),
            self._headers,
            body,
            self._parser.should_keep_alive(),
            self._allowance,
        )
        self._allowance = None
        fresh, self._fresh = self._fresh, None
        if fresh is not None:
            self._remember(fresh, request)
        self._queue.append(request)
        self._queued_bytes += len(body)

    def _remember(self, fresh: tuple[bytes, int], request: Request) -> None:
        """Keep what the parser made of ``request``'s header block when its read held exactly
        that one request, nothing more or less (so the block is all of the head), and nothing
        in it asks for more than a plain answer (an upgrade, a 100 Continue)."""
        head, read = fresh
        known_heads = self.server.known_heads
        if (
            read == len(head) + len(request.body)
            and len(known_heads) < _KNOWN_HEADS_MAX
            and not self._parser.should_upgrade()
            and request.method != "CONNECT"
        ):
            known = known_heads.get(head)  # never replaced: its route (see KnownHead) stays
            if known is None:
                known = known_heads[head] = KnownHead(
                    request.method,
                    request.path,
                    request.query,
                    dict(request.headers),
                    len(request.body),
                    request.keep_alive,
                    head,
                    read,
                )
            request.known = known

    def _answer_known(self, known: KnownHead, body: bytes) -> None:
        """A request whose header block the server has parsed before, body and all in one read:
        what ``on_message_begin`` to ``on_message_complete`` would do, minus the parsing; or,
        when the block has an inline route that answers it, only the answer."""
        route = known.route
        if route is not None:
            if (
                route.batching
                and len(self.server.connections) > 1
                and route.later(body, functools.partial(self.answer_later, known, route.head, body))
            ):
                # Its answer comes from answer_later, after this wake-up's other reads: until
                # then the connection is busy (what else it sends waits in the queue).
                self._messages += 1
                self._busy = True
                self._timer_kind = ""  # _disarm, written out
                return
            try:
                answer = route.answer(body)
            except Exception:  # noqa: BLE001 - a broken route must not take the connection down
                log.exception("inline route for %s %s failed; the handler answers", known.method, known.path)
                answer = None
            if answer is not None:
                self._messages += 1
                try:
                    # What ``respond`` and ``_send`` do for a 200 with nothing queued, no EOF
                    # and no allowance held (the route held and gave back its own), written
                    # out for the one case.
                    transport = self.transport
                    if transport is not None and not transport.is_closing():
                        answer_body, fields = answer
                        lines = _FIELD_LINES.get(fields) or field_lines(fields)  # field_lines' first step, written out
                        keep = known.keep_alive and not self.server.draining
                        head = f"{route.head}{len(answer_body)}\r\n{lines}{'' if keep else _CLOSE}\r\n"
                        if len(answer_body) < _COALESCE_BYTES:
                            transport.write(head.encode("latin-1") + answer_body)
                        else:
                            transport.writelines((head.encode("latin-1"), answer_body))
                        if keep:
                            self._timer_kind = "idle"  # _arm("idle", ...) written out
                            now = self.loop.time()
                            self._deadline = now + self.limits.keepalive_timeout_s
                            if self._timer is None:
                                self._tick_at(now + self.server.timer_period_s)
                        else:
                            self._closing = True
                            self._stop_timer()
                            transport.close()
                finally:
                    route.answered()  # its bookkeeping, after the answer is on its way
                return
        self._messages += 1
        self._to_handler(known, body)

    def _to_handler(self, known: KnownHead, body: bytes) -> None:
        """A request of ``known`` with ``body``, to the server's handler as any other."""
        allowance = None
        if known.length:
            allowance = Allowance(self.server.budget, self.server.decoded_bytes)
            if not allowance.take_body(known.length):
                self.server.on_over_budget()
                self._fail(_error(503, self.server.over_budget_message(known.length), [("Retry-After", "1")]))
                return
        self._timer_kind = ""  # _disarm, written out
        self._dispatch(
            Request(
                known.method, known.path, known.query, dict(known.headers), body, known.keep_alive, allowance, known
            )
        )

    def answer_later(self, known: KnownHead, head: str, body: bytes, answer: tuple[bytes, AnswerFields] | None) -> None:
        """The answer to the request of ``known`` with ``body`` that its route took to answer later
        (``InlineRoute.later``; ``answer`` and ``head`` as ``answer`` and ``head`` there): what
        ``respond`` does for a 200 (the connection was busy meanwhile: a half-close, pipelined
        requests, a closed connection are handled as for any answer). None: the route declined
        after all; the server's handler answers it."""
        if answer is None:
            self._busy = False
            if not self._closing:
                self._to_handler(known, body)
            return
        transport = self.transport
        keep = known.keep_alive and not self.server.draining and not (self._eof and not self._queue)
        if transport is None or self._closing or transport.is_closing():
            return
        answer_body, fields = answer
        head = f"{head}{len(answer_body)}\r\n{field_lines(fields)}{'' if keep else _CLOSE}\r\n"
        if len(answer_body) < _COALESCE_BYTES:
            transport.write(head.encode("latin-1") + answer_body)
        else:
            transport.writelines((head.encode("latin-1"), answer_body))
        if not keep:
            self._closing = True
            self._stop_timer()
            transport.close()
            return
        self._answered()

    def _answered(self) -> None:
        """The answer of the request being handled has gone out on a connection kept alive:
        the next queued request, or the keep-alive timer."""
        self._busy = False
        if self._paused:
            self._resume()
        if self._queue:
            self._drain()
        elif self._phase == _IDLE:
            # What _drain, _idle and _arm do with nothing queued (and no EOF: the connection is
            # kept), written out: three calls saved on every answer of a keep-alive client.
            self._timer_kind = "idle"
            now = self.loop.time()
            self._deadline = now + self.limits.keepalive_timeout_s
            if self._timer is None:
                self._tick_at(now + self.server.timer_period_s)

    def _reject(self, status: int, message: str, headers: list[tuple[str, str]] | None = None) -> None:
        # httptools wraps what a callback raises; keep ours to answer with its status.
        self._rejected = _BadRequest(status, message, headers)
        raise self._rejected

    # -- timers -------------------------------------------------------------------------------

    # One timer per connection, moved lazily: a request sets a deadline (a float), and the
    # timer, when it fires before it, re-arms itself for it. Three call_later + cancel pairs per
    # request cost more than a tiny model's whole HTTP handling. The timer is always set to fire
    # within ``timer_period_s`` (the shortest timeout) of when it was set, and every deadline is
    # at least that far ahead, so a new deadline is never earlier than the pending timer: arming
    # is two assignments, with no timer to cancel or compare.

    def _arm(self, kind: str, seconds: float) -> None:
        self._timer_kind = kind
        now = self.loop.time()
        self._deadline = now + seconds
        if self._timer is None:
            self._tick_at(now + self.server.timer_period_s)

    def _tick_at(self, due: float) -> None:
        """The connection timer's next tick, and when it is due (read back by ``_timed_out``)."""
        self._tick_due = due
        self._timer = self.loop.call_at(due, self._timed_out)

    def _disarm(self) -> None:
        self._timer_kind = ""  # a pending timer finds nothing due and lapses

    def _stop_timer(self) -> None:
        self._timer_kind = ""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _timed_out(self) -> None:
        self._timer = None
        if self._closing or self.transport is None or not self._timer_kind:
            return
        now = self.loop.time()
        if now - self._tick_due > self.server.timer_period_s and not self._stalled:
            # This tick is over a period late: the process did not run meanwhile (stopped,
            # swapped out, its loop blocked), and what the client sent then may still wait unread
            # in the socket (uvloop runs due timers before it polls). Judged on the next tick,
            # after a poll; only once in a row, so a loop late on every tick still cuts slow clients.
            self._stalled = True
            self._tick_at(now + self.server.timer_period_s)
            return
        self._stalled = False
        if now < self._deadline:
            if self._timer_kind != "idle" and self._below_min_rate(now):
                self.server.on_slow_client()
                rate = self.limits.min_rate_bytes_s
                log.info("client too slow (%s under %d bytes/s): closing", self._timer_kind, rate)
                self._fail(_error(408, f"request arriving too slowly ({self._timer_kind} under {rate} bytes/s)"))
                return
            self._tick_at(min(self._deadline, now + self.server.timer_period_s))
            return
        if self._timer_kind == "idle" and self._phase == _IDLE:
            self.transport.close()
            return
        self.server.on_slow_client()
        kind = self._timer_kind or "header"
        log.info("client too slow (%s timeout): closing", kind)
        self._fail(_error(408, f"request not received in time ({kind} timeout)"))

    def _below_min_rate(self, now: float) -> bool:
        """Whether the header block or body being read has come slower than ``min_rate_bytes_s``
        since its first byte, past the grace (checked on the connection's timer ticks)."""
        rate = self.limits.min_rate_bytes_s
        if not rate:
            return False
        received = self._body_filled if self._timer_kind == "body" else self._head_bytes
        return now > self._phase_start + self.limits.min_rate_grace_s + received / rate

    def _pause(self) -> None:
        self._paused = True
        self._disarm()  # the client cannot be slow while we do not read
        self.transport.pause_reading()  # type: ignore[union-attr]

    def _resume(self) -> None:
        self._paused = False
        if self._phase != _IDLE:
            # Its rate is counted again from now: while paused, it could not send.
            self._phase_start = self.loop.time()
            if self._phase == _BODY:
                self._arm("body", self.limits.body_timeout_s)
            else:
                self._arm("header", self.limits.header_timeout_s)
        self.transport.resume_reading()  # type: ignore[union-attr]

    # -- dispatch -------------------------------------------------------------------------------

    def _fail(self, response: Response) -> None:
        """Answer with an error after the requests already queued, then close; read no more.
        Every refusal of this server's own (framing, limits, timeouts) passes here, and is
        counted here once, by kind (``HttpServer.count_error``)."""
        self.server.count_error(_REFUSAL_KINDS.get(response.status, "bad_request"))
        self._eof = True
        self._disarm()
        self._queue.append(response)
        if not self._busy:
            self._drain()

    def _drain(self) -> None:
        """Hand queued requests to the handler in order while none is running."""
        if self._draining_queue:
            return  # an inline answer inside the loop below: the loop goes on by itself
        self._draining_queue = True
        try:
            while self._queue and not self._busy and not self._closing:
                item = self._queue.popleft()
                if isinstance(item, Response):
                    self._send(item, keep_alive=False)
                    return
                self._queued_bytes -= len(item.body)
                self._dispatch(item)
        finally:
            self._draining_queue = False
        if not self._busy and not self._closing and not self._queue:
            self._idle()

    def _idle(self) -> None:
        if self._eof:
            self._closing = True
            self.transport.close()  # type: ignore[union-attr]
        elif self._phase == _IDLE:
            self._arm("idle", self.limits.keepalive_timeout_s)

    def _dispatch(self, request: Request) -> None:
        self._busy = True
        answered = False

        def respond(response: Response) -> None:
            nonlocal answered
            if answered:
                return
            answered = True
            keep = request.keep_alive and not self.server.draining and not (self._eof and not self._queue)
            self._send(response, keep_alive=keep, head_only=request.method == "HEAD")
            # Bookkeeping after the answer is on its way: the client reads it meanwhile.
            if request.allowance is not None:
                request.allowance.release()
            if keep and not self._closing:
                self._answered()

        try:
            self.handler(request, respond)
        except Exception:  # noqa: BLE001 - one broken request must never take the server down
            log.exception("handler failed on %s %s", request.method, request.path)
            respond(_error(500, "internal error"))

    def _send(self, response: Response, *, keep_alive: bool, head_only: bool = False) -> None:
        transport = self.transport
        if transport is None or self._closing or transport.is_closing():
            return
        head = _encode_head(response, keep_alive)
        if head_only:
            transport.write(head)
        elif len(response.body) < _COALESCE_BYTES:
            transport.write(head + response.body)
        else:
            transport.writelines((head, response.body))
        if not keep_alive:
            self._closing = True
            self._stop_timer()
            transport.close()


def _uncounted(kind: str) -> None:
    """An HttpServer's error counter when it is given none."""


class HttpServer:
    """The listening sockets (TCP and/or Unix) sharing one handler and one set of limits."""

    def __init__(
        self, handler: Handler, limits: HttpLimits, *, count_error: Callable[[str], None] | None = None
    ) -> None:
        self.handler = handler
        self.limits = limits
        #: The agent's error counter (``Metrics.count_error``): every refusal of this server's own
        #: (``HttpProtocol._fail``: 400, 408, 411, 413, 431, 503) once, by kind.
        self.count_error = count_error or _uncounted
        self.connections: set[HttpProtocol] = set()
        self.draining = False
        self._servers: list[asyncio.AbstractServer] = []
        self.slow_clients = 0
        self.oversized = 0
        #: Connections answered 503 and closed as they opened (``max_connections`` with none to
        #: make room, or ``max_connections_per_client``): no request of theirs was read.
        self.refused = 0
        #: Connections closed to make room for a new one past ``max_connections`` (make_room).
        self.evicted = 0
        self.over_budget = 0
        #: Open connections per peer address (only the ones counted: see ``_counted_client``).
        self.per_client: dict[str, int] = {}
        self.budget = InflightBytesBudget(limits.inflight_bytes)
        self.decoded_bytes = limits.decoded_bytes
        #: Header blocks parsed before, by their exact bytes (see KnownHead); bounded.
        self.known_heads: dict[bytes, KnownHead] = {}
        #: The connection timer fires at least this often (see ``HttpProtocol._arm``).
        periods = [limits.header_timeout_s, limits.body_timeout_s, limits.keepalive_timeout_s]
        if limits.min_rate_bytes_s:
            periods.append(limits.min_rate_grace_s)  # the rate is checked on the timer's ticks
        self.timer_period_s = min(periods)

    @property
    def open_connections(self) -> int:
        return len(self.connections)

    def make_room(self) -> bool:
        """Close one connection to admit a new one past ``max_connections``: the oldest inside
        an unfinished header block, else the one idle the longest; False when every connection
        is reading a body or being answered. A scan of all of them, only ever at the limit."""
        victim = None
        best: tuple[int, float] | None = None
        for conn in self.connections:
            rank = conn.eviction_rank()
            if rank is not None and (best is None or rank < best):
                victim, best = conn, rank
        if victim is None:
            return False
        victim.evict()
        return True

    def on_slow_client(self) -> None:
        self.slow_clients += 1

    def on_oversized(self) -> None:
        self.oversized += 1

    def on_over_budget(self) -> None:
        self.over_budget += 1

    def over_budget_message(self, length: int) -> str:
        return (
            f"body of {length} bytes does not fit the agent's memory budget for requests in flight "
            f"({self.budget.capacity} bytes, api.max_inflight_bytes) now; retry shortly"
        )

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


def _counted_client(peername: Any) -> str | None:
    """The address a connection counts against ``max_connections_per_client``; None for a Unix
    socket and for loopback, where every local client (the device's own apps) shares one address
    and a per-address cap would throttle them all together."""
    if not isinstance(peername, tuple) or not peername or not isinstance(peername[0], str):
        return None
    host = peername[0]
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    if address.is_loopback or (mapped is not None and mapped.is_loopback):
        return None
    return host


def json_response(status: int, payload: Any, headers: list[tuple[str, str]] | None = None) -> Response:
    """A JSON response (the API's default)."""
    return Response(status, dumps(payload), headers=headers or [])
