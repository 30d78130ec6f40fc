"""The Open Inference Protocol (KServe v2) of a real ``edge-agent run`` process serving a real
digits bundle, spoken by the official ``tritonclient.http`` client, unchanged: health,
metadata, JSON and binary-data inference compared with onnxruntime run directly, refusals with
their status codes; and ``promtool check metrics`` on the live ``/metrics`` after that traffic."""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest

from tests.agent_helpers import AgentProcess, make_device, run_agent_cli

httpx = pytest.importorskip("httpx")
pytest.importorskip("onnxruntime")
httpclient = pytest.importorskip("tritonclient.http", reason="tritonclient[http] (the dev extra) not installed")
from tritonclient.utils import InferenceServerException  # noqa: E402 - after the skip above


@pytest.fixture(scope="module")
def agent(convert_dir, tmp_path_factory):
    device = make_device(tmp_path_factory.mktemp("agent-v2"))
    bundle = device.bundle(convert_dir, version="1.0.0", release=1)
    proc = run_agent_cli("install", "--config", str(device.config), str(bundle))
    assert proc.returncode == 0, proc.stderr
    with AgentProcess(device) as running:
        yield running
        assert running.proc.poll() is None, running.log()


@pytest.fixture()
def triton(agent):
    client = httpclient.InferenceServerClient(url=f"127.0.0.1:{agent.port}", network_timeout=30)
    yield client
    client.close()


def image_input(images: np.ndarray, *, binary: bool, datatype: str = "FP32") -> object:
    tensor = httpclient.InferInput("image", list(images.shape), datatype)
    tensor.set_data_from_numpy(images, binary_data=binary)
    return tensor


def test_health_and_metadata(triton) -> None:
    assert triton.is_server_live() and triton.is_server_ready()
    assert triton.is_model_ready("digits") and triton.is_model_ready("digits", "1.0.0")
    assert not triton.is_model_ready("nope") and not triton.is_model_ready("digits", "9.9.9")
    server = triton.get_server_metadata()
    assert server["name"] == "edgesdk-agent" and "binary_tensor_data" in server["extensions"]
    meta = triton.get_model_metadata("digits")
    assert meta["name"] == "digits" and meta["versions"] == ["1.0.0"] and meta["platform"] == "onnxruntime_onnx"
    assert meta["inputs"] == [{"name": "image", "datatype": "FP32", "shape": [-1, 1, 8, 8]}]
    assert [(o["name"], o["datatype"]) for o in meta["outputs"]] == [("logits", "FP32")]
    assert triton.get_model_metadata("digits", "1.0.0") == meta


@pytest.mark.parametrize(
    ("binary_in", "binary_out"),
    [(False, False), (True, True), (True, False), (False, True), (True, None)],
    ids=["json", "binary", "binary-in-json-out", "json-in-binary-out", "binary-default-outputs"],
)
def test_inference_matches_onnxruntime(triton, images, reference, binary_in, binary_out) -> None:
    outputs = None if binary_out is None else [httpclient.InferRequestedOutput("logits", binary_data=binary_out)]
    result = triton.infer("digits", [image_input(images, binary=binary_in)], outputs=outputs, request_id="req-7")
    logits = result.as_numpy("logits")
    assert logits.dtype == np.float32 and logits.shape == reference.shape
    np.testing.assert_allclose(logits, reference, atol=1e-5)
    response = result.get_response()
    assert response["model_name"] == "digits" and response["model_version"] == "1.0.0"
    assert response["id"] == "req-7" and response["parameters"]["variant"] == "onnx-fp32"


def test_versioned_infer_and_one_image(triton, images, reference) -> None:
    result = triton.infer("digits", [image_input(images[:1], binary=True)], model_version="1.0.0")
    np.testing.assert_allclose(result.as_numpy("logits"), reference[:1], atol=1e-5)


def refusal(call) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return caught.value


def test_refusals_have_v1_status_codes_and_clear_messages(triton, images) -> None:
    wrong_type = refusal(
        lambda: triton.infer("digits", [image_input(images.astype(np.float64), binary=True, datatype="FP64")])
    )
    assert wrong_type.status() == "422" and "datatype FP64, the model takes FP32" in wrong_type.message()

    wrong_shape = refusal(lambda: triton.infer("digits", [image_input(images[:, 0], binary=False)]))
    assert wrong_shape.status() == "422" and "input 'image': shape [8, 8, 8]" in wrong_shape.message()

    unknown = refusal(lambda: triton.infer("nope", [image_input(images, binary=True)]))
    assert unknown.status() == "404" and "model 'nope' is not served here" in unknown.message()

    no_version = refusal(lambda: triton.infer("digits", [image_input(images, binary=True)], model_version="2"))
    assert no_version.status() == "404" and "no version '2'" in no_version.message()

    metadata = refusal(lambda: triton.get_model_metadata("nope"))
    assert metadata.status() == "404"

    nan = images.copy()
    nan[0, 0, 0, 0] = np.nan
    non_finite = refusal(lambda: triton.infer("digits", [image_input(nan, binary=True)]))
    assert non_finite.status() == "422" and "NaN" in non_finite.message()

    unknown_output = refusal(
        lambda: triton.infer(
            "digits", [image_input(images, binary=True)], outputs=[httpclient.InferRequestedOutput("probs")]
        )
    )
    assert unknown_output.status() == "422" and "unknown output 'probs'" in unknown_output.message()


def test_v2_inferences_are_counted_like_v1_and_metrics_pass_promtool(agent, triton, images) -> None:
    def fp32_count(text: str) -> int:
        match = re.search(r'^edgesdk_agent_inference_latency_seconds_count\{variant="onnx-fp32"\} (\d+)$', text, re.M)
        return int(match[1]) if match else 0

    with httpx.Client(base_url=agent.url, timeout=30) as client:
        before = fp32_count(client.get("/metrics").text)
        for _ in range(5):
            triton.infer("digits", [image_input(images, binary=True)])
        client.post("/v1/models/digits/infer", json={"inputs": {"image": images.tolist()}})
        body = client.get("/metrics").text
    assert fp32_count(body) == before + 6
    assert "# TYPE edgesdk_agent_inference_latency_seconds histogram" in body

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package 'prometheus'; scripts/test installs it)")
    checked = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, f"promtool check metrics failed:\n{checked.stdout}{checked.stderr}\n---\n{body}"
