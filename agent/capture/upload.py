"""Uploading finished capture files to the fleet service (``[capture] upload = true``).

One thread hands the oldest file not yet sent to the MQTT link's store-and-forward outbox
(QoS 1, ``devices/{id}/capture``), one message at a time and only when the link is connected and
the outbox is empty: the previous message (and every telemetry report before it) has been
acknowledged by the broker, so capture never fills the outbox's quota and pushes out telemetry,
and while the device is offline the files wait on disk. A file over ``CHUNK_BYTES`` goes in
chunks (``edgesdk.capture.upload``), one chunk a message, in order.

Each chunk handed to the outbox is written to ``.uploaded`` in the capture directory (``name
sha256 index``): the outbox is durable, so after a restart or a broker outage the upload goes on
from the next chunk and no chunk is queued twice.

A sent file stays on the device until the service says it holds it: a ``CaptureAck`` on
``devices/{id}/capture/ack`` (a topic the broker lets only the service write and only this device
read) naming this device and the SHA-256 of a file this device sent in full. Then the file is
deleted and leaves the ledger. An ack for any other SHA-256 or device deletes nothing (counted).
Until its ack a file is within the capture disk budget and retention like every other. A file
still not acknowledged ``RESEND_AFTER_S`` after its last chunk was queued (counted from the
agent's start for files sent before it) is sent again from its first chunk: chunks that reached
no service (none listening yet, or an upload it dropped idle) are not lost for good, and a file
the service already holds is only acknowledged again.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgesdk.agent.capture.budget import capture_files
from pydantic import ValidationError

from edgesdk.capture.sealed import SUFFIX
from edgesdk.capture.upload import CaptureAck, chunks_of, upload_message
from edgesdk.protocol import topics

log = logging.getLogger("edgesdk.agent.capture")

#: What was handed to the outbox: one line per chunk (``name sha256 index``), in the capture directory.
LEDGER = ".uploaded"
#: How often the uploader looks for a chunk to send and an empty outbox.
POLL_S = 0.2
#: A file sent in full and not acknowledged this long after is sent again (the service's idle
#: timeout for an unfinished upload is as long).
RESEND_AFTER_S = 6 * 3600.0


@dataclass
class UploadCounts:
    uploaded: int = 0  # files handed to the outbox in full
    chunks: int = 0  # messages handed to the outbox
    acknowledged: int = 0  # files the service acknowledged: deleted on the device
    ignored_acks: int = 0  # acks naming another device or a file not sent in full: nothing deleted
    resent: int = 0  # files sent again, not acknowledged RESEND_AFTER_S after they were sent


@dataclass
class _Sent:
    sha256: str
    next_index: int  # the first chunk not yet handed to the outbox
    count: int  # 0: an entry of an older ledger, sent whole (its SHA-256 unknown)
    at: float = field(default_factory=time.monotonic)  # when this entry was made

    @property
    def done(self) -> bool:
        return self.next_index >= self.count


def model_of(name: str) -> str:
    """The model a capture file is of, from its name (``{time}-{sequence}-{model}.edgecap``)."""
    parts = name.removesuffix(SUFFIX).split("-", 2)
    return parts[2] if len(parts) == 3 else ""


class CaptureUploader:
    """Sends the files of ``directory`` through the link ``link_of()`` returns (None: not yet)."""

    def __init__(
        self,
        directory: Path,
        device_id: str,
        link_of: Callable[[], Any],
        *,
        poll_s: float = POLL_S,
        resend_after_s: float = RESEND_AFTER_S,
    ):
        self.directory = directory
        self.device_id = device_id
        self.link_of = link_of
        self.poll_s = poll_s
        self.resend_after_s = resend_after_s
        self.counts = UploadCounts()
        self._ledger = directory / LEDGER
        self._lock = threading.Lock()  # the ack arrives on the link's thread
        self._sent = self._read_ledger()
        self._subscribed: Any = None
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
        log.info(
            "capture: %d files uploaded, %d acknowledged and deleted", self.counts.uploaded, self.counts.acknowledged
        )

    def _loop(self) -> None:
        while not self._stopping.wait(self.poll_s):
            try:
                self.send_next()
            except Exception:  # noqa: BLE001 - one failing upload must not end uploading for good
                log.exception("capture: an upload failed")

    def send_next(self) -> bool:
        """Queue the next chunk of the oldest file not sent in full when the outbox is empty; True
        when one was queued."""
        link = self.link_of()
        if link is not None:
            self.attach(link)  # before any upload (start_capture attaches it earlier, before it connects)
        if link is None or not link.client.connected or link.queue.depth > 0:
            return False  # offline (or stopping) the file waits on disk, not in the outbox's quota
        for path in capture_files(self.directory):
            with self._lock:
                sent = self._sent.get(path.name)
            if sent is not None and sent.done:
                if time.monotonic() - sent.at < self.resend_after_s:
                    continue
                sent = None  # not acknowledged in time: again, from the first chunk
                self.counts.resent += 1
            try:
                raw = path.read_bytes()
            except FileNotFoundError:  # deleted for the budget meanwhile
                continue
            sha256 = hashlib.sha256(raw).hexdigest()
            if sent is None or sent.sha256 != sha256:
                sent = _Sent(sha256, 0, chunks_of(len(raw)))
            message = upload_message(self.device_id, path.name, model_of(path.name), raw, sent.next_index)
            link.publish_reliable(topics.CAPTURE, message)
            self._mark_sent(path.name, _Sent(sha256, sent.next_index + 1, sent.count))  # in the outbox: durable
            self.counts.chunks += 1
            self.counts.uploaded += sent.next_index + 1 == sent.count
            return True
        return False

    def attach(self, link: Any) -> None:
        """Take the acks on ``link`` (once per link). Called before the link connects: the broker
        keeps an ack sent while the agent was down in the device's session and hands it over right
        after the connection, and an ack that finds no handler then is dropped (the file would
        stay until it is sent again, ``resend_after_s`` later)."""
        with self._lock:
            if self._subscribed is link:
                return
            self._subscribed = link
        link.subscribe(topics.CAPTURE_ACK, self.on_ack)

    def on_ack(self, payload: bytes) -> None:
        """The service holds a file: delete it if it is one this device sent in full."""
        try:
            ack = CaptureAck.model_validate_json(payload)
        except ValidationError:
            self.counts.ignored_acks += 1
            log.warning("capture: ignored a malformed acknowledgement")
            return
        with self._lock:
            names = [n for n, s in self._sent.items() if s.done and s.sha256 == ack.sha256]
            if ack.device_id != self.device_id or not names:
                self.counts.ignored_acks += 1
                log.warning(
                    "capture: ignored an acknowledgement of %s for %s: not a file sent", ack.sha256, ack.device_id
                )
                return
            for name in names:
                (self.directory / name).unlink(missing_ok=True)
                del self._sent[name]
            self._rewrite_ledger()
        self.counts.acknowledged += len(names)
        log.debug("capture: %s stored by the service, deleted here", ", ".join(names))

    def _mark_sent(self, name: str, sent: _Sent) -> None:
        with self._lock:
            self._sent[name] = sent
            with self._ledger.open("a") as ledger:
                ledger.write(f"{name} {sent.sha256} {sent.next_index - 1} {sent.count}\n")

    def _rewrite_ledger(self) -> None:
        """The ledger replaced whole (a SIGKILL leaves the old one or the new one, never a cut one:
        a cut ledger would send its files again from their first chunk)."""
        lines = [f"{name} {s.sha256} {s.next_index - 1} {s.count}\n" for name, s in sorted(self._sent.items())]
        fresh = self._ledger.with_name(self._ledger.name + ".new")
        fresh.write_text("".join(lines))
        os.replace(fresh, self._ledger)

    def _read_ledger(self) -> dict[str, _Sent]:
        """What was sent before, of the files still on disk (the ledger is rewritten without the rest)."""
        try:
            lines = self._ledger.read_text().splitlines()
        except FileNotFoundError:
            return {}
        present = {path.name for path in capture_files(self.directory)}
        sent: dict[str, _Sent] = {}
        for line in lines:
            fields = line.split()
            if not fields or fields[0] not in present:
                continue
            if len(fields) == 4 and fields[2].isdigit() and fields[3].isdigit():
                sent[fields[0]] = _Sent(fields[1], int(fields[2]) + 1, int(fields[3]))
            elif len(fields) == 1:  # a name alone: sent whole before chunks and acknowledgements
                sent[fields[0]] = _Sent("", 1, 0)
            # else a line cut by a SIGKILL while it was appended: the file's line before it holds
            # (the chunk it named is sent again: at least once); read as a name alone, the file
            # could not be acknowledged and waited resend_after_s to be sent again whole.
        with self._lock:
            self._sent = sent
            self._rewrite_ledger()
        return sent
