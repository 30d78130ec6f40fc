"""Every refusal the agent's HTTP server makes before a handler sees the request (framing,
limits, a slow client, the memory budget) is counted once, by kind, on the agent's error
counter: a 400, 408, 411 or 431 was answered and counted nowhere (only 413 and 503 were)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from edgesdk.agent.api.http import HttpLimits

from tests.agent_helpers import raw_exchange
from tests.unit.test_agent_http import PATIENCE_S, RunningServer

CASES = {
    "malformed": (b"NOT HTTP AT ALL\r\n\r\n", 400, "bad_request"),
    "chunked body": (b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 411, "bad_request"),
    "body over max_body_bytes": (b"POST /x HTTP/1.1\r\nContent-Length: 5000\r\n\r\n", 413, "bad_request"),
    "header block over max_header_bytes": (
        b"GET /x HTTP/1.1\r\nX-Big: " + b"a" * 2000 + b"\r\n\r\n",
        431,
        "bad_request",
    ),
    "body over the in-flight budget": (b"POST /x HTTP/1.1\r\nContent-Length: 900\r\n\r\n", 503, "overload"),
    "header block never finished": (b"GET /x HTTP/1.1\r\nHost: a", 408, "slow_client"),
}


@pytest.fixture(scope="module")
def counted() -> Iterator[tuple[int, list[str]]]:
    limits = HttpLimits(max_header_bytes=1024, max_body_bytes=1000, max_inflight_bytes=500, header_timeout_s=0.3)
    running = RunningServer(limits)
    kinds: list[str] = []
    running.http.count_error = kinds.append
    yield running.port, kinds
    running.stop()


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_request_the_http_server_refuses_is_counted_once_by_its_kind(
    counted: tuple[int, list[str]], case: str
) -> None:
    port, kinds = counted
    data, status, kind = CASES[case]
    kinds.clear()
    answer = raw_exchange(port, data, timeout=PATIENCE_S)
    assert answer.startswith(b"HTTP/1.1 %d " % status), answer[:120]
    assert kinds == [kind]  # counted before the answer is written: no wait


def test_a_request_the_http_server_hands_on_is_not_counted_by_it(counted: tuple[int, list[str]]) -> None:
    port, kinds = counted
    kinds.clear()
    answer = raw_exchange(
        port, b"POST /x HTTP/1.1\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc", timeout=PATIENCE_S
    )
    assert answer.startswith(b"HTTP/1.1 200 ") and kinds == []
