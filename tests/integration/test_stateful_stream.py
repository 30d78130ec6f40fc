"""A stateful model (state [2, batch, 8] batched on axis 1, a 0-d sample rate) converted from data
in its own layout, validated over streams with its state fed back, then served by a real agent
with the client passing the state: outputs equal onnxruntime on the original over the sequence."""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.schemas.report import ConversionReport
from tests import agent_helpers
from tests.onnx_builders import stateful_vad, vad_numpy, vad_stream

pytest.importorskip("onnxruntime", reason="needs edgesdk[convert]")
pytest.importorskip("onnx", reason="the model is built with onnx.helper (edgesdk[convert])")

STEPS = 8


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    import subprocess
    import sys

    folder = tmp_path_factory.mktemp("stream")
    model = stateful_vad(folder / "vad.onnx")
    # audio [T, N, 32]: a leading step axis (one stream per sample); state [2, N, 8] is the initial state.
    np.savez(folder / "streams.npz", **vad_stream(6, steps=STEPS))
    out = folder / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "edgesdk.cli.main", "convert", str(model), "--profile", "rpi5-8gb", "--out", str(out),
         "--calibration", str(folder / "streams.npz"), "--formats", "onnx,openvino", "--precisions", "fp32,fp16"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return model, out, ConversionReport.model_validate_json((out / "report.json").read_text())


def test_validation_runs_streams_with_the_state_fed_back_and_reports_the_drift(converted) -> None:
    _, _, report = converted
    assert any(d.startswith("stateful: state → stateN fed back over streams of 8 steps") for d in report.decisions)
    drift = [d for d in report.decisions if "state fed back over 8 steps" in d]
    assert [d.split(":")[0] for d in drift] == ["onnx-fp32", "onnx-fp16", "openvino-fp32", "openvino-fp16"], drift
    assert "step 1 0, step 8 0, worst 0" in drift[0]  # fp32 is the model itself
    shipped = {v.id: v for v in report.variants}
    # Every step of 6 streams is scored: 6 samples, each over its 8 steps.
    assert (
        shipped["onnx-fp16"].accuracy.samples == 6 and 0 < shipped["onnx-fp16"].accuracy.max_abs_diff["stateN"] < 0.01
    )


@pytest.mark.needs_agent_extra
def test_a_real_agent_serves_the_stream_with_the_client_passing_the_state(converted, tmp_path) -> None:
    httpx = pytest.importorskip("httpx")
    from edgesdk.runtimes import load_model

    model, out, _ = converted
    device = agent_helpers.make_device(tmp_path / "device")
    device.install(out, name="vad")
    stream = vad_stream(1, steps=STEPS, seed=7)
    original = load_model("onnxruntime", model.read_bytes())
    state = stream["state"]
    want_state = state
    with agent_helpers.AgentProcess(device) as agent, httpx.Client(base_url=agent.url, timeout=30) as client:
        # The runtime choice: every variant of the bundle, loaded or why not.
        (served,) = client.get("/v1/models").json()["models"]
        choices = {c["id"]: c for c in served["bundle_variants"]}
        assert set(choices) == {"onnx-fp32", "onnx-fp16", "openvino-fp32", "openvino-fp16"}
        assert choices["onnx-fp32"]["loaded"] and choices["onnx-fp32"]["active"]
        assert not choices["openvino-fp32"]["loaded"]
        assert choices["openvino-fp32"]["reason"].startswith("onnx-fp32 serves fp32 (onnxruntime comes first")
        assert client.get("/v1/status").json()["variants"] == served["bundle_variants"]
        for step in range(STEPS):
            feeds = {"audio": stream["audio"][step], "state": state, "sr": stream["sr"]}
            body = {"inputs": {k: v.tolist() for k, v in feeds.items()}}
            response = client.post("/v1/models/vad/infer", json=body)
            assert response.status_code == 200, response.text
            got = {k: np.asarray(v, np.float32) for k, v in response.json()["outputs"].items()}
            want = original.run({"audio": stream["audio"][step], "state": want_state, "sr": stream["sr"]})
            np.testing.assert_allclose(got["prob"], want["prob"], atol=1e-6)
            np.testing.assert_allclose(got["stateN"], want["stateN"], atol=1e-6)
            np.testing.assert_allclose(got["stateN"], vad_numpy(feeds)["stateN"], atol=1e-5)
            state, want_state = got["stateN"], want["stateN"]  # the client carries the state
