"""Batches of a tiny model's requests that one wake-up of the event loop brings
(``api.inline_batch_max``, ``PreparedInfer.later``), through the real HTTP layer and ApiApp with
a fake model (y = 2x, batch axis): requests from several connections read in one wake-up run as
one batch, each answered its own rows in its own connection's order; a lone client is never
made to wait; whatever goes wrong between the reads and the batch's run (the model swapped,
outputs without a batch axis, a half-close, a closed connection) is answered as without batching,
and nothing stays held."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import numpy as np
import pytest
from edgesdk.agent.api.http import HttpProtocol
from edgesdk.agent.api.prepared import PreparedInfer
from edgesdk.agent.batching import PROBE_EVERY

from edgesdk.schemas.manifest import TensorSpec
from tests.unit.test_agent_api_prepared import Agent, raw_request, values
from tests.unit.test_agent_http_known_heads import FakeTransport
from tests.unit.test_agent_serving import FakeModel


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


class Client:
    """One more connection to ``agent``'s HTTP server, fed by hand."""

    def __init__(self, agent: Agent) -> None:
        async def make() -> HttpProtocol:
            return HttpProtocol(agent.app.handle, agent.http.limits, agent.http)

        self.agent = agent
        self.protocol = agent.loop.run_until_complete(make())
        self.transport = FakeTransport()
        self.protocol.connection_made(self.transport)  # type: ignore[arg-type]

    def answers(self) -> list[np.ndarray]:
        """The bodies written so far, as the 1x4 float32 answers they are."""
        sent, found = bytes(self.transport.sent), []
        while sent:
            head, _, rest = sent.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 "), head
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            found.append(np.frombuffer(rest[:length], np.float32).reshape(1, 4))
            sent = rest[length:]
        return found


def wake_up(agent: Agent, reads: list[tuple[Client, bytes]]) -> None:
    """The reads of one wake-up of the loop, then what the loop runs after them."""
    for client, data in reads:
        client.protocol.data_received(data)
    agent.loop.run_until_complete(asyncio.sleep(0))


def batching_agent(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch, clients: int
) -> tuple[Agent, PreparedInfer, list[Client], FakeModel]:
    agent = Agent(loop, monkeypatch, inline_batch_max=8)
    model = agent.serve(2.0)  # its own, to count its runs
    plan = agent.prepared()
    assert plan.batching
    return agent, plan, [Client(agent) for _ in range(clients)], model


def batch_sizes(model: FakeModel) -> list[int]:
    return [len(x) for x in model.seen]


def company(agent: Agent) -> int:
    """Members of the last batch the served model's former ran on the loop."""
    return agent.server.model.former.company  # type: ignore[union-attr]


def until_batching(agent: Agent, plan: PreparedInfer, clients: list[Client]) -> None:
    """Wake-ups of one request per client until a batch has run (the plan probes for company
    every PROBE_EVERY requests while its last batch ran alone)."""
    for round_index in range(4 * PROBE_EVERY):
        wake_up(agent, [(c, raw_request(values(round_index + i))) for i, c in enumerate(clients)])
        if company(agent) > 1:
            return
    raise AssertionError("no batch ran")


def test_requests_of_one_wake_up_run_as_one_batch_each_answered_its_rows(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent, plan, clients, model = batching_agent(loop, monkeypatch, 3)
    until_batching(agent, plan, clients)
    runs_before, batched_before = len(model.seen), agent.metrics.inline_batched
    inputs = [np.array([[i, i + 0.5, -i, 7]], np.float32) for i in range(3)]
    wake_up(agent, [(c, raw_request(x)) for c, x in zip(clients, inputs, strict=True)])
    # One run for the three, then each connection got its own row.
    assert batch_sizes(model)[runs_before:] == [3]
    assert agent.metrics.inline_batched == batched_before + 3
    assert "edgesdk_agent_inline_batched_inferences_total " in agent.metrics.prometheus()
    for client, x in zip(clients, inputs, strict=True):
        np.testing.assert_array_equal(client.answers()[-1], x * 2.0)
    # Nothing held, nothing counted twice: the latency histogram has one sample per request.
    assert agent.metrics.requests.count == 0 and agent.http.budget.used == 0
    assert sum(agent.metrics.errors().values()) == 0
    assert all(not c.protocol._busy for c in clients)


def test_a_lone_client_is_answered_at_once(loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch) -> None:
    agent = Agent(loop, monkeypatch, inline_batch_max=8)
    assert agent.prepared().batching
    # One connection: the request is answered within its read, never left for a batch.
    for i in range(3 * PROBE_EVERY):
        before = len(agent.transport.sent)
        agent.protocol.data_received(raw_request(values(i)))
        assert len(agent.transport.sent) > before, "answered later"
    assert company(agent) == 0
    # Two connections, one of them idle: a request now and then waits one turn of the loop to
    # look for company (the 16th, then the 33rd: about 1 in PROBE_EVERY), the others go at once.
    idle = Client(agent)
    waited = 0
    for i in range(3 * PROBE_EVERY):
        before = len(agent.transport.sent)
        agent.protocol.data_received(raw_request(values(i)))
        if len(agent.transport.sent) == before:
            waited += 1
            loop.run_until_complete(asyncio.sleep(0))
            assert len(agent.transport.sent) > before
    assert waited == 2 and idle.transport.sent == bytearray()


def test_a_connection_keeps_its_order_when_it_sends_more_while_its_request_waits(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent, plan, clients, _ = batching_agent(loop, monkeypatch, 2)
    until_batching(agent, plan, clients)
    first, second = clients
    count_before = [len(c.answers()) for c in clients]
    a, b, c = (np.full((1, 4), v, np.float32) for v in (3.0, 4.0, 5.0))
    first.protocol.data_received(raw_request(a))
    second.protocol.data_received(raw_request(b))
    assert first.protocol._busy  # taken for the batch
    first.protocol.data_received(raw_request(c))  # arrives while its first request waits
    loop.run_until_complete(asyncio.sleep(0.01))
    answers = first.answers()[count_before[0] :]
    assert len(answers) == 2
    np.testing.assert_array_equal(answers[0], a * 2)
    np.testing.assert_array_equal(answers[1], c * 2)
    np.testing.assert_array_equal(second.answers()[-1], b * 2)
    assert agent.metrics.requests.count == 0 and agent.http.budget.used == 0


def test_a_model_swapped_before_the_batch_runs_answers_each_by_the_generic_path(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent, plan, clients, _ = batching_agent(loop, monkeypatch, 3)
    until_batching(agent, plan, clients)
    generic = agent.generic
    for i, client in enumerate(clients):
        client.protocol.data_received(raw_request(values(i)))
    agent.serve(3.0)  # an update lands between the reads and the batch
    loop.run_until_complete(asyncio.sleep(0.01))
    # Each answered by the generic path, on the model serving now; nothing lost, nothing held.
    assert agent.generic == generic + 3
    for i, client in enumerate(clients):
        np.testing.assert_array_equal(client.answers()[-1], values(i) * 3.0)
    assert agent.metrics.requests.count == 0 and agent.http.budget.used == 0


class OneRowModel(FakeModel):
    """Declares a batch axis but answers one row whatever it is given."""

    def run(self, feeds):  # type: ignore[no-untyped-def]
        return {"y": super().run(feeds)["y"][:1]}


class OneAtATimeModel(FakeModel):
    """Declares a batch axis but fails on more than one row (a runtime that cannot resize)."""

    def run(self, feeds):  # type: ignore[no-untyped-def]
        if len(feeds["x"]) > 1:
            raise RuntimeError("batch size fixed at 1")
        return super().run(feeds)


@pytest.mark.parametrize("model", [OneRowModel, OneAtATimeModel])
def test_a_batch_that_cannot_run_turns_batching_off_and_loses_nothing(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch, model: type[FakeModel]
) -> None:
    agent = Agent(loop, monkeypatch, inline_batch_max=8)
    agent.serve(2.0, model(2.0))
    plan = agent.prepared()
    clients = [Client(agent) for _ in range(3)]
    for round_index in range(2 * PROBE_EVERY):
        inputs = [values(round_index + i) for i in range(3)]
        wake_up(agent, [(c, raw_request(x)) for c, x in zip(clients, inputs, strict=True)])
        loop.run_until_complete(asyncio.sleep(0.01))
        for client, x in zip(clients, inputs, strict=True):
            np.testing.assert_array_equal(client.answers()[-1], x * 2.0)  # every answer right
        if not plan.batching:
            break
    assert not plan.batching
    assert agent.metrics.requests.count == 0 and agent.http.budget.used == 0


def test_a_half_close_or_a_closed_connection_while_waiting(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent, plan, clients, _ = batching_agent(loop, monkeypatch, 3)
    until_batching(agent, plan, clients)
    closing, gone, staying = clients
    for i, client in enumerate(clients):
        client.protocol.data_received(raw_request(values(i)))
    assert closing.protocol.eof_received() is True  # half-closed: its answer still comes
    gone.protocol.connection_lost(None)
    loop.run_until_complete(asyncio.sleep(0.01))
    head = bytes(closing.transport.sent).rsplit(b"HTTP/1.1 ", 1)[1]
    assert b"Connection: close" in head and closing.transport.closed
    np.testing.assert_array_equal(closing.answers()[-1], values(0) * 2)
    np.testing.assert_array_equal(staying.answers()[-1], values(2) * 2)
    assert agent.metrics.requests.count == 0 and agent.http.budget.used == 0


def test_batching_is_on_by_default_off_with_one_and_for_models_it_cannot_stack(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert Agent(loop, monkeypatch).prepared().batching
    assert not Agent(loop, monkeypatch, inline_batch_max=1).prepared().batching

    class Fixed(FakeModel):
        def __init__(self) -> None:
            super().__init__(2.0)
            self.inputs = [TensorSpec(name="x", dtype="float32", shape=[1, 4])]  # no batch axis

    agent = Agent(loop, monkeypatch, inline_batch_max=8)
    agent.serve(2.0, Fixed())
    assert not agent.prepared().batching


def test_a_batch_whose_stacked_inputs_do_not_fit_the_memory_budget_is_answered_one_by_one(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent, plan, clients, model = batching_agent(loop, monkeypatch, 3)
    until_batching(agent, plan, clients)
    budget = agent.http.budget
    stack = 3 * values(0).nbytes  # the three 1x4 float32 inputs, stacked
    for room, batched in ((3 * plan.hold + stack, True), (3 * plan.hold + stack - 1, False)):
        budget.capacity = room
        runs, generic = len(model.seen), agent.generic
        inputs = [values(i + 2) for i in range(3)]
        wake_up(agent, [(c, raw_request(x)) for c, x in zip(clients, inputs, strict=True)])
        loop.run_until_complete(asyncio.sleep(0.01))
        # Fits: one run of three. One byte short: the former runs each alone, still on the loop.
        assert batch_sizes(model)[runs:] == ([3] if batched else [1, 1, 1])
        assert agent.generic == generic
        for client, x in zip(clients, inputs, strict=True):
            np.testing.assert_array_equal(client.answers()[-1], x * 2.0)
        assert budget.used == 0 and agent.metrics.requests.count == 0
