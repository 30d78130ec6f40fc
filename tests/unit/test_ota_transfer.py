"""Chunked bundle transfer: per-chunk hashes, resume, flow control, raw frames; HTTP with Range."""

from __future__ import annotations

import hashlib
import http.server
import os
import threading
from pathlib import Path

import pytest
from edgesdk.agent.ota.http_fetch import download_http
from edgesdk.agent.ota.machine import UpdateCancelled
from edgesdk.agent.ota.transfer import ChunkReceiver

from edgesdk.errors import IntegrityError, SchemaError, UpdateError
from edgesdk.fleet.chunk_server import ChunkServer
from edgesdk.protocol.chunks import chunk_hashes, decode_frame, encode_frame
from edgesdk.protocol.topics import OTA_CHUNK_REQUEST, device_topic
from edgesdk.schemas.messages import ChunkHeader, ChunkRequest, Deployment
from tests.faulty_agent import FaultPlan
from tests.ota_helpers import command_fields

NS = "edgesdk"
CHUNK = 4096


def make_bundle(tmp_path: Path, size: int = 10 * CHUNK + 123, chunk: int = CHUNK) -> tuple[Path, Deployment]:
    path = tmp_path / "src" / "bundle.edgepkg"
    path.parent.mkdir()
    path.write_bytes(os.urandom(size))
    deployment = Deployment(
        deployment_id="dep-1",
        **command_fields(),
        model_name="digits",
        model_version="1.0.0",
        release=2,
        bundle_sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
        bundle_size=size,
        chunk_size=chunk,
        chunk_sha256=chunk_hashes(path, chunk),
    )
    return path, deployment


class Wire:
    """A loopback 'broker' between one ChunkReceiver and one ChunkServer, with fault knobs."""

    def __init__(self, path: Path, deployment: Deployment, ota_dir: Path, **receiver_kwargs) -> None:
        self.bytes_to_device = 0
        self.bytes_to_server = 0
        self.corrupt_once: set[int] = set()
        self.drop_requests = 0
        self.requested: list[int] = []
        self.max_outstanding = 0
        self._outstanding: set[int] = set()
        self.server = ChunkServer(NS, self._deliver)
        self.server.add(path, deployment)
        self.receiver = ChunkReceiver(deployment, ota_dir, self._request, **receiver_kwargs)
        self.deployment = deployment

    def _request(self, indices: list[int]) -> None:
        request = ChunkRequest(
            device_id="dev-1",
            deployment_id=self.deployment.deployment_id,
            bundle_sha256=self.deployment.bundle_sha256,
            indices=indices,
        )
        payload = request.model_dump_json().encode()
        self.bytes_to_server += len(payload)
        self.requested.extend(indices)
        self._outstanding.update(indices)
        self.max_outstanding = max(self.max_outstanding, len(self._outstanding))
        if self.drop_requests > 0:  # the broker is down: the request is lost
            self.drop_requests -= 1
            self._outstanding.difference_update(indices)
            return
        self.server.on_message(device_topic(NS, "dev-1", OTA_CHUNK_REQUEST), payload)

    def _deliver(self, topic: str, frame: bytes, qos: int) -> None:
        assert topic == device_topic(NS, "dev-1", "ota/chunks/data")
        self.bytes_to_device += len(frame)
        header, data = decode_frame(frame)
        self._outstanding.discard(header.index)
        if header.index in self.corrupt_once:
            self.corrupt_once.discard(header.index)
            data = memoryview(bytes([data[0] ^ 0xFF]) + bytes(data)[1:])  # flip, so it always differs
        self.receiver.on_frame(header, data)


def test_frame_roundtrip_and_garbage() -> None:
    header = ChunkHeader(deployment_id="d", bundle_sha256="a" * 64, index=3)
    decoded, data = decode_frame(encode_frame(header, b"\x00\x01raw"))
    assert decoded == header and bytes(data) == b"\x00\x01raw"
    for garbage in (b"", b"EOC1", b"XXXX\x00\x02{}", b"EOC1\xff\xff{}"):
        with pytest.raises(SchemaError):
            decode_frame(garbage)


def test_download_is_complete_flow_controlled_and_close_to_bundle_size(tmp_path: Path) -> None:
    # Real chunks are 256 KiB; at 64 KiB the per-chunk header and request are already < 1 %.
    path, deployment = make_bundle(tmp_path, size=40 * 65536 - 7, chunk=65536)
    wire = Wire(path, deployment, tmp_path / "ota", window=4)
    progress: list[float] = []
    done = wire.receiver.run(progress.append, lambda: False)
    assert done.read_bytes() == path.read_bytes()
    assert progress[-1] == 1.0
    assert wire.max_outstanding <= 4
    ratio = (wire.bytes_to_device + wire.bytes_to_server) / deployment.bundle_size
    assert ratio <= 1.05, ratio
    assert sorted(wire.requested) == list(range(40))  # nothing asked twice on a clean link


def test_corrupted_chunk_is_asked_for_again(tmp_path: Path) -> None:
    path, deployment = make_bundle(tmp_path)
    wire = Wire(path, deployment, tmp_path / "ota")
    wire.corrupt_once = {2, 7}
    done = wire.receiver.run(lambda _f: None, lambda: False)
    assert done.read_bytes() == path.read_bytes()
    assert wire.receiver.bad_chunks == 2
    assert wire.requested.count(2) == 2 and wire.requested.count(7) == 2


def test_persistently_corrupted_chunks_fail_the_download(tmp_path: Path) -> None:
    path, deployment = make_bundle(tmp_path)
    wire = Wire(path, deployment, tmp_path / "ota", max_bad_chunks=2)
    original = wire._deliver

    def always_corrupt(topic: str, frame: bytes, qos: int) -> None:
        wire.corrupt_once.add(decode_frame(frame)[0].index)
        original(topic, frame, qos)

    wire.server.publish = always_corrupt
    with pytest.raises(IntegrityError, match="hash check"):
        wire.receiver.run(lambda _f: None, lambda: False)


def test_lost_requests_time_out_and_are_repeated(tmp_path: Path) -> None:
    path, deployment = make_bundle(tmp_path)
    wire = Wire(path, deployment, tmp_path / "ota", timeout_s=0.2, initial_timeout_s=0.2)
    wire.drop_requests = 3  # e.g. a broker restart swallowed them
    done = wire.receiver.run(lambda _f: None, lambda: False)
    assert done.read_bytes() == path.read_bytes()
    assert len(wire.requested) > len(set(wire.requested))


def test_resume_after_interruption_fetches_only_what_is_missing(tmp_path: Path) -> None:
    path, deployment = make_bundle(tmp_path, size=20 * CHUNK)
    ota_dir = tmp_path / "ota"
    first = Wire(path, deployment, ota_dir, window=2)
    with pytest.raises(UpdateCancelled):
        first.receiver.run(lambda _f: None, lambda: len(first.requested) >= 10)  # 'power loss' midway
    fetched_before = set(first.requested)
    # One chunk on disk got damaged while the agent was down: it must be fetched again too.
    with open(ota_dir / "dep-1.part", "r+b") as handle:
        handle.seek(3 * CHUNK)
        handle.write(b"\xff" * 10)
    second = Wire(path, deployment, ota_dir, window=2)
    done = second.receiver.run(lambda _f: None, lambda: False)
    assert done.read_bytes() == path.read_bytes()
    assert 3 in second.requested
    assert len(second.requested) <= 20 - len(fetched_before) + 1 + 2


def test_wrong_chunk_list_is_refused(tmp_path: Path) -> None:
    _, deployment = make_bundle(tmp_path)
    broken = deployment.model_copy(update={"chunk_sha256": deployment.chunk_sha256[:-1]})
    with pytest.raises(UpdateError, match="chunk hashes"):
        ChunkReceiver(broken, tmp_path / "ota", lambda _i: None)


def test_disk_full_is_reported_before_fetching(tmp_path: Path) -> None:
    path, deployment = make_bundle(tmp_path)
    wire = Wire(path, deployment, tmp_path / "ota", hooks=FaultPlan(disk_full={"download"}))
    with pytest.raises(UpdateError, match="ENOSPC"):
        wire.receiver.run(lambda _f: None, lambda: False)
    assert wire.requested == []


def test_server_answers_unknown_deployments_with_an_error_frame(tmp_path: Path) -> None:
    sent: list[bytes] = []
    server = ChunkServer(NS, lambda _t, frame, _q: sent.append(frame))
    request = ChunkRequest(device_id="dev-1", deployment_id="nope", bundle_sha256="b" * 64, indices=[0])
    server.on_message(device_topic(NS, "dev-1", OTA_CHUNK_REQUEST), request.model_dump_json().encode())
    server.on_message(device_topic(NS, "dev-2", OTA_CHUNK_REQUEST), request.model_dump_json().encode())  # spoofed id
    server.on_message(device_topic(NS, "dev-1", OTA_CHUNK_REQUEST), b"{not json")
    assert len(sent) == 1 and decode_frame(sent[0])[0].error
    assert server.bad_requests == 2


class _RangeHandler(http.server.BaseHTTPRequestHandler):
    body = b""
    honour_range = True
    fail_after: int | None = None
    ranges: list[str | None] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server API
        start, end = 0, len(self.body) - 1
        header = self.headers.get("Range")
        self.ranges.append(header)
        if header and self.honour_range:
            first, _, last = header.split("=")[1].partition("-")
            start, end = int(first), min(int(last or end), end)
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(self.body)}")
        else:
            self.send_response(200)
        payload = self.body[start : end + 1]
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.fail_after is not None:
            self.wfile.write(payload[: self.fail_after])
            type(self).fail_after = None
            self.close_connection = True
            return
        self.wfile.write(payload)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def http_bundle(tmp_path: Path):
    path, deployment = make_bundle(tmp_path, size=30 * CHUNK)
    handler = type("Handler", (_RangeHandler,), {"body": path.read_bytes()})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/bundle.edgepkg"
    yield path, deployment.model_copy(update={"url": url}), handler
    server.shutdown()


def test_http_download_resumes_with_range(tmp_path: Path, http_bundle) -> None:
    path, deployment, handler = http_bundle
    handler.fail_after = 12 * CHUNK + 100  # the connection breaks mid-file: tried again, resumed
    handler.ranges = []
    done = download_http(deployment, tmp_path / "ota")
    assert done.read_bytes() == path.read_bytes()
    # The second request starts at the first chunk that did not arrive whole.
    assert handler.ranges == [f"bytes=0-{30 * CHUNK - 1}", f"bytes={12 * CHUNK}-{30 * CHUNK - 1}"]


def test_http_download_checks_the_signed_hash(tmp_path: Path, http_bundle) -> None:
    _, deployment, _ = http_bundle
    lying = deployment.model_copy(update={"bundle_sha256": "0" * 64, "chunk_sha256": []})
    with pytest.raises(UpdateError, match="sha256"):
        download_http(lying, tmp_path / "ota")
    with pytest.raises(UpdateError, match="not http"):
        download_http(deployment.model_copy(update={"url": "file:///etc/passwd"}), tmp_path)


def test_request_window_backs_off_under_loss_and_adapts_to_the_round_trip() -> None:
    from edgesdk.agent.ota.transfer import RequestWindow

    window = RequestWindow(8, min_timeout_s=1.0)
    assert window.size == 2  # starts small
    for _ in range(40):
        window.arrived(0.05)
    assert window.size == 8  # opened up to the maximum, never beyond
    assert window.timeout_s == 1.0  # fast link: the floor
    window.expired()
    assert window.size == 1 and window.timeout_s == 2.0  # the frames may only be late: ask for one
    window.arrived(None)
    assert window.size == 2  # reopens as chunks arrive
    window.expired()
    window.expired()
    window.expired()
    assert window.size == 1 and window.timeout_s == 16.0  # congestion: one at a time, long waits
    for _ in range(20):
        window.arrived(5.0)  # a slow, overloaded path: the timeout follows the round trip
    assert 5.0 < window.timeout_s < 16.0
    window.arrived(None)  # a repeated chunk gives no RTT sample (Karn)
