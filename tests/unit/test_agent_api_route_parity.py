"""Every inference route answers through a plan (agent/api/plan.py): the same bad input gets the
same refusal whichever route and encoding carries it (/v1 JSON and raw tensors, /v2 JSON and
binary over HTTP, gRPC raw and typed contents): the same HTTP status or gRPC code, counted the
same way; and the generic routes work their plans out once per head shape."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from edgesdk.agent.api.app import ApiApp
from edgesdk.agent.api.budget import InflightBytesBudget
from edgesdk.agent.api.http import Request
from edgesdk.agent.api.open_inference import datatype_name
from edgesdk.agent.metrics import Metrics

from edgesdk.protocol.tensor_header import describe
from tests.unit.test_agent_api_app import make_app, run_requests
from tests.unit.test_agent_serving import FakeModel

#: A bad request: (model it names, input name, the array it sends).
Bad = tuple[str, str, np.ndarray]
GOOD = np.arange(4, dtype=np.float32).reshape(1, 4)
#: name → (the request, its HTTP status, its gRPC code, how it is counted). The model takes
#: x: float32[batch, 4].
CASES: dict[str, tuple[Bad, int, str, dict[str, int]]] = {
    "unknown input": (("m", "z", GOOD), 422, "INVALID_ARGUMENT", {"bad_input": 1}),
    "wrong rank": (("m", "x", GOOD.ravel()), 422, "INVALID_ARGUMENT", {"bad_input": 1}),
    "wrong fixed axis": (("m", "x", np.zeros((1, 5), np.float32)), 422, "INVALID_ARGUMENT", {"bad_input": 1}),
    "NaN": (("m", "x", np.array([[1, np.nan, 3, 4]], np.float32)), 422, "INVALID_ARGUMENT", {"bad_input": 1}),
    "empty": (("m", "x", np.zeros((0, 4), np.float32)), 422, "INVALID_ARGUMENT", {"bad_input": 1}),
    "wrong dtype": (("m", "x", GOOD.astype(np.float64)), 422, "INVALID_ARGUMENT", {"bad_input": 1}),
    "unknown model": (("q", "x", GOOD), 404, "NOT_FOUND", {"not_found": 1}),
}


def v1_json(bad: Bad) -> Request | None:
    model, name, array = bad
    if array.dtype != np.float32:
        return None  # JSON numbers carry no dtype: the input's is taken
    body = json.dumps({"inputs": {name: array.tolist()}}).encode()  # NaN as Python writes it
    return Request("POST", f"/v1/models/{model}/infer", "", {"content-type": "application/json"}, body)


def v1_raw(bad: Bad) -> Request:
    model, name, array = bad
    headers = {"content-type": "application/x-edgesdk-tensors", "x-tensors": describe(name, array.dtype, array.shape)}
    return Request("POST", f"/v1/models/{model}/infer", "", headers, array.tobytes())


def _v2_input(name: str, array: np.ndarray) -> dict[str, Any]:
    return {"name": name, "shape": list(array.shape), "datatype": datatype_name(array.dtype)}


def v2_json(bad: Bad) -> Request:
    model, name, array = bad
    body = json.dumps({"inputs": [{**_v2_input(name, array), "data": array.ravel().tolist()}]}).encode()
    return Request("POST", f"/v2/models/{model}/infer", "", {"content-type": "application/json"}, body)


def v2_binary(bad: Bad) -> Request:
    model, name, array = bad
    header = json.dumps({"inputs": [{**_v2_input(name, array), "parameters": {"binary_data_size": array.nbytes}}]})
    headers = {"content-type": "application/octet-stream", "inference-header-content-length": str(len(header))}
    return Request("POST", f"/v2/models/{model}/infer", "", headers, header.encode() + array.tobytes())


HTTP_ROUTES: list[Callable[[Bad], Request | None]] = [v1_json, v1_raw, v2_json, v2_binary]


def grpc_message(bad: Bad, *, raw: bool) -> Any:
    from edgesdk.agent.api import grpc_codec
    from edgesdk.agent.api import open_inference_v2_pb2 as pb

    model, name, array = bad
    message = pb.ModelInferRequest(model_name=model)
    datatype = datatype_name(array.dtype)
    item = message.inputs.add(name=name, datatype=datatype, shape=array.shape)
    if raw:
        message.raw_input_contents.append(array.tobytes())
    else:
        getattr(item.contents, grpc_codec.CONTENTS_FIELDS[datatype]).extend(array.ravel().tolist())
    return message


class AbortContext:
    """grpc's ServicerContext as far as an aborting handler uses it."""

    code: Any = None

    def abort(self, code: Any, details: str) -> None:
        self.code = code
        raise RuntimeError(details)


@pytest.fixture
def running_loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


def fresh_app() -> tuple[ApiApp, Metrics]:
    return make_app(FakeModel(2.0))


@pytest.mark.parametrize("case", list(CASES))
def test_the_same_bad_input_gets_the_same_refusal_on_every_http_route(case: str) -> None:
    bad, status, _, counted = CASES[case]
    answered = {}
    for route in HTTP_ROUTES:
        request = route(bad)
        if request is None:
            continue
        app, metrics = fresh_app()
        (response,) = run_requests(app, [request])
        answered[route.__name__] = (response.status, metrics.errors())
        app.close()
    assert answered == {name: (status, counted) for name in answered}, case


@pytest.mark.parametrize("case", list(CASES))
def test_the_same_bad_input_gets_the_same_refusal_over_grpc_raw_and_typed(
    case: str, running_loop: asyncio.AbstractEventLoop
) -> None:
    grpc = pytest.importorskip("grpc", reason="grpcio (the grpc extra) not installed")
    from edgesdk.agent.api.grpc_server import GrpcInferenceService

    bad, _, code, counted = CASES[case]
    for raw in (True, False):
        app, metrics = fresh_app()
        app.loop = running_loop
        service = GrpcInferenceService(app.scheduler, InflightBytesBudget(1 << 24), 1 << 20)
        context = AbortContext()
        with pytest.raises(RuntimeError):
            service.model_infer(grpc_message(bad, raw=raw).SerializeToString(), context)  # type: ignore[arg-type]
        assert (context.code, metrics.errors()) == (getattr(grpc.StatusCode, code), counted), (case, raw)
        app.close()


def test_the_generic_routes_work_out_one_plan_per_head_shape() -> None:
    app, _ = fresh_app()
    model = app.server.model
    assert model is not None
    longer = np.full((3, 4), 1.25, np.float32)
    requests = [
        v1_json(("m", "x", GOOD)),
        v1_json(("m", "x", longer)),  # another length, the same head shape
        v1_raw(("m", "x", GOOD)),
        v1_raw(("m", "x", longer)),  # another X-Tensors: another head shape
        v2_json(("m", "x", GOOD)),
        v2_json(("m", "x", longer)),
        v2_binary(("m", "x", GOOD)),  # Inference-Header-Content-Length: its own
    ]
    responses = run_requests(app, [r for r in requests if r is not None])
    assert [r.status for r in responses] == [200] * 7
    kinds = sorted(str(key[0]) for key in model.plans)
    assert kinds == ["route", "route", "route", "v2", "v2"], model.plans.keys()
    plans = dict(model.plans)
    again = run_requests(app, [r for r in requests if r is not None])
    assert [r.status for r in again] == [200] * 7
    assert model.plans == plans  # the same plans, none made again
    # A body in a type the API does not speak: its plan answers 415, as before plans (never a 500).
    xml = Request("POST", "/v1/models/m/infer", "", {"content-type": "application/xml"}, b"<xml/>")
    (refused,) = run_requests(app, [xml])
    assert refused.status == 415
    app.close()


def test_grpc_works_out_one_plan_per_model(running_loop: asyncio.AbstractEventLoop) -> None:
    pytest.importorskip("grpc", reason="grpcio (the grpc extra) not installed")
    from edgesdk.agent.api.grpc_server import GrpcInferenceService

    app, _ = fresh_app()
    app.loop = running_loop
    service = GrpcInferenceService(app.scheduler, InflightBytesBudget(1 << 24), 1 << 20)
    for raw in (True, False, True):
        service.model_infer(grpc_message(("m", "x", GOOD), raw=raw).SerializeToString(), AbortContext())  # type: ignore[arg-type]
    model = app.server.model
    assert model is not None and list(model.plans) == [("grpc",)]
    app.close()


#: Values an int8 input cannot hold, refused while the request is decoded (before the server's
#: check): name → the values sent for x: int8[batch, 4].
VALUE_CASES: dict[str, list[Any]] = {
    "a fraction for an int input": [1.5, 2, 3, 4],
    "a value out of the dtype's range": [300, 2, 3, 4],
    "strings for numbers": ["a", "b", "c", "d"],
}


def _value_requests(values: list[Any]) -> dict[str, Request]:
    v1 = json.dumps({"inputs": {"x": [values]}}).encode()
    v2 = json.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "INT8", "data": values}]}).encode()
    json_type = {"content-type": "application/json"}
    return {
        "v1_json": Request("POST", "/v1/models/m/infer", "", json_type, v1),
        "v2_json": Request("POST", "/v2/models/m/infer", "", json_type, v2),
    }


@pytest.mark.parametrize("case", list(VALUE_CASES))
def test_values_refused_while_decoding_are_counted_as_bad_input_on_every_json_route(case: str) -> None:
    answered = {}
    for route, request in _value_requests(VALUE_CASES[case]).items():
        app, metrics = make_app(FakeModel(2.0, dtype="int8"))
        (response,) = run_requests(app, [request])
        answered[route] = (response.status, metrics.errors())
        app.close()
    assert answered == {route: (422, {"bad_input": 1}) for route in answered}, case


def test_a_value_out_of_range_in_grpc_typed_contents_is_counted_as_bad_input(
    running_loop: asyncio.AbstractEventLoop,
) -> None:
    grpc = pytest.importorskip("grpc", reason="grpcio (the grpc extra) not installed")
    from edgesdk.agent.api import open_inference_v2_pb2 as pb
    from edgesdk.agent.api.grpc_server import GrpcInferenceService

    app, metrics = make_app(FakeModel(2.0, dtype="int8"))
    app.loop = running_loop
    service = GrpcInferenceService(app.scheduler, InflightBytesBudget(1 << 24), 1 << 20)
    message = pb.ModelInferRequest(model_name="m")
    message.inputs.add(name="x", datatype="INT8", shape=[1, 4]).contents.int_contents.extend([300, 2, 3, 4])
    context = AbortContext()
    with pytest.raises(RuntimeError, match="out of range"):
        service.model_infer(message.SerializeToString(), context)  # type: ignore[arg-type]
    assert (context.code, metrics.errors()) == (grpc.StatusCode.INVALID_ARGUMENT, {"bad_input": 1})
    app.close()
