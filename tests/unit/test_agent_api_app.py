"""The API routes and admission control in-process, with fake models: overload 503 with
Retry-After, 504 after request_timeout_s, 503 without a model, the inline fast path, drain."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import numpy as np
from edgesdk.agent.api.app import ApiApp
from edgesdk.agent.api.http import Request, Response
from edgesdk.agent.metrics import Metrics
from edgesdk.agent.serving import ModelServer

from edgesdk.schemas.agent_config import ApiConfig
from tests.unit.test_agent_serving import FakeModel, variant


def infer_request(n: int = 1) -> Request:
    body = json.dumps({"inputs": {"x": np.ones((n, 4)).tolist()}}).encode()
    return Request("POST", "/v1/models/m/infer", "", {"content-type": "application/json"}, body)


def make_app(model: FakeModel | None, **config: object) -> tuple[ApiApp, Metrics]:
    server = ModelServer()
    metrics = Metrics(server)
    server.observe, server.count_error = metrics.observe, metrics.count_error
    if model is not None:
        server.serve(name="m", version="1.0.0", release=1, variants=[(variant("fp32", "fp32"), model)])
    return ApiApp(server, metrics, ApiConfig(**config)), metrics  # type: ignore[arg-type]


def run_requests(app: ApiApp, requests: list[Request], settle: float = 3.0) -> list[Response]:
    """Hand every request to the app on one event loop; collect the answers in order given."""
    answers: list[Response | None] = [None] * len(requests)

    async def main() -> None:
        app.loop = asyncio.get_running_loop()
        for i, request in enumerate(requests):
            app.handle(request, lambda r, i=i: answers.__setitem__(i, r))
        deadline = time.monotonic() + settle
        while any(a is None for a in answers) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    asyncio.run(main())
    return [a for a in answers if a is not None]


def test_overload_gets_503_with_retry_after() -> None:
    model = FakeModel(1.0)
    model.gate = threading.Event()
    app, metrics = make_app(model, max_concurrency=1, max_queue=2)
    threading.Timer(0.3, model.gate.set).start()
    answers = run_requests(app, [infer_request() for _ in range(6)])
    statuses = sorted(a.status for a in answers)
    assert statuses == [200, 200, 200, 503, 503, 503]
    assert all(("Retry-After", "1") in a.headers for a in answers if a.status == 503)
    assert metrics.errors()["overload"] == 3
    app.close()


def test_slow_inference_times_out_with_504() -> None:
    model = FakeModel(1.0)
    model.gate = threading.Event()
    app, metrics = make_app(model, request_timeout_s=0.2)
    answers = run_requests(app, [infer_request()], settle=2)
    model.gate.set()
    assert answers[0].status == 504 and b"0.2 s" in answers[0].body
    assert metrics.errors()["timeout"] == 1
    app.close()


def test_no_model_is_503_and_readyz_says_so() -> None:
    app, _ = make_app(None)
    answers = run_requests(app, [infer_request(), Request("GET", "/readyz", "", {})])
    assert [a.status for a in answers] == [503, 503]
    assert b"no model" in answers[0].body and b"no model loaded" in answers[1].body
    app.close()


def _threads_of_second_request(inline_max_ms: float) -> list[str]:
    """Serve one request to measure the model, then report which thread ran the second."""
    app, _ = make_app(FakeModel(1.0), inline_max_ms=inline_max_ms)
    assert app.scheduler.inline_left == 0  # nothing measured yet: the first goes to the pool
    answers = run_requests(app, [infer_request()])
    assert answers[0].status == 200
    seen: list[str] = []
    original = app.server.infer_with_variant  # both paths call it: inline on the loop, or in a pool worker

    def spy(*args):  # type: ignore[no-untyped-def]
        seen.append(threading.current_thread().name)
        return original(*args)

    app.server.infer_with_variant = spy  # type: ignore[method-assign]
    assert run_requests(app, [infer_request()])[0].status == 200
    app.close()
    return seen


def test_tiny_model_is_answered_inline_once_measured() -> None:
    # A threshold (one minute) that no machine misses, however loaded: the test is about the
    # decision once a measurement exists, not about how fast this host is.
    assert _threads_of_second_request(inline_max_ms=60_000) == ["MainThread"]  # on the event loop, no pool hop
    # The same model with the fast path switched off goes through the pool.
    (worker,) = _threads_of_second_request(inline_max_ms=0)
    assert worker != "MainThread"


def test_drain_waits_for_requests_in_flight() -> None:
    model = FakeModel(1.0)
    model.gate = threading.Event()
    app, _ = make_app(model)
    answers: list[Response] = []

    async def main() -> tuple[bool, bool]:
        app.loop = asyncio.get_running_loop()
        app.handle(infer_request(), answers.append)
        quick = await app.drain(0.1)  # still running: times out
        threading.Timer(0.1, model.gate.set).start()
        done = await app.drain(5)
        return quick, done

    quick, done = asyncio.run(main())
    assert (quick, done) == (False, True)
    assert [a.status for a in answers] == [200]
    app.close()


def test_one_preempted_run_keeps_the_fast_path_two_slow_ones_leave_it() -> None:
    app, _ = make_app(FakeModel(1.0), inline_max_ms=1.0)  # slow: over 10 ms
    for _ in range(8):
        app.scheduler.took(0.0001)
    assert app.scheduler.inline_left
    app.scheduler.took(0.5)  # one run preempted for half a second (a loaded machine): still inline
    assert app.scheduler.inline_left
    app.scheduler.took(0.0001)
    app.scheduler.took(0.5)
    app.scheduler.took(0.5)  # slow twice in a row: the model is slow now, the next ones go to the pool
    assert not app.scheduler.inline_left
    app.scheduler.took(0.002)  # slow, not far over: still the pool
    assert not app.scheduler.inline_left
    app.scheduler.took(0.0001)  # until a fast run (in the pool) says otherwise
    assert app.scheduler.inline_left
    app.close()


def test_inline_while_the_shortest_of_the_last_eight_is_under_the_threshold() -> None:
    """``took`` counts slow answers down instead of keeping the last eight: against the
    definition (inline while the shortest of the last eight durations is under inline_max_s;
    two in a row over ten times it fill the window with themselves), on random durations
    around the thresholds, slow pairs included."""
    import random

    app, _ = make_app(FakeModel(1.0), inline_max_ms=1.0)
    rng = random.Random(7)
    window: list[float] = [float("inf")] * 8
    slow_last = False
    for step in range(5000):
        took = rng.choice([0.0001, 0.0002, 0.0005, 0.002, 0.02, 0.5]) * rng.uniform(0.5, 1.5)
        app.scheduler.took(took)
        if took > 0.01 and slow_last:  # two far over in a row fill the window (see took)
            window = [took] * 8
        else:
            window = window[1:] + [took]
        slow_last = took > 0.01
        assert bool(app.scheduler.inline_left) == (min(window) < app.scheduler.inline_max_s), step
    app.close()
