"""Header blocks the HTTP server has parsed before (agent/api/http.py, KnownHead): a read that
holds exactly such a block and its body is answered without the parser, and the answer is the
one the parser's path gives; anything else (pipelined reads, partial bodies, 100-continue,
upgrades, a full memory budget) takes the parser's path or its error, as before."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from edgesdk.agent.api import http as http_module
from edgesdk.agent.api.answer import AnswerFields
from edgesdk.agent.api.http import HttpLimits, HttpProtocol, HttpServer, Request, Respond, Response


class FakeTransport:
    def __init__(self) -> None:
        self.sent = bytearray()
        self.closed = False

    def write(self, data: bytes) -> None:
        self.sent += data

    def writelines(self, parts: tuple[bytes, ...]) -> None:
        for part in parts:
            self.sent += part

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str, default: object = None) -> object:
        return ("127.0.0.1", 40000) if name == "peername" else default

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class Connection:
    """One HttpProtocol fed by hand: every ``feed`` is one read."""

    def __init__(self, loop: asyncio.AbstractEventLoop, limits: HttpLimits | None = None) -> None:
        self.seen: list[Request] = []

        def handler(request: Request, respond: Respond) -> None:
            self.seen.append(request)
            respond(Response(200, f"{request.method} {request.path}?{request.query} {bytes(request.body)!r}".encode()))

        self.server = HttpServer(handler, limits or HttpLimits())

        async def make() -> HttpProtocol:  # a protocol is made on its running loop
            return HttpProtocol(handler, self.server.limits, self.server)

        self.protocol = loop.run_until_complete(make())
        self.transport = FakeTransport()
        self.protocol.connection_made(self.transport)  # type: ignore[arg-type]

    def feed(self, data: bytes) -> bytes:
        before = len(self.transport.sent)
        self.protocol.data_received(data)
        return bytes(self.transport.sent[before:])


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    yield loop
    asyncio.set_event_loop(None)
    loop.close()


def request(body: bytes = b"hello", path: str = "/v1/models/m/infer?x=1", extra: str = "") -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: h\r\nContent-Type: text/plain\r\n{extra}Content-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


def _parse_count(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many messages the parser began (its callbacks run only on the parser's path)."""
    began = [0]
    original = HttpProtocol.on_message_begin

    def counting(self: HttpProtocol) -> None:
        began[0] += 1
        original(self)

    monkeypatch.setattr(HttpProtocol, "on_message_begin", counting)
    return began


def test_a_repeated_request_skips_the_parser_and_gets_the_same_answer(loop, monkeypatch) -> None:
    began = _parse_count(monkeypatch)
    conn = Connection(loop)
    first = conn.feed(request())
    second = conn.feed(request())
    assert began[0] == 1, "the second, byte-identical request must not go through the parser"
    assert first == second and first.startswith(b"HTTP/1.1 200 OK\r\n")
    assert first.endswith(b"POST /v1/models/m/infer?x=1 b'hello'")
    one, two = conn.seen
    assert (one.method, one.path, one.query, one.headers, one.body, one.keep_alive) == (
        two.method,
        two.path,
        two.query,
        two.headers,
        two.body,
        two.keep_alive,
    )
    assert one.headers is not two.headers  # each request its own dict: a handler may not share it
    # A different body of the same length has the same header block: the new body is served.
    assert conn.feed(request(b"HELLO")).endswith(b"b'HELLO'")
    assert began[0] == 1
    assert len(conn.server.known_heads) == 1


def test_the_block_a_connection_sent_last_is_matched_by_its_bytes_and_length_only(loop, monkeypatch) -> None:
    """A connection checks its last known block first (a compare, no search or hash): another
    block of the same read length, the same block with a longer read (pipelined) or a shorter
    one (a partial body), each alternating with it, get what the parser's path gives them."""
    began = _parse_count(monkeypatch)
    conn = Connection(loop)
    a, b = request(b"hello", "/a"), request(b"hello", "/b")
    assert len(a) == len(b)
    for read in (a, b, a, b):
        conn.feed(read)
    assert began[0] == 2 and len(conn.server.known_heads) == 2  # each parsed once, then known
    answers = [conn.feed(read) for read in (a, b, a, a, b)]
    assert [answer.rsplit(b" ", 2)[-2] for answer in answers] == [b"/a?", b"/b?", b"/a?", b"/a?", b"/b?"]
    assert began[0] == 2
    pipelined = conn.feed(a + b)  # the last block known, the read longer: the parser's path
    assert pipelined.count(b"HTTP/1.1 200") == 2 and pipelined.endswith(b"POST /b? b'hello'")
    assert conn.feed(a[:-2]) == b"" and conn.feed(b"lo").endswith(b"POST /a? b'hello'")
    assert conn.feed(b).endswith(b"POST /b? b'hello'")
    assert [r.path for r in conn.seen][-4:] == ["/a", "/b", "/a", "/b"]


def test_the_body_share_of_the_budget_is_taken_and_given_back_on_the_known_path(loop) -> None:
    conn = Connection(loop, HttpLimits(max_inflight_bytes=100))
    conn.feed(request())
    assert conn.feed(request()).startswith(b"HTTP/1.1 200")
    assert conn.server.budget.used == 0
    conn.server.budget.used = 98  # other requests hold nearly all of it
    refused = conn.feed(request())
    assert refused.startswith(b"HTTP/1.1 503 ") and b"Retry-After: 1\r\n" in refused
    assert b"memory budget" in refused and conn.server.over_budget == 1
    assert conn.transport.closed


@pytest.mark.parametrize(
    "read",
    [
        request() + request(),  # two pipelined requests in one read
        request(extra="Expect: 100-continue\r\n"),  # its answer depends on when the body comes
        request()[:-2],  # the body's end comes in the next read
    ],
    ids=["pipelined", "expect-100-continue", "partial-body"],
)
def test_only_a_read_of_exactly_one_plain_request_is_remembered(loop, read: bytes) -> None:
    conn = Connection(loop)
    conn.feed(read)
    if read == request()[:-2]:
        conn.feed(b"lo")
        assert conn.seen[0].body == b"hello"
    assert conn.server.known_heads == {}


def test_an_upgrade_request_is_never_remembered(loop) -> None:
    conn = Connection(loop)
    answer = conn.feed(
        b"GET /ws HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nContent-Length: 0\r\n\r\n"
    )
    assert answer.startswith(b"HTTP/1.1 200") and conn.server.known_heads == {}


def test_a_partial_body_after_a_known_head_is_read_by_the_parser(loop, monkeypatch) -> None:
    began = _parse_count(monkeypatch)
    conn = Connection(loop)
    conn.feed(request())
    assert conn.feed(request()[:-3]) == b""  # known head, body incomplete: the parser's path
    assert conn.feed(b"llo").endswith(b"b'hello'")
    assert began[0] == 2


def test_what_the_server_refused_is_never_remembered(loop) -> None:
    conn = Connection(loop, HttpLimits(max_body_bytes=3))
    assert conn.feed(request()).startswith(b"HTTP/1.1 413 ")
    assert conn.server.known_heads == {}


def test_the_memory_of_header_blocks_is_bounded(loop, monkeypatch) -> None:
    monkeypatch.setattr(http_module, "_KNOWN_HEADS_MAX", 3)
    conn = Connection(loop)
    for n in range(6):
        assert conn.feed(request(path=f"/p{n}")).endswith(b"b'hello'")
    assert len(conn.server.known_heads) == 3
    # Past the bound, new blocks are served by the parser and not remembered.
    assert conn.feed(request(path="/p5")).endswith(b"b'hello'")
    assert len(conn.server.known_heads) == 3


def test_connection_close_is_remembered_and_honoured(loop) -> None:
    conn = Connection(loop)
    answer = conn.feed(request(extra="Connection: close\r\n"))
    assert b"Connection: close\r\n" in answer and conn.transport.closed
    again = Connection(loop)
    again.server.known_heads.update(conn.server.known_heads)
    answer = again.feed(request(extra="Connection: close\r\n"))
    assert b"Connection: close\r\n" in answer and again.transport.closed


class Route:
    """An inline route (http.InlineRoute) that answers with the body reversed, declines bodies
    starting with ``no`` and raises on bodies starting with ``boom``."""

    head = http_module.head_start(200, "text/plain")
    batching = False  # never takes a request to answer later (test_agent_api_batch_inline.py does)

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.asked = 0
        self.answered_after: list[bytes] = []  # what had been written when answered() came

    def answer(self, body: bytes) -> tuple[bytes, AnswerFields] | None:
        self.asked += 1
        if body.startswith(b"boom"):
            raise RuntimeError("broken route")
        if body.startswith(b"no"):
            return None
        return body[::-1], AnswerFields("inline", lasting=True)

    def answered(self) -> None:
        self.answered_after.append(bytes(self.conn.transport.sent[-5:]))


def test_an_inline_route_answers_its_block_without_a_request_and_declines_to_the_handler(loop) -> None:
    conn = Connection(loop)
    conn.feed(request(b"hello"))
    (known,) = conn.server.known_heads.values()
    known.route = route = Route(conn)
    answer = conn.feed(request(b"hello"))
    assert (
        answer
        == b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\nX-Model-Variant: inline\r\n\r\nolleh"
    )
    assert len(conn.seen) == 1 and route.asked == 1  # the handler never saw it
    # Declined, or the route broke: the handler answers the same request, and the connection lives.
    for body in (b"nope!", b"boom!"):
        assert conn.feed(request(body)).endswith(b"b'" + body + b"'")
    assert [r.body for r in conn.seen[1:]] == [b"nope!", b"boom!"] and route.asked == 3
    assert not conn.transport.closed and conn.server.budget.used == 0
    assert conn.feed(request(b"abcde")).endswith(b"\r\n\r\nedcba")
    assert route.answered_after == [b"olleh", b"edcba"]  # once per answer, after it was written
    # Draining: the inline answer says so and closes, as the handler's answers do.
    conn.server.draining = True
    answer = conn.feed(request(b"hello"))
    assert b"\r\nConnection: close\r\n\r\nolleh" in answer and conn.transport.closed
