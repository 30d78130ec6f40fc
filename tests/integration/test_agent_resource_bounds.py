"""Resource-exhaustion attacks on a real ``edge-agent run`` serving the digits bundle: bodies
that declare far more array bytes than they weigh (npz, npy, X-Tensors, JSON, v2 binary) get a
4xx each, several at once get 4xx/503, and the agent's peak memory stays bounded while it goes
on answering. The bound is a memory figure read from /proc, never a timing."""

from __future__ import annotations

import io
import json
import socket
import struct
import sys
import threading
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from tests.agent_helpers import AgentProcess, make_device, run_agent_cli

httpx = pytest.importorskip("httpx")
pytest.importorskip("onnxruntime")
if not sys.platform.startswith("linux"):
    pytest.skip("reads the agent's peak RSS from /proc/PID/status (Linux only)", allow_module_level=True)

MiB = 1 << 20
#: How much the agent's peak RSS (VmHWM) may grow while it refuses every bomb below. Why 64 MB:
#: the largest body sent is 12 MiB and at most four are read at once (the 64 MiB in-flight
#: budget refuses the rest before reading them), and the interpreter's allocator keeps some of
#: what it freed; before the declared sizes were checked, one 250 kB .npz below made the agent
#: allocate 256 MiB (and copy it), and the issue measured 237 MB for a 1.1 MB body.
MAX_PEAK_GROWTH = 64 * MiB


@pytest.fixture(scope="module")
def agent(convert_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("agent-bounds")
    device = make_device(root)
    # The shipped defaults (16 MiB bodies, 16 MiB of arrays per request) with a small board's
    # 64 MiB in flight (the default is 8 bodies, 128 MiB).
    device.write_config(api={"max_concurrency": 2, "max_queue": 16, "max_inflight_bytes": 64 * MiB})
    bundle = device.bundle(convert_dir, version="1.0.0", release=1)
    proc = run_agent_cli("install", "--config", str(device.config), str(bundle))
    assert proc.returncode == 0, proc.stderr
    with AgentProcess(device) as running:
        yield running
        assert running.proc.poll() is None, running.log()


def memory_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def npy_header(shape: tuple[int, ...], dtype: str = "<f4") -> bytes:
    header = repr({"descr": dtype, "fortran_order": False, "shape": shape}).encode()
    header += b" " * (63 - (10 + len(header)) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header


def npz_bomb(array_bytes: int) -> bytes:
    """A real, valid .npz of zero images: ``array_bytes`` of arrays in ~1/1000 of that."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        with archive.open("image.npy", "w", force_zip64=True) as member:
            member.write(npy_header((array_bytes // 256, 1, 8, 8)))
            zeros = bytes(4 * MiB)
            for _ in range(array_bytes // len(zeros)):
                member.write(zeros)
    return buffer.getvalue()


def image_rows(last: bytes) -> bytes:
    """One 1x8x8 digits image as JSON text, its last number written as ``last``."""
    row = b"[" + b", ".join([b"0.25"] * 8) + b"]"
    return b"[[" + b", ".join([row] * 7) + b", [" + b", ".join([b"0.25"] * 7 + [last]) + b"]]]"


@pytest.fixture(scope="module")
def bombs() -> dict[str, tuple[bytes, dict[str, str], str]]:
    """name → (body, headers, path); each declares far more than it weighs or the model takes."""
    infer = "/v1/models/digits/infer"
    v2_header = json.dumps(
        {
            "inputs": [
                {
                    "name": "image",
                    "datatype": "FP32",
                    "shape": [1 << 40, 1, 8, 8],
                    "parameters": {"binary_data_size": 256},
                }
            ]
        }
    ).encode()
    return {
        "npz_256MiB": (npz_bomb(256 * MiB), {"content-type": "application/x-npz"}, infer),
        "npy_header_4GiB": (npy_header((1 << 24, 1, 8, 8)) + bytes(256), {"content-type": "application/x-npy"}, infer),
        "x_tensors_overflow": (
            bytes(256),
            {"content-type": "application/x-edgesdk-tensors", "x-tensors": "image=float32[0,18446744073709551615,8,8]"},
            infer,
        ),
        "x_tensors_digits": (
            bytes(256),
            {"content-type": "application/x-edgesdk-tensors", "x-tensors": "image=float32[" + "9" * 5000 + ",1,8,8]"},
            infer,
        ),
        "json_flat_4M": (
            b'{"inputs": {"image": [' + b"0," * (4 * MiB - 1) + b"0]}}",
            {"content-type": "application/json"},
            infer,
        ),
        # Read by simdjson (bodies of one float input, 16 KiB and more: agent/api/tensor_json.py):
        # a whole rectangular tensor of the wrong rank, and one hiding a list among its numbers.
        "json_tensor_wrong_rank": (
            b'{"inputs": {"image": [[' + b"0.123456789, " * 200_000 + b"0.5]]}}",
            {"content-type": "application/json"},
            infer,
        ),
        "json_tensor_hidden_list": (
            b'{"inputs": {"image": [' + b", ".join([image_rows(b"0.5")] * 200 + [image_rows(b"[0.5]")]) + b"]}}",
            {"content-type": "application/json"},
            infer,
        ),
        "json_deep": (
            b'{"inputs": {"image": ' + b"[" * 200_000 + b"]" * 200_000 + b"}}",
            {"content-type": "application/json"},
            infer,
        ),
        "v2_binary_size": (
            v2_header + bytes(256),
            {"content-type": "application/octet-stream", "inference-header-content-length": str(len(v2_header))},
            "/v2/models/digits/infer",
        ),
    }


def good_inference(client) -> None:
    images = np.zeros((1, 1, 8, 8), np.float32)
    answer = client.post("/v1/models/digits/infer", json={"inputs": {"image": images.tolist()}})
    assert answer.status_code == 200, answer.text


def test_each_bomb_gets_a_4xx_and_peak_memory_stays_bounded(agent, bombs) -> None:
    with httpx.Client(base_url=agent.url, timeout=60) as client:
        good_inference(client)  # warm: the model and the pool threads exist
        baseline = memory_kib(agent.proc.pid, "VmHWM") * 1024
        for name, (body, headers, path) in bombs.items():
            answer = client.post(path, content=body, headers=headers)
            assert 400 <= answer.status_code < 500, (name, answer.status_code, answer.text[:300])
            assert "error" in answer.json(), name
        grown = memory_kib(agent.proc.pid, "VmHWM") * 1024 - baseline
        assert grown < MAX_PEAK_GROWTH, f"peak RSS grew {grown / MiB:.0f} MiB over {baseline / MiB:.0f} MiB"
        good_inference(client)


def _announce_body(port: int, size: int) -> socket.socket:
    """A connection that sends a request head announcing ``size`` body bytes, and no body yet."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    head = (
        "POST /v1/models/digits/infer HTTP/1.1\r\nHost: agent\r\n"
        "Content-Type: application/x-edgesdk-tensors\r\nX-Tensors: image=float32[1,1,8,8]\r\n"
        f"Content-Length: {size}\r\n\r\n"
    )
    sock.sendall(head.encode())
    return sock


def _bytes_unread_by(port: int) -> int:
    """Bytes on their way to the listener on 127.0.0.1:``port`` that it has not read yet: in its
    connections' receive queues or still in their clients' send queues (Linux /proc/net/tcp)."""
    unread = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote, (tx_queue, rx_queue) = fields[1], fields[2], fields[4].split(":")
        if int(local.split(":")[1], 16) == port:
            unread += int(rx_queue, 16)
        elif int(remote.split(":")[1], 16) == port:
            unread += int(tx_queue, 16)
    return unread


def _wait_read_by_agent(port: int, timeout: float = 120) -> None:
    """Until the agent has read every byte sent to it (however slowly a loaded machine runs it)."""
    deadline = time.monotonic() + timeout
    while (unread := _bytes_unread_by(port)) > 0:
        assert time.monotonic() < deadline, f"the agent left {unread} bytes unread for {timeout} s"
        time.sleep(0.05)


def _answer_within(sock: socket.socket, seconds: float) -> bytes:
    """What the agent sent on ``sock`` within ``seconds`` (b"" when it is still waiting)."""
    sock.settimeout(seconds)
    try:
        return sock.recv(4096)
    except TimeoutError:
        return b""


def test_many_bombs_at_once_get_4xx_or_503_and_the_agent_answers_healthz(agent, bombs) -> None:
    big_raw = (
        bytes(12 * MiB),
        {"content-type": "application/x-edgesdk-tensors", "x-tensors": "image=float32[1,1,8,8]"},
    )
    statuses: list[int] = []
    lock = threading.Lock()
    baseline = memory_kib(agent.proc.pid, "VmHWM") * 1024

    def attack(body: bytes, headers: dict[str, str], path: str) -> None:
        with httpx.Client(base_url=agent.url, timeout=60) as client:
            try:
                status = client.post(path, content=body, headers=headers).status_code
            except httpx.TransportError:
                status = 0  # a 503 before the body was read closes the connection under our upload
        with lock:
            statuses.append(status)

    work = [(big_raw[0], big_raw[1], "/v1/models/digits/infer")] * 8 + list(bombs.values()) * 2
    threads = [threading.Thread(target=attack, args=item) for item in work]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    refused = [s for s in statuses if s != 0]
    assert len(statuses) == len(work)
    assert all(400 <= s < 500 or s == 503 for s in refused), statuses
    # Whether those bodies overlapped in flight depends on timing; the budget itself is proven
    # deterministically. A body is charged by the bytes that arrived, not by the size it
    # declares (issue 37, finding 6: declared bodies that never came held the whole budget):
    # five bodies 10 MiB in hold 50 MiB; a sixth that declares 12 MiB (50 + 12 fit in 64) is let
    # in and holds the 3 MiB it sent; a seventh (53 + 12 do not fit) is refused before it is read.
    # Each body follows its head at once: a head whose body waits behind the others' 40 MiB is a
    # silent body, cut off at the minimum rate when a loaded machine takes over 2 s to send them.
    held: list[socket.socket] = []
    try:
        for _ in range(5):
            held.append(_announce_body(agent.port, 12 * MiB))
            held[-1].sendall(bytes(10 * MiB))
        _wait_read_by_agent(agent.port)  # (it answers nothing: two MiB of each are missing)
        held.append(_announce_body(agent.port, 12 * MiB))
        held[-1].sendall(bytes(3 * MiB))  # under way (a silent body is cut off at the minimum rate)
        _wait_read_by_agent(agent.port)
        held.append(_announce_body(agent.port, 12 * MiB))
        answers = [_answer_within(sock, 1.0) for sock in held[:6]] + [_answer_within(held[6], 60)]
    finally:
        for sock in held:
            sock.close()
    assert answers[:6] == [b""] * 6, answers  # still waiting for the rest of their bodies
    assert answers[6].startswith(b"HTTP/1.1 503"), answers  # over the budget: 503 before reading
    with httpx.Client(base_url=agent.url, timeout=10) as client:
        assert client.get("/healthz").status_code == 200
        good_inference(client)
    grown = memory_kib(agent.proc.pid, "VmHWM") * 1024 - baseline
    assert grown < MAX_PEAK_GROWTH + 64 * MiB, (
        f"peak RSS grew {grown / MiB:.0f} MiB"
    )  # the budget, plus the bound above


def _keep_alive_exchange(sock: socket.socket, request: bytes) -> tuple[int, bytes]:
    sock.sendall(request)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += sock.recv(65536)
    return int(head.split()[1]), body


def test_bad_bodies_behind_a_repeated_header_block_get_the_usual_answers(agent) -> None:
    """A keep-alive client repeating one header block has its requests answered by a route
    prepared for that block (agent/api/prepared.py): bodies of the same length that are no
    JSON, hold NaN, strings, nulls, objects, a float32 overflow, a wrong shape or another
    input's name get the generic path's 400/422, and the same connection goes on being answered."""
    image = np.zeros((1, 1, 8, 8), np.float32)
    good = json.dumps({"inputs": {"image": image.tolist()}}).encode()

    def request(body: bytes) -> bytes:
        assert len(body) == len(good)
        head = f"POST /v1/models/digits/infer HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: {len(good)}\r\n\r\n"
        return head.encode() + body

    def padded(text: bytes) -> bytes:
        return text[:-1] + b" " * (len(good) - len(text)) + text[-1:]

    attacks = {
        b"[" + b"," * (len(good) - 1): (400, b"malformed JSON"),
        good.replace(b"0.0", b"NaN", 1): (422, b"NaN"),
        good.replace(b"0.0", b'"0"', 1): (422, b"values must be numbers"),
        # What a float32 reading would take for NaN (null), fail on ({}) or overflow to Inf.
        good.replace(b"0.0, ", b"null,", 1): (422, b"values must be numbers"),
        good.replace(b"0.0, ", b"{},  ", 1): (422, b"values must be numbers"),
        good.replace(b"0.0, ", b"1e39,", 1): (422, b"NaN"),
        good.replace(b"0.0, ", b"true,", 1): (200, b'"outputs"'),  # a number to numpy, both ways
        padded(json.dumps({"inputs": {"image": [[0.0, 1.0]]}}).encode()): (422, b"rank"),
        good.replace(b'"image"', b'"other"'): (422, b"other"),
    }
    with socket.create_connection(("127.0.0.1", agent.port), timeout=30) as sock:
        for _ in range(20):  # the block is remembered, then answered inline, then prepared
            assert _keep_alive_exchange(sock, request(good))[0] == 200
        for body, (status, says) in attacks.items():
            answer = _keep_alive_exchange(sock, request(body))
            assert answer[0] == status and says in answer[1], (body[:60], answer)
            assert _keep_alive_exchange(sock, request(good))[0] == 200
