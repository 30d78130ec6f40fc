"""Errors carry their codes (agent/api/refusal.py): every AgentError subclass a route can raise
is answered with its own HTTP status over HTTP and its own gRPC code over gRPC, counted as its
class says, with its Retry-After; anything else is a 500/INTERNAL that names only its type."""

from __future__ import annotations

import asyncio
import importlib
import pkgutil
import threading
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from edgesdk.agent import batching, serving
from edgesdk.agent.api.budget import BudgetRefused
from edgesdk.agent.api.codec import DeclaredInputError, DecodedValueError, DecodeError, UnsupportedEncodingError
from edgesdk.agent.api.http import Request
from edgesdk.agent.api.refusal import AgentStoppingError, AnswerTimeoutError, AtCapacityError, QueueExpiredError
from edgesdk.agent.batching import BatchAbandonedError
from edgesdk.agent.serving import ModelNotFoundError, NoModelError

from edgesdk.errors import AgentError, InferenceInputError, RuntimeBackendError
from tests.unit.test_agent_api_app import make_app
from tests.unit.test_agent_serving import FakeModel

#: (the error, HTTP status, gRPC code, counted as, Retry-After)
CASES: list[tuple[BaseException, int, str, str | None, str | None]] = [
    (DecodeError("not JSON"), 400, "INVALID_ARGUMENT", "bad_request", None),
    (ModelNotFoundError("no model 'q'"), 404, "NOT_FOUND", "not_found", None),
    (UnsupportedEncodingError("Accept: text/html", 406), 406, "INVALID_ARGUMENT", "bad_request", None),
    (UnsupportedEncodingError("Content-Type: text/html", 415), 415, "INVALID_ARGUMENT", "bad_request", None),
    (BudgetRefused(413, "arrays over max_decoded_bytes"), 413, "RESOURCE_EXHAUSTED", "bad_request", None),
    (BudgetRefused(503, "budget full", retry_after=1), 503, "UNAVAILABLE", "overload", "1"),
    (InferenceInputError("x: NaN"), 422, "INVALID_ARGUMENT", None, None),
    (DeclaredInputError("x: float64"), 422, "INVALID_ARGUMENT", "bad_input", None),
    (DecodedValueError("x: a fraction for int8"), 422, "INVALID_ARGUMENT", "bad_input", None),
    (RuntimeBackendError("onnxruntime failed"), 500, "INTERNAL", None, None),
    (BatchAbandonedError("batch ended"), 500, "INTERNAL", "internal", None),
    (AgentError("unexpected"), 500, "INTERNAL", "internal", None),
    (ValueError("a bug"), 500, "INTERNAL", "internal", None),
    (AtCapacityError("at capacity"), 503, "UNAVAILABLE", "overload", "1"),
    (NoModelError("no model loaded"), 503, "UNAVAILABLE", "no_model", "5"),
    (AgentStoppingError("stopping"), 503, "UNAVAILABLE", None, "1"),
    (AnswerTimeoutError("no answer within 1 s"), 504, "DEADLINE_EXCEEDED", "timeout", None),
    (QueueExpiredError("expired in the queue"), 504, "DEADLINE_EXCEEDED", None, None),
]
#: Unexpected failures: only their type is named.
HIDDEN = {AgentError, BatchAbandonedError, ValueError}
IDS = [f"{type(case[0]).__name__}-{case[1]}" for case in CASES]


def _subclasses(cls: type) -> Iterator[type]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def test_every_agent_error_a_route_can_raise_has_its_codes_checked_here() -> None:
    import edgesdk.agent.api as api

    for module in pkgutil.iter_modules(api.__path__):
        if module.name.startswith("grpc") and importlib.util.find_spec("grpc") is None:
            continue  # the grpc extra: its modules define no error of their own
        importlib.import_module(f"edgesdk.agent.api.{module.name}")
    route_modules = (api.__name__ + ".", serving.__name__, batching.__name__)
    reachable = {
        cls
        for cls in _subclasses(AgentError)
        # _BadRequest never leaves the HTTP connection, which answers it with its status itself
        if cls.__module__.startswith(route_modules) and cls.__name__ != "_BadRequest"
    }
    reachable |= {InferenceInputError}  # the server's signature check and the decoders raise it
    checked = {type(case[0]) for case in CASES}
    assert reachable - checked == set()


def _answer_raising(exc: BaseException) -> Any:
    def answer(server: object, request: object, target: object) -> object:
        raise exc

    return answer


@pytest.mark.parametrize(("exc", "status", "code", "kind", "retry"), CASES, ids=IDS)
def test_http_answers_each_error_with_its_own_status_count_and_retry_after(
    exc: BaseException, status: int, code: str, kind: str | None, retry: str | None
) -> None:
    app, metrics = make_app(FakeModel(2.0))
    request = Request("POST", "/v1/models/m/infer", "", {}, b"{}")
    app.scheduler.inline_left = 8  # answered inline, on this thread
    answers: list[Any] = []
    app._infer(request, answers.append, _answer_raising(exc), "m")
    (response,) = answers
    assert response.status == status
    message = f"internal error: {type(exc).__name__}" if type(exc) in HIDDEN else str(exc)
    assert orjson.loads(response.body) == {"error": message}
    assert dict(response.headers).get("Retry-After") == retry
    assert metrics.errors() == ({kind: 1} if kind else {})
    app.close()


class AbortContext:
    """grpc's ServicerContext as far as an aborting handler uses it."""

    code: Any = None
    details = ""

    def abort(self, code: Any, details: str) -> None:
        self.code, self.details = code, details
        raise RuntimeError("aborted")


@pytest.fixture
def running_loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


@pytest.mark.parametrize(("exc", "status", "code", "kind", "retry"), CASES, ids=IDS)
def test_grpc_answers_each_error_with_its_own_code_and_message(
    exc: BaseException,
    status: int,
    code: str,
    kind: str | None,
    retry: str | None,
    running_loop: asyncio.AbstractEventLoop,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    grpc = pytest.importorskip("grpc", reason="grpcio (the grpc extra) not installed")
    from edgesdk.agent.api import grpc_codec
    from edgesdk.agent.api import open_inference_v2_pb2 as pb
    from edgesdk.agent.api.grpc_server import GrpcInferenceService

    app, metrics = make_app(FakeModel(2.0))
    app.loop = running_loop
    monkeypatch.setattr(grpc_codec, "answer_grpc_infer", _answer_raising(exc))
    service = GrpcInferenceService(app.scheduler, app_budget(), 1 << 20)
    context = AbortContext()
    with pytest.raises(RuntimeError, match="aborted"):
        service.model_infer(pb.ModelInferRequest(model_name="m").SerializeToString(), context)  # type: ignore[arg-type]
    assert context.code == getattr(grpc.StatusCode, code)
    assert context.details == (f"internal error: {type(exc).__name__}" if type(exc) in HIDDEN else str(exc))
    assert metrics.errors() == ({kind: 1} if kind else {})
    app.close()


def app_budget() -> Any:
    from edgesdk.agent.api.budget import InflightBytesBudget

    return InflightBytesBudget(1 << 24)
