"""A connection whose bytes arrived while the agent's event loop did not run (the process stopped,
swapped out, its loop blocked) is not cut as a slow client: uvloop runs a due timer before it
reads the socket, so the late tick judged a body still waiting unread (408 'body timeout' in 4
of 5 runs of an integration test with the agent stopped now and then)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from edgesdk.agent.api.http import HttpLimits, HttpServer, Request, Respond, Response

from tests.unit.test_agent_http import LOOPS, PATIENCE_S

BLOCK_S = 2.5  # longer than the body timeout and the rate grace below
blocking = threading.Event()


def handler(request: Request, respond: Respond) -> None:
    if request.path == "/block":  # the loop does not run while this sleeps
        blocking.set()
        time.sleep(BLOCK_S)
    respond(Response(200, bytes(request.body) or b"ok", content_type="application/octet-stream"))


@pytest.fixture(params=sorted(LOOPS))
def port(request: pytest.FixtureRequest) -> Iterator[int]:
    http = HttpServer(handler, HttpLimits(body_timeout_s=1.0, min_rate_grace_s=1.0))
    loop = LOOPS[request.param]()
    ready = threading.Event()
    bound: list[int] = []

    def run() -> None:
        asyncio.set_event_loop(loop)
        bound.append(loop.run_until_complete(http.listen_tcp("127.0.0.1", 0)))
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(PATIENCE_S)
    yield bound[0]
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def test_a_body_sent_while_the_loop_was_blocked_is_read_not_judged_late(port: int) -> None:
    blocking.clear()
    with (
        socket.create_connection(("127.0.0.1", port), timeout=PATIENCE_S) as slow,
        socket.create_connection(("127.0.0.1", port), timeout=PATIENCE_S) as blocker,
    ):
        slow.sendall(b"POST /echo HTTP/1.1\r\nContent-Length: 10\r\nConnection: close\r\n\r\n")
        time.sleep(0.2)  # the head is read (no assertion rests on it: a late read only helps)
        blocker.sendall(b"GET /block HTTP/1.1\r\nConnection: close\r\n\r\n")
        assert blocking.wait(PATIENCE_S), "the blocking request never reached the handler"
        slow.sendall(b"0123456789")  # arrives while the loop is blocked, past the body timeout
        answer = _read_all(slow)
        assert _read_all(blocker).startswith(b"HTTP/1.1 200 ")
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"0123456789"), answer[:200]
