"""edgesdk.AgentClient and AsyncAgentClient against the agent's real API stack (ApiApp on its
HttpServer, on TCP and on a Unix socket) serving fake models: numpy round trips in every
form the client sends, and each typed error with the status and the agent's own message."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from edgesdk.agent.api.app import ApiApp
from edgesdk.agent.api.http import HttpLimits, HttpServer
from edgesdk.agent.metrics import Metrics
from edgesdk.agent.serving import ModelServer

from edgesdk import AgentClient, AsyncAgentClient
from edgesdk.errors import (
    AgentConnectionError,
    AgentError,
    AgentInputError,
    AgentNotFoundError,
    AgentRequestError,
    AgentTimeoutError,
    AgentUnavailableError,
    InferenceInputError,
    UsageError,
)
from edgesdk.schemas.agent_config import ApiConfig
from edgesdk.schemas.manifest import TensorSpec
from tests.unit.test_agent_serving import FakeModel, variant


class TwoWayModel:
    """Two inputs, two outputs of different dtypes: y = x * 2 (float32), s = k + 1 (int64)."""

    inputs = [
        TensorSpec(name="x", dtype="float32", shape=["batch", 4]),
        TensorSpec(name="k", dtype="int64", shape=["batch"]),
    ]
    outputs = [
        TensorSpec(name="y", dtype="float32", shape=["batch", 4]),
        TensorSpec(name="s", dtype="int64", shape=["batch"]),
    ]
    thread_safe = True

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"y": feeds["x"] * 2, "s": feeds["k"] + 1}


class RunningAgentApi:
    """The agent's ApiApp + HttpServer on an event loop thread, on 127.0.0.1:0 and a Unix socket."""

    def __init__(self, model: Any, socket_path: Path, **config: Any) -> None:
        self.server = ModelServer()
        metrics = Metrics(self.server)
        self.server.observe, self.server.count_error = metrics.observe, metrics.count_error
        if model is not None:
            meta = variant("fp32", "fp32").model_copy(update={"inputs": model.inputs, "outputs": model.outputs})
            self.server.serve(name="m", version="1.0.0", release=1, variants=[(meta, model)])
        api_config = ApiConfig(**config)
        self.app = ApiApp(self.server, metrics, api_config, status=lambda: {"device_id": "dev-1"})
        self.http = HttpServer(self.app.handle, HttpLimits(max_body_bytes=api_config.max_body_bytes))
        self.socket_path = str(socket_path)
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            self.app.loop = self.loop
            self.port = self.loop.run_until_complete(self.http.listen_tcp("127.0.0.1", 0))
            self.loop.run_until_complete(self.http.listen_unix(self.socket_path))
            ready.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert ready.wait(5)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.app.close()


@pytest.fixture()
def start_api(tmp_path: Path) -> Iterator[Callable[..., RunningAgentApi]]:
    started: list[RunningAgentApi] = []

    def start(model: Any, **config: Any) -> RunningAgentApi:
        # AF_UNIX paths are short (108 bytes): keep the socket name short too.
        running = RunningAgentApi(model, tmp_path / f"a{len(started)}.sock", **config)
        started.append(running)
        return running

    yield start
    for running in started:
        running.stop()


@pytest.fixture(params=["tcp", "unix"])
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def sync_client(api: RunningAgentApi, transport: str, **kwargs: Any) -> AgentClient:
    if transport == "unix":
        return AgentClient(unix_socket=api.socket_path, **kwargs)
    return AgentClient(api.url, **kwargs)


def async_client(api: RunningAgentApi, transport: str, **kwargs: Any) -> AsyncAgentClient:
    if transport == "unix":
        return AsyncAgentClient(unix_socket=api.socket_path, **kwargs)
    return AsyncAgentClient(api.url, **kwargs)


# -- round trips ----------------------------------------------------------------------------------


def test_sync_routes_and_numpy_round_trip(start_api, transport) -> None:
    api = start_api(TwoWayModel())
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    k = np.array([1, 2, -7], dtype=np.int64)
    with sync_client(api, transport) as agent:
        assert agent.health() == {"status": "ok"}
        assert agent.ready() == {"ready": True, "model": "m", "variant": "fp32"}
        assert agent.status() == {"device_id": "dev-1"}
        assert [m["name"] for m in agent.models()] == ["m"]
        outputs = agent.infer("m", {"x": x, "k": k})
        assert outputs.variant == "fp32"
        assert set(outputs) == {"y", "s"}
        np.testing.assert_array_equal(outputs["y"], x * 2)
        np.testing.assert_array_equal(outputs["s"], k + 1)
        assert outputs["y"].dtype == np.float32 and outputs["s"].dtype == np.int64
        assert outputs["y"].flags.writeable  # decoded over the client's own buffer, not read-only
        # The same kept-alive connection serves the next requests.
        for _ in range(3):
            np.testing.assert_array_equal(agent.infer("m", {"x": x, "k": k})["s"], k + 1)
        assert "edgesdk_agent_inferences_total" in agent.metrics()


def test_sync_single_array_non_contiguous_and_big_endian(start_api, transport) -> None:
    api = start_api(FakeModel(3.0))
    x = np.arange(32, dtype=np.float32).reshape(4, 8)[:, ::2]  # a strided view
    with sync_client(api, transport) as agent:
        np.testing.assert_array_equal(agent.infer("m", x)["y"], x * 3)  # one array: sent as .npy
        swapped = (x * 1).astype(">f4")
        np.testing.assert_array_equal(agent.infer("m", {"x": swapped})["y"], x * 3)


def test_async_round_trip_and_concurrent_requests(start_api, transport) -> None:
    api = start_api(TwoWayModel())
    x = np.random.default_rng(0).random((5, 4), dtype=np.float32)

    async def main() -> None:
        async with async_client(api, transport) as agent:
            assert await agent.health() == {"status": "ok"}
            assert (await agent.ready())["ready"] is True
            assert (await agent.models())[0]["name"] == "m"
            answers = await asyncio.gather(
                *(agent.infer("m", {"x": x + i, "k": np.full(5, i, np.int64)}) for i in range(6))
            )
            for i, outputs in enumerate(answers):
                np.testing.assert_allclose(outputs["y"], (x + i) * 2)
                np.testing.assert_array_equal(outputs["s"], np.full(5, i + 1))
                assert outputs.variant == "fp32"
            assert "edgesdk_agent_inferences_total" in await agent.metrics()

    asyncio.run(main())


def test_unknown_dtype_for_raw_goes_as_npz_and_the_agent_names_the_mismatch(start_api) -> None:
    api = start_api(FakeModel(1.0))
    with AgentClient(api.url) as agent, pytest.raises(AgentInputError) as caught:
        agent.infer("m", {"x": np.ones((1, 4), dtype=np.uint16)})
    assert caught.value.status == 422 and "uint16" in str(caught.value)


# -- typed errors ---------------------------------------------------------------------------------


def test_wrong_dtype_is_an_input_error_with_the_agents_message(start_api, transport) -> None:
    api = start_api(FakeModel(1.0))
    with sync_client(api, transport) as agent, pytest.raises(AgentInputError) as caught:
        agent.infer("m", {"x": np.ones((1, 4), dtype=np.float64)})
    error = caught.value
    assert error.status == 422
    assert isinstance(error, InferenceInputError) and isinstance(error, AgentError)
    assert "422 Unprocessable Entity" in str(error) and "/v1/models/m/infer" in str(error)
    assert error.detail and error.detail in str(error)  # the agent's own text, quoted whole
    assert "float64" in error.detail


def test_body_over_the_limit_is_an_input_error(start_api) -> None:
    api = start_api(FakeModel(1.0), max_body_bytes=64)
    with AgentClient(api.url) as agent, pytest.raises(AgentInputError) as caught:
        agent.infer("m", {"x": np.ones((8, 4), dtype=np.float32)})  # 128 bytes
    assert caught.value.status == 413


def test_unknown_model_is_not_found(start_api, transport) -> None:
    api = start_api(FakeModel(1.0))
    with sync_client(api, transport) as agent, pytest.raises(AgentNotFoundError) as caught:
        agent.infer("nope", np.ones((1, 4), np.float32))
    assert caught.value.status == 404 and "nope" in caught.value.detail


def test_no_model_is_unavailable_with_retry_after(start_api) -> None:
    api = start_api(None)
    with AgentClient(api.url) as agent:
        assert agent.ready() == {"ready": False, "reason": "no model loaded"}
        with pytest.raises(AgentUnavailableError) as caught:
            agent.infer("m", np.ones((1, 4), np.float32))
    assert caught.value.status == 503 and caught.value.retry_after == 5.0


def test_overload_is_unavailable_with_retry_after(start_api) -> None:
    model = FakeModel(1.0)
    model.gate = threading.Event()
    api = start_api(model, max_concurrency=1, max_queue=0)
    x = np.ones((1, 4), np.float32)
    first = AgentClient(api.url)
    done: list[Any] = []
    worker = threading.Thread(target=lambda: done.append(first.infer("m", x)))
    worker.start()
    try:
        assert model.entered.wait(5)
        with AgentClient(api.url) as agent, pytest.raises(AgentUnavailableError) as caught:
            agent.infer("m", x)
        assert caught.value.status == 503 and caught.value.retry_after == 1.0
        assert "capacity" in caught.value.detail
    finally:
        model.gate.set()
        worker.join(5)
        first.close()
    np.testing.assert_array_equal(done[0]["y"], x)  # the one admitted still got its answer


def test_agent_deadline_is_a_timeout_with_status_504(start_api) -> None:
    model = FakeModel(1.0)
    model.gate = threading.Event()
    api = start_api(model, request_timeout_s=0.2)
    try:
        with AgentClient(api.url) as agent, pytest.raises(AgentTimeoutError) as caught:
            agent.infer("m", np.ones((1, 4), np.float32))
        assert caught.value.status == 504
    finally:
        model.gate.set()


def test_client_timeout_sync_and_async(start_api, transport) -> None:
    model = FakeModel(1.0)
    model.gate = threading.Event()
    api = start_api(model)
    x = np.ones((1, 4), np.float32)
    try:
        with sync_client(api, transport, timeout=0.3) as agent, pytest.raises(AgentTimeoutError) as caught:
            agent.infer("m", x)
        assert caught.value.status is None and "0.3 s" in str(caught.value)

        async def main() -> None:
            async with async_client(api, transport, timeout=0.3) as agent:
                with pytest.raises(AgentTimeoutError) as caught:
                    await agent.infer("m", x)
                assert caught.value.status is None

        asyncio.run(main())
    finally:
        model.gate.set()


def test_async_typed_errors(start_api) -> None:
    api = start_api(FakeModel(1.0))

    async def main() -> None:
        async with AsyncAgentClient(api.url) as agent:
            with pytest.raises(AgentNotFoundError):
                await agent.infer("nope", np.ones((1, 4), np.float32))
            with pytest.raises(AgentInputError) as caught:
                await agent.infer("m", {"x": np.ones((1, 5), np.float32)})
            assert caught.value.status == 422 and "shape" in caught.value.detail.lower()
            # The connection stays usable after error answers.
            outputs = await agent.infer("m", np.ones((2, 4), np.float32))
            np.testing.assert_array_equal(outputs["y"], np.ones((2, 4)))

    asyncio.run(main())


def test_nothing_listening_is_a_connection_error(tmp_path: Path) -> None:
    with AgentClient(unix_socket=tmp_path / "absent.sock") as agent, pytest.raises(AgentConnectionError) as caught:
        agent.health()
    assert caught.value.status is None and "absent.sock" in str(caught.value)

    async def main() -> None:
        async with AsyncAgentClient(unix_socket=tmp_path / "absent.sock") as agent:
            with pytest.raises(AgentConnectionError):
                await agent.health()

    asyncio.run(main())


def test_reconnects_after_the_agent_closed_an_idle_connection(start_api) -> None:
    api = start_api(FakeModel(1.0))
    x = np.ones((1, 4), np.float32)
    with AgentClient(api.url) as agent:
        agent.infer("m", x)
        api.loop.call_soon_threadsafe(api.http.close_idle)  # what the keep-alive timeout does
        deadline = threading.Event()
        deadline.wait(0.2)
        np.testing.assert_array_equal(agent.infer("m", x)["y"], x)

    async def main() -> None:
        async with AsyncAgentClient(api.url) as agent:
            await agent.infer("m", x)
            api.loop.call_soon_threadsafe(api.http.close_idle)
            await asyncio.sleep(0.2)
            np.testing.assert_array_equal((await agent.infer("m", x))["y"], x)

    asyncio.run(main())


def test_wait_ready_times_out_while_no_model(start_api) -> None:
    api = start_api(None)
    with AgentClient(api.url) as agent, pytest.raises(AgentTimeoutError, match="no model loaded"):
        agent.wait_ready(timeout=0.3, interval=0.05)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"url": "https://127.0.0.1:8470"}, "is not http://HOST:PORT"),
        ({"url": "127.0.0.1:8470"}, "is not http://HOST:PORT"),
        ({"url": "http://127.0.0.1:8470", "unix_socket": "/run/a.sock"}, "not both"),
    ],
)
def test_bad_addresses_are_usage_errors(kwargs: dict[str, Any], needle: str) -> None:
    with pytest.raises(UsageError, match=needle):
        AgentClient(**kwargs)


def test_error_tree() -> None:
    for kind in (AgentInputError, AgentNotFoundError, AgentUnavailableError, AgentTimeoutError, AgentConnectionError):
        assert issubclass(kind, AgentRequestError) and issubclass(kind, AgentError)
