"""Request and response bodies of the REST API (pydantic, frozen, unknown fields refused);
FastAPI turns them into the OpenAPI document at ``/openapi.json``.

Every number a request carries has both bounds and must be finite (``NaN`` and ``Infinity``,
which Python's JSON parser accepts, are refused): an absurd value is a 422 naming the field,
never a 500 from a date or an integer column it overflows (tests/integration/test_fleet_api_fuzz.py).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Generic, Literal, TypeVar, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

from edgesdk.protocol.ota import OTA_STATE_NAMES
from edgesdk.schemas.messages import MAX_CHUNK_SIZE, MAX_COMMAND_VALIDITY_S, MAX_P95_LATENCY_MS, MAX_PROBATION_S

#: Upper bounds of the request numbers that have no natural one: generous for real use, far
#: below what overflows a date (``issued_at + expires_s``), a timer or a 64-bit column.
MAX_WAVE_TIMEOUT_S = MAX_PROBATION_S
MAX_WAVES = 100


class _Body(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class DeploymentCreate(_Body):
    """A staged rollout of an uploaded bundle (``POST /api/v1/deployments``)."""

    bundle_id: str = Field(description="id from POST /api/v1/bundles")
    devices: list[str] | None = Field(None, description="target device ids (or give group)")
    group: str | None = Field(None, description="every device the service saw announce this group")
    target_filter: str | None = Field(None, description="a saved dynamic group, resolved now (or give where)")
    where: str | None = Field(None, max_length=1000, description="e.g. tag.site=berlin and profile=pi5, resolved now")
    deployment_id: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    canary: float = Field(0.10, ge=0, le=1, description="share of devices in the first wave")
    waves: list[float] = Field(
        [0.10, 0.50, 1.00], min_length=1, max_length=MAX_WAVES, description="cumulative shares, rising, ending at 1"
    )
    max_failures: float = Field(0.05, ge=0, le=1)
    probation_s: float = Field(600.0, ge=0, le=MAX_PROBATION_S)
    p95_ms: float | None = Field(None, gt=0, le=MAX_P95_LATENCY_MS, description="p95 latency SLO during probation")
    max_error_rate: float = Field(0.01, ge=0, le=1)
    min_agreement: float | None = Field(
        None, ge=0, le=1, description="roll back below this lower bound of agreement with the previous release"
    )
    shadow_rate: float | None = Field(None, ge=0, le=1, description="share of live requests shadowed; default 0.1")
    shadow_s: float | None = Field(
        None, ge=0, le=MAX_PROBATION_S, description="seconds the new model shadows the current one before activation"
    )
    wave_timeout_s: float | None = Field(None, gt=0, le=MAX_WAVE_TIMEOUT_S)
    expires_s: float = Field(
        6 * 3600.0,
        ge=1,
        le=MAX_COMMAND_VALIDITY_S,
        description="lifetime of each command sent, 1 s to a week (devices refuse a longer one)",
    )
    chunk_size: int | None = Field(None, gt=0, le=MAX_CHUNK_SIZE)
    artifact_urls: list[str] = Field(
        default_factory=list, max_length=8, description="HTTP(S) URLs devices try first (the service's own follows)"
    )
    mqtt_fallback: bool = Field(True, description="devices fetch MQTT chunks when every URL fails")
    start_at: datetime | None = Field(None, description="send nothing before (ISO 8601 with its zone); PENDING until")
    window: str | None = Field(None, description="maintenance window HH:MM-HH:MM in the devices' local time")
    window_tz: str | None = Field(None, max_length=64, description="IANA zone of window; default the service's")

    @model_validator(mode="after")
    def _check(self) -> DeploymentCreate:
        _check_schedule(self.start_at, self.window, self.window_tz)
        if [self.devices, self.group, self.target_filter, self.where].count(None) != 3:
            raise ValueError("give exactly one of devices, group, target_filter or where")
        if self.waves != sorted(self.waves) or self.waves[-1] != 1.0 or any(not 0 < w <= 1 for w in self.waves):
            raise ValueError(f"waves {self.waves} must rise and end at 1.0")
        if self.min_agreement is not None and self.shadow_rate == 0:
            raise ValueError("min_agreement needs a shadow_rate above 0 (no request would be compared)")
        if self.shadow_s and self.shadow_rate == 0:
            raise ValueError("shadow_s needs a shadow_rate above 0 (no request would be compared)")
        return self


def _check_schedule(start_at: datetime | None, window: str | None, window_tz: str | None) -> None:
    from edgesdk.errors import UsageError
    from edgesdk.fleet import schedule

    if start_at is not None and start_at.tzinfo is None:
        raise ValueError("start_at needs its zone (2026-12-06T02:00Z)")
    try:
        if window is not None:
            schedule.parse_window(window, option="window")
        if window_tz is not None:
            schedule.zone(window_tz, option="window_tz")
    except UsageError as exc:
        raise ValueError(str(exc)) from None


class CommandOptions(_Body):
    """Options of abort and rollback."""

    reason: str = Field("", max_length=500)
    expires_s: float | None = Field(
        None, ge=1, le=MAX_COMMAND_VALIDITY_S, description="lifetime of the commands sent, 1 s to a week"
    )


class TokenCreate(_Body):
    name: str = Field(min_length=1, max_length=128)
    role: Literal["viewer", "operator", "admin"]


class EnrollmentDecision(_Body):
    reason: str = Field("", max_length=500)
    key_id: str | None = Field(
        None,
        pattern=r"^[0-9a-fA-F]{32}$",
        description="approve: the FULL key id (32 hex digits) the device shows locally (edge-agent key); "
        "required, and refused when neither the requested nor the offered key has it",
    )
    replace: bool = Field(False, description="approve a device that now offers a different key")
    allow_shared_key: bool = Field(
        False, description="approve a key that is already approved for another device (refused otherwise)"
    )


#: ``state`` of ``GET /api/v1/devices``: presence, or the OTA state the device last reported.
DeviceState = Literal[
    "online",
    "offline",
    "IDLE",
    "DOWNLOADING",
    "VERIFYING",
    "STAGED",
    "ACTIVATING",
    "PROBATION",
    "COMMITTED",
    "ROLLING_BACK",
    "ROLLED_BACK",
    "FAILED",
]
if set(get_args(DeviceState)) != {"online", "offline", *OTA_STATE_NAMES}:  # pragma: no cover - a drift guard
    raise RuntimeError("DeviceState no longer lists every OTA state of edgesdk.protocol.ota")
RolloutState = Literal["PENDING", "IN_PROGRESS", "SUCCEEDED", "ABORTED", "ROLLED_BACK"]
EnrollmentStatus = Literal["pending", "approved", "revoked"]
Role = Literal["viewer", "operator", "admin"]


class _Answer(BaseModel):
    """A response body: typed fields, and any field a newer store adds passes through."""

    model_config = ConfigDict(extra="allow")


class Problem(_Answer):
    """RFC 9457 problem details (``application/problem+json``): every error of the API."""

    type: str = Field("about:blank", description="about:blank: the status and detail say it all")
    title: str = Field(description="the HTTP status phrase")
    status: int
    detail: str = Field(description="what was wrong and how to fix it, in one line")
    instance: str = Field(description="the path asked")
    errors: list[dict[str, Any]] | None = Field(None, description="422 only: one {field, message, value} per bad input")


T = TypeVar("T")


class Page(_Answer, Generic[T]):
    """One page of a list: ``limit`` items from ``offset``, of ``total``."""

    items: list[T]
    total: int = Field(description="items matching the filters, on every page")
    limit: int
    offset: int


class Device(_Body):
    device_id: str
    online: bool | None
    profile: str | None
    agent_version: str | None
    groups: list[str]
    model_name: str | None
    model_version: str | None
    model_release: int | None
    variant: str | None
    model_sha256: str | None
    precision: str | None
    runtime: str | None
    ota_state: str | None
    ota_deployment_id: str | None
    first_seen: float
    last_seen: float
    latest: dict[str, Any] | None = Field(None, description="the newest telemetry row")


class DeviceHistory(_Answer):
    device_id: str
    resolution: Literal["raw", "minute"]
    telemetry: list[dict[str, Any]]
    events: list[dict[str, Any]]
    ota: list[dict[str, Any]]


class DeploymentSummary(_Answer):
    """A rollout: its state, counts by device state (overall and per wave), its plan."""

    deployment_id: str
    state: RolloutState
    reason: str
    wave: int
    model: str
    model_name: str
    devices: int
    by_state: dict[str, int]
    waves: dict[str, dict[str, int]]
    plan: dict[str, Any]
    created: str
    updated: str
    asked: int | None = Field(None, description="rollback: how many devices were asked to roll back")


class SecurityEvent(_Answer):
    """A device's refusal of a command this service did not issue to it (``refusals``)."""

    id: int
    ts: float
    device_id: str
    msg_id: str
    kind: str
    deployment_id: str | None
    command_sha256: str | None
    why: str | None
    reason: str


class DeviceRolloutState(_Answer):
    """Where one target device is in a rollout."""

    device_id: str
    wave: int
    state: str
    reason: str | None
    progress: float | None
    model_release: int | None
    updated: float | None


class TimelineEntry(_Answer):
    """One OTA status a device reported for the rollout."""

    ts: float
    device_id: str
    state: str
    reason: str | None


class DeploymentDetail(DeploymentSummary):
    device_states: list[DeviceRolloutState]
    timeline: list[TimelineEntry]
    security_events: list[SecurityEvent]


class Bundle(_Answer):
    """An uploaded bundle (kept by its SHA-256; the server's file path is never shown)."""

    id: str
    sha256: str
    filename: str
    size: int
    model_name: str
    model_version: str
    model_release: int
    uploaded: float
    uploaded_by: str
    in_use_by: list[str] = Field(default_factory=list, description="deployments that roll it out")


class EnrollmentRequest(_Answer):
    device_id: str
    key_id: str
    public_key: str
    profile: str | None
    agent_version: str | None
    hostname: str | None
    requested: float
    status: str
    offered_key_id: str | None = None
    warnings: list[str] | None = None


class Token(_Answer):
    id: str
    name: str
    role: str
    created: float
    created_by: str
    revoked: float | None


class NewToken(_Answer):
    id: str
    token: str = Field(description="shown once: only its SHA-256 is kept")
    role: Role
    name: str


class AuditEntry(_Answer):
    ts: float
    actor: str
    role: str | None
    action: str
    target: str
    outcome: str = Field(description="ok, refused (with detail.status) or failed")
    detail: dict[str, Any]


class Group(_Answer):
    group: str
    devices: int
    online: int


class Alert(_Answer):
    kind: str = Field(description="offline, thermal, rollout_aborted or refused_messages")
    severity: Literal["warning", "critical"]
    target: str
    message: str
    since: float | None = None


class Decommissioned(_Answer):
    device_id: str
    broker_credentials_removed: bool
    enrollment_revoked: bool


class Health(_Answer):
    status: Literal["ok", "degraded"]
    broker: dict[str, Any]


class Stats(_Answer):
    ingest: dict[str, Any]
