"""The capture tap and its ONE writer thread.

The tap (on ``ModelServer.taps``, after each answer, on the request's thread) only draws a random
number and puts the request on a small bounded queue: a full queue drops the sample and counts
it, so capture never slows an answer or grows memory. The worker redacts, packs, encrypts to the
operator key in memory and writes the file atomically (agent/fsutil.py): the plaintext never
touches the disk. Files past the disk budget or the retention are deleted oldest first; a write
that fails (disk full) is counted and serving goes on.
"""

from __future__ import annotations

import collections
import logging
import queue
import random
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
from edgesdk.agent.capture.budget import capture_files, enforce
from edgesdk.agent.fsutil import atomic_write_bytes

from edgesdk.capture.record import pack_record
from edgesdk.capture.sealed import SUFFIX, seal

log = logging.getLogger("edgesdk.agent.capture")

#: What a model name may keep in a file name (anything else becomes ``_``).
_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")
#: Requests waiting for the writer; beyond it samples are dropped (and counted).
QUEUE_SIZE = 16
#: How often the whole directory is checked against the retention (between writes too).
RETENTION_CHECK_S = 60.0

Redact = Callable[[Mapping[str, np.ndarray], Mapping[str, np.ndarray]], Any]
#: The version and release a model name serves, read on the request's thread when it is sampled
#: (a swap right after the answer must not relabel it).
Describe = Callable[[str], Mapping[str, Any]]


@dataclass
class CaptureCounts:
    """What the capture did since the agent started."""

    seen: int = 0
    sampled: int = 0
    dropped: int = 0  # the queue was full
    redacted_out: int = 0  # the redaction hook kept nothing (or raised)
    written: int = 0
    too_large: int = 0  # one record over the whole budget
    write_errors: int = 0
    evicted: int = 0  # deleted for the budget or the retention
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)


@dataclass
class _Sample:
    model: str
    feeds: Mapping[str, np.ndarray]
    outputs: Mapping[str, np.ndarray]
    variant: str
    at: float
    about: Mapping[str, Any] = field(default_factory=dict)  # version, release: read when sampled


class CaptureWriter:
    """Samples ``rate`` of answered requests into ``directory``, sealed to ``operator``."""

    def __init__(
        self,
        directory: Path,
        operator: Any,
        *,
        rate: float,
        max_bytes: int,
        retention_s: float,
        device_id: str = "",
        redact: Redact | None = None,
        describe: Describe = lambda _: {},
        queue_size: int = QUEUE_SIZE,
        draw: Callable[[], float] | None = None,
    ) -> None:
        self.directory = directory
        self.operator = operator  # X25519PublicKey
        self.rate = rate
        self.max_bytes = max_bytes
        self.retention_s = retention_s
        self.device_id = device_id
        self.redact = redact
        self.describe = describe
        self.counts = CaptureCounts()
        self._draw = draw or random.Random().random
        self._queue: queue.Queue[_Sample] = queue.Queue(maxsize=queue_size)
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._files: collections.deque[tuple[Path, int]] = collections.deque()
        self._total = 0
        self._sequence = 0
        self._retention_checked = 0.0

    # -- the tap (request threads) ----------------------------------------------------------------

    def tap(
        self, model_name: str, feeds: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray], variant: str
    ) -> None:
        """``ModelServer.taps`` entry: sample, then hand over without waiting."""
        taken = self._draw() < self.rate
        queued = False
        if taken:
            try:
                sample = _Sample(model_name, feeds, outputs, variant, time.time(), self.describe(model_name))
                self._queue.put_nowait(sample)
                queued = True
            except queue.Full:
                pass
        with self.counts.lock:  # request threads tap at once: no count may be lost
            self.counts.seen += 1
            self.counts.sampled += queued
            self.counts.dropped += taken and not queued

    # -- the worker -------------------------------------------------------------------------------

    def start(self) -> CaptureWriter:
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._check_retention()
        self._thread = threading.Thread(target=self._work, name="capture-writer", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Write what is queued, then stop the worker."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)
        counts = self.counts
        log.info(
            "capture: %d of %d answers sampled, %d written, %d dropped (queue full), %d kept nothing (redact), "
            "%d over the budget, %d write errors, %d files deleted (budget, retention)",
            counts.sampled,
            counts.seen,
            counts.written,
            counts.dropped,
            counts.redacted_out,
            counts.too_large,
            counts.write_errors,
            counts.evicted,
        )

    def _work(self) -> None:
        while True:
            try:
                sample = self._queue.get(timeout=0.2)
            except queue.Empty:
                if self._stopping.is_set():
                    return
                continue
            try:
                self.write(sample)
            except Exception:  # noqa: BLE001 - the writer thread outlives any one bad record
                self._count("write_errors")
                log.exception("capture: a record could not be written")

    def write(self, sample: _Sample) -> Path | None:
        """Redact, seal and write one sample; the file, or None when nothing was written."""
        kept = self._redacted(sample)
        if kept is None:
            self._count("redacted_out")
            return None
        feeds, outputs = kept
        meta = {
            "model": sample.model,
            "variant": sample.variant,
            "device_id": self.device_id,
            "time": datetime.fromtimestamp(sample.at, timezone.utc).isoformat(),
            **sample.about,
        }
        sealed = seal(pack_record(feeds, outputs, meta), self.operator)
        if len(sealed) > self.max_bytes:
            self._count("too_large")
            return None
        self._make_room(len(sealed))
        path = self.directory / self._file_name(sample.at, sample.model)
        try:
            atomic_write_bytes(path, sealed)
        except OSError as exc:
            self._count("write_errors")
            log.warning("capture: cannot write %s: %s", path, exc.strerror or exc)
            return None
        self._files.append((path, len(sealed)))
        self._total += len(sealed)
        self._count("written")
        return path

    def _redacted(self, sample: _Sample) -> tuple[Mapping[str, Any], Mapping[str, Any]] | None:
        if self.redact is None:
            return sample.feeds, sample.outputs
        try:
            kept = self.redact(sample.feeds, sample.outputs)
        except Exception as exc:  # noqa: BLE001 - a failing hook keeps nothing (never the unredacted record)
            log.warning("capture: the redact hook raised %s; the record is not kept", type(exc).__name__)
            return None
        if kept is None:
            return None
        feeds, outputs = kept
        return feeds, outputs

    def _file_name(self, at: float, model: str) -> str:
        """``{UTC time}-{sequence}-{model}.edgecap``: the time first (name order is age order), the model
        last so that the uploader can say which model a file is of without opening it."""
        self._sequence += 1
        stamp = datetime.fromtimestamp(at, timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
        return f"{stamp}-{self._sequence:06d}-{_SAFE_NAME.sub('_', model)}{SUFFIX}"

    def _make_room(self, size: int) -> None:
        """Delete the oldest files until ``size`` more bytes fit the budget (and, once a minute,
        every file past the retention)."""
        if time.monotonic() - self._retention_checked > RETENTION_CHECK_S:
            self._check_retention()
        while self._files and self._total + size > self.max_bytes:
            path, old = self._files.popleft()
            self._total -= old
            try:
                path.unlink()
                self._count("evicted")
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.warning("capture: cannot delete %s: %s", path, exc.strerror or exc)

    def _check_retention(self) -> None:
        """The directory as it is on disk: retention and budget applied, the sizes re-read."""
        deleted = enforce(self.directory, max_bytes=self.max_bytes, retention_s=self.retention_s)
        self._count("evicted", deleted)
        self._files.clear()
        for path in capture_files(self.directory):
            try:
                self._files.append((path, path.stat().st_size))
            except FileNotFoundError:
                continue
        self._total = sum(size for _, size in self._files)
        self._retention_checked = time.monotonic()

    def _count(self, name: str, by: int = 1) -> None:
        with self.counts.lock:
            setattr(self.counts, name, getattr(self.counts, name) + by)
