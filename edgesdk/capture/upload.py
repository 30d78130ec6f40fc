"""The upload message of one capture file (device → fleet, ``devices/{id}/capture``, QoS 1).

The file travels as it lies on the device, sealed to the operator's key: the service stores the
bytes and cannot read them. Beside them, in the clear, only what the service lists (which
device, which model, size, SHA-256 and the file's name, whose first part is the UTC time it was
written). The SHA-256 is checked on arrival: a changed or cut message is refused, never stored.

One file a message: the base64 text of a file of at most ``MAX_UPLOAD_BYTES`` and its header fit
the shipped broker's ``max_packet_size`` (2 MiB). A larger file is not uploaded (it stays on the
device, counted); capture files hold one request each, so they are far smaller in practice.
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
_SHA256 = r"^[0-9a-f]{64}$"
_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"


class CaptureUpload(Schema):
    """One capture file and what the service lists about it."""

    device_id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    msg_id: str = Field(pattern=r"^[0-9a-f]{32}$")
    ts: datetime
    name: str = Field(pattern=_NAME, description="the file's name on the device")
    model: str = Field("", max_length=128, description="the model whose answer it holds")
    size: int = Field(ge=0)
    sha256: str = Field(pattern=_SHA256)
    data: str = Field(description="the sealed file, base64")

    def content(self) -> bytes:
        """The file's bytes, checked against ``size`` and ``sha256``; SchemaError if they differ."""
        try:
            raw = base64.b64decode(self.data, validate=True)
        except ValueError as exc:
            raise SchemaError(f"capture upload {self.name!r}: data is not base64") from exc
        if len(raw) != self.size or hashlib.sha256(raw).hexdigest() != self.sha256:
            raise SchemaError(f"capture upload {self.name!r}: the bytes do not match its size and sha256")
        return raw


def upload_message(device_id: str, name: str, model: str, raw: bytes) -> CaptureUpload:
    """The message that uploads capture file ``name`` (its bytes ``raw``)."""
    return CaptureUpload(
        device_id=device_id,
        msg_id=uuid.uuid4().hex,
        ts=datetime.now(timezone.utc),
        name=name,
        model=model,
        size=len(raw),
        sha256=hashlib.sha256(raw).hexdigest(),
        data=base64.b64encode(raw).decode(),
    )
