"""Dynamic batching in a real ``edge-agent run`` process serving the digits CNN (fp32 ONNX, a
dynamic batch axis): concurrent requests on /v1 and /v2 are answered from shared batches (the
agent's debug log says so), and every answer equals onnxruntime's unbatched run of that request
to float tolerance (measured: bit-identical here; a batched GEMM may differ in the last ulp, so
the test allows 1e-5); a NaN request among them gets its own 422."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from tests.agent_helpers import AgentProcess, make_device, run_agent_cli

httpx = pytest.importorskip("httpx")
ort = pytest.importorskip("onnxruntime")

THREADS = 12
PER_THREAD = 6


@pytest.fixture(scope="module")
def agent(digits, tmp_path_factory, request):
    from tests.bundle_helpers import make_digits_convert_dir

    cache = Path(request.config.cache.mkdir("edgesdk-agent-digits-fp32-convert-v1"))
    convert_dir = make_digits_convert_dir(digits, cache / "out", int8=False)  # one variant, batch axis kept
    device = make_device(tmp_path_factory.mktemp("agent-batching"))
    device.write_config(
        log_level="debug",
        api={
            "inline_max_ms": 0,  # every request through the pool, so that they meet in batches
            "batching": {
                "enabled": True,
                "max_batch_size": 8,
                "max_queue_delay_us": 20_000,
                "max_concurrent_batches": 1,
            },
        },
    )
    bundle = device.bundle(convert_dir, version="1.0.0", release=1)
    proc = run_agent_cli("install", "--config", str(device.config), str(bundle))
    assert proc.returncode == 0, proc.stderr
    with AgentProcess(device) as running:
        yield running
        assert running.proc.poll() is None, running.log()


def test_concurrent_answers_equal_unbatched_runs_and_a_bad_request_stays_alone(agent, digits) -> None:
    images = np.load(digits.validation)["image"][: THREADS * PER_THREAD].astype(np.float32)
    session = ort.InferenceSession(str(digits.onnx), providers=["CPUExecutionProvider"])
    unbatched = [session.run(["logits"], {"image": images[i : i + 1]})[0] for i in range(len(images))]
    answers: dict[int, np.ndarray] = {}
    variants: set[str] = set()
    refused: list[int] = []
    failures: list[str] = []
    start = threading.Barrier(THREADS)

    def client(thread: int) -> None:
        with httpx.Client(base_url=agent.url, timeout=60) as http:
            start.wait()
            for k in range(PER_THREAD):
                i = thread * PER_THREAD + k
                x = images[i : i + 1]
                if thread == 0 and k == 2:  # one NaN request in the middle of the crowd
                    bad = x.copy()
                    bad[0, 0, 3, 3] = np.nan
                    dims = ",".join(map(str, bad.shape))
                    response = http.post(
                        "/v1/models/digits/infer",
                        content=bad.astype("<f4").tobytes(),
                        headers={
                            "Content-Type": "application/x-edgesdk-tensors",
                            "X-Tensors": f"image=float32[{dims}]",
                        },
                    )
                    refused.append(response.status_code)
                if k % 2:  # the Open Inference Protocol route takes the same server call
                    response = http.post(
                        "/v2/models/digits/infer",
                        json={
                            "inputs": [
                                {
                                    "name": "image",
                                    "datatype": "FP32",
                                    "shape": list(x.shape),
                                    "data": x.ravel().tolist(),
                                }
                            ]
                        },
                    )
                    if response.status_code != 200:
                        failures.append(f"v2 {i}: {response.status_code} {response.text}")
                        continue
                    out = response.json()["outputs"][0]
                    answers[i] = np.asarray(out["data"], np.float32).reshape(out["shape"])
                else:
                    response = http.post("/v1/models/digits/infer", json={"inputs": {"image": x.tolist()}})
                    if response.status_code != 200:
                        failures.append(f"v1 {i}: {response.status_code} {response.text}")
                        continue
                    answers[i] = np.asarray(response.json()["outputs"]["logits"], np.float32)
                variants.add(response.headers["X-Model-Variant"])

    threads = [threading.Thread(target=client, args=(t,)) for t in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not failures, failures
    assert refused == [422]
    assert len(answers) == len(images) and len(variants) == 1
    for i, answer in answers.items():
        np.testing.assert_allclose(answer, unbatched[i], rtol=1e-5, atol=1e-5, err_msg=f"request {i}")
    assert "as one batch on" in agent.log(), "no request was answered from a shared batch"
