"""The Open Inference Protocol translation (``agent/api/open_inference.py``) and its routes in
``ApiApp``, in-process with a fake model: routes, metadata, JSON and binary tensors, every
refusal with its status. Bodies built and parsed by tritonclient's own (public, offline)
helpers where it is installed, so "what tritonclient sends and reads" is not our guess."""

from __future__ import annotations

import json

import numpy as np
import pytest
from edgesdk.agent.api.codec import DecodeError
from edgesdk.agent.api.http import Request, Response
from edgesdk.agent.api.open_inference import (
    HEADER_LENGTH,
    ModelRoute,
    decode_infer_request,
    encode_infer_response,
    model_metadata,
    parse_model_route,
)
from edgesdk.agent.tensor_signature import Signature, TensorSlot

from edgesdk.errors import InferenceInputError
from tests.unit.test_agent_api_app import make_app, run_requests
from tests.unit.test_agent_serving import FakeModel

SIGNATURE = Signature(
    [TensorSlot("x", np.dtype("float32"), ("batch", 4)), TensorSlot("ids", np.dtype("int64"), (None,))],
    [TensorSlot("y", np.dtype("float32"), ("batch", 4))],
    allow_nonfinite=False,
)


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/v2/models/digits", ModelRoute("metadata", "digits", None)),
        ("/v2/models/digits/ready", ModelRoute("ready", "digits", None)),
        ("/v2/models/digits/infer", ModelRoute("infer", "digits", None)),
        ("/v2/models/digits/versions/1.0.0", ModelRoute("metadata", "digits", "1.0.0")),
        ("/v2/models/digits/versions/1.0.0/ready", ModelRoute("ready", "digits", "1.0.0")),
        ("/v2/models/digits/versions/1.0.0/infer", ModelRoute("infer", "digits", "1.0.0")),
        # A model may be called "ready": only a suffix after the name is an action.
        ("/v2/models/ready", ModelRoute("metadata", "ready", None)),
        ("/v2/models/digits/config", None),
        ("/v2/models/digits/stats", None),
        ("/v2/models/", None),
        ("/v2/models/digits/versions//infer", None),
        ("/v2/models/digits/versions/1/infer/x", None),
        ("/v1/models/digits/infer", None),
    ],
)
def test_parse_model_route(path: str, expected: ModelRoute | None) -> None:
    assert parse_model_route(path) == expected


def test_json_tensors_flat_or_nested_become_feeds_of_the_inputs_dtype() -> None:
    body = json.dumps(
        {
            "id": "r1",
            "inputs": [
                {"name": "x", "shape": [2, 4], "datatype": "FP32", "data": list(range(8))},
                {"name": "ids", "shape": [3], "datatype": "INT64", "data": [[1], [2], [3]]},
            ],
        }
    ).encode()
    request = decode_infer_request(body, {}, SIGNATURE)
    assert request.feeds["x"].dtype == np.float32 and request.feeds["x"].shape == (2, 4)
    np.testing.assert_array_equal(request.feeds["x"][1], [4, 5, 6, 7])
    assert request.feeds["ids"].dtype == np.int64 and request.feeds["ids"].tolist() == [1, 2, 3]
    assert request.id == "r1" and request.outputs is None and not request.binary_output


def test_binary_tensors_follow_the_json_header() -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    ids = np.array([7, 8, 9], dtype=np.int64)
    header = json.dumps(
        {
            "inputs": [
                {"name": "x", "shape": [2, 4], "datatype": "FP32", "parameters": {"binary_data_size": x.nbytes}},
                {"name": "ids", "shape": [3], "datatype": "INT64", "parameters": {"binary_data_size": ids.nbytes}},
            ],
            "outputs": [{"name": "y", "parameters": {"binary_data": True}}],
        }
    ).encode()
    header += b" " * (1 + (-len(header)) % 8)  # an odd length: the tensors are misaligned
    body = header + x.tobytes() + ids.tobytes()
    request = decode_infer_request(body, {HEADER_LENGTH: str(len(header))}, SIGNATURE)
    np.testing.assert_array_equal(request.feeds["x"], x)
    np.testing.assert_array_equal(request.feeds["ids"], ids)
    assert all(a.flags.aligned for a in request.feeds.values())
    assert request.outputs is not None and request.outputs[0].binary


def bad(document: dict, headers: dict | None = None, body: bytes | None = None) -> Exception:
    raw = json.dumps(document).encode() if body is None else body
    with pytest.raises((DecodeError, InferenceInputError)) as caught:
        decode_infer_request(raw, headers or {}, SIGNATURE)
    return caught.value


X_OK = {"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [0, 1, 2, 3]}
IDS_OK = {"name": "ids", "shape": [1], "datatype": "INT64", "data": [1]}


@pytest.mark.parametrize(
    ("document", "error", "message"),
    [
        ({"inputs": {"x": [1]}}, DecodeError, '"inputs"'),
        ({"inputs": [{**X_OK, "datatype": "FLOAT32"}, IDS_OK]}, DecodeError, "unknown datatype 'FLOAT32'"),
        (
            {"inputs": [{**X_OK, "datatype": "FP64"}, IDS_OK]},
            InferenceInputError,
            "datatype FP64, the model takes FP32",
        ),
        ({"inputs": [{**X_OK, "datatype": "BYTES"}, IDS_OK]}, InferenceInputError, "datatype BYTES"),
        ({"inputs": [{**X_OK, "shape": [2, 4]}, IDS_OK]}, DecodeError, "4 values for shape [2, 4], which holds 8"),
        ({"inputs": [{**X_OK, "shape": [1, -4]}, IDS_OK]}, DecodeError, "non-negative integers"),
        ({"inputs": [{**X_OK, "name": "z"}, IDS_OK]}, InferenceInputError, "unknown input 'z'"),
        ({"inputs": [X_OK, X_OK]}, DecodeError, "given twice"),
        ({"inputs": [{k: v for k, v in X_OK.items() if k != "data"}]}, DecodeError, "neither data"),
        ({"inputs": [X_OK, {**IDS_OK, "data": [1.5]}]}, InferenceInputError, "got fractions"),
        ({"inputs": [X_OK, {**IDS_OK, "data": [1e20]}]}, InferenceInputError, "out of range for INT64"),
        # orjson reads an integer beyond 64 bits as a float: still refused, as out of range.
        ({"inputs": [X_OK, {**IDS_OK, "data": [2**70]}]}, InferenceInputError, "out of range for INT64"),
        ({"inputs": [{**X_OK, "data": ["a", "b", "c", "d"]}]}, InferenceInputError, "must be numbers"),
        ({"inputs": [X_OK, IDS_OK], "outputs": [{"name": "q"}]}, InferenceInputError, "unknown output 'q'"),
        (
            {"inputs": [X_OK, IDS_OK], "outputs": [{"name": "y", "parameters": {"classification": 3}}]},
            DecodeError,
            "classification",
        ),
        ({"inputs": [X_OK, IDS_OK], "parameters": {"binary_data_output": "yes"}}, DecodeError, "true or false"),
        ({"inputs": [X_OK, IDS_OK], "id": 5}, DecodeError, '"id" must be a string'),
    ],
)
def test_refusals_name_the_problem(document: dict, error: type, message: str) -> None:
    caught = bad(document)
    assert isinstance(caught, error) and message in str(caught), caught


def test_binary_section_refusals() -> None:
    x = np.zeros((1, 4), np.float32)
    doc = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "parameters": {"binary_data_size": 12}}]}
    header = json.dumps(doc).encode()
    assert "does not match shape [1, 4] of FP32 (16 bytes)" in str(
        bad({}, {HEADER_LENGTH: str(len(header))}, header + x.tobytes())
    )
    doc["inputs"][0]["parameters"]["binary_data_size"] = 16
    header = json.dumps(doc).encode()
    assert "needs bytes 0..16" in str(bad({}, {HEADER_LENGTH: str(len(header))}, header + x.tobytes()[:8]))
    assert "add up to 16" in str(bad({}, {HEADER_LENGTH: str(len(header))}, header + x.tobytes() + b"extra"))
    assert "Inference-Header-Content-Length" in str(bad({}, {HEADER_LENGTH: "99999"}, header))
    assert "Inference-Header-Content-Length" in str(bad({}, {HEADER_LENGTH: "-1"}, header))
    assert "Content-Encoding 'gzip'" in str(bad({}, {"content-encoding": "gzip"}, header))
    assert "malformed JSON" in str(bad({}, {HEADER_LENGTH: "3"}, header))


def test_response_json_or_binary_per_output() -> None:
    outputs = {"y": np.arange(4, dtype=np.float32).reshape(1, 4), "z": np.array([3], dtype=np.int64)}
    signature = Signature(
        SIGNATURE.inputs, [*SIGNATURE.outputs, TensorSlot("z", np.dtype("int64"), (1,))], allow_nonfinite=False
    )
    body = json.dumps(
        {
            "id": "abc",
            "inputs": [X_OK, IDS_OK],
            "outputs": [{"name": "z"}, {"name": "y", "parameters": {"binary_data": True}}],
        }
    ).encode()
    request = decode_infer_request(body, {}, signature)
    response = encode_infer_response(request, outputs, model="m", version="1.0.0", variant="onnx-fp32")
    length = response.fields.json_length
    header = json.loads(response.body[:length])
    assert response.content_type == "application/octet-stream"
    assert header["model_name"] == "m" and header["model_version"] == "1.0.0" and header["id"] == "abc"
    assert header["outputs"] == [
        {"name": "z", "datatype": "INT64", "shape": [1], "data": [3]},
        {"name": "y", "datatype": "FP32", "shape": [1, 4], "parameters": {"binary_data_size": 16}},
    ]
    np.testing.assert_array_equal(np.frombuffer(response.body[length:], "<f4"), [0, 1, 2, 3])

    plain = encode_infer_response(
        decode_infer_request(json.dumps({"inputs": [X_OK, IDS_OK]}).encode(), {}, signature),
        outputs,
        model="m",
        version="1.0.0",
        variant="v",
    )
    assert plain.content_type == "application/json" and plain.fields.json_length is None
    assert [o["name"] for o in json.loads(plain.body)["outputs"]] == ["y", "z"]  # all, JSON by default


def test_tritonclient_bodies_round_trip() -> None:
    """What tritonclient builds decodes, and what we answer, tritonclient parses."""
    httpclient = pytest.importorskip("tritonclient.http", reason="tritonclient[http] (the dev extra) not installed")
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    ids = np.array([5, 6], dtype=np.int64)
    for binary in (False, True):
        tx = httpclient.InferInput("x", list(x.shape), "FP32")
        tx.set_data_from_numpy(x, binary_data=binary)
        tids = httpclient.InferInput("ids", list(ids.shape), "INT64")
        tids.set_data_from_numpy(ids, binary_data=binary)
        wanted = [httpclient.InferRequestedOutput("y", binary_data=binary)]
        body, json_size = httpclient.InferenceServerClient.generate_request_body([tx, tids], outputs=wanted)
        headers = {} if json_size is None else {HEADER_LENGTH: str(json_size)}
        request = decode_infer_request(body, headers, SIGNATURE)
        np.testing.assert_array_equal(request.feeds["x"], x)
        np.testing.assert_array_equal(request.feeds["ids"], ids)
        response = encode_infer_response(request, {"y": x * 2}, model="m", version="1", variant="v")
        result = httpclient.InferenceServerClient.parse_response_body(
            response.body, header_length=response.fields.json_length
        )
        np.testing.assert_array_equal(result.as_numpy("y"), x * 2)
        assert (response.fields.json_length is not None) == binary


def test_model_metadata_uses_protocol_datatypes_and_minus_one_for_dynamic_dims() -> None:
    app, _ = make_app(FakeModel(2.0))
    model = app.server.get_model("m")
    assert model_metadata(model) == {
        "name": "m",
        "versions": ["1.0.0"],
        "platform": "onnxruntime_onnx",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 4]}],
    }


def get(path: str, method: str = "GET") -> Request:
    return Request(method, path, "", {})


def infer(path: str, document: dict | bytes, headers: dict | None = None) -> Request:
    body = document if isinstance(document, bytes) else json.dumps(document).encode()
    return Request("POST", path, "", headers or {}, body)


def status_and_error(response: Response) -> tuple[int, str]:
    return response.status, json.loads(response.body).get("error", "") if response.body else ""


def test_routes_through_the_app_same_status_codes_as_v1() -> None:
    model = FakeModel(2.0)
    app, metrics = make_app(model)
    ok = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
    answers = run_requests(
        app,
        [
            get("/v2"),
            get("/v2/health/live"),
            get("/v2/health/ready"),
            get("/v2/models/m"),
            get("/v2/models/m/versions/1.0.0/ready"),
            infer("/v2/models/m/infer", ok),
            infer("/v2/models/m/versions/1.0.0/infer", ok),
            get("/v2/models/m/infer"),  # 405
            infer("/v2/models/m", ok),  # 405
            get("/v2/models/nope"),  # 404
            get("/v2/models/m/versions/9/ready"),  # 404
            infer("/v2/models/nope/infer", ok),  # 404
            infer("/v2/models/m/versions/9/infer", ok),  # 404
            infer("/v2/models/m/infer", b"{not json"),  # 400
            infer("/v2/models/m/infer", {"inputs": [{**ok["inputs"][0], "datatype": "INT32"}]}),  # 422
            infer("/v2/models/m/infer", {"inputs": [{**ok["inputs"][0], "shape": [4]}]}),  # 422 (rank)
            infer("/v2/models/m/infer", {"inputs": [{**ok["inputs"][0], "data": [1, 2, float("nan"), 4]}]}),
            get("/v2/models/m/stats"),  # 404: not an extension this agent has
        ],
    )
    statuses = [a.status for a in answers]
    assert statuses == [200, 200, 200, 200, 200, 200, 200, 405, 405, 404, 404, 404, 404, 400, 422, 422, 422, 404]
    server_meta = json.loads(answers[0].body)
    assert server_meta["name"] == "edgesdk-agent" and "binary_tensor_data" in server_meta["extensions"]
    result = json.loads(answers[5].body)
    assert result["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [1, 4], "data": [2.0, 4.0, 6.0, 8.0]}]
    assert answers[5].head_lines == "X-Model-Variant: fp32\r\n"
    assert "model 'nope' is not served here" in status_and_error(answers[9])[1]
    assert "has no version '9'; served: ['1.0.0']" in status_and_error(answers[12])[1]
    assert "datatype INT32, the model takes FP32" in status_and_error(answers[14])[1]
    assert "rank" in status_and_error(answers[15])[1]
    assert "NaN" in status_and_error(answers[16])[1] or "nan" in status_and_error(answers[16])[1].lower()
    # The same counters as /v1: two inferences observed, refusals counted by kind.
    assert metrics.totals() == {"fp32": 2}
    errors = metrics.errors()
    assert errors["not_found"] >= 5 and errors["bad_request"] == 1 and errors["bad_input"] >= 2


def test_without_a_model_v2_is_live_but_not_ready() -> None:
    app, _ = make_app(None)
    answers = run_requests(
        app,
        [
            get("/v2/health/live"),
            get("/v2/health/ready"),
            get("/v2/models/m/ready"),
            infer("/v2/models/m/infer", {"inputs": []}),
        ],
    )
    assert [a.status for a in answers] == [200, 503, 503, 503]
