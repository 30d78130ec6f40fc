"""Getting a bundle onto the device: chunks over MQTT (here), or HTTP(S) (:mod:`.http_fetch`).

Both write into ``<ota dir>/<deployment>.part`` at the chunk's offset and check every chunk
against the signed hash list of the Deployment, so a download survives a broker restart, a
dropped link or an agent restart: on start the partial file is re-hashed chunk by chunk and
only what is missing or wrong is fetched again. The finished file must match the signed
``bundle_sha256`` before it is renamed to ``<deployment>.edgepkg``.

Both are bounded in time (:class:`Pace`): an overall deadline (the size at the minimum rate,
clamped) and a minimum rate over a sliding window, so a source that trickles a byte now and
then ends the update in FAILED with a reason that says so, instead of holding it forever.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import queue
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from edgesdk.agent.ota.hooks import NO_HOOKS, OtaHooks
from edgesdk.agent.ota.machine import UpdateCancelled

from edgesdk.errors import IntegrityError, UpdateError
from edgesdk.hashing import sha256_file
from edgesdk.protocol.chunks import chunk_count
from edgesdk.schemas.messages import ChunkHeader, Deployment

log = logging.getLogger(__name__)

ProgressFn = Callable[[float], None]
CancelledFn = Callable[[], bool]


@dataclass(frozen=True)
class TransferLimits:
    """How slow a download may be (``AgentConfig.ota``; the defaults are its defaults)."""

    min_rate_bytes_s: float = 1024.0
    window_s: float = 60.0
    deadline_min_s: float = 300.0
    deadline_max_s: float = 6 * 3600.0

    def deadline_s(self, size: int) -> float:
        """The whole download's time: ``size`` at the minimum rate, within [min, max]."""
        return min(self.deadline_max_s, max(self.deadline_min_s, size / self.min_rate_bytes_s))


class Pace:
    """One download's clock: ``check`` raises UpdateError past the overall deadline, or when
    fewer than ``min_rate_bytes_s`` arrived on average over the last window (checked once a
    whole window has passed). ``unit``: the bytes that arrive at once (an MQTT chunk), so the
    window is at least two of them at the minimum rate and a slow but steady link passes."""

    def __init__(self, limits: TransferLimits, size: int, what: str, *, unit: int = 1) -> None:
        self.limits = limits
        self.what = what
        self.size = size
        self.window_s = max(limits.window_s, 2 * unit / limits.min_rate_bytes_s)
        self.deadline_s = limits.deadline_s(size)
        self.started = time.monotonic()
        self.received = 0
        # (time, bytes received by then); the first one is the last sample at least a window old.
        self._samples: deque[tuple[float, int]] = deque([(self.started, 0)])

    def add(self, size: int) -> None:
        self.received += size
        self._samples.append((time.monotonic(), self.received))

    def check(self) -> None:
        now = time.monotonic()
        elapsed = now - self.started
        if elapsed > self.deadline_s:
            raise UpdateError(
                f"{self.what} too slow: {self.received} of {self.size} bytes after {elapsed:.0f} s, past its "
                f"deadline of {self.deadline_s:.0f} s ({self.limits.min_rate_bytes_s:g} bytes/s minimum)"
            )
        samples = self._samples
        while len(samples) > 1 and samples[1][0] <= now - self.window_s:
            samples.popleft()
        since, then = samples[0]
        if now - since >= self.window_s:
            rate = (self.received - then) / (now - since)
            if rate < self.limits.min_rate_bytes_s:
                raise UpdateError(
                    f"{self.what} too slow: {rate:.1f} bytes/s over the last {now - since:.0f} s, below the "
                    f"minimum of {self.limits.min_rate_bytes_s:g} bytes/s ({self.received} of {self.size} bytes)"
                )


class DownloadPaths:
    """Where a deployment's bytes live while and after they arrive."""

    def __init__(self, ota_dir: Path, deployment: Deployment) -> None:
        self.part = ota_dir / f"{deployment.deployment_id}.part"
        self.done = ota_dir / f"{deployment.deployment_id}.edgepkg"


def reserve(path: Path, size: int, hooks: OtaHooks = NO_HOOKS) -> int:
    """Open ``path`` for writing and make sure ``size`` bytes fit: disk full shows up here,
    before any chunk is fetched, not halfway through. Returns the open descriptor."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        hooks.before_write("download", path, size)
        if hasattr(os, "posix_fallocate"):
            os.posix_fallocate(fd, 0, size)
        else:  # pragma: no cover - macOS
            os.ftruncate(fd, size)
    except OSError as exc:
        os.close(fd)
        if exc.errno == errno.ENOSPC:
            raise UpdateError(f"not enough disk space for the {size}-byte bundle in {path.parent} (ENOSPC)") from exc
        raise
    return fd


def verified_chunks(fd: int, deployment: Deployment) -> set[int]:
    """Indices of chunks already on disk with the right hash (resume after any interruption)."""
    have: set[int] = set()
    if not deployment.chunk_sha256:
        return have
    for index, expected in enumerate(deployment.chunk_sha256):
        piece = os.pread(fd, chunk_length(deployment, index), index * deployment.chunk_size)
        if hashlib.sha256(piece).hexdigest() == expected:
            have.add(index)
    return have


def chunk_length(deployment: Deployment, index: int) -> int:
    return min(deployment.chunk_size, deployment.bundle_size - index * deployment.chunk_size)


def finish(fd: int, paths: DownloadPaths, deployment: Deployment) -> Path:
    """fsync, check the whole-file hash, rename into place."""
    os.fsync(fd)
    digest = hashlib.sha256()
    offset = 0
    while offset < deployment.bundle_size:
        piece = os.pread(fd, min(1 << 20, deployment.bundle_size - offset), offset)
        if not piece:
            break
        digest.update(piece)
        offset += len(piece)
    if digest.hexdigest() != deployment.bundle_sha256:
        raise IntegrityError(
            f"downloaded bundle sha256 {digest.hexdigest()} != signed {deployment.bundle_sha256}; "
            "the partial file is discarded"
        )
    os.replace(paths.part, paths.done)
    return paths.done


def check_chunk_list(deployment: Deployment) -> None:
    expected = chunk_count(deployment.bundle_size, deployment.chunk_size)
    if deployment.chunk_sha256 and len(deployment.chunk_sha256) != expected:
        raise UpdateError(
            f"deployment {deployment.deployment_id!r} lists {len(deployment.chunk_sha256)} chunk hashes; "
            f"{deployment.bundle_size} bytes in {deployment.chunk_size}-byte chunks need {expected}"
        )


class RequestWindow:
    """How many chunks a device may have requested and not received: AIMD like TCP.

    It opens by one chunk per window's worth of arrivals and closes to one on a timeout; the timeout
    itself follows the measured round trip (srtt + 4·rttvar, Jacobson/Karels, sampled only on
    chunks asked for once — Karn) and doubles after each expiry. When a broker or chunk server
    is overloaded, devices therefore ask for less and wait longer instead of repeating requests
    into the congestion (which multiplies the bytes on the wire)."""

    def __init__(
        self,
        max_window: int,
        min_timeout_s: float,
        *,
        initial_timeout_s: float | None = None,
        max_timeout_s: float = 60.0,
    ) -> None:
        self.max_window = max(1, max_window)
        self.cwnd = float(min(2, self.max_window))
        self.min_timeout_s = min_timeout_s
        self.max_timeout_s = max(max_timeout_s, min_timeout_s)
        # Before the first measured round trip, be patient: a whole fleet starting at once, or a
        # slow link moving a 256 KiB chunk, takes seconds; repeating early only adds load.
        self.timeout_s = max(min_timeout_s, initial_timeout_s if initial_timeout_s is not None else min_timeout_s)
        self._srtt: float | None = None
        self._rttvar = 0.0

    @property
    def size(self) -> int:
        return max(1, int(self.cwnd))

    def arrived(self, rtt: float | None) -> None:
        """A good chunk arrived; ``rtt`` only when it was asked for once."""
        self.cwnd = min(float(self.max_window), self.cwnd + 1.0 / self.cwnd)
        if rtt is None:
            return
        if self._srtt is None:
            self._srtt, self._rttvar = rtt, rtt / 2
        else:
            self._rttvar = 0.75 * self._rttvar + 0.25 * abs(self._srtt - rtt)
            self._srtt = 0.875 * self._srtt + 0.125 * rtt
        self.timeout_s = min(self.max_timeout_s, max(self.min_timeout_s, self._srtt + 4 * self._rttvar))

    def expired(self) -> None:
        """One or more requests timed out: back off to one chunk in flight (as TCP does after a
        retransmission timeout) — the frames may only be late, and asking for the whole window
        again would fetch it twice."""
        self.cwnd = 1.0
        self.timeout_s = min(self.max_timeout_s, self.timeout_s * 2)


class ChunkReceiver:
    """Pulls a bundle over MQTT with a sliding window of outstanding chunk requests.

    ``request(indices)`` publishes one ChunkRequest; frames arrive through :meth:`on_frame`
    (called from the MQTT thread) and are written by :meth:`run` (the update thread). Lost
    requests or frames (broker restart, dropped link) time out and are asked for again;
    a chunk whose hash is wrong is dropped and asked for again, a few times at most.
    """

    def __init__(
        self,
        deployment: Deployment,
        ota_dir: Path,
        request: Callable[[list[int]], None],
        *,
        window: int = 4,
        timeout_s: float = 3.0,
        initial_timeout_s: float = 15.0,
        stall_timeout_s: float = 600.0,
        max_bad_chunks: int = 8,
        hooks: OtaHooks = NO_HOOKS,
        limits: TransferLimits = TransferLimits(),
    ) -> None:
        if not deployment.chunk_sha256:
            raise UpdateError(f"deployment {deployment.deployment_id!r} has no chunk hashes and no url")
        check_chunk_list(deployment)
        self.deployment = deployment
        self.paths = DownloadPaths(ota_dir, deployment)
        self.request = request
        self.window = RequestWindow(window, timeout_s, initial_timeout_s=initial_timeout_s)
        self.stall_timeout_s = stall_timeout_s
        self.max_bad_chunks = max_bad_chunks
        self.hooks = hooks
        self.limits = limits
        self.bad_chunks = 0
        self.requests_sent = 0
        self.rerequests = 0  # chunks asked for again after a timeout (lost request or frame)
        self._arrivals: queue.Queue[tuple[int, bytes]] = queue.Queue()

    def on_frame(self, header: ChunkHeader, data: memoryview) -> None:
        """Hand over a frame (MQTT thread). Frames of other deployments are ignored."""
        if (
            header.deployment_id != self.deployment.deployment_id
            or header.bundle_sha256 != self.deployment.bundle_sha256
        ):
            return
        if header.error:
            log.warning("chunk server refused chunk %d: %s", header.index, header.error)
            return
        self._arrivals.put((header.index, bytes(data)))

    def run(self, progress: ProgressFn, cancelled: CancelledFn) -> Path:
        """Fetch what is missing; return the finished file (already hash-checked)."""
        if self.paths.done.exists() and sha256_file(self.paths.done) == self.deployment.bundle_sha256:
            return self.paths.done
        total = len(self.deployment.chunk_sha256)
        fd = reserve(self.paths.part, self.deployment.bundle_size, self.hooks)
        try:
            have = verified_chunks(fd, self.deployment)
            missing = deque(i for i in range(total) if i not in have)
            in_flight: dict[int, float] = {}
            asked_again: set[int] = set()
            last_progress_at = time.monotonic()
            reported = -1
            missing_bytes = sum(chunk_length(self.deployment, i) for i in missing)
            pace = Pace(self.limits, missing_bytes, "download over MQTT", unit=self.deployment.chunk_size)
            while len(have) < total:
                if cancelled():
                    raise UpdateCancelled("download cancelled")
                pace.check()
                now = time.monotonic()
                expired = [i for i, sent in in_flight.items() if now - sent > self.window.timeout_s]
                if expired:  # lost request or frame (or an overloaded server): back off, ask again
                    self.window.expired()
                    for index in sorted(expired, reverse=True):
                        del in_flight[index]
                        missing.appendleft(index)
                        asked_again.add(index)
                        self.rerequests += 1
                batch: list[int] = []
                while missing and len(in_flight) + len(batch) < self.window.size:
                    index = missing.popleft()
                    if index not in have and index not in in_flight:
                        batch.append(index)
                if batch:
                    for index in batch:
                        in_flight[index] = now
                    self.requests_sent += 1
                    self.request(batch)
                try:
                    index, data = self._arrivals.get(timeout=0.2)
                except queue.Empty:
                    if now - last_progress_at > self.stall_timeout_s:
                        raise UpdateError(
                            f"download stalled: no chunk for {self.stall_timeout_s:.0f} s ({len(have)}/{total} chunks)"
                        ) from None
                    continue
                if index in have or not 0 <= index < total:
                    continue
                sent_at = in_flight.pop(index, None)
                if hashlib.sha256(data).hexdigest() != self.deployment.chunk_sha256[index]:
                    self.bad_chunks += 1
                    log.warning("chunk %d failed its hash check; asking again", index)
                    if self.bad_chunks > self.max_bad_chunks:
                        raise IntegrityError(f"{self.bad_chunks} chunks failed their hash check; giving up")
                    missing.appendleft(index)
                    continue
                os.pwrite(fd, data, index * self.deployment.chunk_size)
                pace.add(len(data))
                have.add(index)
                last_progress_at = time.monotonic()
                once = sent_at is not None and index not in asked_again
                self.window.arrived(last_progress_at - sent_at if once and sent_at is not None else None)
                tenth = len(have) * 10 // total
                if tenth != reported:
                    reported = tenth
                    progress(len(have) / total)
            return finish(fd, self.paths, self.deployment)
        finally:
            os.close(fd)
