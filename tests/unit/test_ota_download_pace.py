"""URL and MQTT downloads end within their deadline when the source trickles: a real HTTP
server (a thread) that sends one byte every second, against test-sized limits."""

from __future__ import annotations

import hashlib
import http.server
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from edgesdk.agent.ota.http_fetch import download_http
from edgesdk.agent.ota.transfer import ChunkReceiver, Pace, TransferLimits

from edgesdk.errors import UpdateError
from edgesdk.schemas.messages import Deployment

SIZE = 4096
#: Minimum rate 100 B/s over 2 s; the whole download within 3..5 s.
LIMITS = TransferLimits(min_rate_bytes_s=100.0, window_s=2.0, deadline_min_s=3.0, deadline_max_s=5.0)


class TrickleHandler(http.server.BaseHTTPRequestHandler):
    """Announces SIZE bytes, then sends one every ``interval`` seconds (a slow-retrieval attack)."""

    interval = 1.0
    stop = threading.Event()

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        self.send_response(200)
        self.send_header("Content-Length", str(SIZE))
        self.end_headers()
        try:
            for _ in range(SIZE):
                if self.stop.wait(self.interval):
                    return
                self.wfile.write(b"x")
                self.wfile.flush()
        except OSError:
            return  # the agent hung up: what we expect

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def trickle_url() -> Iterator[str]:
    TrickleHandler.stop.clear()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), TrickleHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/bundle.edgepkg"
    TrickleHandler.stop.set()
    server.shutdown()
    server.server_close()


def deployment(url: str | None = None, chunk_sha256: list[str] | None = None) -> Deployment:
    return Deployment(
        deployment_id="dep-slow",
        issued_at=datetime.now(timezone.utc),
        model_name="digits",
        model_version="1.0.0",
        release=2,
        bundle_sha256=hashlib.sha256(b"x" * SIZE).hexdigest(),
        bundle_size=SIZE,
        chunk_size=1024,
        chunk_sha256=chunk_sha256 or [],
        url=url,
        expires_at=datetime.now(timezone.utc) + timedelta(hours=1),
        sequence=1,
        targets=["dev-1"],
    )


def test_a_trickling_server_fails_the_download_for_its_rate(tmp_path: Path, trickle_url: str) -> None:
    started = time.monotonic()
    with pytest.raises(UpdateError, match="too slow") as failed:
        download_http(
            deployment(trickle_url), tmp_path, progress=lambda _: None, cancelled=lambda: False, limits=LIMITS
        )
    # Not a timing assertion of the code's speed: a bound that says it did not wait for the
    # 4096 s the server would take (the deadline is 5 s; a generous margin for a loaded VM).
    assert time.monotonic() - started < 60
    assert "bytes/s" in str(failed.value) or "deadline" in str(failed.value)


def test_a_server_that_keeps_just_above_the_rate_meets_the_deadline(tmp_path: Path, trickle_url: str) -> None:
    TrickleHandler.interval = 0.001  # ~1000 B/s at best: above the rate, but 4096 bytes need > 3 s
    try:
        limits = TransferLimits(min_rate_bytes_s=10.0, window_s=1.0, deadline_min_s=0.5, deadline_max_s=0.5)
        with pytest.raises(UpdateError, match="deadline"):
            download_http(
                deployment(trickle_url), tmp_path, progress=lambda _: None, cancelled=lambda: False, limits=limits
            )
    finally:
        TrickleHandler.interval = 1.0


def test_an_mqtt_download_with_no_chunks_fails_for_its_rate(tmp_path: Path) -> None:
    hashes = [hashlib.sha256(b"x" * 1024).hexdigest()] * 4
    receiver = ChunkReceiver(deployment(chunk_sha256=hashes), tmp_path, lambda indices: None, limits=LIMITS)
    with pytest.raises(UpdateError, match="too slow"):
        receiver.run(lambda _: None, lambda: False)


def test_pace_window_covers_two_chunks_at_the_minimum_rate() -> None:
    pace = Pace(TransferLimits(min_rate_bytes_s=1024.0, window_s=60.0), 10 << 20, "download", unit=256 * 1024)
    assert pace.window_s == 512.0
    assert TransferLimits().deadline_s(100 << 20) == 6 * 3600.0
    assert TransferLimits().deadline_s(1 << 10) == 300.0
