"""A bounded property-based fuzz of the agent's HTTP/1.1 server (agent/api/http.py; issue 37):
request bytes, well-formed, mutated or random, cut into random reads, fed to one connection
(an ``HttpProtocol`` on a fake transport). Whatever comes, no exception leaves the protocol,
what it writes is a sequence of whole, well-formed HTTP answers (an interim 100 Continue
allowed), nothing follows an answer that says ``Connection: close`` and the connection is then
closed, and once the connection is gone every byte of the memory budget has been given back.

Bounded: a few hundred examples per property, no deadline per example (the machine is shared);
the whole file runs in well under 30 s."""

from __future__ import annotations

import asyncio
import re

import pytest

hypothesis = pytest.importorskip("hypothesis", reason="hypothesis not installed (the dev extra installs it)")
from edgesdk.agent.api.http import HttpLimits, HttpProtocol, HttpServer, Request, Respond, Response  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.unit.test_agent_http_known_heads import FakeTransport  # noqa: E402

LIMITS = HttpLimits(max_header_bytes=512, max_body_bytes=256, max_inflight_bytes=600)
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

_STATUS_LINE = re.compile(rb"HTTP/1\.1 (\d{3}) [^\r\n]*\r\n")


def handler(request: Request, respond: Respond) -> None:
    if request.path == "/boom":
        raise RuntimeError("handler bug")
    if request.path == "/later":
        asyncio.get_running_loop().call_soon(respond, Response(200, b"late"))
        return
    respond(Response(200, b"%d" % len(request.body), content_type="text/plain"))


def answers(sent: bytes, head_asked: bool = False) -> list[tuple[int, dict[bytes, bytes]]]:
    """The answers in ``sent``, each checked whole and well-formed (AssertionError otherwise).
    ``head_asked``: a HEAD request was sent, so an answer may be a head without its body."""
    found = []
    rest = sent
    while rest:
        status_line = _STATUS_LINE.match(rest)
        assert status_line, f"not an HTTP answer: {rest[:80]!r}"
        end = rest.find(b"\r\n\r\n")
        assert end >= 0, f"answer head cut short: {rest[:200]!r}"
        headers = {}
        for line in rest[status_line.end() : end].split(b"\r\n") if end > status_line.end() else []:
            name, colon, value = line.partition(b": ")
            assert colon and name and b"\n" not in value, f"bad header line {line!r}"
            headers[name.lower()] = value
        status = int(status_line.group(1))
        rest = rest[end + 4 :]
        if status == 100:
            assert not headers
            found.append((status, headers))
            continue
        length = int(headers[b"content-length"])
        if head_asked and (not rest or rest.startswith(b"HTTP/1.1 ")):
            length = 0  # the answer to HEAD: its Content-Length, no body
        assert len(rest) >= length, f"body cut short: {length} announced, {len(rest)} sent"
        rest = rest[length:]
        found.append((status, headers))
    return found


def run_connection(reads: list[bytes], half_close: bool) -> None:
    loop = asyncio.new_event_loop()
    try:
        server = HttpServer(handler, LIMITS)

        async def feed() -> tuple[HttpProtocol, FakeTransport]:
            protocol = HttpProtocol(handler, LIMITS, server)
            transport = FakeTransport()
            protocol.connection_made(transport)  # type: ignore[arg-type]
            for data in reads:
                if transport.closed:
                    break
                protocol.data_received(data)
                await asyncio.sleep(0)  # answers given later go out between reads
            if half_close and not transport.closed and not protocol.eof_received():
                transport.close()
            for _ in range(3):
                await asyncio.sleep(0)
            return protocol, transport

        protocol, transport = loop.run_until_complete(feed())
        found = answers(bytes(transport.sent), head_asked=b"HEAD" in b"".join(reads))
        finals = [(status, headers) for status, headers in found if status != 100]
        for _status, headers in finals[:-1]:
            assert headers.get(b"connection") != b"close", f"answers after a Connection: close: {found}"
        if finals and finals[-1][1].get(b"connection") == b"close":
            assert transport.closed, "Connection: close answered, connection left open"
        for status, _ in finals:
            assert 200 <= status < 600
        protocol.connection_lost(None)
        assert server.budget.used == 0, f"{server.budget.used} bytes of the budget never given back"
    finally:
        loop.close()


def _cut(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    reads, start = [], 0
    for point in [*points, len(data)]:
        if point > start:
            reads.append(data[start:point])
            start = point
    return reads


_METHODS = st.sampled_from([b"GET", b"POST", b"HEAD", b"PUT", b"DELETE", b"OPTIONS", b"CONNECT", b"PRI", b"G\x00T"])
_PATHS = st.sampled_from([b"/", b"/x", b"/later", b"/boom", b"/a?b=c", b"/%2e%2e/%zz", b"*", b"http://h/x", b""])
_VERSIONS = st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2.0", b"HTTP/1.1 ", b"HTTP/0.9", b""])
_HEADER_NAMES = st.sampled_from(
    [b"Host", b"Content-Length", b"Transfer-Encoding", b"Expect", b"Connection", b"Upgrade", b"X-A", b"Bad Name", b""]
)
_HEADER_VALUES = st.one_of(
    st.sampled_from(
        [
            b"0",
            b"5",
            b"256",
            b"257",
            b"-1",
            b"18446744073709551616",
            b"chunked",
            b"100-continue",
            b"close",
            b"keep-alive",
            b"upgrade",
            b"h2c",
            b" 5",
            b"5, 5",
        ]
    ),
    st.binary(max_size=12),
)


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    head = draw(_METHODS) + b" " + draw(_PATHS) + b" " + draw(_VERSIONS) + b"\r\n"
    for _ in range(draw(st.integers(0, 5))):
        head += draw(_HEADER_NAMES) + b": " + draw(_HEADER_VALUES) + draw(st.sampled_from([b"\r\n", b"\n", b"\r"]))
    body = draw(st.binary(max_size=300))
    return head + b"\r\n" + body


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = b"".join(draw(st.lists(requests(), min_size=1, max_size=3)))
    for _ in range(draw(st.integers(0, 4))):
        if not data:
            break
        at = draw(st.integers(0, len(data) - 1))
        kind = draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
        if kind == "flip":
            data = data[:at] + bytes([data[at] ^ draw(st.integers(1, 255))]) + data[at + 1 :]
        elif kind == "insert":
            data = data[:at] + draw(st.sampled_from([b"\r\n", b"\x00", b":", b" ", b"\r\n\r\n", b"\xff"])) + data[at:]
        elif kind == "delete":
            data = data[:at] + data[at + 1 :]
        else:
            data = data[:at]
    return data


@FUZZ
@given(data=mutated(), cuts=st.lists(st.integers(0, 2000), max_size=6), half_close=st.booleans())
def test_mutated_requests_get_well_formed_answers_and_hold_nothing(data: bytes, cuts: list[int], half_close: bool):
    run_connection(_cut(data, cuts), half_close)


@FUZZ
@given(data=st.binary(max_size=600), cuts=st.lists(st.integers(0, 600), max_size=4), half_close=st.booleans())
def test_random_bytes_get_well_formed_answers_and_hold_nothing(data: bytes, cuts: list[int], half_close: bool):
    run_connection(_cut(data, cuts), half_close)


@FUZZ
@given(
    bodies=st.lists(st.binary(min_size=1, max_size=256), min_size=1, max_size=4),
    cuts=st.lists(st.integers(0, 2000), max_size=8),
)
def test_pipelined_valid_requests_are_all_answered_in_order(bodies: list[bytes], cuts: list[int]) -> None:
    data = b"".join(b"POST /x HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (len(b), b) for b in bodies)
    loop = asyncio.new_event_loop()
    try:
        server = HttpServer(handler, HttpLimits(max_body_bytes=256, max_inflight_bytes=1 << 20))

        async def feed() -> FakeTransport:
            protocol = HttpProtocol(handler, server.limits, server)
            transport = FakeTransport()
            protocol.connection_made(transport)  # type: ignore[arg-type]
            for read in _cut(data, cuts):
                protocol.data_received(read)
            await asyncio.sleep(0)
            protocol.connection_lost(None)
            return transport

        sent = bytes(loop.run_until_complete(feed()).sent)
    finally:
        loop.close()
    expected = b"".join(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%d" % (len(b"%d" % len(b)), len(b))
        for b in bodies
    )
    assert sent == expected
    assert server.budget.used == 0
