"""From the broker into the database: presence, telemetry, events, OTA statuses, enrollment.

``handle(topic, payload)`` runs on the MQTT network thread. A payload that does not parse as
the schema its topic names is counted (``malformed``) and dropped; one whose ``device_id``
differs from the id in its topic (a device speaking for another) is counted (``impersonating``)
and dropped; a message seen before (QoS 1 redelivers; store-and-forward replays) is counted
(``duplicates``) and dropped, by an in-memory window and then by unique keys in the tables.
None of these ever raises.

OTA statuses and enrollment requests are written before ``handle`` returns, so before the
client acknowledges them (paho sends PUBACK after the callback): a service killed right after
cannot lose one. Presence, telemetry and events go through a bounded queue to one writer
thread that inserts them in batches (a full queue blocks the network thread, which slows the
broker down instead of dropping); a kill can lose the last batch, which telemetry tolerates
(retained latest value, the next report comes).
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import sqlalchemy as sa
from pydantic import BaseModel, ValidationError

from edgesdk.errors import EdgeSDKError
from edgesdk.fleet.service import schema
from edgesdk.fleet.service.database import Transaction, insert_ignoring_duplicates
from edgesdk.fleet.service.store import SqlRolloutStore
from edgesdk.protocol import topics
from edgesdk.schemas.messages import EnrollRequest, Event, OtaStatus, Presence, Telemetry

log = logging.getLogger(__name__)

_DEDUP_WINDOW = 65536
_STOP = object()


@dataclass
class IngestCounters:
    """What the ingest saw since start (persisted as deltas into ``service_counters``)."""

    messages: int = 0
    malformed: int = 0
    impersonating: int = 0
    duplicates: int = 0
    telemetry: int = 0
    events: int = 0
    presence: int = 0
    ota_status: int = 0
    enroll_requests: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class Ingest:
    """Folds device messages of ``namespace`` into the service database."""

    SUFFIXES = (topics.PRESENCE, topics.TELEMETRY, topics.EVENTS, topics.OTA_STATUS, topics.ENROLL)

    def __init__(
        self,
        engine: Any,
        namespace: str,
        store: SqlRolloutStore,
        *,
        batch_max: int = 1000,
        flush_s: float = 0.1,
        queue_max: int = 20000,
    ) -> None:
        self.engine = engine
        self.namespace = namespace
        self.store = store
        self.counters = IngestCounters()
        self._persisted = IngestCounters()
        self._batch_max = batch_max
        self._flush_s = flush_s
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=queue_max)
        self._seen: deque[tuple[str, str]] = deque(maxlen=_DEDUP_WINDOW)
        self._seen_set: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        self._writer: threading.Thread | None = None
        self._enqueued = 0
        self._written = 0
        self._telemetry_insert = insert_ignoring_duplicates(engine, schema.telemetry)
        self._event_insert = insert_ignoring_duplicates(engine, schema.events)
        self._history_insert = insert_ignoring_duplicates(engine, schema.ota_history)
        self._handlers: dict[str, tuple[type[BaseModel], Callable[[Any], None]]] = {
            topics.PRESENCE: (Presence, self._queue_item),
            topics.TELEMETRY: (Telemetry, self._queue_item),
            topics.EVENTS: (Event, self._queue_item),
            topics.OTA_STATUS: (OtaStatus, self._ota_status),
            topics.ENROLL: (EnrollRequest, self._enroll),
        }

    def filters(self) -> list[str]:
        """The subscriptions this ingest needs (QoS 1)."""
        return [topics.all_devices_filter(self.namespace, suffix) for suffix in self.SUFFIXES]

    # -- the network thread -----------------------------------------------------------------

    def handle(self, topic: str, payload: bytes) -> bool:
        """Take one message; True when it was one of ours (parsed or counted)."""
        parsed = topics.parse_topic(self.namespace, topic)
        if parsed is None or parsed.scope != "devices" or parsed.suffix not in self._handlers:
            return False
        model, handler = self._handlers[parsed.suffix]
        with self._lock:
            self.counters.messages += 1
        try:
            message: Any = model.model_validate_json(payload)
        except ValidationError as exc:
            self._count("malformed")
            log.debug("ignored malformed %s from %s: %s", parsed.suffix, parsed.name, exc)
            return True
        if message.device_id != parsed.name:
            self._count("impersonating")
            log.warning(
                "ignored %s on the topic of %r claiming device %r", parsed.suffix, parsed.name, message.device_id
            )
            return True
        msg_id = getattr(message, "msg_id", None)
        if msg_id is not None and self._duplicate(parsed.name, msg_id):
            self._count("duplicates")
            return True
        try:
            handler(message)
        except EdgeSDKError as exc:  # the database refused: log, keep the service up
            log.error("could not store %s from %s: %s", parsed.suffix, parsed.name, exc)
        return True

    def _count(self, name: str, by: int = 1) -> None:
        with self._lock:
            setattr(self.counters, name, getattr(self.counters, name) + by)

    def _duplicate(self, device_id: str, msg_id: str) -> bool:
        key = (device_id, msg_id)
        with self._lock:
            if key in self._seen_set:
                return True
            if len(self._seen) == self._seen.maxlen:
                self._seen_set.discard(self._seen[0])
            self._seen.append(key)
            self._seen_set.add(key)
        return False

    def _queue_item(self, message: Any) -> None:
        with self._lock:
            self._enqueued += 1
        self._queue.put(message)  # blocks when full: back-pressure, never a silent drop

    def _ota_status(self, status: OtaStatus) -> None:
        with Transaction(self.engine, self.store.where) as db:
            db.execute(
                self._history_insert,
                [
                    {
                        "device_id": status.device_id,
                        "deployment_id": status.deployment_id,
                        "msg_id": status.msg_id,
                        "ts": status.ts.timestamp(),
                        "state": status.state,
                        "reason": status.reason,
                        "progress": status.progress,
                        "model_release": status.model.release if status.model else None,
                    }
                ],
            )
            devices = schema.devices
            values = {"ota_state": status.state, "ota_deployment_id": status.deployment_id}
            known = db.execute(sa.select(devices.c.device_id).where(devices.c.device_id == status.device_id)).first()
            ts = status.ts.timestamp()
            if known is None:
                db.execute(
                    devices.insert().values(
                        device_id=status.device_id, groups="[]", first_seen=time.time(), last_seen=ts, **values
                    )
                )
            else:
                db.execute(devices.update().where(devices.c.device_id == status.device_id).values(**values))
        self.store.record_status(status)
        self._count("ota_status")

    def _enroll(self, request: EnrollRequest) -> None:
        table = schema.enrollment_requests
        with Transaction(self.engine, self.store.where) as db:
            row = db.execute(sa.select(table.c.key_id).where(table.c.device_id == request.device_id)).first()
            values = {
                "public_key": request.public_key,
                "key_id": request.key_id,
                "profile": request.profile,
                "agent_version": request.agent_version,
                "hostname": request.hostname,
                "requested": request.ts.timestamp(),
            }
            if row is None:
                db.execute(table.insert().values(device_id=request.device_id, status="pending", **values))
            elif row.key_id != request.key_id:  # a new key asks again: it must be approved again
                db.execute(
                    table.update().where(table.c.device_id == request.device_id).values(status="pending", **values)
                )
        self._count("enroll_requests")

    # -- the writer thread ------------------------------------------------------------------

    def start(self) -> Ingest:
        self._writer = threading.Thread(target=self._write_loop, name="fleet-ingest-writer", daemon=True)
        self._writer.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Write what is queued, then stop the writer."""
        if self._writer is not None:
            self._queue.put(_STOP)
            self._writer.join(timeout)
            self._writer = None
        self._flush_counters()

    def drain(self, timeout: float = 10.0) -> bool:
        """Wait until everything queued so far is written (tests, benchmarks)."""
        with self._lock:
            target = self._enqueued
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if self._written >= target:
                    return True
            time.sleep(0.02)
        return False

    def _write_loop(self) -> None:
        while True:
            batch: list[Any] = [self._queue.get()]
            deadline = time.monotonic() + self._flush_s
            while len(batch) < self._batch_max:
                remaining = deadline - time.monotonic()
                try:
                    batch.append(
                        self._queue.get(timeout=max(remaining, 0.0)) if remaining > 0 else self._queue.get_nowait()
                    )
                except queue.Empty:
                    break
            stop = any(item is _STOP for item in batch)
            items = [item for item in batch if item is not _STOP]
            if items:
                try:
                    self._write_batch(items)
                except EdgeSDKError as exc:
                    log.error("dropped a batch of %d device messages: %s", len(items), exc)
            with self._lock:
                self._written += len(items)
            self._flush_counters()
            if stop:
                return

    def _write_batch(self, items: list[Any]) -> None:
        telemetry = [m for m in items if isinstance(m, Telemetry)]
        events = [m for m in items if isinstance(m, Event)]
        presence = [m for m in items if isinstance(m, Presence)]
        with Transaction(self.engine, self.store.where) as db:
            now = time.time()
            seen = {m.device_id: m.ts.timestamp() for m in items}
            self._ensure_devices(db, seen, now)
            for announcement in sorted(presence, key=lambda p: p.ts):
                self._apply_presence(db, announcement)
            if telemetry:
                db.execute(self._telemetry_insert, [_telemetry_row(m) for m in telemetry])
                newest: dict[str, Telemetry] = {}
                for report in telemetry:
                    if report.device_id not in newest or report.seq > newest[report.device_id].seq:
                        newest[report.device_id] = report
                for report in newest.values():
                    self._apply_telemetry(db, report)
            if events:
                db.execute(
                    self._event_insert,
                    [
                        {
                            "device_id": m.device_id,
                            "msg_id": m.msg_id,
                            "seq": m.seq,
                            "ts": m.ts.timestamp(),
                            "event": m.event,
                            "detail": json.dumps(m.detail),
                        }
                        for m in events
                    ],
                )
        self._count("telemetry", len(telemetry))
        self._count("events", len(events))
        self._count("presence", len(presence))

    def _ensure_devices(self, db: Any, seen: dict[str, float], now: float) -> None:
        table = schema.devices
        known = {r.device_id for r in db.execute(sa.select(table.c.device_id).where(table.c.device_id.in_(seen)))}
        missing = [d for d in seen if d not in known]
        if missing:
            db.execute(
                table.insert(),
                [{"device_id": d, "groups": "[]", "first_seen": now, "last_seen": seen[d]} for d in missing],
            )

    def _apply_presence(self, db: Any, presence: Presence) -> None:
        table = schema.devices
        ts = presence.ts.timestamp()
        row = db.execute(
            sa.select(table.c.presence_ts, table.c.last_seen).where(table.c.device_id == presence.device_id)
        ).first()
        if row is not None and row.presence_ts is not None and row.presence_ts > ts:
            return  # an older presence arriving late
        values: dict[str, Any] = {
            "online": presence.online,
            "groups": json.dumps(sorted(presence.groups)),
            "presence_ts": ts,
            "last_seen": max(ts, row.last_seen if row is not None else ts),
        }
        for name in ("profile", "agent_version", "public_key"):
            if getattr(presence, name) is not None:
                values[name] = getattr(presence, name)
        if presence.model is not None:
            values.update(_model_columns(presence.model))
        db.execute(table.update().where(table.c.device_id == presence.device_id).values(**values))

    def _apply_telemetry(self, db: Any, message: Telemetry) -> None:
        table = schema.devices
        row = db.execute(
            sa.select(table.c.telemetry_seq, table.c.last_seen).where(table.c.device_id == message.device_id)
        ).first()
        ts = message.ts.timestamp()
        values: dict[str, Any] = {"last_seen": max(ts, row.last_seen if row is not None else ts)}
        if row is None or row.telemetry_seq is None or message.seq >= row.telemetry_seq:
            values["telemetry_seq"] = message.seq
            if message.model is not None:
                values.update(_model_columns(message.model))
        db.execute(table.update().where(table.c.device_id == message.device_id).values(**values))

    def _flush_counters(self) -> None:
        with self._lock:
            current = self.counters.as_dict()
            deltas = {
                k: v - getattr(self._persisted, k) for k, v in current.items() if v != getattr(self._persisted, k)
            }
            self._persisted = IngestCounters(**current)
        if not deltas:
            return
        try:
            add_counters(self.engine, self.store.where, deltas)
        except EdgeSDKError as exc:
            log.error("ingest counters not persisted: %s", exc)


def add_counters(engine: Any, where: str, deltas: dict[str, int]) -> None:
    """Add ``deltas`` to the persisted counters of the same names."""
    table = schema.service_counters
    with Transaction(engine, where) as db:
        existing = {r.name for r in db.execute(sa.select(table.c.name).where(table.c.name.in_(deltas)))}
        for name, delta in deltas.items():
            if name in existing:
                db.execute(table.update().where(table.c.name == name).values(value=table.c.value + delta))
            else:
                db.execute(table.insert().values(name=name, value=delta))


def read_counters(engine: Any, where: str) -> dict[str, int]:
    """Every persisted counter."""
    with Transaction(engine, where) as db:
        return {r.name: int(r.value) for r in db.execute(sa.select(schema.service_counters))}


def _model_columns(model: Any) -> dict[str, Any]:
    return {
        "model_name": model.name,
        "model_version": model.version,
        "model_release": model.release,
        "variant": model.variant,
        "model_sha256": model.sha256,
        "precision": model.precision,
        "runtime": model.runtime,
    }


def _telemetry_row(message: Telemetry) -> dict[str, Any]:
    variant = message.model.variant if message.model is not None else None
    stats = message.latency.get(variant or "")
    if stats is None and message.latency:
        stats = max(message.latency.values(), key=lambda s: s.count)
    return {
        "device_id": message.device_id,
        "msg_id": message.msg_id,
        "seq": message.seq,
        "ts": message.ts.timestamp(),
        "model_version": message.model.version if message.model else None,
        "precision": message.model.precision if message.model else None,
        "requests": stats.count if stats else 0,
        "p50_ms": stats.p50_ms if stats else None,
        "p95_ms": stats.p95_ms if stats else None,
        "p99_ms": stats.p99_ms if stats else None,
        "throughput_rps": message.throughput_rps,
        "errors": sum(message.errors.values()),
        "temperature_c": max(message.temperatures_c.values(), default=None),
        "cpu_percent": message.cpu_percent,
        "rss_mb": message.rss_mb,
        "queue_depth": message.queue_depth,
        "outbox_depth": message.outbox_depth,
        "dropped_messages": message.dropped_messages,
        "governor_state": message.governor_state,
        "power_source": message.power_source,
    }
