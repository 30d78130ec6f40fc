"""Payloads that travel over MQTT. Every one carries its kind and schema_version so a
reader can reject what it does not understand instead of misreading it."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Final, Literal, TypeAlias

from pydantic import ConfigDict, Field, model_validator

from edgesdk.protocol.ota import OTA_STATE_NAMES
from edgesdk.schemas.base import SCHEMA_VERSION, Schema
from edgesdk.schemas.manifest import SEMVER_PATTERN, SHA256_PATTERN, KeySlot
from edgesdk.schemas.measurements import MeasuredSummary


class RunningModel(Schema):
    """What is serving: the one value the agent's API, metrics, MQTT link and updater report,
    and the fleet reads from presence, telemetry and OTA status. The last three fields came
    later and are optional, so messages from older agents still validate."""

    name: str
    version: str
    release: int
    variant: str
    sha256: str = Field(pattern=SHA256_PATTERN, description="hash of the artifact now serving")
    precision: str | None = Field(None, description="precision of the active variant (fp32, fp16, int8)")
    runtime: str | None = Field(None, description="runtime of the active variant (onnxruntime, ...)")
    bundle_sha256: str | None = Field(None, pattern=SHA256_PATTERN, description="hash of the bundle file it came from")


class Presence(Schema):
    """Retained on ``devices/{id}/presence``; the Last Will publishes ``online=False``."""

    schema_version: Literal[1] = SCHEMA_VERSION
    kind: Literal["presence"] = "presence"
    device_id: str
    online: bool
    ts: datetime
    agent_version: str | None = None
    profile: str | None = None
    groups: list[str] = Field(default_factory=list)
    model: RunningModel | None = None
    models: list[RunningModel] = Field(
        default_factory=list, description="every model the device serves, the default one (model) first"
    )
    public_key: str | None = Field(None, description="device X25519 public key, base64 (enrollment)")


class LatencyStats(Schema):
    count: int = Field(ge=0)
    p50_ms: float | None = None
    p95_ms: float | None = None
    p99_ms: float | None = None


class DriftScore(Schema):
    """How far one tensor's live values moved from the reference profile signed into its bundle
    (computed at conversion from the validation data), over the reference's own bins.

    Unlike every other schema it ignores keys it does not know: a score a later agent adds (as
    ``ks`` was added) is dropped by this service, not its whole telemetry report."""

    model_config = ConfigDict(allow_inf_nan=False, extra="ignore")

    psi: float = Field(ge=0, description="population stability index (0.1 watch, 0.25 act, by convention)")
    js: float = Field(ge=0, le=1, description="Jensen-Shannon distance, base 2")
    ks: float | None = Field(
        None, ge=0, le=1, description="Kolmogorov-Smirnov distance on the binned CDFs; null: no ordered bins"
    )


class ShadowAgreement(Schema):
    """One output's shadow agreement during probation (issue 41): the new model's answers against
    the previous release's on the same sampled requests, the figure the probation gate reads."""

    model_config = ConfigDict(allow_inf_nan=False)

    kind: str = Field(description="the output's metric: top1, ctc, abs, max_abs (shares), cosine, iou (tails)")
    value: float
    lower_bound: float = Field(description="the one-sided 95 % bound probation holds against the minimum")
    samples: int = Field(ge=0, description="compared samples so far in this probation")
    minimum: float | None = Field(None, description="the deployment's min_agreement; null: reported only")


class ModelQuality(Schema):
    """What the device saw of one model's inputs and outputs since its last report: drift against
    the bundle's reference profile and data-quality counts (issue 41). ``reference`` is False when
    the bundle carries no profile: the counts still hold, the scores are then empty."""

    model_config = ConfigDict(allow_inf_nan=False)

    samples: int = Field(0, ge=0, description="requests sketched in this window")
    window_s: float = Field(0.0, ge=0)
    reference: bool = False
    inputs: dict[str, DriftScore] = Field(default_factory=dict, description="per input tensor (worst channel)")
    outputs: dict[str, DriftScore] = Field(default_factory=dict, description="per output tensor")
    nonfinite: int = Field(0, ge=0, description="requests refused for NaN/Inf")
    out_of_range: int = Field(0, ge=0, description="requests with values outside the reference's range")
    constant: int = Field(0, ge=0, description="requests whose every value was the same")
    agreement: dict[str, ShadowAgreement] | None = Field(
        None, description="per output, while a shadow comparison runs in probation (else null)"
    )


class ModelTelemetry(Schema):
    """One model's figures in a telemetry message (a device may serve several)."""

    model: RunningModel
    latency: dict[str, LatencyStats] = Field(default_factory=dict, description="per variant id")
    throughput_rps: float = 0.0
    errors: dict[str, int] = Field(default_factory=dict, description="count by error kind")
    resident_mb: float | None = Field(None, description="load size of the variants it holds (MB)")
    quality: ModelQuality | None = Field(None, description="drift and data-quality figures (issue 41)")


class Telemetry(Schema):
    """Periodic metrics on ``devices/{id}/telemetry``. ``msg_id`` lets the fleet de-duplicate."""

    schema_version: Literal[1] = SCHEMA_VERSION
    kind: Literal["telemetry"] = "telemetry"
    device_id: str
    msg_id: str
    seq: int = Field(ge=0)
    ts: datetime
    model: RunningModel | None = None
    latency: dict[str, LatencyStats] = Field(default_factory=dict, description="per variant id")
    throughput_rps: float = 0.0
    errors: dict[str, int] = Field(default_factory=dict, description="count by error kind")
    queue_depth: int = Field(0, ge=0, description="inference requests running or waiting in the local API")
    outbox_depth: int = Field(
        0, ge=0, description="messages in the MQTT store-and-forward outbox, not yet acknowledged"
    )
    cpu_percent: float | None = None
    rss_mb: float | None = None
    temperatures_c: dict[str, float] = Field(default_factory=dict)
    power_source: Literal["ac", "battery", "unknown"] = "unknown"
    governor_state: str | None = None
    switch_count: int = 0
    measured: MeasuredSummary | None = Field(
        None, description="what edge-agent profile (at install, or on demand) measured on this device"
    )
    dropped_messages: int = Field(
        0, ge=0, description="messages the MQTT outbox dropped (oldest first) to stay within its disk quota"
    )
    models: list[ModelTelemetry] = Field(
        default_factory=list, description="each model serving, default first (the top-level fields: the default's)"
    )
    model_budget_mb: float | None = Field(None, description="the profile's model memory budget")
    resident_mb: float | None = Field(None, description="what the serving models hold together (MB)")
    quality: ModelQuality | None = Field(None, description="the default model's drift and data-quality figures")


class Event(Schema):
    """Things that happen between telemetry ticks: precision switches, error bursts, OTA changes."""

    schema_version: Literal[1] = SCHEMA_VERSION
    kind: Literal["event"] = "event"
    device_id: str
    msg_id: str
    seq: int = Field(ge=0)
    ts: datetime
    event: str = Field(description="e.g. precision_switch, error_burst, ota_state")
    detail: dict[str, str | int | float | bool | None] = Field(default_factory=dict)


#: The longest probation, and the slowest p95 latency SLO, a command may carry: far beyond real
#: use, far below what overflows a date or a timer.
MAX_PROBATION_S: Final = 30 * 24 * 3600.0
MAX_P95_LATENCY_MS: Final = 3600 * 1000.0
#: The largest chunk a rollout may ask for (devices take 1 MiB MQTT messages by default).
MAX_CHUNK_SIZE: Final = 64 << 20


class HealthCriteria(Schema):
    """What a new model must hold during probation, or it is rolled back. Every number finite: an
    Infinity was written into the signed command as ``null``, which no device (and no later read
    of the stored deployment) could parse."""

    model_config = ConfigDict(allow_inf_nan=False)

    probation_s: float = Field(600.0, ge=0, le=MAX_PROBATION_S, description="at most 30 days")
    max_error_rate: float = Field(0.01, ge=0, le=1)
    p95_latency_ms: float | None = Field(None, gt=0, le=MAX_P95_LATENCY_MS)
    max_restarts: int = Field(2, ge=0)
    max_output_drift: float | None = Field(None, ge=0)
    # Issue 41: the previous release runs beside the new one on a sampled share of live requests
    # (docs/ota.md, "Shadow agreement"). Both are left out of the wire and signed bytes at None,
    # so a deployment that does not use them is byte for byte what older devices parse and verify.
    min_agreement: float | None = Field(
        None,
        ge=0,
        le=1,
        description="roll back when the lower bound of the agreement with the previous release is below",
    )
    shadow_rate: float | None = Field(
        None, ge=0, le=1, description="share of live requests also run on the previous release; None: 0.1"
    )
    # Issue 41: a shadow phase before activation (docs/ota.md): the staged model runs on the sampled
    # share of live requests the serving model answers, and answers nobody. Bounded like probation.
    shadow_s: float | None = Field(
        None, ge=0, le=MAX_PROBATION_S, description="seconds of shadow phase before activation; None: none"
    )

    @model_validator(mode="after")
    def _shadow_to_check(self) -> HealthCriteria:
        if self.min_agreement is not None and self.shadow_rate == 0:
            raise ValueError("min_agreement needs a shadow_rate above 0 (no request would be compared)")
        if self.shadow_s and self.shadow_rate == 0:
            raise ValueError("shadow_s needs a shadow_rate above 0 (no request would be compared)")
        return self

    def later_fields_unset(self) -> set[str]:
        """Fields newer than the first signed format that are at their default (left out on the wire)."""
        return {name for name in ("min_agreement", "shadow_rate", "shadow_s") if getattr(self, name) is None}


#: Deployment messages before version 2 carried no freshness or audience fields. They still
#: parse (an update record saved by an older agent must load after an upgrade), but a device
#: acts on no version-1 command (edgesdk.agent.ota.freshness).
DEPLOYMENT_SCHEMA_VERSION: Final = 2

#: The longest a command may stay valid (``expires_at - issued_at``): what the fleet service and
#: the CLI accept for ``expires_s`` / ``--expires``, and the default of a device's
#: ``[ota] max_command_validity_s``. A week covers a device that is offline over a long weekend;
#: longer, a captured command stays usable for as long (docs/ota.md, "Fresh, bound commands").
MAX_COMMAND_VALIDITY_S: Final = 7 * 24 * 3600.0


class Deployment(Schema):
    """Sent by the fleet to a device or group: install this bundle (or cancel / roll back a
    deployment). Signed by the operator; every field but ``signature`` is signed, so the
    freshness window, the sequence and the audience cannot be changed in transit."""

    schema_version: Literal[1, 2] = DEPLOYMENT_SCHEMA_VERSION
    kind: Literal["deployment"] = "deployment"
    deployment_id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    issued_at: datetime
    expires_at: datetime | None = Field(
        None, description="devices refuse the command after this instant (plus their clock-skew tolerance)"
    )
    sequence: int | None = Field(
        None, ge=0, description="strictly increasing per signing key; devices refuse one not above the last accepted"
    )
    model_name: str
    model_version: str = Field(pattern=SEMVER_PATTERN)
    release: int = Field(ge=1)
    bundle_sha256: str = Field(pattern=SHA256_PATTERN)
    bundle_size: int = Field(gt=0)
    chunk_size: int = Field(262144, gt=0)
    url: str | None = Field(None, description="one HTTP(S) source (older deployments; newer ones list artifact_urls)")
    artifact_urls: list[str] = Field(
        default_factory=list,
        max_length=8,
        description="HTTP(S) sources of the bundle, tried in order with Range requests (the fleet service, a "
        "static server, a CDN, a presigned object-store URL). Hints only: the signed size and hashes are the trust",
    )
    mqtt_fallback: bool = Field(
        True, description="when every URL fails, fetch the chunks over MQTT (needs chunk_sha256)"
    )
    chunk_sha256: list[str] = Field(
        default_factory=list,
        description="sha256 of each chunk_size piece of the bundle, in order: every chunk is checked on arrival",
    )
    targets: list[str] = Field(default_factory=list, description="device ids this command is for")
    target_groups: list[str] = Field(
        default_factory=list, description="device groups this command is for (a device in any of them)"
    )
    wave: int | None = Field(None, ge=0, description="rollout wave the command was issued for (0 = canary)")
    health: HealthCriteria = Field(default_factory=HealthCriteria)
    action: Literal["install", "cancel", "rollback"] = "install"
    signature: str | None = Field(None, description="Ed25519 over the canonical JSON without this field")

    def artifact_sources(self) -> list[str]:
        """The HTTP(S) URLs to try, in order (``artifact_urls``, then a legacy ``url``)."""
        return [*self.artifact_urls, *([self.url] if self.url and self.url not in self.artifact_urls else [])]

    @model_validator(mode="after")
    def _fresh_and_addressed(self) -> Deployment:
        # Version 2 makes the freshness window, the sequence and an explicit audience required:
        # "empty targets = every device" made a canary's message valid for the whole fleet.
        if self.schema_version < 2:
            return self
        missing = [name for name in ("expires_at", "sequence") if getattr(self, name) is None]
        if not self.targets and not self.target_groups:
            missing.append("targets or target_groups")
        if missing:
            raise ValueError(f"schema_version 2 deployment needs {', '.join(missing)}")
        if self.expires_at is not None and self.expires_at <= self.issued_at:
            raise ValueError(
                f"expires_at {self.expires_at.isoformat()} is not after issued_at {self.issued_at.isoformat()}"
            )
        return self


# The accepted strings come from the enum the update machine walks, not from a second list:
# pydantic and the JSON Schema see ``Literal["IDLE", ...]`` (an inline string enum, as before);
# mypy cannot evaluate a Literal built at run time, so it sees plain ``str``.
if TYPE_CHECKING:
    OtaState: TypeAlias = str
else:
    OtaState = Literal[OTA_STATE_NAMES]


class OtaStatus(Schema):
    """Published on every update state change (QoS 1, through the store-and-forward queue)."""

    schema_version: Literal[1] = SCHEMA_VERSION
    kind: Literal["ota_status"] = "ota_status"
    device_id: str
    deployment_id: str
    msg_id: str
    ts: datetime
    state: OtaState
    reason: str = ""
    progress: float | None = Field(None, ge=0, le=1)
    model: RunningModel | None = None
    command_sha256: str | None = Field(
        None,
        pattern=SHA256_PATTERN,
        description="set when this status answers a signed command the device refused (state FAILED, reason "
        "'refused: …'): the sha256 of that command message as received. The device's update is unchanged; the "
        "operator counts the refusal only when it issued that command to this device",
    )


#: Why a device did not act on a command (``CommandRefusal.why``): the message did not parse, its
#: signature did not verify (the first four after it), or a signed command failed the freshness
#: gate (edgesdk.agent.ota.freshness).
RefusalKind = Literal[
    "malformed",
    "unsigned",
    "malformed_signature",
    "unknown_key",
    "bad_signature",
    "replay",
    "expired",
    "not_yet_valid",
    "not_addressed",
    "unversioned",
    "validity_too_long",
    "sequence_ahead",
]


class CommandRefusal(Schema):
    """The ``detail`` of an ``ota_refused`` event: a command the device did not act on.

    For a message that does not parse or whose signature does not verify this event (rate-limited)
    is all the device says: no ``ota/status`` names a deployment id nobody proved to have sent.
    ``deployment_id`` is what the message claims, for display only; ``command_sha256`` is what
    the operator matches against the commands it issued (docs/ota.md, "Refusals")."""

    command_sha256: str = Field(pattern=SHA256_PATTERN, description="sha256 of the refused message as received")
    why: RefusalKind
    reason: str = Field(max_length=1024)
    deployment_id: str | None = Field(None, description="as the message claims it (unverified when unsigned)")


class ChunkRequest(Schema):
    """A device asks for pieces of a bundle (JSON on ``devices/{id}/ota/chunks/req``).

    Flow control lives here: a device never has more than its window of chunks requested and
    not yet received, so a 50 MB bundle trickles instead of flooding the broker."""

    schema_version: Literal[1] = SCHEMA_VERSION
    kind: Literal["ota_chunk_request"] = "ota_chunk_request"
    device_id: str
    deployment_id: str
    bundle_sha256: str = Field(pattern=SHA256_PATTERN)
    indices: list[int] = Field(min_length=1, max_length=64)


class ChunkHeader(Schema):
    """Header of a chunk frame on ``devices/{id}/ota/chunks/data``.

    The frame is binary — ``b"EOC1"``, a big-endian u16 header length, this header as JSON, then
    the raw chunk bytes — so bytes on the wire stay within a few hundred bytes of the chunk size
    (base64 would add a third)."""

    schema_version: Literal[1] = SCHEMA_VERSION
    kind: Literal["ota_chunk"] = "ota_chunk"
    deployment_id: str
    bundle_sha256: str = Field(pattern=SHA256_PATTERN)
    index: int = Field(ge=0)
    error: str | None = Field(None, description="set (and no data) when the server cannot serve this chunk")


class EnrollRequest(Schema):
    """Retained on ``devices/{id}/enroll``: a device asks to receive bundles with its own key.

    The key pair was made on the device at first start; only the public half travels. The
    operator compares ``key_id`` with what the device shows locally before approving it
    (``edgesdk fleet enroll approve``), see docs/enrollment.md.
    """

    schema_version: Literal[1] = SCHEMA_VERSION
    kind: Literal["enroll_request"] = "enroll_request"
    device_id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    ts: datetime
    public_key: str = Field(pattern=r"^[A-Za-z0-9+/]{43}=$", description="X25519 public key, raw 32 bytes, base64")
    key_id: str = Field(pattern=r"^[0-9a-f]{32}$", description="edgesdk.keys.key_id of the public key")
    profile: str | None = None
    agent_version: str | None = None
    hostname: str | None = None


class MqttCredentials(Schema):
    """Retained on ``devices/{id}/enroll/credentials`` by the operator when it approves a device.

    The device's own broker password (``username`` = device id), wrapped for the device's
    approved X25519 key exactly like a bundle's content key, so only the device whose key the
    operator pinned can read it; the topic itself may be readable by every enrolling device.
    See docs/enrollment.md, "Broker credentials".
    """

    schema_version: Literal[1] = SCHEMA_VERSION
    kind: Literal["mqtt_credentials"] = "mqtt_credentials"
    device_id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    username: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    issued_at: datetime
    password: KeySlot = Field(description="the 32-character password, wrapped for the device key")
