"""Routes prepared per known header block (agent/api/prepared.py), through the real HTTP layer
and ApiApp, with a fake model: a keep-alive client repeating its request is answered without the
generic path and exactly as the generic path answers it; whatever the plan does not expect (NaN,
a malformed body, another model, a runtime failure, a full agent, a slow model) is answered by the
generic path, as before, and the plan takes the next plain request again."""

from __future__ import annotations

import asyncio
import gc
import io
import json
import time
import weakref
from collections.abc import Iterator

import numpy as np
import pytest
from edgesdk.agent.api import app as app_module
from edgesdk.agent.api.app import ApiApp
from edgesdk.agent.api.http import HttpLimits, HttpProtocol, HttpServer
from edgesdk.agent.api.prepared import PreparedInfer
from edgesdk.agent.metrics import Metrics
from edgesdk.agent.serving import ModelServer

from edgesdk.schemas.agent_config import ApiConfig
from tests.unit.test_agent_http_known_heads import FakeTransport
from tests.unit.test_agent_serving import FakeModel, variant


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


class Agent:
    """An ApiApp behind one HttpProtocol fed by hand (every ``send`` is one read), counting the
    requests that reached the generic v1 path (``answer_v1``)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        monkeypatch: pytest.MonkeyPatch,
        limits: HttpLimits | None = None,
        **config: object,
    ) -> None:
        self.loop = loop
        self.server = ModelServer()
        self.metrics = Metrics(self.server)
        self.server.observe, self.server.count_error = self.metrics.observe, self.metrics.count_error
        self.serve(2.0)
        # inline_max_ms high: the fake model's runs count as tiny whatever the machine's load.
        self.app = ApiApp(self.server, self.metrics, ApiConfig(**{"inline_max_ms": 1e4, **config}))  # type: ignore[arg-type]
        self.app.loop = loop
        self.generic = 0
        real = app_module.answer_v1

        def counted(*args: object) -> object:
            self.generic += 1
            return real(*args)  # type: ignore[arg-type]

        monkeypatch.setattr(app_module, "answer_v1", counted)
        self.http = HttpServer(self.app.handle, limits or HttpLimits())

        async def make() -> HttpProtocol:
            return HttpProtocol(self.app.handle, self.http.limits, self.http)

        self.protocol = loop.run_until_complete(make())
        self.transport = FakeTransport()
        self.protocol.connection_made(self.transport)  # type: ignore[arg-type]

    def serve(self, factor: float, model: FakeModel | None = None) -> FakeModel:
        model = model or FakeModel(factor)
        self.server.serve(name="m", version="1.0.0", release=1, variants=[(variant("fp32", "fp32"), model)])
        return model

    def send(self, data: bytes) -> tuple[int, dict[str, str], bytes]:
        """One read; the answer (status, headers, body), waiting for the pool when it went there."""
        start = len(self.transport.sent)
        self.protocol.data_received(data)
        deadline = time.monotonic() + 5
        while True:
            answer = bytes(self.transport.sent[start:])
            head, sep, body = answer.partition(b"\r\n\r\n")
            if sep:
                lines = head.decode("latin-1").split("\r\n")
                headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
                if len(body) >= int(headers["content-length"]):
                    return int(lines[0].split()[1]), headers, body
            assert time.monotonic() < deadline, f"no whole answer: {answer!r}"
            self.loop.run_until_complete(asyncio.sleep(0.005))

    def known_route(self) -> object:
        (known,) = self.http.known_heads.values()
        return known.route

    def prepared(self) -> PreparedInfer:
        """Three raw requests of one header block: the first goes to the pool, the second is
        answered inline by the generic path, which prepares the block's route; that route."""
        for i in range(3):
            assert self.send(raw_request(values(i)))[0] == 200
        plan = self.known_route()
        assert isinstance(plan, PreparedInfer) and self.generic == 2
        return plan


def raw_request(x: np.ndarray, extra: str = "") -> bytes:
    head = (
        "POST /v1/models/m/infer HTTP/1.1\r\nHost: t\r\nContent-Type: application/x-edgesdk-tensors\r\n"
        f"X-Tensors: x=float32[{','.join(map(str, x.shape))}]\r\n{extra}Content-Length: {x.nbytes}\r\n\r\n"
    )
    return head.encode() + np.ascontiguousarray(x, np.float32).tobytes()


def json_request(text: bytes) -> bytes:
    head = f"POST /v1/models/m/infer HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: {len(text)}\r\n\r\n"
    return head.encode() + text


def npy_request(x: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, x.astype(np.float32))
    body = buffer.getvalue()
    head = f"POST /v1/models/m/infer HTTP/1.1\r\nHost: t\r\nContent-Type: application/x-npy\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


def json_text(x: np.ndarray) -> bytes:
    # Fixed-width numbers: the same length for every x of one shape, as one header block
    # (its Content-Length) needs.
    rows = ",".join("[" + ",".join(f"{v:.3f}" for v in row) + "]" for row in x)
    return b'{"inputs": {"x": [%s]}}' % rows.encode()


def values(i: int) -> np.ndarray:
    return np.full((1, 4), 1.0 + i % 7, np.float32)


@pytest.mark.parametrize("encoding", ["raw", "json", "npy"])
def test_a_repeated_block_is_answered_by_its_plan_exactly_as_by_the_generic_path(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch, encoding: str
) -> None:
    agent = Agent(loop, monkeypatch)
    make = {"raw": raw_request, "npy": npy_request, "json": lambda x: json_request(json_text(x))}[encoding]
    answers = [agent.send(make(values(i))) for i in range(12)]
    # The first went through the pool (no run timed yet), the second was answered inline by the
    # generic path and prepared the block's route, the rest took that route.
    assert agent.generic == 2
    assert isinstance(agent.known_route(), PreparedInfer)
    for i, (status, headers, body) in enumerate(answers):
        assert status == 200 and headers["x-model-variant"] == "fp32"
        if encoding == "raw":
            assert headers["x-tensors"] == "y=float32[1,4]"
            got = np.frombuffer(body, np.float32).reshape(1, 4)
        elif encoding == "npy":
            got = np.load(io.BytesIO(body))
        else:
            document = json.loads(body)
            assert (document["model"], document["version"], document["variant"]) == ("m", "1.0.0", "fp32")
            got = np.asarray(document["outputs"]["y"], np.float32)
        np.testing.assert_array_equal(got, values(i) * 2.0)
    # Byte for byte what the generic path answered to the same request (i = 1 and 8 send the same).
    assert answers[8] == answers[1]
    assert agent.metrics.requests.count == 0
    agent.app.scheduler.inline_left = 1  # seven slow answers in a row: the plan's next fast one counts
    assert agent.send(make(values(3)))[0] == 200 and agent.generic == 2
    assert agent.app.scheduler.inline_left == 8  # the plan's answers feed the inline decision
    assert sum(agent.metrics.errors().values()) == 0


def test_nan_and_a_broken_body_are_answered_by_the_generic_path_and_the_plan_stays(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = Agent(loop, monkeypatch)
    plan = agent.prepared()
    status, _, body = agent.send(raw_request(np.array([[1, np.nan, 3, 4]], np.float32)))
    assert status == 422 and b"NaN" in body
    assert agent.generic == 3 and agent.metrics.errors()["bad_input"] == 1
    assert agent.known_route() is plan  # the block keeps its plan
    assert agent.send(raw_request(values(5)))[0] == 200 and agent.generic == 3

    # JSON of the block's length that is no JSON: the generic path's 400. What the plan's decode
    # took of the request's allowance is given back first: the per-request cap allows parsing
    # this body once (40 bytes per value), not twice, and the answer is the 400, not a 413.
    good = json_text(values(0))
    cost = len(good) * 40
    json_agent = Agent(loop, monkeypatch, HttpLimits(max_decoded_bytes=cost * 3 // 2))
    for _ in range(3):
        assert json_agent.send(json_request(good))[0] == 200
    assert isinstance(json_agent.known_route(), PreparedInfer)
    status, _, body = json_agent.send(json_request(b"[" + b"," * (len(good) - 1)))
    assert status == 400 and b"malformed JSON" in body, body
    assert json_agent.metrics.errors()["bad_request"] == 1
    assert json_agent.http.budget.used == 0
    # NaN in Python's JSON dialect, which only the generic path reads: its 422.
    status, _, body = json_agent.send(json_request(good.replace(b"1.000", b"  NaN", 1)))
    assert status == 422 and b"NaN" in body, body
    # A number written as a string (numpy would read it as one): the generic path's 422.
    status, _, body = json_agent.send(json_request(good.replace(b"1.000", b'"1.0"', 1)))
    assert status == 422 and b"values must be numbers" in body, body
    # A null and an object, which the plan's float32 reading would take for NaN or fail on:
    # the generic path's 422; an overflow of float32 (finite in JSON): its NaN/Inf 422.
    for value, says in ((b" null", b"values must be numbers"), (b"   {}", b"values must be numbers")):
        status, _, body = json_agent.send(json_request(good.replace(b"1.000", value, 1)))
        assert status == 422 and says in body, (value, body)
    status, _, body = json_agent.send(json_request(good.replace(b"1.000", b" 1e39", 1)))
    assert status == 422 and b"NaN or Inf" in body, body
    errors = json_agent.metrics.errors()
    # Booleans are numbers to numpy either way (1 and 0): answered, by the plan.
    generic = json_agent.generic
    status, _, body = json_agent.send(json_request(good.replace(b"1.000", b" true", 1)))
    assert status == 200 and json.loads(body)["outputs"]["y"][0][:2] == [2.0, 2.0], body
    assert json_agent.generic == generic and json_agent.metrics.errors() == errors
    # A shape the model does not take, in a body of the same length: the generic path's 422.
    wrong = json.dumps({"inputs": {"x": [[1.0, 2.0, 3.0]]}}).encode()
    wrong = wrong[:-1] + b" " * (len(good) - len(wrong)) + b"}"
    status, _, body = json_agent.send(json_request(wrong))
    assert status == 422 and b"axis 1 must be 4" in body
    assert json_agent.send(json_request(good))[0] == 200


@pytest.mark.parametrize(
    "document",
    [
        b'{"inputs": {"x": ROWS}, "k": 0}',  # another key beside "inputs"
        b'{"inputs": {"x": ROWS, "z": 0}}',  # another input
        b'{"inputs": {"w": ROWS}}',  # another name
        b'{"inputs": [ROWS]}',  # inputs as a list
        b'[{"inputs": {"x": ROWS}}]',  # the document a list
        b'{"inputs": {"x\\"": ROWS}}',  # a quote escaped in the name
        b'{"inputs": 7, "x": ROWS}',  # the name's string elsewhere
    ],
)
def test_documents_other_than_the_one_input_go_to_the_generic_path(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch, document: bytes
) -> None:
    """The plan for a one-input model reads ``document["inputs"][name]`` and counts the body's
    quotes instead of checking the document's keys one by one: whatever else a body of the
    block's length holds, the generic path answers it (declined, nothing booked twice)."""
    agent = Agent(loop, monkeypatch)
    good = json_text(values(0))
    for _ in range(3):
        assert agent.send(json_request(good))[0] == 200
    assert isinstance(agent.known_route(), PreparedInfer)
    body = document.replace(b"ROWS", b"[[1,1,1,1]]")
    assert len(body) <= len(good)
    body = body[:-1] + b" " * (len(good) - len(body)) + body[-1:]
    generic = agent.generic
    status, _, answer = agent.send(json_request(body))
    assert agent.generic == generic + 1, (status, answer)  # declined: the generic path answered
    assert agent.metrics.requests.count == 0 and agent.http.budget.used == 0
    assert agent.send(json_request(good))[0] == 200 and agent.generic == generic + 1  # the plan again


def test_a_swapped_model_drops_the_plan_and_the_next_is_prepared_for_it(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = Agent(loop, monkeypatch)
    first = agent.prepared()
    agent.serve(3.0)  # an update lands: same name, a new model
    status, _, body = agent.send(raw_request(values(1)))
    assert status == 200 and np.frombuffer(body, np.float32).tolist() == [6.0] * 4
    assert agent.generic == 3  # the old plan handed it to the generic path, which prepared anew
    second = agent.known_route()
    assert isinstance(second, PreparedInfer) and second is not first
    assert np.frombuffer(agent.send(raw_request(values(2)))[2], np.float32).tolist() == [9.0] * 4
    assert agent.generic == 3


def test_a_plan_does_not_keep_a_replaced_model_in_memory(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The block's plan stays until a request with it comes again, which may be never: it holds
    its model weakly, so an update's previous model (its runtime sessions) is freed at once."""
    agent = Agent(loop, monkeypatch)
    plan = agent.prepared()
    previous = weakref.ref(agent.server.model)  # type: ignore[arg-type]
    agent.serve(3.0)
    gc.collect()
    assert previous() is None
    assert agent.known_route() is plan  # still there, and
    assert np.frombuffer(agent.send(raw_request(values(1)))[2], np.float32).tolist() == [6.0] * 4


def test_a_runtime_failure_is_the_generic_paths_500_counted_once(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = Agent(loop, monkeypatch)
    model = agent.serve(2.0)
    agent.prepared()

    def broken(feeds: object) -> object:
        raise RuntimeError("device lost")

    monkeypatch.setattr(model, "run", broken)
    status, _, body = agent.send(raw_request(values(1)))
    assert status == 500 and b"RuntimeError" in body
    assert agent.metrics.errors() == {"runtime": 1}  # once, by the server: not internal as well
    assert agent.metrics.requests.count == 0


def test_a_full_agent_and_a_slow_model_take_the_generic_path(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = Agent(loop, monkeypatch, max_concurrency=1, max_queue=0)
    agent.prepared()
    agent.metrics.requests.count = 1  # one inference in flight fills this agent
    status, headers, _ = agent.send(raw_request(values(1)))
    assert status == 503 and headers["retry-after"] == "1"
    assert agent.metrics.errors()["overload"] == 1
    agent.metrics.requests.count = 0
    agent.app.scheduler.inline_left = 0  # the model got slow: the pool answers, as before
    before = agent.generic
    assert agent.send(raw_request(values(1)))[0] == 200
    assert agent.generic == before + 1


@pytest.mark.parametrize("what", ["npz", "batching"])
def test_blocks_without_a_plan_keep_the_generic_route(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch, what: str
) -> None:
    if what == "batching":
        agent = Agent(loop, monkeypatch, batching={"enabled": True, "max_batch_size": 4})
        request = raw_request(values(0))
    else:
        agent = Agent(loop, monkeypatch)
        buffer = io.BytesIO()
        np.savez(buffer, x=values(0))
        body = buffer.getvalue()
        request = (
            "POST /v1/models/m/infer HTTP/1.1\r\nHost: t\r\nContent-Type: application/x-npz\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body
    statuses = [agent.send(request)[0] for _ in range(5)]
    assert statuses == [200] * 5
    (known,) = agent.http.known_heads.values()
    assert known.route is None and known.settled  # decided once, not asked again
    assert agent.generic == 5


@pytest.mark.parametrize("encoding", ["raw", "json", "npy"])
def test_a_plan_holds_its_share_of_the_memory_budget_while_it_answers(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch, encoding: str
) -> None:
    """The body (and for JSON the bound of the arrays read from it) is held from before decoding
    until the answer is made, as the request's allowance holds it on the generic path; nothing
    after."""
    agent = Agent(loop, monkeypatch)
    model = agent.serve(2.0)
    make = {"raw": raw_request, "npy": npy_request, "json": lambda x: json_request(json_text(x))}[encoding]
    for i in range(3):
        assert agent.send(make(values(i)))[0] == 200
    assert isinstance(agent.known_route(), PreparedInfer) and agent.generic == 2
    held: list[int] = []
    real_run = model.run
    monkeypatch.setattr(model, "run", lambda feeds: (held.append(agent.http.budget.used), real_run(feeds))[1])
    request = make(values(4))
    body_length = len(request) - request.index(b"\r\n\r\n") - 4
    assert agent.send(request)[0] == 200 and agent.generic == 2
    assert len(held) == 1 and held[0] >= body_length
    if encoding == "json":  # and the bound of the arrays read from it
        assert held[0] >= body_length + values(4).size * 4
    assert agent.http.budget.used == 0


def test_a_full_memory_budget_is_the_generic_paths_503_counted_once(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = Agent(loop, monkeypatch)
    plan = agent.prepared()
    budget = agent.http.budget
    budget.used = budget.capacity - 1  # other requests hold all but one byte
    status, headers, body = agent.send(raw_request(values(5)))
    assert status == 503 and headers["retry-after"] == "1" and b"memory budget" in body
    assert budget.refused == 1 and agent.http.over_budget == 1 and agent.generic == 2
    assert agent.transport.closed  # as for any body refused before it is read
    assert agent.known_route() is plan and budget.used == budget.capacity - 1  # nothing kept


def test_a_plans_answer_closes_the_connection_when_the_server_drains(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = Agent(loop, monkeypatch)
    agent.prepared()
    agent.http.draining = True
    status, headers, _ = agent.send(raw_request(values(7)))
    assert status == 200 and headers["connection"] == "close" and agent.generic == 2
    assert agent.transport.closed


def test_integer_inputs_in_json_take_the_generic_decoder_inside_the_plan(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = Agent(loop, monkeypatch)
    agent.serve(2.0, FakeModel(2.0, dtype="int64"))
    text = b'{"inputs": {"x": [[1, 2, 3, 4]]}}'
    for _ in range(4):
        status, _, body = agent.send(json_request(text))
        assert status == 200 and json.loads(body)["outputs"]["y"] == [[2, 4, 6, 8]]
    assert isinstance(agent.known_route(), PreparedInfer) and agent.generic == 2
    # A fraction for an integer input, in a body of the same length: the generic path's 422.
    status, _, body = agent.send(json_request(b'{"inputs": {"x": [[1,2,3, 0.5]]}}'))
    assert status == 422 and b"expected integers" in body, body


def test_a_cap_under_the_json_bound_has_the_plan_count_the_values(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With api.max_decoded_bytes under the plan's charge bound for its block (a digit and a
    comma per value), the plan charges what decode_json would, and still answers itself."""
    good = json_text(values(0))
    bound = (len(good) + 1) // 2 * (40 + 4 + 8)
    agent = Agent(loop, monkeypatch, HttpLimits(max_decoded_bytes=bound - 1))
    for _ in range(6):
        assert agent.send(json_request(good))[0] == 200
    assert isinstance(agent.known_route(), PreparedInfer)
    assert agent.generic == 2 and agent.http.budget.used == 0
