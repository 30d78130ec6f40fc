"""Answers devices' chunk requests from the bundle file (operator side).

Devices pull: each asks for a window of chunks on ``devices/{id}/ota/chunks/req`` and gets raw
frames back on ``devices/{id}/ota/chunks/data``. The server keeps no per-device state, so a
device that restarts, reconnects or was offline simply asks again; and it never pushes more
than it was asked for, which is the flow control.

It does keep one small thing per device: a token bucket on its chunk requests, charged one
token per chunk asked for (the frame is the server's real cost). An honest device keeps a
small window of chunks outstanding and asks again only as frames arrive, so its rate is its
link's speed; a device that floods requests (or has been taken over) would otherwise make the
server read and publish frames as fast as it can ask, for every device sharing the server.
Requests over the budget are dropped and counted; the device's own retry timer asks again.
"""

from __future__ import annotations

import logging
import mmap
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from edgesdk.errors import EdgeSDKError, UpdateError
from edgesdk.protocol.chunks import encode_frame
from edgesdk.protocol.topics import OTA_CHUNK_DATA, OTA_CHUNK_REQUEST, all_devices_filter, device_topic, parse_topic
from edgesdk.schemas.messages import ChunkHeader, ChunkRequest, Deployment

log = logging.getLogger(__name__)

Publish = Callable[[str, bytes, int], object]


class BundleSource:
    """The bytes of one deployment's bundle, memory-mapped, cut into frames on demand."""

    def __init__(self, path: Path, deployment: Deployment) -> None:
        self.deployment = deployment
        self.path = path
        self._file = open(path, "rb")  # noqa: SIM115 - closed in close()
        size = path.stat().st_size
        if size != deployment.bundle_size:
            self._file.close()
            raise UpdateError(
                f"{path} is {size} bytes; deployment {deployment.deployment_id!r} says {deployment.bundle_size}"
            )
        self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)

    def frame(self, index: int) -> bytes:
        d = self.deployment
        header = ChunkHeader(deployment_id=d.deployment_id, bundle_sha256=d.bundle_sha256, index=index)
        start = index * d.chunk_size
        if index < 0 or start >= d.bundle_size:
            return encode_frame(header.model_copy(update={"error": f"chunk {index} out of range"}))
        return encode_frame(header, self._map[start : start + d.chunk_size])

    def close(self) -> None:
        self._map.close()
        self._file.close()


@dataclass(frozen=True)
class RequestBudget:
    """How many chunks one device may ask for: ``rate_per_s`` on average, ``burst`` at once.

    The default (200 chunks/s, 50 MiB/s at the default 256 KiB chunk) is above what a device's
    link delivers, so only a flood meets it.
    """

    rate_per_s: float = 200.0
    burst: int = 400

    def __post_init__(self) -> None:
        if not self.rate_per_s > 0 or self.burst < 1:
            raise UpdateError(f"chunk request budget needs rate_per_s > 0 and burst >= 1, not {self}")


class DeviceRateLimiter:
    """One token bucket per device id; ``clock`` is monotonic seconds (a parameter for tests)."""

    def __init__(self, budget: RequestBudget, clock: Callable[[], float] = time.monotonic) -> None:
        self.budget = budget
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # device id → (tokens, last refill)
        self._lock = threading.Lock()
        self.dropped: dict[str, int] = {}

    def allow(self, device_id: str, cost: int = 1) -> bool:
        """Take ``cost`` tokens for ``device_id``; False (and counted) when it has fewer left."""
        now = self._clock()
        with self._lock:
            tokens, last = self._buckets.get(device_id, (float(self.budget.burst), now))
            tokens = min(float(self.budget.burst), tokens + (now - last) * self.budget.rate_per_s)
            if tokens < cost:
                self._buckets[device_id] = (tokens, now)
                self.dropped[device_id] = self.dropped.get(device_id, 0) + 1
                return False
            self._buckets[device_id] = (tokens - cost, now)
            return True


class ChunkServer:
    """Serves any number of deployments to any number of devices over one MQTT client."""

    def __init__(
        self,
        namespace: str,
        publish: Publish,
        *,
        budget: RequestBudget | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.namespace = namespace
        self.publish = publish
        self._sources: dict[str, BundleSource] = {}
        self._lock = threading.Lock()
        self.limiter = DeviceRateLimiter(budget or RequestBudget(), clock)
        self.frames_sent = 0
        self.bytes_sent = 0
        self.bad_requests = 0

    @property
    def rate_limited(self) -> int:
        """Chunk requests dropped because their device was over its budget (all devices together)."""
        return sum(self.limiter.dropped.values())

    @property
    def request_filter(self) -> str:
        """Subscribe the client to this filter and route its messages to :meth:`on_message`."""
        return all_devices_filter(self.namespace, OTA_CHUNK_REQUEST)

    def add(self, path: Path, deployment: Deployment) -> None:
        with self._lock:
            if deployment.deployment_id not in self._sources:
                self._sources[deployment.deployment_id] = BundleSource(path, deployment)

    def path_of(self, bundle_sha256: str) -> Path | None:
        """The file of a bundle being served (the fleet service's HTTP artifact route asks)."""
        with self._lock:
            for source in self._sources.values():
                if source.deployment.bundle_sha256 == bundle_sha256:
                    return source.path
        return None

    def remove(self, deployment_id: str) -> None:
        with self._lock:
            source = self._sources.pop(deployment_id, None)
        if source is not None:
            source.close()

    def close(self) -> None:
        for deployment_id in list(self._sources):
            self.remove(deployment_id)

    def on_message(self, topic: str, payload: bytes) -> None:
        """One chunk request. Bad requests are counted and dropped; they never stop the server."""
        parsed = parse_topic(self.namespace, topic)
        if parsed is None or parsed.scope != "devices" or parsed.suffix != OTA_CHUNK_REQUEST:
            return
        try:
            request = ChunkRequest.parse_json_clear(payload, source=f"chunk request on {topic}")
        except EdgeSDKError as exc:
            self.bad_requests += 1
            log.warning("%s", exc)
            return
        if request.device_id != parsed.name:
            self.bad_requests += 1  # a device asks only for itself (the ACL enforces it too)
            return
        if not self.limiter.allow(parsed.name, cost=len(request.indices)):
            log.debug("chunk request from %s dropped: over its request budget", parsed.name)
            return
        with self._lock:
            source = self._sources.get(request.deployment_id)
        reply_topic = device_topic(self.namespace, parsed.name, OTA_CHUNK_DATA)
        for index in request.indices:
            if source is None or source.deployment.bundle_sha256 != request.bundle_sha256:
                header = ChunkHeader(
                    deployment_id=request.deployment_id,
                    bundle_sha256=request.bundle_sha256,
                    index=index,
                    error="deployment not served here",
                )
                frame = encode_frame(header)
            else:
                frame = source.frame(index)
            try:
                self.publish(reply_topic, frame, 0)
            except EdgeSDKError as exc:  # not connected: the device times out and asks again
                log.debug("chunk %d for %s not sent: %s", index, parsed.name, exc)
                return
            self.frames_sent += 1
            self.bytes_sent += len(frame)
