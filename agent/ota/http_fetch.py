"""Getting a bundle over HTTP(S): the deployment's signed artifact URLs, tried in order.

The URLs are hints — the fleet service, any static server, a CDN, a presigned object-store URL;
what the device trusts is the signed size and hashes. The download writes into the same
``<deployment>.part`` file as the MQTT chunks (the bundle is encrypted to the device, so a
partial ciphertext on disk reveals nothing; nothing decrypted is ever written), asks only for
the chunks it does not have yet (one ``Range`` request per run of missing chunks), and checks
every chunk against the signed list as it completes: a server that sends other bytes is
dropped at its first bad chunk, not after the whole file, and what good chunks it sent stay.
A cut connection, an agent restart or a reboot resumes where the verified chunks end (the
partial file is re-hashed on start, as for MQTT), so at most one chunk is fetched twice.

Each source is bounded by the transfer limits (:class:`~edgesdk.agent.ota.transfer.Pace`: the
deadline and the minimum rate) and by the signed size: a body longer than the range asked for
is refused when announced and never read past it otherwise. Redirects are followed only to the
same scheme, host and port, unless the target host is listed in ``[ota] http_redirect_hosts``;
https never redirects to http. TLS is verified against ``[ota] http_ca_file`` (the fleet CA),
else the MQTT link's CA file, else the system's trust store.

:func:`download_http` is the whole download with nothing of the agent around it (the arm64 lane
and the benchmarks call it directly); :class:`HttpDownload` is the same behind the interface of
:class:`~edgesdk.agent.ota.transfer.ChunkReceiver` (``run(progress, cancelled) -> Path``).
"""

from __future__ import annotations

import hashlib
import http.client
import logging
import os
import re
import ssl
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urljoin, urlsplit

from edgesdk.agent.ota.hooks import NO_HOOKS, OtaHooks
from edgesdk.agent.ota.machine import UpdateCancelled
from edgesdk.agent.ota.transfer import (
    CancelledFn,
    DownloadPaths,
    Pace,
    ProgressFn,
    TransferLimits,
    check_chunk_list,
    chunk_length,
    finish,
    reserve,
    verified_chunks,
)

from edgesdk.errors import IntegrityError, UpdateError
from edgesdk.hashing import sha256_file
from edgesdk.schemas.messages import Deployment

log = logging.getLogger(__name__)

_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")


class SourcesFailed(UpdateError):
    """Every artifact URL failed; the message names each one and why."""


class ConnectionCut(UpdateError):
    """The server could not be reached, or the connection ended early (worth another try when
    the same server delivered chunks before: a restart, a dropped link)."""


#: Tries again after a cut, waiting 1, 2, 4, 8, 16 s (a try that brings chunks resets the count).
RETRY_WAITS_S = (1.0, 2.0, 4.0, 8.0, 16.0)


@dataclass(frozen=True)
class HttpSettings:
    """How the device talks to artifact servers (``AgentConfig.ota``)."""

    ca_file: Path | None = None  # None: the system's trust store
    redirect_hosts: tuple[str, ...] = ()  # other hosts a redirect may lead to
    max_redirects: int = 5
    _contexts: dict[str, ssl.SSLContext] = field(default_factory=dict, compare=False, repr=False)

    def tls_context(self) -> ssl.SSLContext:
        key = str(self.ca_file or "")
        if key not in self._contexts:
            # Hostname checked and certificates verified; only the anchors change.
            self._contexts[key] = ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file else None)
        return self._contexts[key]


@dataclass
class FetchStats:
    """What one download took from the network (benchmarks and tests read it)."""

    body_bytes: int = 0
    requests: int = 0
    failures: list[str] = field(default_factory=list)


def missing_runs(have: set[int], total: int) -> list[tuple[int, int]]:
    """Runs ``(first, last)`` of consecutive chunk indices not in ``have``."""
    runs: list[tuple[int, int]] = []
    index = 0
    while index < total:
        if index in have:
            index += 1
            continue
        first = index
        while index < total and index not in have:
            index += 1
        runs.append((first, index - 1))
    return runs


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    default = 443 if parts.scheme == "https" else 80
    return parts.scheme, (parts.hostname or "").lower(), parts.port or default


def open_range(
    url: str, start: int, end: int, settings: HttpSettings, timeout_s: float
) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    """GET bytes ``start``..``end`` of ``url`` (redirects as the settings allow). The caller
    closes the connection. UpdateError naming the URL on any refusal."""
    current = url
    for _hop in range(settings.max_redirects + 1):
        parts = urlsplit(current)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UpdateError(f"artifact url {current!r} is not http(s)://HOST/...")
        port = parts.port
        conn: http.client.HTTPConnection
        if parts.scheme == "https":
            conn = http.client.HTTPSConnection(parts.hostname, port, timeout=timeout_s, context=settings.tls_context())
        else:
            conn = http.client.HTTPConnection(parts.hostname, port, timeout=timeout_s)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        headers = {"Range": f"bytes={start}-{end}", "Accept-Encoding": "identity", "User-Agent": "edgesdk-agent"}
        try:
            conn.request("GET", target, headers=headers)
            response = conn.getresponse()
        except ssl.SSLError as exc:
            conn.close()
            raise UpdateError(f"TLS with {parts.hostname} failed: {exc.reason or exc}") from exc
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise ConnectionCut(f"cannot reach {parts.hostname}:{_origin(current)[2]}: {exc}") from exc
        if response.status in _REDIRECTS:
            location = response.getheader("Location") or ""
            conn.close()
            following = urljoin(current, location)
            _check_redirect(current, following, settings)
            current = following
            continue
        if response.status not in (200, 206):
            conn.close()
            failed = ConnectionCut if response.status in (429, 502, 503, 504) else UpdateError
            raise failed(f"answered HTTP {response.status} {response.reason}")
        return conn, response
    raise UpdateError(f"more than {settings.max_redirects} redirects")


def _check_redirect(current: str, following: str, settings: HttpSettings) -> None:
    was, now = _origin(current), _origin(following)
    if was[0] == "https" and now[0] != "https":
        raise UpdateError(f"redirect from https to {following!r} refused")
    if was != now and now[1] not in settings.redirect_hosts:
        raise UpdateError(
            f"redirect to another host ({now[1]}:{now[2]}) refused; allow it with [ota] http_redirect_hosts"
        )


class HttpDownload:
    """One deployment's bundle from its artifact URLs into ``<ota dir>/<deployment>.part``."""

    def __init__(
        self,
        deployment: Deployment,
        ota_dir: Path,
        *,
        settings: HttpSettings = HttpSettings(),
        limits: TransferLimits = TransferLimits(),
        hooks: OtaHooks = NO_HOOKS,
    ) -> None:
        check_chunk_list(deployment)
        self.deployment = deployment
        self.paths = DownloadPaths(ota_dir, deployment)
        self.settings = settings
        self.limits = limits
        self.hooks = hooks
        self.stats = FetchStats()

    def run(self, progress: ProgressFn, cancelled: CancelledFn) -> Path:
        """Try each URL in order until the bundle is complete and its hash matches; SourcesFailed
        (naming every URL's failure) when none delivered. Chunks any source delivered are kept."""
        d = self.deployment
        if self.paths.done.exists() and sha256_file(self.paths.done) == d.bundle_sha256:
            return self.paths.done
        fd = reserve(self.paths.part, d.bundle_size, self.hooks)
        try:
            have = verified_chunks(fd, d)
            for url in d.artifact_sources():
                if cancelled():
                    raise UpdateCancelled("download cancelled")
                try:
                    self._fetch(url, fd, have, progress, cancelled)
                    return finish(fd, self.paths, d)
                except UpdateCancelled:
                    raise
                except (UpdateError, IntegrityError) as exc:
                    log.warning("artifact %s failed: %s", url, exc)
                    self.stats.failures.append(f"{url}: {exc}")
            raise SourcesFailed("every artifact URL failed: " + "; ".join(self.stats.failures))
        finally:
            os.close(fd)

    def _fetch(self, url: str, fd: int, have: set[int], progress: ProgressFn, cancelled: CancelledFn) -> None:
        """Fill what ``have`` lacks from ``url``. A cut after this server delivered chunks is
        tried again (:data:`RETRY_WAITS_S`, within the deadline); a server that never delivered
        fails at once, so a dead URL costs no waiting before the next source."""
        d = self.deployment
        total = max(1, -(-d.bundle_size // d.chunk_size))
        missing = sum(chunk_length(d, i) for i in range(total) if i not in have)
        pace = Pace(self.limits, missing, f"download of {url}")
        # A socket silent for a whole rate window is below any positive rate: reads time out
        # then, so the deadline is checked at least that often.
        silence_s = min(30.0, pace.window_s)
        delivered, tries = False, 0
        while True:
            before = len(have)
            try:
                for first, last in missing_runs(have, total):
                    if all(i in have for i in range(first, last + 1)):
                        continue  # a server that ignored Range sent it with an earlier run
                    start, end = first * d.chunk_size, min((last + 1) * d.chunk_size, d.bundle_size) - 1
                    conn, response = open_range(url, start, end, self.settings, silence_s)
                    self.stats.requests += 1
                    try:
                        position = self._body_start(response, start, end)
                        self._stream(response, fd, have, position, end, pace, progress, cancelled, silence_s)
                    finally:
                        conn.close()
                return
            except ConnectionCut as exc:
                delivered = delivered or len(have) > before
                tries = 1 if len(have) > before else tries + 1
                if not delivered or tries > len(RETRY_WAITS_S):
                    raise
                log.info("download of %s cut (%s); again in %g s", url, exc, RETRY_WAITS_S[tries - 1])
                self._wait(RETRY_WAITS_S[tries - 1], pace, cancelled)

    @staticmethod
    def _wait(seconds: float, pace: Pace, cancelled: CancelledFn) -> None:
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            if cancelled():
                raise UpdateCancelled("download cancelled")
            pace.check()
            time.sleep(min(0.2, max(0.0, until - time.monotonic())))

    def _body_start(self, response: http.client.HTTPResponse, start: int, end: int) -> int:
        """Where the body begins in the bundle; refuses a body the signed size cannot hold."""
        size = self.deployment.bundle_size
        if response.status == 206:
            match = _CONTENT_RANGE.match(response.getheader("Content-Range") or "")
            if match is None or int(match.group(1)) != start or int(match.group(2)) > end:
                raise UpdateError(
                    f"answered a range other than bytes {start}-{end}: {response.getheader('Content-Range')!r}"
                )
            if match.group(3) != "*" and int(match.group(3)) != size:
                raise IntegrityError(f"serves a {match.group(3)}-byte file; the signed size is {size}")
            expected = end - start + 1
        else:  # 200: the server ignored Range and sends the whole file
            start, expected = 0, size
        announced = response.getheader("Content-Length")
        if announced is not None and announced.isdigit() and int(announced) > expected:
            raise IntegrityError(f"announces {announced} bytes where the signed size allows {expected}; not read")
        return start

    def _stream(
        self,
        response: http.client.HTTPResponse,
        fd: int,
        have: set[int],
        position: int,
        end: int,
        pace: Pace,
        progress: ProgressFn,
        cancelled: CancelledFn,
        silence_s: float,
    ) -> None:
        """Read up to byte ``end`` (never past it: a longer body is cut off), writing each
        complete, verified chunk; returns when the range is in."""
        d = self.deployment
        total = max(1, -(-d.bundle_size // d.chunk_size))
        index = position // d.chunk_size
        pending = bytearray()
        reported = -1
        whole = response.status == 200  # from byte 0: read on until nothing is missing
        while (position < d.bundle_size and len(have) < total) if whole else position <= end:
            if cancelled():
                raise UpdateCancelled("download cancelled")
            pace.check()
            wanted = min(1 << 16, chunk_length(d, index) - len(pending))
            try:
                # read1: what has arrived, so the pace is checked as the bytes come in.
                block = response.read1(wanted)
            except TimeoutError as exc:
                raise UpdateError(f"too slow: nothing received for {silence_s:g} s (at byte {position})") from exc
            except (OSError, http.client.HTTPException) as exc:
                raise ConnectionCut(f"broke at byte {position}: {exc}") from exc
            if not block:
                raise ConnectionCut(f"ended at byte {position} of {d.bundle_size}")
            pace.add(len(block))
            self.stats.body_bytes += len(block)
            pending += block
            position += len(block)
            if len(pending) < chunk_length(d, index):
                continue
            if index not in have:
                self._keep(fd, index, bytes(pending))
                have.add(index)
                tenth = len(have) * 10 // total
                if tenth != reported:
                    reported = tenth
                    progress(len(have) / total)
            pending.clear()
            index += 1

    def _keep(self, fd: int, index: int, data: bytes) -> None:
        d = self.deployment
        if d.chunk_sha256 and hashlib.sha256(data).hexdigest() != d.chunk_sha256[index]:
            raise IntegrityError(f"chunk {index} is not the signed bundle's (sha256 mismatch); source dropped")
        os.pwrite(fd, data, index * d.chunk_size)


def download_http(
    deployment: Deployment,
    ota_dir: Path,
    *,
    settings: HttpSettings = HttpSettings(),
    limits: TransferLimits = TransferLimits(),
    progress: ProgressFn = lambda _fraction: None,
    cancelled: CancelledFn = lambda: False,
) -> Path:
    """The bundle of ``deployment`` from its artifact URLs, verified, as ``<ota dir>/<id>.edgepkg``."""
    return HttpDownload(deployment, ota_dir, settings=settings, limits=limits).run(progress, cancelled)
