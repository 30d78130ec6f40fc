"""Post-answer taps (``ModelServer.taps``): every route that runs the model through the API calls
each tap once per answered request, with the model's name, feeds, outputs and variant, after the
answer is written; never for a refused request; a tap that raises costs its request nothing.

Through the real HTTP layer and ApiApp with the fake model y = 2x (tests/unit/test_agent_api_prepared.py's
harness): each route is sent four times, so the first (the pool), the second (inline, generic)
and the later ones (the block's prepared route) are all counted."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import orjson
import pytest

from edgesdk.schemas.agent_config import BatchingConfig
from tests.unit.test_agent_api_batch_inline import batching_agent, until_batching, wake_up
from tests.unit.test_agent_api_prepared import Agent, json_request, json_text, npy_request, raw_request, values


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


class Recorder:
    """A tap that records what it was called with, and whether the answer was written by then."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.calls: list[tuple[str, dict[str, np.ndarray], dict[str, np.ndarray], str]] = []
        self.written_before: list[int] = []

    def __call__(self, model: str, feeds: Mapping[str, Any], outputs: Mapping[str, Any], variant: str) -> None:
        self.calls.append((model, dict(feeds), dict(outputs), variant))
        self.written_before.append(len(self.agent.transport.sent))

    def check(self, inputs: list[np.ndarray]) -> None:
        """One call per input, in order, each with y = 2x on variant fp32 of model m."""
        assert len(self.calls) == len(inputs)
        for (model, feeds, outputs, variant), x in zip(self.calls, inputs, strict=True):
            assert (model, variant) == ("m", "fp32")
            np.testing.assert_array_equal(feeds["x"], x)
            np.testing.assert_array_equal(outputs["y"], 2 * x)


def tapped(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch, **config: object
) -> tuple[Agent, Recorder]:
    agent = Agent(loop, monkeypatch, **config)
    recorder = Recorder(agent)
    agent.server.taps.append(recorder)
    return agent, recorder


def v2_json_request(x: np.ndarray) -> bytes:
    body = orjson.dumps(
        {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
    )
    head = f"POST /v2/models/m/infer HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


def v2_binary_request(x: np.ndarray) -> bytes:
    header = orjson.dumps(
        {
            "inputs": [
                {"name": "x", "shape": list(x.shape), "datatype": "FP32", "parameters": {"binary_data_size": x.nbytes}}
            ]
        }
    )
    body = header + x.astype("<f4").tobytes()
    head = (
        "POST /v2/models/m/infer HTTP/1.1\r\nHost: t\r\nContent-Type: application/octet-stream\r\n"
        f"Inference-Header-Content-Length: {len(header)}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


@pytest.mark.parametrize(
    "make",
    [
        lambda x: json_request(json_text(x)),
        raw_request,
        npy_request,
        v2_json_request,
        v2_binary_request,
    ],
    ids=["v1-json", "v1-raw", "v1-npy", "v2-json", "v2-binary"],
)
def test_every_rest_route_calls_the_taps_once_per_answer_after_writing_it(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch, make: Any
) -> None:
    agent, recorder = tapped(loop, monkeypatch)
    inputs = [values(i) for i in range(4)]
    for x in inputs:
        before = len(agent.transport.sent)
        assert agent.send(make(x))[0] == 200
        # Called once the answer was written, not before.
        assert recorder.written_before[-1] > before
    recorder.check(inputs)


def test_a_refused_request_calls_no_tap(loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch) -> None:
    agent, recorder = tapped(loop, monkeypatch)
    for i in range(3):
        assert agent.send(raw_request(values(i)))[0] == 200
    assert agent.send(raw_request(np.full((1, 4), np.nan, np.float32)))[0] == 422
    assert agent.send(json_request(b'{"inputs": {"nope": [[1,2,3,4]]}}'))[0] == 422
    assert len(recorder.calls) == 3


def test_a_tap_that_raises_is_logged_once_counted_and_the_request_answered(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    agent, recorder = tapped(loop, monkeypatch)

    def broken(*args: object) -> None:
        raise ValueError("tap bug")

    agent.server.taps.insert(0, broken)
    with caplog.at_level(logging.ERROR, logger="edgesdk.agent.serving"):
        for i in range(4):
            assert agent.send(raw_request(values(i)))[0] == 200
    assert agent.server.tap_failures == 4
    assert len([r for r in caplog.records if r.name == "edgesdk.agent.serving" and "tap" in r.getMessage()]) == 1
    recorder.check([values(i) for i in range(4)])  # the taps after it still run


def test_the_dynamic_batcher_route_calls_the_taps_per_member(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent, recorder = tapped(loop, monkeypatch, batching={"enabled": True, "max_batch_size": 8})
    agent.server.batching = BatchingConfig(enabled=True, max_batch_size=8)
    agent.serve(2.0)
    assert agent.server.model is not None and agent.server.model.former.pooled  # type: ignore[union-attr]
    inputs = [values(i) for i in range(4)]
    for x in inputs:
        assert agent.send(raw_request(x))[0] == 200
    recorder.check(inputs)


def test_inline_batches_call_the_taps_once_per_member_with_its_rows(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent, plan, clients, model = batching_agent(loop, monkeypatch, 3)
    recorder = Recorder(agent)
    agent.server.taps.append(recorder)
    until_batching(agent, plan, clients)
    recorder.calls.clear()
    runs_before = len(model.seen)
    inputs = [np.array([[i, i + 0.5, -i, 7]], np.float32) for i in range(3)]
    wake_up(agent, [(c, raw_request(x)) for c, x in zip(clients, inputs, strict=True)])
    assert [len(x) for x in model.seen[runs_before:]] == [3]  # one run of three
    recorder.check(inputs)


def call_model_infer(service: Any, message: bytes, answer: list[bytes]) -> None:
    answer.append(service.model_infer(message, None))  # no context: an abort would fail the test


def test_grpc_model_infer_calls_the_taps_once_per_answer(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("grpc", reason="grpcio (the grpc extra) not installed")
    from edgesdk.agent.api import open_inference_v2_pb2 as pb
    from edgesdk.agent.api.grpc_server import GrpcInferenceService

    agent, recorder = tapped(loop, monkeypatch)
    service = GrpcInferenceService(agent.app.scheduler, agent.http.budget, 1 << 20)
    inputs = [values(i) for i in range(4)]
    for x in inputs:
        message = pb.ModelInferRequest(model_name="m")
        message.inputs.add(name="x", datatype="FP32", shape=list(x.shape))
        message.raw_input_contents.append(x.tobytes())
        answer: list[bytes] = []
        thread = threading.Thread(target=call_model_infer, args=(service, message.SerializeToString(), answer))
        thread.start()
        while thread.is_alive():  # the loop answers what the gRPC thread hands it
            loop.run_until_complete(asyncio.sleep(0.002))
        (body,) = answer
        reply = pb.ModelInferResponse.FromString(body)
        np.testing.assert_array_equal(np.frombuffer(reply.raw_output_contents[0], np.float32), 2 * x.ravel())
    recorder.check(inputs)


def test_no_taps_no_served_record(loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch) -> None:
    agent = Agent(loop, monkeypatch)
    plan_answers = [agent.send(raw_request(values(i)))[0] for i in range(4)]
    assert plan_answers == [200] * 4
    assert agent.known_route()._served is None  # type: ignore[attr-defined]


def test_predict_calls_the_taps_with_the_models_own_feeds_and_outputs() -> None:
    pytest.importorskip("PIL.Image", reason="the pipeline's decoder needs Pillow (pip install 'edgesdk[pipeline]')")
    from tests.unit.test_agent_api_app import run_requests
    from tests.unit.test_agent_predict_route import PIPELINE, _app, _png, _predict

    app, _ = _app(PIPELINE)
    calls: list[tuple[str, Mapping[str, Any], Mapping[str, Any], str]] = []
    app.server.taps.append(lambda *call: calls.append(call))  # type: ignore[arg-type]
    answers = run_requests(app, [_predict(_png([[10, 20], [250, 30]])), _predict(b"not an image")])
    assert [a.status for a in answers] == [200, 400]
    ((model, feeds, outputs, variant),) = calls
    assert (model, variant) == ("m", "fp32")
    np.testing.assert_allclose(feeds["image"].ravel(), np.array([10, 20, 250, 30]) / 255, rtol=1e-6)
    np.testing.assert_array_equal(outputs["logits"], feeds["image"].reshape(1, 4))
    app.close()
