"""The gRPC translation (``agent/api/grpc_codec.py``): ``ModelInferRequest`` → the feeds the
HTTP ``/v2`` routes decode to, through the same checks, and outputs → a ``ModelInferResponse``
that tritonclient's own ``InferResult`` reads (where tritonclient[grpc] is installed)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("google.protobuf", reason="protobuf (the grpc extra) not installed")
from edgesdk.agent.api import open_inference_v2_pb2 as pb  # noqa: E402 - after the skip above
from edgesdk.agent.api.budget import Allowance, BudgetRefused, InflightBytesBudget  # noqa: E402
from edgesdk.agent.api.codec import DecodeError  # noqa: E402
from edgesdk.agent.api.grpc_codec import decode_grpc_request, encode_grpc_response  # noqa: E402
from edgesdk.agent.tensor_signature import Signature, TensorSlot  # noqa: E402

from edgesdk.errors import InferenceInputError  # noqa: E402

SIGNATURE = Signature(
    [TensorSlot("x", np.dtype("float32"), ("batch", 4)), TensorSlot("ids", np.dtype("int8"), (None,))],
    [TensorSlot("y", np.dtype("float32"), ("batch", 4)), TensorSlot("z", np.dtype("int64"), (2,))],
    allow_nonfinite=False,
)
X = np.arange(8, dtype=np.float32).reshape(2, 4)
IDS = np.array([-3, 0, 7], dtype=np.int8)


def raw_request() -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="m", id="r1")
    request.inputs.add(name="x", datatype="FP32", shape=[2, 4])
    request.inputs.add(name="ids", datatype="INT8", shape=[3])
    request.raw_input_contents.extend([X.tobytes(), IDS.tobytes()])
    return request


def contents_request(ids: list[int] | None = None) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="m")
    request.inputs.add(name="x", datatype="FP32", shape=[2, 4]).contents.fp32_contents.extend(X.ravel().tolist())
    request.inputs.add(name="ids", datatype="INT8", shape=[3]).contents.int_contents.extend(
        IDS.tolist() if ids is None else ids
    )
    return request


@pytest.mark.parametrize("make", [raw_request, contents_request], ids=["raw", "contents"])
def test_raw_and_typed_contents_give_the_same_feeds(make) -> None:
    decoded = decode_grpc_request(make(), SIGNATURE)
    assert set(decoded.feeds) == {"x", "ids"}
    np.testing.assert_array_equal(decoded.feeds["x"], X)
    assert decoded.feeds["x"].dtype == np.float32
    np.testing.assert_array_equal(decoded.feeds["ids"], IDS)
    assert decoded.feeds["ids"].dtype == np.int8 and decoded.outputs is None


def test_requested_outputs_and_the_id_travel() -> None:
    request = raw_request()
    request.outputs.add(name="z")
    decoded = decode_grpc_request(request, SIGNATURE)
    assert [o.name for o in decoded.outputs or ()] == ["z"] and decoded.id == "r1"


def bad(request: pb.ModelInferRequest, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        decode_grpc_request(request, SIGNATURE)


def test_refusals_name_the_bad_value() -> None:
    request = raw_request()
    del request.raw_input_contents[1]
    bad(request, DecodeError, "raw_input_contents has 1 entries for 2 inputs")

    request = raw_request()
    request.raw_input_contents[0] = X.tobytes()[:-1]
    bad(request, DecodeError, r"input 'x': 31 bytes of data for shape \[2, 4\] of FP32, which needs 32")

    request = raw_request()
    request.inputs[0].contents.fp32_contents.append(1.0)
    bad(request, DecodeError, "contents beside raw_input_contents")

    bad(contents_request(ids=[1, 2, 300]), InferenceInputError, "out of range for INT8")
    bad(contents_request(ids=[1, 2]), DecodeError, r"2 values for shape \[3\], which holds 3")

    request = contents_request()
    request.inputs[1].datatype = "INT64"
    bad(request, InferenceInputError, "datatype INT64, the model takes INT8")

    request = raw_request()
    request.inputs[0].shape[:] = [2, 5]
    bad(request, InferenceInputError, r"axis 1 must be 4")

    request = raw_request()
    request.inputs[1].name = "nope"
    bad(request, InferenceInputError, "unknown input 'nope'")

    request = raw_request()
    request.outputs.add(name="w")
    bad(request, InferenceInputError, "unknown output 'w'")

    bad(pb.ModelInferRequest(model_name="m"), DecodeError, "no inputs")


def test_typed_contents_are_charged_to_the_allowance() -> None:
    allowance = Allowance(InflightBytesBudget(1 << 30), max_decoded=16)
    with pytest.raises(BudgetRefused, match="input 'x'") as caught:
        decode_grpc_request(contents_request(), SIGNATURE, allowance)
    assert caught.value.status == 413


def test_outputs_come_back_raw_and_tritonclient_reads_them() -> None:
    grpcclient = pytest.importorskip("tritonclient.grpc", reason="tritonclient[grpc] (the dev extra) not installed")
    from tritonclient.grpc import service_pb2

    outputs = {"y": X * 2, "z": np.array([5, -6], dtype=np.int64)}
    body = encode_grpc_response(
        decode_grpc_request(raw_request(), SIGNATURE), outputs, model="m", version="3", variant="onnx-fp32"
    )
    result = grpcclient.InferResult(service_pb2.ModelInferResponse.FromString(body))
    np.testing.assert_array_equal(result.as_numpy("y"), X * 2)
    np.testing.assert_array_equal(result.as_numpy("z"), outputs["z"])
    response = result.get_response()
    assert (response.model_name, response.model_version, response.id) == ("m", "3", "r1")
    assert response.parameters["variant"].string_param == "onnx-fp32"
