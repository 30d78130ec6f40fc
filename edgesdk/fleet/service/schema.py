"""The fleet service's tables, as SQLAlchemy Core metadata (the one description of the schema).

Alembic migrations (``migrations/versions``) create and change these tables; the metadata is
what queries are written against, and a test checks that the migrated database matches it.
Times are Unix seconds as floats (one type on SQLite and PostgreSQL, easy to bucket by
minute); JSON documents are stored as text written by pydantic or ``json``.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)

metadata = MetaData()

# -- rollouts (the RolloutStore port of edgesdk.fleet.deployments) --------------------------

deployments = Table(
    "deployments",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("created", Float, nullable=False),
    Column("updated", Float, nullable=False),
    Column("bundle_path", Text, nullable=False),
    Column("message", Text, nullable=False),  # the signed-template Deployment JSON
    Column("plan", Text, nullable=False),  # RolloutPlan JSON
    Column("state", String(16), nullable=False),
    Column("wave", Integer, nullable=False, default=-1),
    Column("reason", Text, nullable=False, default=""),
    Index("ix_deployments_state", "state"),
)

deployment_devices = Table(
    "deployment_devices",
    metadata,
    Column("deployment_id", String(64), ForeignKey("deployments.id"), primary_key=True),
    Column("device_id", String(64), primary_key=True),
    Column("wave", Integer, nullable=False),
    Column("state", String(16), nullable=False, default="PENDING"),
    Column("reason", Text, nullable=False, default=""),
    Column("progress", Float),
    Column("model_release", Integer),
    Column("sent", Float),
    Column("updated", Float),
    Column("status_ts", String(40)),
)

#: The last command sequence each operator key issued (devices refuse anything not above it).
issuers = Table(
    "issuers",
    metadata,
    Column("key_id", String(64), primary_key=True),
    Column("sequence", BigInteger, nullable=False),
)

#: Commands a decision owes to devices, delivered after the decision is stored.
follow_ups = Table(
    "follow_ups",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("deployment_id", String(64), ForeignKey("deployments.id"), nullable=False),
    Column("action", String(16), nullable=False),
    Column("wave", Integer),
    Column("devices", Text, nullable=False),  # JSON list
    Column("ttl_s", Float, nullable=False),
    Column("created", Float, nullable=False),
    Column("delivered", Float),
    Index("ix_follow_ups_pending", "delivered"),
)

#: Every command issued (revision 0004): its digest (sha256 of the message as published) is
#: what a device's refusal quotes; only a refusal of a command issued here to that device counts.
issued_commands = Table(
    "issued_commands",
    metadata,
    Column("digest", String(64), primary_key=True),
    Column("deployment_id", String(64), nullable=False),
    Column("action", String(16), nullable=False),
    Column("targets", Text, nullable=False),  # JSON list of device ids
    Column("sequence", BigInteger, nullable=False),
    Column("issued", Float, nullable=False),
    Index("ix_issued_commands_deployment", "deployment_id"),
)

# -- what devices told us (ingested from the broker) ------------------------------------------

devices = Table(
    "devices",
    metadata,
    Column("device_id", String(64), primary_key=True),
    Column("online", Boolean),
    Column("profile", String(64)),
    Column("agent_version", String(64)),
    Column("groups", Text, nullable=False, default="[]"),  # JSON list
    Column("model_name", String(128)),
    Column("model_version", String(64)),
    Column("model_release", Integer),
    Column("variant", String(128)),
    Column("model_sha256", String(64)),
    Column("precision", String(16)),
    Column("runtime", String(32)),
    Column("public_key", String(64)),
    Column("presence_ts", Float),  # ts of the newest presence applied (older ones are ignored)
    Column("telemetry_seq", BigInteger),
    Column("first_seen", Float, nullable=False),
    Column("last_seen", Float, nullable=False),
    Column("ota_state", String(16)),  # the last OTA status the device reported (revision 0002)
    Column("ota_deployment_id", String(64)),
)

telemetry = Table(
    "telemetry",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    Column("device_id", String(64), nullable=False),
    Column("msg_id", String(64), nullable=False),
    Column("seq", BigInteger, nullable=False),
    Column("ts", Float, nullable=False),
    Column("model_version", String(64)),
    Column("precision", String(16)),
    Column("requests", Integer, nullable=False, default=0),
    Column("p50_ms", Float),
    Column("p95_ms", Float),
    Column("p99_ms", Float),
    Column("throughput_rps", Float),
    Column("errors", Integer, nullable=False, default=0),
    Column("temperature_c", Float),
    Column("cpu_percent", Float),
    Column("rss_mb", Float),
    Column("queue_depth", Integer),
    Column("outbox_depth", Integer),
    Column("dropped_messages", Integer),
    Column("governor_state", String(32)),
    Column("power_source", String(16)),
    UniqueConstraint("device_id", "msg_id", name="uq_telemetry_msg"),
    Index("ix_telemetry_device_ts", "device_id", "ts"),
    Index("ix_telemetry_ts", "ts"),
)

#: Per-minute aggregates of ``telemetry``, kept much longer than the raw rows.
telemetry_minutely = Table(
    "telemetry_minutely",
    metadata,
    Column("device_id", String(64), primary_key=True),
    Column("minute", Float, primary_key=True),  # Unix time of the minute's start
    Column("samples", Integer, nullable=False),
    Column("requests", Integer, nullable=False),
    Column("p50_ms", Float),  # mean of the samples' p50
    Column("p95_ms", Float),  # max of the samples' p95 (a bound, not a merged percentile)
    Column("p99_ms", Float),  # max of the samples' p99
    Column("throughput_rps", Float),
    Column("errors", Integer),
    Column("temperature_c", Float),  # max
    Column("dropped_messages", Integer),  # max
)

events = Table(
    "events",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    Column("device_id", String(64), nullable=False),
    Column("msg_id", String(64), nullable=False),
    Column("seq", BigInteger, nullable=False),
    Column("ts", Float, nullable=False),
    Column("event", String(64), nullable=False),
    Column("detail", Text, nullable=False, default="{}"),
    UniqueConstraint("device_id", "msg_id", name="uq_events_msg"),
    Index("ix_events_device_ts", "device_id", "ts"),
)

#: Every OTA status a device published (the device's update history).
ota_history = Table(
    "ota_history",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    Column("device_id", String(64), nullable=False),
    Column("deployment_id", String(64), nullable=False),
    Column("msg_id", String(64), nullable=False),
    Column("ts", Float, nullable=False),
    Column("state", String(16), nullable=False),
    Column("reason", Text, nullable=False, default=""),
    Column("progress", Float),
    Column("model_release", Integer),
    UniqueConstraint("device_id", "msg_id", name="uq_ota_history_msg"),
    Index("ix_ota_history_deployment", "deployment_id", "device_id"),
)

enrollment_requests = Table(
    "enrollment_requests",
    metadata,
    Column("device_id", String(64), primary_key=True),
    Column("public_key", String(64), nullable=False),
    Column("key_id", String(32), nullable=False),
    Column("profile", String(64)),
    Column("agent_version", String(64)),
    Column("hostname", String(255)),
    Column("requested", Float, nullable=False),
    Column("status", String(16), nullable=False, default="pending"),  # pending | approved | revoked
    # Another key announced for this device (the latest one), never written over the key above:
    # approving it needs its own full key id (and ``replace`` for an approved device). Revision 0003.
    Column("offered_public_key", String(64)),
    Column("offered_key_id", String(32)),
    Column("offered_at", Float),
)

#: Counters that must survive restarts (messages ingested, malformed, impersonating, duplicates)
#: and small service state (the downsampling watermark).
service_counters = Table(
    "service_counters",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("value", BigInteger, nullable=False),
)


# -- the REST API (revision 0002) ---------------------------------------------------------------

#: Operator tokens: only the SHA-256 of each token is stored (tokens are 256-bit random, so a
#: fast hash is enough); ``revoked`` set means refused.
operator_tokens = Table(
    "operator_tokens",
    metadata,
    Column("id", String(16), primary_key=True),
    Column("name", String(128), nullable=False),
    Column("role", String(16), nullable=False),  # viewer | operator | admin
    Column("token_sha256", String(64), nullable=False, unique=True),
    Column("created", Float, nullable=False),
    Column("created_by", String(128), nullable=False),
    Column("revoked", Float),
)

#: Dashboard sign-ins (revision 0005): the browser holds a random session id, the database its
#: SHA-256 and the token it stands for, never the token itself; a revoked token ends its sessions.
dashboard_sessions = Table(
    "dashboard_sessions",
    metadata,
    Column("id_sha256", String(64), primary_key=True),
    Column("token_id", String(16), nullable=False, index=True),
    Column("created", Float, nullable=False),
    Column("expires", Float, nullable=False, index=True),
)

#: Every write through the API, allowed or refused: who, what, when, the outcome.
audit_log = Table(
    "audit_log",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    Column("ts", Float, nullable=False),
    Column("actor", String(128), nullable=False),  # token name and id, or "anonymous"
    Column("role", String(16)),
    Column("action", String(64), nullable=False),  # e.g. deployment.create
    Column("target", String(128), nullable=False, default=""),
    Column("outcome", String(16), nullable=False),  # ok | refused | failed
    Column("detail", Text, nullable=False, default="{}"),
    Index("ix_audit_log_ts", "ts"),
)

#: Bundles uploaded to the service (the file lives in DATA_DIR/bundles, named by its hash).
bundles = Table(
    "bundles",
    metadata,
    Column("id", String(16), primary_key=True),  # the first 16 hex digits of the SHA-256
    Column("sha256", String(64), nullable=False, unique=True),
    Column("filename", String(255), nullable=False),
    Column("path", Text, nullable=False),
    Column("size", BigInteger, nullable=False),
    Column("model_name", String(128), nullable=False),
    Column("model_version", String(64), nullable=False),
    Column("model_release", Integer, nullable=False),
    Column("uploaded", Float, nullable=False),
    Column("uploaded_by", String(128), nullable=False),
)


# -- security events (revision 0004) ----------------------------------------------------------

#: What the service noticed and refused to act on: a device's refusal of a command this service
#: did not issue to it (a forged or replayed copy published on its topic), or of an install
#: command of a deployment the device already works on. ``deployment_id`` is what the refused
#: message claimed; ``(device_id, msg_id)`` is the device message it came from (de-duplicated).
security_events = Table(
    "security_events",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    Column("ts", Float, nullable=False),
    Column("device_id", String(64), nullable=False),
    Column("msg_id", String(64), nullable=False),
    Column("kind", String(64), nullable=False),
    Column("deployment_id", String(64)),
    Column("command_sha256", String(64)),
    Column("why", String(32)),
    Column("reason", Text, nullable=False, default=""),
    UniqueConstraint("device_id", "msg_id", name="uq_security_events_msg"),
    Index("ix_security_events_ts", "ts"),
    Index("ix_security_events_deployment", "deployment_id"),
)


# -- targeting and notifications (revision 0007) ----------------------------------------------

#: Tags the operator set on a device (``PUT /api/v1/devices/{id}/tags/{key}``): the service's own
#: labels, never sent by the device (unlike its announced groups).
device_tags = Table(
    "device_tags",
    metadata,
    Column("device_id", String(64), primary_key=True),
    Column("key", String(64), primary_key=True),
    Column("value", String(255), nullable=False),
    Column("updated", Float, nullable=False),
)

#: Dynamic groups: a saved ``where`` expression (``targeting``), resolved when a rollout starts.
target_filters = Table(
    "target_filters",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("query", Text, nullable=False),
    Column("created", Float, nullable=False),
    Column("created_by", String(128), nullable=False),
)

#: A group's maintenance window (``PUT /api/v1/groups/{group}/window``): a rollout to the group
#: that names no window of its own takes this one when it is created (``edgesdk.fleet.schedule``).
maintenance_windows = Table(
    "maintenance_windows",
    metadata,
    Column("group_name", String(128), primary_key=True),
    Column("window", String(16), nullable=False),
    Column("window_tz", String(64)),
    Column("updated", Float, nullable=False),
)

#: Webhooks for rollout and alert events. The secret signs each payload (HMAC-SHA256), so it is
#: kept as given (a hash could not sign); the API never shows it back.
webhooks = Table(
    "webhooks",
    metadata,
    Column("id", String(16), primary_key=True),
    Column("url", Text, nullable=False),
    Column("secret", String(255), nullable=False),
    Column("events", Text, nullable=False, default="[]"),  # JSON list of prefixes; [] = every event
    Column("format", String(16), nullable=False, default="edgesdk"),  # edgesdk | alertmanager
    Column("created", Float, nullable=False),
    Column("created_by", String(128), nullable=False),
)

#: The outcome of each webhook delivery (after its last try): delivered, failed or dropped.
webhook_deliveries = Table(
    "webhook_deliveries",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    Column("webhook_id", String(16), nullable=False),
    Column("event", String(64), nullable=False),
    Column("ts", Float, nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("outcome", String(16), nullable=False),
    Column("status", Integer),
    Column("error", Text, nullable=False, default=""),
    Index("ix_webhook_deliveries_webhook", "webhook_id", "ts"),
)

#: Acknowledged alerts (the dashboard's Alerts page): who and when. ``alert_key`` names one
#: occurrence (kind, target and when it began), so a new occurrence is unacknowledged. Revision 0008.
alert_acks = Table(
    "alert_acks",
    metadata,
    Column("alert_key", String(255), primary_key=True),
    Column("acked_by", String(128), nullable=False),
    Column("acked_at", Float, nullable=False),
)

# -- model quality (revision 0009, issue 41) --------------------------------------------------

#: Each telemetry report's drift scores and data-quality counts, per model it names
#: (``edgesdk.fleet.service.quality``). ``scores``: JSON ``{"inputs": {tensor: {"psi", "js"}},
#: "outputs": {...}}``; ``worst_psi``: their maximum (what the drift alert reads). Kept like raw telemetry.
model_quality = Table(
    "model_quality",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    Column("device_id", String(64), nullable=False),
    Column("msg_id", String(64), nullable=False),
    Column("model_name", String(128), nullable=False),
    Column("model_release", Integer),
    Column("ts", Float, nullable=False),
    Column("samples", Integer, nullable=False),
    Column("window_s", Float, nullable=False),
    Column("reference", Boolean, nullable=False),
    Column("scores", Text, nullable=False),
    Column("worst_psi", Float),
    Column("nonfinite", Integer, nullable=False),
    Column("out_of_range", Integer, nullable=False),
    Column("constant", Integer, nullable=False),
    UniqueConstraint("device_id", "msg_id", "model_name", name="uq_model_quality_msg"),
    Index("ix_model_quality_device_model_ts", "device_id", "model_name", "ts"),
    Index("ix_model_quality_ts", "ts"),
)

#: Running totals of the counts above per (device, model), added once per stored report: the
#: Prometheus counters (``edgesdk_fleet_model_requests_total``), never pruned.
model_quality_totals = Table(
    "model_quality_totals",
    metadata,
    Column("device_id", String(64), primary_key=True),
    Column("model_name", String(128), primary_key=True),
    Column("samples", BigInteger, nullable=False),
    Column("nonfinite", BigInteger, nullable=False),
    Column("out_of_range", BigInteger, nullable=False),
    Column("constant", BigInteger, nullable=False),
)

# -- sampled data capture (issue 41, edgesdk/fleet/service/captures.py) --------------------------

#: Capture files uploaded by devices, stored as they came: sealed to the operator's key, which
#: the service never holds. ``id`` is the capture id of ``GET /api/v1/captures/{id}``.
captures = Table(
    "captures",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    Column("device_id", String(64), nullable=False),
    Column("model", String(128), nullable=False),
    Column("name", String(128), nullable=False),
    Column("size", Integer, nullable=False),
    Column("sha256", String(64), nullable=False),
    Column("received", Float, nullable=False),
    Column("data", LargeBinary, nullable=False),
    UniqueConstraint("device_id", "sha256", name="uq_captures_device_sha256"),
    Index("ix_captures_device_received", "device_id", "received"),
)

#: The chunks of capture files still arriving (a file over one message): kept until the last one
#: comes and the file is stored in ``captures`` (then deleted), or until the upload has been idle
#: past its timeout. One row per chunk; a redelivered chunk is the same row.
capture_parts = Table(
    "capture_parts",
    metadata,
    Column("device_id", String(64), primary_key=True),
    Column("sha256", String(64), primary_key=True),
    Column("idx", Integer, primary_key=True),
    Column("count", Integer, nullable=False),
    Column("size", Integer, nullable=False),
    Column("model", String(128), nullable=False),
    Column("name", String(128), nullable=False),
    Column("received", Float, nullable=False),
    Column("data", LargeBinary, nullable=False),
    Index("ix_capture_parts_received", "received"),
)
