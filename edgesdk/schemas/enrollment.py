"""The operator's registry of enrolled devices (``edgesdk fleet enroll``).

A JSON document the operator keeps (and may check into the repository that builds their
bundles): one entry per device with its X25519 public key and its status. Bundles are
encrypted to the keys of the ``approved`` entries only; a ``revoked`` entry stays so the same
key is never approved again by mistake.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from edgesdk.schemas.base import SCHEMA_VERSION, Schema

EnrollmentStatus = Literal["approved", "revoked"]


class EnrolledDevice(Schema):
    device_id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    public_key: str = Field(pattern=r"^[A-Za-z0-9+/]{43}=$", description="X25519 public key, raw 32 bytes, base64")
    key_id: str = Field(pattern=r"^[0-9a-f]{32}$")
    status: EnrollmentStatus
    profile: str | None = None
    approved_at: datetime
    revoked_at: datetime | None = None
    reason: str = Field("", description="why it was revoked, for the audit trail")
    revoked_key_ids: list[str] = Field(
        default_factory=list, description="earlier keys of this device that were revoked; never approved again"
    )


class EnrollmentRegistry(Schema):
    schema_version: Literal[1] = SCHEMA_VERSION
    kind: Literal["enrollment_registry"] = "enrollment_registry"
    devices: dict[str, EnrolledDevice] = Field(default_factory=dict)
