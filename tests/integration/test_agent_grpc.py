"""The Open Inference Protocol over gRPC of a real ``edge-agent run`` process (``api.grpc``
enabled) serving a real digits bundle, spoken by the official ``tritonclient.grpc`` client:
health, metadata, inference equal to onnxruntime run directly (raw contents, what the client
sends, and typed contents through tritonclient's own stub), and clean refusals with their gRPC
codes; the agent still serves afterwards."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tests.agent_helpers import AgentProcess, make_device, run_agent_cli

httpx = pytest.importorskip("httpx")
pytest.importorskip("onnxruntime")
pytest.importorskip("grpc", reason="grpcio (the grpc extra) not installed")
grpcclient = pytest.importorskip("tritonclient.grpc", reason="tritonclient[grpc] (the dev extra) not installed")
import grpc  # noqa: E402 - after the skips above
from tritonclient.grpc import service_pb2, service_pb2_grpc  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

MAX_BODY = 1024 * 1024


@pytest.fixture(scope="module")
def agent(convert_dir, tmp_path_factory):
    device = make_device(tmp_path_factory.mktemp("agent-grpc"))
    # A budget of one body: a message's bytes and its parsed form (2x) must fit in it.
    device.write_config(
        api={"max_body_bytes": MAX_BODY, "max_inflight_bytes": MAX_BODY, "grpc": {"enabled": True, "port": 0}}
    )
    bundle = device.bundle(convert_dir, version="1.0.0", release=1)
    proc = run_agent_cli("install", "--config", str(device.config), str(bundle))
    assert proc.returncode == 0, proc.stderr
    with AgentProcess(device) as running:
        running.grpc_port = int((device.data_dir / "grpc.port").read_text())
        yield running
        assert running.proc.poll() is None, running.log()


@pytest.fixture()
def triton(agent):
    client = grpcclient.InferenceServerClient(url=f"127.0.0.1:{agent.grpc_port}")
    yield client
    client.close()


@pytest.fixture()
def stub(agent):
    """tritonclient's generated stub: for requests its high-level client never sends."""
    channel = grpc.insecure_channel(
        f"127.0.0.1:{agent.grpc_port}", options=[("grpc.max_send_message_length", 8 * MAX_BODY)]
    )
    yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
    channel.close()


def image_input(images: np.ndarray, datatype: str = "FP32") -> object:
    tensor = grpcclient.InferInput("image", list(images.shape), datatype)
    tensor.set_data_from_numpy(images)
    return tensor


def test_health_and_metadata(triton) -> None:
    assert triton.is_server_live() and triton.is_server_ready()
    assert triton.is_model_ready("digits") and triton.is_model_ready("digits", "1.0.0")
    assert not triton.is_model_ready("nope") and not triton.is_model_ready("digits", "9.9.9")
    server = triton.get_server_metadata(as_json=True)
    assert server["name"] == "edgesdk-agent" and "binary_tensor_data" in server["extensions"]
    meta = triton.get_model_metadata("digits", as_json=True)
    assert meta["name"] == "digits" and meta["versions"] == ["1.0.0"] and meta["platform"] == "onnxruntime_onnx"
    assert meta["inputs"] == [{"name": "image", "datatype": "FP32", "shape": ["-1", "1", "8", "8"]}]
    assert [(o["name"], o["datatype"]) for o in meta["outputs"]] == [("logits", "FP32")]
    assert triton.get_model_metadata("digits", "1.0.0", as_json=True) == meta


def inference_count(agent) -> int:
    text = httpx.get(f"{agent.url}/metrics", timeout=30).text
    match = re.search(r'^edgesdk_agent_inference_latency_seconds_count\{variant="onnx-fp32"\} (\d+)$', text, re.M)
    return int(match[1]) if match else 0


def test_inference_matches_onnxruntime_and_is_counted(agent, triton, images, reference) -> None:
    before = inference_count(agent)
    outputs = [grpcclient.InferRequestedOutput("logits")]
    result = triton.infer("digits", [image_input(images)], outputs=outputs, request_id="req-7")
    logits = result.as_numpy("logits")
    assert logits.dtype == np.float32 and logits.shape == reference.shape
    np.testing.assert_allclose(logits, reference, atol=1e-5)
    response = result.get_response(as_json=True)
    assert response["model_name"] == "digits" and response["model_version"] == "1.0.0" and response["id"] == "req-7"
    assert response["parameters"]["variant"]["string_param"] == "onnx-fp32"
    one = triton.infer("digits", [image_input(images[:1])], model_version="1.0.0")
    np.testing.assert_allclose(one.as_numpy("logits"), reference[:1], atol=1e-5)
    assert inference_count(agent) == before + 2


def test_typed_contents_match_onnxruntime(stub, images, reference) -> None:
    request = service_pb2.ModelInferRequest(model_name="digits")
    tensor = request.inputs.add(name="image", datatype="FP32", shape=list(images.shape))
    tensor.contents.fp32_contents.extend(images.ravel().tolist())
    response = stub.ModelInfer(request, timeout=30)
    assert [(o.name, o.datatype, list(o.shape)) for o in response.outputs] == [("logits", "FP32", [8, 10])]
    logits = np.frombuffer(response.raw_output_contents[0], dtype="<f4").reshape(8, 10)
    np.testing.assert_allclose(logits, reference, atol=1e-5)


def refusal(call) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return caught.value


def test_refusals_get_grpc_codes_and_the_http_messages(triton, images) -> None:
    wrong_type = refusal(lambda: triton.infer("digits", [image_input(images.astype(np.float64), "FP64")]))
    assert wrong_type.status() == "StatusCode.INVALID_ARGUMENT"
    assert "datatype FP64, the model takes FP32" in wrong_type.message()

    wrong_shape = refusal(lambda: triton.infer("digits", [image_input(images[:, 0])]))
    assert wrong_shape.status() == "StatusCode.INVALID_ARGUMENT" and "shape [8, 8, 8]" in wrong_shape.message()

    unknown = refusal(lambda: triton.infer("nope", [image_input(images)]))
    assert unknown.status() == "StatusCode.NOT_FOUND" and "model 'nope' is not served here" in unknown.message()

    no_version = refusal(lambda: triton.infer("digits", [image_input(images)], model_version="2"))
    assert no_version.status() == "StatusCode.NOT_FOUND" and "no version '2'" in no_version.message()

    assert refusal(lambda: triton.get_model_metadata("nope")).status() == "StatusCode.NOT_FOUND"

    nan = images.copy()
    nan[0, 0, 0, 0] = np.nan
    non_finite = refusal(lambda: triton.infer("digits", [image_input(nan)]))
    assert non_finite.status() == "StatusCode.INVALID_ARGUMENT" and "NaN" in non_finite.message()

    unknown_output = refusal(
        lambda: triton.infer("digits", [image_input(images)], outputs=[grpcclient.InferRequestedOutput("probs")])
    )
    assert (
        unknown_output.status() == "StatusCode.INVALID_ARGUMENT"
        and "unknown output 'probs'" in unknown_output.message()
    )


def code_of(call) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value.code(), caught.value.details()


def test_malformed_and_oversized_messages_get_clean_codes_and_the_agent_serves_on(
    agent, stub, triton, images, reference
) -> None:
    short = service_pb2.ModelInferRequest(model_name="digits")
    short.inputs.add(name="image", datatype="FP32", shape=list(images.shape))
    short.raw_input_contents.append(images.tobytes()[:-4])
    code, details = code_of(lambda: stub.ModelInfer(short, timeout=30))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "bytes of data for shape [8, 1, 8, 8]" in details

    missing = service_pb2.ModelInferRequest(model_name="digits")
    missing.inputs.add(name="image", datatype="FP32", shape=list(images.shape))
    code, details = code_of(lambda: stub.ModelInfer(missing, timeout=30))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "has no data" in details

    wrong_field = service_pb2.ModelInferRequest(model_name="digits")
    tensor = wrong_field.inputs.add(name="image", datatype="FP32", shape=[1, 1, 8, 8])
    tensor.contents.int_contents.extend([1] * 64)
    code, details = code_of(lambda: stub.ModelInfer(wrong_field, timeout=30))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "contents.fp32_contents, got int_contents" in details

    no_inputs = service_pb2.ModelInferRequest(model_name="digits")
    code, details = code_of(lambda: stub.ModelInfer(no_inputs, timeout=30))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "no inputs" in details

    # Bytes that are no protobuf message at all, on the ModelInfer method.
    channel = grpc.insecure_channel(f"127.0.0.1:{agent.grpc_port}")
    raw_call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
    code, details = code_of(lambda: raw_call(b"\xff\xff\xff\xff", timeout=30))
    channel.close()
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "not a ModelInferRequest message" in details

    # Under the message limit, but it and its parsed form do not fit the memory budget.
    rows = MAX_BODY * 6 // 10 // 256
    heavy = service_pb2.ModelInferRequest(model_name="digits")
    heavy.inputs.add(name="image", datatype="FP32", shape=[rows, 1, 8, 8])
    heavy.raw_input_contents.append(np.zeros((rows, 1, 8, 8), np.float32).tobytes())
    code, details = code_of(lambda: stub.ModelInfer(heavy, timeout=30))
    assert code == grpc.StatusCode.UNAVAILABLE and "memory budget" in details

    # Over api.max_body_bytes: refused by grpc before the handler.
    big = service_pb2.ModelInferRequest(model_name="digits")
    big.inputs.add(name="image", datatype="FP32", shape=[MAX_BODY // 256 + 1, 1, 8, 8])
    big.raw_input_contents.append(b"\x00" * ((MAX_BODY // 256 + 1) * 256))
    code, _ = code_of(lambda: stub.ModelInfer(big, timeout=30))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED

    result = triton.infer("digits", [image_input(images)])
    np.testing.assert_allclose(result.as_numpy("logits"), reference, atol=1e-5)
