"""Uploading finished capture files to the fleet service (``[capture] upload = true``).

One thread hands the oldest file not yet sent to the MQTT link's store-and-forward outbox
(QoS 1, ``devices/{id}/capture``), one file at a time and only when the link is connected and the
outbox is empty: the previous upload (and every telemetry report before it) has been acknowledged
by the broker, so capture never fills the outbox's quota and pushes out telemetry, and while the
device is offline the files wait on disk. The broker keeps an upload in the service's persistent
session until the service has stored it (the service acknowledges only after its commit).

A sent file stays on the device, within the capture disk budget and retention like every other
(the budget deletes it, oldest first); its name goes to ``.uploaded`` in the capture directory
so that it is not sent again after a restart. A file larger than one message carries
(``MAX_UPLOAD_BYTES``) is not sent and is counted.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgesdk.agent.capture.budget import capture_files

from edgesdk.capture.sealed import SUFFIX
from edgesdk.capture.upload import MAX_UPLOAD_BYTES, upload_message
from edgesdk.protocol import topics

log = logging.getLogger("edgesdk.agent.capture")

#: The names of the files already handed to the outbox (in the capture directory).
LEDGER = ".uploaded"
#: How often the uploader looks for a file to send and an empty outbox.
POLL_S = 0.2


@dataclass
class UploadCounts:
    uploaded: int = 0
    too_large: int = 0  # over MAX_UPLOAD_BYTES: kept on the device only


def model_of(name: str) -> str:
    """The model a capture file is of, from its name (``{time}-{sequence}-{model}.edgecap``)."""
    parts = name.removesuffix(SUFFIX).split("-", 2)
    return parts[2] if len(parts) == 3 else ""


class CaptureUploader:
    """Sends the files of ``directory`` through the link ``link_of()`` returns (None: not yet)."""

    def __init__(self, directory: Path, device_id: str, link_of: Callable[[], Any], *, poll_s: float = POLL_S):
        self.directory = directory
        self.device_id = device_id
        self.link_of = link_of
        self.poll_s = poll_s
        self.counts = UploadCounts()
        self._ledger = directory / LEDGER
        self._sent = self._read_ledger()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> CaptureUploader:
        self._thread = threading.Thread(target=self._loop, name="capture-uploader", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)
        log.info("capture: %d files uploaded, %d too large to upload", self.counts.uploaded, self.counts.too_large)

    def _loop(self) -> None:
        while not self._stopping.wait(self.poll_s):
            try:
                self.send_next()
            except Exception:  # noqa: BLE001 - one failing upload must not end uploading for good
                log.exception("capture: an upload failed")

    def send_next(self) -> bool:
        """Queue the oldest unsent file when the outbox is empty; True when one was queued."""
        link = self.link_of()
        if link is None or not link.client.connected or link.queue.depth > 0:
            return False  # offline (or stopping) the file waits on disk, not in the outbox's quota
        for path in capture_files(self.directory):
            if path.name in self._sent:
                continue
            try:
                raw = path.read_bytes()
            except FileNotFoundError:  # deleted for the budget meanwhile
                continue
            if len(raw) > MAX_UPLOAD_BYTES:
                self._mark_sent(path.name)  # never sent: not looked at again
                self.counts.too_large += 1
                log.warning(
                    "capture: %s is %d bytes, over the %d an upload carries: kept on the device only",
                    path.name,
                    len(raw),
                    MAX_UPLOAD_BYTES,
                )
                continue
            link.publish_reliable(topics.CAPTURE, upload_message(self.device_id, path.name, model_of(path.name), raw))
            self._mark_sent(path.name)  # once in the outbox: durable, sent after a restart too
            self.counts.uploaded += 1
            return True
        return False

    def _mark_sent(self, name: str) -> None:
        self._sent.add(name)
        with self._ledger.open("a") as ledger:
            ledger.write(name + "\n")

    def _read_ledger(self) -> set[str]:
        """The names sent before, those still on disk only (the ledger is rewritten without the rest)."""
        try:
            names = set(self._ledger.read_text().split())
        except FileNotFoundError:
            return set()
        present = {path.name for path in capture_files(self.directory)}
        kept = names & present
        self._ledger.write_text("".join(name + "\n" for name in sorted(kept)))
        return kept
