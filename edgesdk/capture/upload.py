"""The upload message of one capture file (device → fleet, ``devices/{id}/capture``, QoS 1).

The file travels as it lies on the device, sealed to the operator's key: the service stores the
bytes and cannot read them. Beside them, in the clear, only what the service lists (which
device, which model, size, SHA-256 and the file's name, whose first part is the UTC time it was
written). The SHA-256 is checked on arrival: a changed or cut message is refused, never stored.

A file of at most ``CHUNK_BYTES`` travels in one message (``count`` 1). A larger one travels in
``chunks_of(size)`` messages, chunk ``index`` holding bytes ``[index * CHUNK_BYTES, …)`` of it;
``size`` and ``sha256`` are always the whole file's, so the service can refuse a chunk whose
count, index or length does not fit the size it declares before it keeps a byte, and checks the
whole file's SHA-256 once it holds every chunk. (A message with ``count`` 1 may carry a whole
file of up to ``MAX_UPLOAD_BYTES``: what agents before chunking sent.) Each message's base64
text fits the shipped broker's ``max_packet_size`` (2 MiB).

Once the service has stored a file it says so on ``devices/{id}/capture/ack`` (``CaptureAck``,
service → that device only), and the device deletes its copy.
"""

from __future__ import annotations

import base64
import hashlib
import uuid
from datetime import datetime, timezone

from pydantic import Field

from edgesdk.errors import SchemaError
from edgesdk.schemas.base import Schema

#: The largest capture file one message carries (base64 makes it 4/3 larger; the broker takes 2 MiB).
MAX_UPLOAD_BYTES = 1_400_000
#: The bytes of a file each chunk message carries (the last one: the rest).
CHUNK_BYTES = 512 * 1024
_SHA256 = r"^[0-9a-f]{64}$"
_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"


class CaptureUpload(Schema):
    """One capture file and what the service lists about it."""

    device_id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    msg_id: str = Field(pattern=r"^[0-9a-f]{32}$")
    ts: datetime
    name: str = Field(pattern=_NAME, description="the file's name on the device")
    model: str = Field("", max_length=128, description="the model whose answer it holds")
    size: int = Field(ge=0, description="of the whole file")
    sha256: str = Field(pattern=_SHA256, description="of the whole file")
    index: int = Field(0, ge=0, description="which chunk of the file this message carries")
    count: int = Field(1, ge=1, description="how many chunks the file travels in")
    data: str = Field(description="the sealed file (or chunk ``index`` of it), base64")

    def content(self) -> bytes:
        """The file's bytes, checked against ``size`` and ``sha256``; SchemaError if they differ."""
        raw = self._decoded()
        if len(raw) != self.size or hashlib.sha256(raw).hexdigest() != self.sha256:
            raise SchemaError(f"capture upload {self.name!r}: the bytes do not match its size and sha256")
        return raw

    def chunk(self) -> bytes:
        """This chunk's bytes, checked against what ``size`` says chunk ``index`` of ``count`` holds."""
        expected = chunks_of(self.size)
        if self.count != expected or self.index >= self.count:
            raise SchemaError(
                f"capture upload {self.name!r}: chunk {self.index} of {self.count}, but a file of {self.size} bytes "
                f"travels in {expected} chunk(s) of {CHUNK_BYTES} bytes"
            )
        raw = self._decoded()
        want = min(CHUNK_BYTES, self.size - self.index * CHUNK_BYTES)
        if len(raw) != want:
            raise SchemaError(f"capture upload {self.name!r}: chunk {self.index} holds {len(raw)} bytes, not {want}")
        return raw

    def _decoded(self) -> bytes:
        try:
            return base64.b64decode(self.data, validate=True)
        except ValueError as exc:
            raise SchemaError(f"capture upload {self.name!r}: data is not base64") from exc


class CaptureAck(Schema):
    """The service holds the file ``sha256`` of ``device_id`` (service → ``devices/{id}/capture/ack``)."""

    device_id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    sha256: str = Field(pattern=_SHA256)


def chunks_of(size: int) -> int:
    """How many chunk messages a file of ``size`` bytes travels in."""
    return max(1, -(-size // CHUNK_BYTES))


def upload_message(device_id: str, name: str, model: str, raw: bytes, index: int = 0) -> CaptureUpload:
    """The message that uploads chunk ``index`` of capture file ``name`` (its bytes ``raw``); a file
    of at most ``CHUNK_BYTES`` is one message, the whole file."""
    count = chunks_of(len(raw))
    if not 0 <= index < count:
        raise ValueError(f"chunk {index} of a {len(raw)}-byte file: it has chunks 0 to {count - 1}")
    return CaptureUpload(
        device_id=device_id,
        msg_id=uuid.uuid4().hex,
        ts=datetime.now(timezone.utc),
        name=name,
        model=model,
        size=len(raw),
        sha256=hashlib.sha256(raw).hexdigest(),
        index=index,
        count=count,
        data=base64.b64encode(raw[index * CHUNK_BYTES : (index + 1) * CHUNK_BYTES]).decode(),
    )
