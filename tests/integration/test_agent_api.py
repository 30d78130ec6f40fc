"""The local API of a real ``edge-agent run`` process serving a real digits bundle: every
route, every encoding, and the bad input the issue lists (malformed JSON, wrong dtype/shape,
NaN/Inf, huge bodies, slow clients, unknown models, floods) — answered, never fatal."""

from __future__ import annotations

import io
import json
import os
import socket
import stat
import threading
import time

import numpy as np
import pytest

from tests.agent_helpers import AgentProcess, make_device, raw_exchange, run_agent_cli

httpx = pytest.importorskip("httpx")
pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def agent(convert_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("agent-api")
    device = make_device(root)
    device.write_config(
        api={
            "max_concurrency": 2,
            "max_queue": 4,
            "header_timeout_s": 1.0,
            "body_timeout_s": 1.0,
            "max_body_bytes": 1_000_000,
            "unix_socket": str(root / "agent.sock"),
        }
    )
    bundle = device.bundle(convert_dir, version="1.0.0", release=1)
    proc = run_agent_cli("install", "--config", str(device.config), str(bundle))
    assert proc.returncode == 0, proc.stderr
    with AgentProcess(device) as running:
        yield running
        assert running.proc.poll() is None, running.log()  # nothing above killed it


@pytest.fixture()
def client(agent):
    with httpx.Client(base_url=agent.url, timeout=30) as c:
        yield c


def test_health_ready_models_status_metrics(client) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["model"] == "digits"
    models = client.get("/v1/models").json()["models"]
    assert [m["name"] for m in models] == ["digits"]
    assert [v["id"] for v in models[0]["variants"]] == ["onnx-fp32", "onnx-int8"]
    assert models[0]["inputs"] == [{"name": "image", "dtype": "float32", "shape": ["batch", 1, 8, 8]}]
    status = client.get("/v1/status").json()
    assert status["model"]["version"] == "1.0.0"
    assert status["model"]["variant"] == "onnx-fp32"
    assert status["governor"]["state"] == "NOMINAL"
    assert "temperatures_c" in status
    metrics = client.get("/metrics")
    assert metrics.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert f'sha256="{status["model"]["sha256"]}"' in metrics.text


def test_json_inference_matches_the_runtime(client, images, reference) -> None:
    response = client.post("/v1/models/digits/infer", json={"inputs": {"image": images.tolist()}})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["variant"] == "onnx-fp32"
    np.testing.assert_allclose(np.asarray(body["outputs"]["logits"]), reference, atol=1e-5)


def test_npy_npz_and_raw_encodings(client, images, reference) -> None:
    buffer = io.BytesIO()
    np.save(buffer, images)
    npy = client.post(
        "/v1/models/digits/infer", content=buffer.getvalue(), headers={"content-type": "application/x-npy"}
    )
    assert npy.status_code == 200, npy.text
    np.testing.assert_allclose(np.load(io.BytesIO(npy.content)), reference, atol=1e-5)

    buffer = io.BytesIO()
    np.savez(buffer, image=images)
    npz = client.post(
        "/v1/models/digits/infer", content=buffer.getvalue(), headers={"content-type": "application/x-npz"}
    )
    assert npz.status_code == 200, npz.text
    np.testing.assert_allclose(np.load(io.BytesIO(npz.content))["logits"], reference, atol=1e-5)

    raw = client.post(
        "/v1/models/digits/infer",
        content=images.tobytes(),
        headers={"content-type": "application/x-edgesdk-tensors", "x-tensors": "image=float32[8,1,8,8]"},
    )
    assert raw.status_code == 200, raw.text
    assert raw.headers["x-tensors"] == "logits=float32[8,10]"
    np.testing.assert_allclose(np.frombuffer(raw.content, np.float32).reshape(8, 10), reference, atol=1e-5)
    assert raw.headers["x-model-variant"] == "onnx-fp32"


@pytest.mark.parametrize(
    ("kwargs", "status", "needle"),
    [
        (
            {"content": b'{"inputs": {"image": [[', "headers": {"content-type": "application/json"}},
            400,
            "malformed JSON",
        ),
        ({"json": {"image": [1, 2]}}, 400, "inputs"),
        ({"json": {"inputs": {"image": [[[[1.0] * 8] * 8]], "extra": [1]}}}, 422, "unknown input"),
        ({"json": {"inputs": {}}}, 422, "missing input"),
        ({"json": {"inputs": {"image": [[[[1.0] * 7] * 8]]}}}, 422, "axis 3 must be 8"),
        ({"json": {"inputs": {"image": [[[1.0] * 8] * 8]}}}, 422, "rank"),
        ({"json": {"inputs": {"image": [[[[1.0, [2.0]] + [1.0] * 6] * 8]]}}}, 400, "rectangular"),
        ({"json": {"inputs": {"image": [[[["a"] * 8] * 8]]}}}, 422, "numbers"),
        (
            {"content": b'{"inputs": {"image": [[[' + b",".join([b"[NaN,1,1,1,1,1,1,1]"] * 8) + b"]]]}}"},
            422,
            "NaN or Inf",
        ),
        (
            {
                "content": np.zeros((1, 1, 8, 8), np.int32).tobytes(),
                "headers": {"content-type": "application/x-edgesdk-tensors", "x-tensors": "image=int32[1,1,8,8]"},
            },
            422,
            "dtype int32, expected float32",
        ),
        (
            {
                "content": np.zeros(10, np.float32).tobytes(),
                "headers": {"content-type": "application/x-edgesdk-tensors", "x-tensors": "image=float32[1,1,8,8]"},
            },
            400,
            "bytes",
        ),
        (
            {
                "content": np.full((1, 1, 8, 8), np.inf, np.float32).tobytes(),
                "headers": {"content-type": "application/x-edgesdk-tensors", "x-tensors": "image=float32[1,1,8,8]"},
            },
            422,
            "NaN or Inf",
        ),
        ({"content": b"not an npy", "headers": {"content-type": "application/x-npy"}}, 400, ".npy"),
        ({"content": b"PK\x03\x04garbage", "headers": {"content-type": "application/x-npz"}}, 400, ".npz"),
        ({"content": b"<xml/>", "headers": {"content-type": "application/xml"}}, 415, "application/xml"),
    ],
)
def test_bad_requests_get_a_clear_4xx(client, kwargs, status, needle) -> None:
    response = client.post("/v1/models/digits/infer", **kwargs)
    assert response.status_code == status, response.text
    assert needle in response.json()["error"]
    assert client.get("/healthz").status_code == 200


@pytest.mark.parametrize("bad", [np.nan, np.inf], ids=["nan", "inf"])
def test_a_large_input_with_one_nonfinite_value_is_refused_and_serving_goes_on(client, bad) -> None:
    """Inputs of 256 KiB and more are scanned where this machine's runtime threads leave room:
    beside the run or before it (LoadedModel.cores_free_while_running). Either way one NaN/Inf
    in the last element of a 1,100-image batch (282 KB) gets the 422, and the agent serves on."""
    from edgesdk.agent.tensor_signature import DEFERRED_SCAN_MIN_BYTES

    images = np.random.default_rng(7).random((1100, 1, 8, 8), dtype=np.float32)
    assert images.nbytes >= DEFERRED_SCAN_MIN_BYTES
    headers = {"content-type": "application/x-edgesdk-tensors", "x-tensors": "image=float32[1100,1,8,8]"}
    poisoned = images.copy()
    poisoned[-1, 0, -1, -1] = bad
    refused = client.post("/v1/models/digits/infer", content=poisoned.tobytes(), headers=headers)
    assert refused.status_code == 422 and "NaN or Inf" in refused.json()["error"], refused.text
    served = client.post("/v1/models/digits/infer", content=images.tobytes(), headers=headers)
    assert served.status_code == 200 and served.headers["x-tensors"] == "logits=float32[1100,10]"
    assert np.isfinite(np.frombuffer(served.content, "<f4")).all()


def test_a_large_json_batch_is_answered_as_its_raw_tensors_and_bad_ones_as_before(client) -> None:
    """Bodies of 16 KiB and more holding one float input are read by simdjson
    (agent/api/tensor_json.py): the same logits as the same images sent raw, bit for bit, and
    a body broken where only a full reading sees it gets the usual error."""
    # 96 images: 126 KB, its charge on this road ~860 KB, within this agent's 1 MB cap.
    images = np.random.default_rng(9).random((96, 1, 8, 8), dtype=np.float32)
    text = json.dumps({"inputs": {"image": images.tolist()}})
    assert len(text) > 16 * 1024
    answer = client.post("/v1/models/digits/infer", content=text, headers={"content-type": "application/json"})
    assert answer.status_code == 200, answer.text
    raw = client.post(
        "/v1/models/digits/infer",
        content=images.tobytes(),
        headers={"content-type": "application/x-edgesdk-tensors", "x-tensors": "image=float32[96,1,8,8]"},
    )
    logits = np.asarray(answer.json()["outputs"]["logits"], np.float32)
    assert logits.tobytes() == raw.content

    rows = images.tolist()
    hidden = json.loads(json.dumps(rows))
    hidden[3][0][2][5] = [hidden[3][0][2][5]]  # a list where a number goes: as many numbers
    ragged = json.loads(json.dumps(rows))
    ragged[7][0][1].append(ragged[7][0][2].pop())  # rows of 9 and 7: as many numbers
    bad = {
        "a list for a number": (json.dumps({"inputs": {"image": hidden}}), 400),
        "ragged rows": (json.dumps({"inputs": {"image": ragged}}), 400),
        "rank 2": (json.dumps({"inputs": {"image": images.reshape(96, 64).tolist()}}), 422),
        "NaN": (json.dumps({"inputs": {"image": rows[:-1] + [[[[float("nan")] * 8] * 8]]}}), 422),
    }
    for name, (body, status) in bad.items():
        refused = client.post("/v1/models/digits/infer", content=body, headers={"content-type": "application/json"})
        assert refused.status_code == status, (name, refused.text)
        assert "error" in refused.json(), name
    assert (
        client.post("/v1/models/digits/infer", content=text, headers={"content-type": "application/json"}).json()[
            "outputs"
        ]
        == answer.json()["outputs"]
    )


def test_unknown_model_route_and_method(client) -> None:
    unknown = client.post("/v1/models/cats/infer", json={"inputs": {}})
    assert unknown.status_code == 404 and "cats" in unknown.json()["error"]
    assert client.get("/v1/nothing").status_code == 404
    wrong = client.get("/v1/models/digits/infer")
    assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"
    assert client.post("/v1/status").status_code == 405


def test_oversized_body_is_refused_before_it_is_read(agent) -> None:
    # Announce 50 MB and send none of it: the answer must come at once, not after a timeout.
    start = time.monotonic()
    answer = raw_exchange(
        agent.port,
        b"POST /v1/models/digits/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 50000000\r\n\r\n",
    )
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"over the limit" in answer
    assert time.monotonic() - start < 0.9  # well under the 1 s body timeout


def test_chunked_body_and_garbage_request_line(agent) -> None:
    chunked = raw_exchange(
        agent.port,
        b"POST /v1/models/digits/infer HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    )
    assert chunked.startswith(b"HTTP/1.1 411")
    garbage = raw_exchange(agent.port, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n")
    assert garbage.startswith(b"HTTP/1.1 400")


def test_slowloris_clients_are_cut_off(agent, client) -> None:
    # Ten clients drip a header byte every 0.2 s; each is cut off at the 1 s header timeout
    # while normal requests keep being served.
    socks = []
    for _ in range(10):
        s = socket.create_connection(("127.0.0.1", agent.port), timeout=5)
        s.sendall(b"POST /v1/models/digits/infer HTTP/1.1\r\n")
        socks.append(s)
    start = time.monotonic()
    closed = [False] * len(socks)
    while not all(closed) and time.monotonic() - start < 5:
        for i, s in enumerate(socks):
            if closed[i]:
                continue
            try:
                s.sendall(b"X")
            except OSError:
                closed[i] = True
        assert client.get("/healthz").status_code == 200
        time.sleep(0.2)
    answers = []
    for s in socks:
        s.settimeout(1)
        try:
            answers.append(s.recv(4096))
        except OSError:
            answers.append(b"")
        s.close()
    assert all(closed) or all(a.startswith(b"HTTP/1.1 408") for a in answers), answers
    assert time.monotonic() - start < 4
    assert any(a.startswith(b"HTTP/1.1 408") for a in answers)


def test_slow_body_is_cut_off(agent) -> None:
    with socket.create_connection(("127.0.0.1", agent.port), timeout=5) as s:
        s.sendall(
            b"POST /v1/models/digits/infer HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
        )
        start = time.monotonic()
        answer = s.recv(4096)
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert 0.5 < time.monotonic() - start < 3


def test_flood_gets_503_with_retry_after_and_the_agent_keeps_serving(agent, images) -> None:
    big = np.repeat(images, 256, axis=0)  # 2048 images: each request takes a few ms
    body = big.tobytes()
    headers = {"content-type": "application/x-edgesdk-tensors", "x-tensors": f"image=float32[{len(big)},1,8,8]"}
    statuses: list[int] = []
    retry_after: list[str | None] = []
    lock = threading.Lock()

    def hammer() -> None:
        with httpx.Client(base_url=agent.url, timeout=30) as c:
            for _ in range(10):
                r = c.post("/v1/models/digits/infer", content=body, headers=headers)
                with lock:
                    statuses.append(r.status_code)
                    retry_after.append(r.headers.get("retry-after"))

    threads = [threading.Thread(target=hammer) for _ in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(statuses) <= {200, 503}, statuses
    assert statuses.count(503) > 0, "24 clients against 2 workers + 4 queue slots must overflow"
    assert statuses.count(200) > 0
    assert all(ra == "1" for s, ra in zip(statuses, retry_after) if s == 503)
    with httpx.Client(base_url=agent.url) as c:
        assert c.get("/readyz").status_code == 200
        metrics = c.get("/metrics").text
    assert 'edgesdk_agent_errors_total{kind="overload"}' in metrics


def test_unix_socket_is_0660_and_serves(agent, images, reference) -> None:
    path = agent.device.root / "agent.sock"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o660
    transport = httpx.HTTPTransport(uds=str(path))
    with httpx.Client(transport=transport, base_url="http://agent") as c:
        response = c.post("/v1/models/digits/infer", json={"inputs": {"image": images[:1].tolist()}})
    assert response.status_code == 200
    np.testing.assert_allclose(np.asarray(response.json()["outputs"]["logits"]), reference[:1], atol=1e-5)


def test_keep_alive_and_pipelining(agent) -> None:
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    answer = raw_exchange(agent.port, request * 3 + b"GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert answer.count(b"HTTP/1.1 200 OK") == 4
    assert json.loads(answer.rsplit(b"\r\n\r\n", 1)[1]) == {"status": "ok"}
