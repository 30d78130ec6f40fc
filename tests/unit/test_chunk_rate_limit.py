"""The chunk server's per-device request budget (token bucket, charged per chunk asked for)."""

from __future__ import annotations

import pytest

from edgesdk.errors import UpdateError
from edgesdk.fleet.chunk_server import ChunkServer, DeviceRateLimiter, RequestBudget
from edgesdk.schemas.messages import ChunkRequest


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_bucket_allows_a_burst_then_the_rate_per_device() -> None:
    clock = Clock()
    limiter = DeviceRateLimiter(RequestBudget(rate_per_s=2.0, burst=3), clock)
    assert [limiter.allow("a") for _ in range(4)] == [True, True, True, False]
    assert limiter.allow("b")  # another device has its own bucket
    clock.now += 0.5  # one token back at 2/s
    assert limiter.allow("a") and not limiter.allow("a")
    clock.now += 100  # refills up to the burst, no further
    assert [limiter.allow("a") for _ in range(4)] == [True, True, True, False]
    assert limiter.dropped == {"a": 3}


def test_a_request_costs_one_token_per_chunk() -> None:
    limiter = DeviceRateLimiter(RequestBudget(rate_per_s=1.0, burst=8), Clock())
    assert limiter.allow("a", cost=5) and not limiter.allow("a", cost=4) and limiter.allow("a", cost=3)


@pytest.mark.parametrize("budget", [{"rate_per_s": 0.0}, {"burst": 0}])
def test_a_budget_that_would_serve_nothing_is_refused(budget: dict[str, float]) -> None:
    with pytest.raises(UpdateError, match="rate_per_s"):
        RequestBudget(**budget)  # type: ignore[arg-type]


def _request(device: str, indices: list[int]) -> bytes:
    return (
        ChunkRequest(device_id=device, deployment_id="d1", bundle_sha256="a" * 64, indices=indices)
        .model_dump_json()
        .encode()
    )


def test_a_flooding_device_is_dropped_and_counted_while_others_are_served() -> None:
    clock = Clock()
    sent: list[str] = []
    server = ChunkServer(
        "edgesdk", lambda topic, _frame, _qos: sent.append(topic), budget=RequestBudget(10.0, 16), clock=clock
    )
    for _ in range(50):  # 50 requests of 4 chunks at one instant: only the burst (16 chunks) is answered
        server.on_message("edgesdk/devices/flood/ota/chunks/req", _request("flood", [0, 1, 2, 3]))
    server.on_message("edgesdk/devices/honest/ota/chunks/req", _request("honest", [0, 1]))
    assert sent.count("edgesdk/devices/flood/ota/chunks/data") == 16
    assert sent.count("edgesdk/devices/honest/ota/chunks/data") == 2
    assert server.rate_limited == 46 and server.limiter.dropped == {"flood": 46}
    clock.now += 1.0  # 10 chunks' worth of tokens back
    server.on_message("edgesdk/devices/flood/ota/chunks/req", _request("flood", [4, 5, 6, 7]))
    assert sent.count("edgesdk/devices/flood/ota/chunks/data") == 20
