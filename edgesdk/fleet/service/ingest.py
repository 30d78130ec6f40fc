"""From the broker into the database: presence, telemetry, events, OTA statuses, enrollment.

``handle(topic, payload, receipt)`` runs on the MQTT network thread. A payload that does not
parse as the schema its topic names is counted (``malformed``) and dropped; one whose
``device_id`` differs from the id in its topic (a device speaking for another) is counted
(``impersonating``) and dropped; one on the topic of a broker account that is not a device
(the enrollment bootstrap account, the operator account: ``RESERVED_USERNAMES``) is counted
(``not_a_device``) and dropped, so such an account never becomes a device row, never joins a
rollout. Everything else goes through a bounded queue to one writer
thread that stores it in batches, one transaction each (a full queue blocks the network
thread, which slows the broker down instead of dropping).

**Acknowledged only after commit.** The service's client acks by hand (``manual_ack``): the
receipts of a batch are handed back (``acknowledge``) only once its transaction committed, so
a worker killed at any point loses nothing the broker considers delivered — what it had not
acknowledged waits in its persistent session and comes again at its restart.

**De-duplicated by the database, across workers.** Several ingest processes may share the
subscriptions (MQTT 5 shared subscriptions), and QoS 1 redelivers and store-and-forward replays
come to any of them. Telemetry, events and OTA history are inserted with ``ON CONFLICT DO
NOTHING`` on their ``(device_id, msg_id)`` unique keys; the rows that came back are what is
counted as stored, the rest as ``duplicates``. Device rows are only ever moved forward by
conditional updates (newest presence by ``ts``, newest telemetry by ``seq``, ``last_seen`` by
maximum), taken in device-id order so two workers never deadlock on them; a deadlock or lost
connection is retried, a batch the database refuses as data is split and the refused messages
are counted (``unstorable``) and acknowledged, so one bad message cannot wedge the stream.

**Enrollment requests are not devices.** The shared bootstrap account may announce any id, so an
enrollment request makes (at most) an ``enrollment_requests`` row, never a device row; a device
row comes from the device's own account (presence, telemetry…) after approval. At most
``max_pending_enrollments`` requests wait at once: a request for a new id beyond that is
dropped and counted (``enroll_refused``, ``edgesdk_fleet_ingest_total{kind="enroll_refused"}``);
the device announces again at its next start, once the operator has decided on the others.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import sqlalchemy as sa
from pydantic import BaseModel, ValidationError
from sqlalchemy.exc import DBAPIError, OperationalError

from edgesdk.capture.upload import MAX_UPLOAD_BYTES, CaptureAck, CaptureUpload
from edgesdk.errors import EdgeSDKError
from edgesdk.fleet.broker_credentials import RESERVED_USERNAMES
from edgesdk.fleet.service import bulk, schema
from edgesdk.fleet.service.captures import (
    DEFAULT_MAX_FILE_BYTES,
    DEFAULT_QUOTA_BYTES,
    Capture,
    CapturePart,
    CaptureStore,
    CaptureWrite,
)
from edgesdk.fleet.service.database import Transaction, insert_ignoring_duplicates, inserted_new_row
from edgesdk.fleet.service.quality import QualityWriter
from edgesdk.fleet.service.refusals import Refusals
from edgesdk.fleet.service.store import SqlRolloutStore
from edgesdk.protocol import topics
from edgesdk.schemas.messages import EnrollRequest, Event, OtaStatus, Presence, Telemetry

log = logging.getLogger(__name__)

_STOP = object()
_RETRY_S = (0.05, 0.2, 1.0)  # waits between attempts of a batch before it is split
_COUNTERS_EVERY_S = 1.0
#: Pending enrollment requests kept at most (``fleet serve --max-pending-enrollments``).
DEFAULT_MAX_PENDING_ENROLLMENTS = 1000

#: Capture files (up to 1.4 MB each) queued for the writer at once; beyond, the network thread
#: waits (back-pressure, as for a full queue): a flood of uploads cannot fill the service's memory.
CAPTURES_IN_FLIGHT = 64

#: Hands a batch's receipts back to the MQTT client once the batch is committed.
Acknowledge = Callable[[list[Any]], None]
#: Publishes (topic, payload) at QoS 1: the capture acknowledgements to devices.
Publish = Callable[..., Any]


@dataclass
class IngestCounters:
    """What the ingest saw since start (persisted as deltas into ``service_counters``)."""

    messages: int = 0
    malformed: int = 0
    impersonating: int = 0
    duplicates: int = 0
    unstorable: int = 0
    telemetry: int = 0
    events: int = 0
    presence: int = 0
    ota_status: int = 0
    enroll_requests: int = 0
    enroll_refused: int = 0  # new ids refused: max_pending_enrollments were waiting already
    not_a_device: int = 0  # messages on the topic of a broker account that is not a device
    refusals_counted: int = 0  # refusals of commands this service issued to the device
    security_events: int = 0  # refusals of commands it did not (edgesdk.fleet.service.refusals)
    capture_stored: int = 0  # capture files uploaded by devices (edgesdk.fleet.service.captures)
    capture_refused: int = 0  # over the size cap of one capture file: not stored
    capture_evicted: int = 0  # deleted for a device's capture quota (its oldest first)
    capture_corrupt: int = 0  # files in chunks whose bytes did not make their SHA-256: dropped
    capture_expired: int = 0  # uploads in chunks idle past their timeout: dropped

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class Ingest:
    """Folds device messages of ``namespace`` into the service database."""

    SUFFIXES = (topics.PRESENCE, topics.TELEMETRY, topics.EVENTS, topics.OTA_STATUS, topics.ENROLL, topics.CAPTURE)

    def __init__(
        self,
        engine: Any,
        namespace: str,
        store: SqlRolloutStore,
        *,
        acknowledge: Acknowledge | None = None,
        batch_max: int = 1000,
        flush_s: float = 0.1,
        queue_max: int = 20000,
        max_pending_enrollments: int = DEFAULT_MAX_PENDING_ENROLLMENTS,
        capture_quota_bytes: int = DEFAULT_QUOTA_BYTES,
        capture_max_bytes: int = DEFAULT_MAX_FILE_BYTES,
        publish: Publish | None = None,
    ) -> None:
        self.engine = engine
        self.namespace = namespace
        self.store = store
        self.counters = IngestCounters()
        self._persisted = IngestCounters()
        self._acknowledge = acknowledge or (lambda _receipts: None)
        self._batch_max = batch_max
        self._max_pending = max_pending_enrollments
        self._flush_s = flush_s
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=queue_max)
        self._lock = threading.Lock()
        self._writer: threading.Thread | None = None
        self._enqueued = 0
        self._written = 0
        self._counters_at = 0.0
        # PostgreSQL takes a batch as arrays (one short statement, see bulk.py); SQLite executemany.
        self._postgres = engine.dialect.name == "postgresql"
        self._telemetry_insert = self._insert_statement(schema.telemetry, _TELEMETRY_COLUMNS)
        self._event_insert = self._insert_statement(schema.events, _EVENT_COLUMNS)
        self._history_insert = self._insert_statement(schema.ota_history, _HISTORY_COLUMNS)
        self._device_insert = insert_ignoring_duplicates(engine, schema.devices)
        self._device_touch = bulk.insert_or_advance(schema.devices, _TOUCH_COLUMNS, "device_id", "last_seen")
        self._enroll_insert = insert_ignoring_duplicates(engine, schema.enrollment_requests)
        self._refusals = Refusals(engine, store.where, store)
        self._quality = QualityWriter(engine)  # drift and data-quality figures (issue 41)
        self._captures = CaptureStore(engine, quota_bytes=capture_quota_bytes)  # sealed capture files (issue 41)
        self._capture_max_bytes = capture_max_bytes
        self._capture_slots = threading.Semaphore(CAPTURES_IN_FLIGHT)
        self._publish = publish  # None: no acknowledgement to devices (they keep their copies)
        self._models: dict[str, type[BaseModel]] = {
            topics.PRESENCE: Presence,
            topics.TELEMETRY: Telemetry,
            topics.EVENTS: Event,
            topics.OTA_STATUS: OtaStatus,
            topics.ENROLL: EnrollRequest,
            topics.CAPTURE: CaptureUpload,
        }

    def _insert_statement(self, table: sa.Table, names: tuple[str, ...]) -> Any:
        """New rows only (``ON CONFLICT DO NOTHING``), returning the ``msg_id`` of each one stored."""
        if self._postgres:
            return bulk.insert_new(table, names, table.c.msg_id)
        return insert_ignoring_duplicates(self.engine, table).returning(table.c.msg_id)

    def filters(self, suffixes: tuple[str, ...] | None = None, *, share_group: str | None = None) -> list[str]:
        """The subscriptions (QoS 1) for ``suffixes`` (default: all); with ``share_group``, MQTT 5
        shared subscriptions (``$share/GROUP/…``): the broker hands each message to one member."""
        plain = [topics.all_devices_filter(self.namespace, s) for s in (suffixes or self.SUFFIXES)]
        return [f"$share/{share_group}/{f}" for f in plain] if share_group else plain

    # -- the network thread -----------------------------------------------------------------

    def handle(self, topic: str, payload: bytes, receipt: Any = None) -> bool:
        """Take one message; True when it was one of ours (queued or counted). ``receipt`` is
        acknowledged once the message is committed (at once when it is dropped)."""
        parsed = topics.parse_topic(self.namespace, topic)
        if parsed is None or parsed.scope != "devices" or parsed.suffix not in self._models:
            return False
        with self._lock:
            self.counters.messages += 1
        if parsed.name in RESERVED_USERNAMES:
            # The bootstrap account passes the devices' ACL patterns under its own name: whatever
            # it says there is not a device's word (nor the operator account's).
            self._count("not_a_device")
            log.debug("ignored %s on the topic of broker account %r (not a device)", parsed.suffix, parsed.name)
            self._ack([receipt])
            return True
        try:
            message: Any = self._models[parsed.suffix].model_validate_json(payload)
        except ValidationError as exc:
            self._count("malformed")
            log.debug("ignored malformed %s from %s: %s", parsed.suffix, parsed.name, exc)
            self._ack([receipt])
            return True
        if message.device_id != parsed.name:
            self._count("impersonating")
            log.warning(
                "ignored %s on the topic of %r claiming device %r", parsed.suffix, parsed.name, message.device_id
            )
            self._ack([receipt])
            return True
        if isinstance(message, CaptureUpload):
            message = self._capture(message)
            if message is None:
                self._ack([receipt])
                return True
            self._capture_slots.acquire()  # released once the writer has stored it
        with self._lock:
            self._enqueued += 1
        self._queue.put((message, receipt))  # blocks when full: back-pressure, never a silent drop
        return True

    def _capture(self, upload: CaptureUpload) -> Capture | CapturePart | None:
        """The upload (a whole file or one chunk) and its checked bytes, or None (counted) when it
        is over the cap or its bytes do not match what it declares."""
        whole_cap = min(self._capture_max_bytes, MAX_UPLOAD_BYTES)  # one message carries no more
        if upload.size > (whole_cap if upload.count == 1 else self._capture_max_bytes):
            self._count("capture_refused")
            log.warning(
                "refused capture %s of %s: %d bytes, over the %d-byte cap",
                upload.name,
                upload.device_id,
                upload.size,
                whole_cap if upload.count == 1 else self._capture_max_bytes,
            )
            return None
        try:
            content = upload.content() if upload.count == 1 else upload.chunk()
        except EdgeSDKError as exc:
            self._count("malformed")
            log.warning("ignored capture from %s: %s", upload.device_id, exc)
            return None
        kind = Capture if upload.count == 1 else CapturePart
        return kind(upload.model_copy(update={"data": ""}), content)  # the base64 text is not kept

    def _count(self, name: str, by: int = 1) -> None:
        with self._lock:
            setattr(self.counters, name, getattr(self.counters, name) + by)

    def _ack(self, receipts: list[Any]) -> None:
        wanted = [r for r in receipts if r is not None]
        if wanted:
            self._acknowledge(wanted)

    # -- the writer thread ------------------------------------------------------------------

    def start(self) -> Ingest:
        self._writer = threading.Thread(target=self._write_loop, name="fleet-ingest-writer", daemon=True)
        self._writer.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Write (and acknowledge) what is queued, then stop the writer."""
        if self._writer is not None:
            self._queue.put(_STOP)
            self._writer.join(timeout)
            self._writer = None
        self._flush_counters(force=True)

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
            try:
                batch: list[Any] = [self._queue.get(timeout=_COUNTERS_EVERY_S)]
            except queue.Empty:
                self._flush_counters()  # idle: the last batch's counts are persisted too
                continue
            deadline = time.monotonic() + self._flush_s
            while len(batch) < self._batch_max and batch[-1] is not _STOP:
                remaining = deadline - time.monotonic()
                try:
                    batch.append(self._queue.get(timeout=remaining) if remaining > 0 else self._queue.get_nowait())
                except queue.Empty:
                    break
            stop = batch[-1] is _STOP
            items = [item for item in batch if item is not _STOP]
            if items:
                self._store(items)
                for _ in range(sum(isinstance(m, (Capture, CapturePart)) for m, _receipt in items)):
                    self._capture_slots.release()
                with self._lock:
                    self._written += len(items)
            self._flush_counters(force=stop)
            if stop:
                return

    def _store(self, items: list[tuple[Any, Any]]) -> None:
        """Commit ``items`` and acknowledge them: retried while the database is unreachable or
        deadlocked; a batch it refuses is split so only the refused messages are dropped."""
        messages = [m for m, _ in items]
        receipts = [r for _, r in items]
        attempt = 0
        while True:
            try:
                self._write_batch(messages)
                self._ack(receipts)
                return
            except EdgeSDKError as exc:
                transient = _transient(exc)
                if transient and attempt >= len(_RETRY_S):
                    # The database is away: keep the messages unacknowledged and keep trying (the
                    # queue fills, the network thread blocks, the broker holds the rest).
                    log.error("fleet database unavailable, retrying a batch of %d: %s", len(items), exc)
                    time.sleep(_RETRY_S[-1])
                    continue
                if transient:
                    time.sleep(_RETRY_S[attempt])
                    attempt += 1
                    continue
                if len(items) == 1:
                    self._count("unstorable")
                    log.error("dropped a device message the database refuses: %s", exc)
                    self._ack(receipts)
                    return
                break
        half = len(items) // 2
        self._store(items[:half])
        self._store(items[half:])

    def _write_batch(self, items: list[Any]) -> None:
        telemetry = [m for m in items if isinstance(m, Telemetry)]
        events = [m for m in items if isinstance(m, Event)]
        presence = [m for m in items if isinstance(m, Presence)]
        statuses = [m for m in items if isinstance(m, OtaStatus)]
        requests = [m for m in items if isinstance(m, EnrollRequest)]
        captures = [m for m in items if isinstance(m, Capture)]
        parts = [m for m in items if isinstance(m, CapturePart)]
        with Transaction(self.engine, self.store.where) as db:
            seen: dict[str, float] = {}
            for m in items:
                if not isinstance(m, EnrollRequest):  # anyone with the bootstrap secret may send one
                    said = m.upload if isinstance(m, (Capture, CapturePart)) else m
                    seen[said.device_id] = max(seen.get(said.device_id, 0.0), said.ts.timestamp())
            self._touch_devices(db, seen)
            stored_telemetry = self._insert(
                db, self._telemetry_insert, _TELEMETRY_COLUMNS, [_telemetry_row(m) for m in telemetry]
            )
            self._quality.write(db, telemetry)
            stored_events = self._insert(db, self._event_insert, _EVENT_COLUMNS, [_event_row(m) for m in events])
            stored_history = self._insert(
                db, self._history_insert, _HISTORY_COLUMNS, [_history_row(m) for m in statuses]
            )
            for announcement in sorted(presence, key=lambda p: p.device_id):  # stable: arrival order per device
                self._apply_presence(db, announcement)
            self._apply_telemetry(db, telemetry)
            self._apply_ota_states(db, statuses)
            refused = self._enroll_all(db, requests)
            written = self._captures.write(db, captures, parts)
        self._acknowledge_captures(written)
        for status in statuses:  # its own transaction; a kill before it is redelivered (not acked)
            if status.command_sha256 is None:
                self.store.record_status(status)
        # Refusals are judged against the commands issued (counted, or a security event).
        counted, security_events = self._refusals.handle(statuses, events)
        with self._lock:
            c = self.counters
            c.telemetry += stored_telemetry
            c.events += stored_events
            c.ota_status += stored_history
            stored = stored_telemetry + stored_events + stored_history
            c.duplicates += len(telemetry) + len(events) + len(statuses) - stored
            c.presence += len(presence)
            c.enroll_requests += len(requests) - refused
            c.enroll_refused += refused
            c.refusals_counted += counted
            c.security_events += security_events
            c.capture_stored += written.stored
            c.capture_evicted += written.evicted
            c.capture_refused += written.refused
            c.capture_corrupt += written.corrupt
            c.capture_expired += written.expired
            c.duplicates += written.duplicates

    def _acknowledge_captures(self, written: CaptureWrite) -> None:
        """Tell each device which of its files the service now holds (after the commit): it deletes
        its copy. QoS 1 to the device's session; one lost is resent at the file's next redelivery."""
        if self._publish is None:
            return
        for device_id, sha256 in dict.fromkeys(written.held):
            topic = topics.device_topic(self.namespace, device_id, topics.CAPTURE_ACK)
            try:
                self._publish(topic, CaptureAck(device_id=device_id, sha256=sha256).model_dump_json().encode(), qos=1)
            except EdgeSDKError as exc:  # the broker is away: the device keeps its copy for now
                log.warning("capture of %s not acknowledged to the device: %s", device_id, exc)

    def _insert(self, db: Any, statement: Any, names: tuple[str, ...], rows: list[dict[str, Any]]) -> int:
        """Insert ``rows`` (each with exactly the columns ``names``), skipping duplicates; how many were new."""
        if not rows:
            return 0
        if self._postgres:
            return len(db.execute(statement, bulk.arrays(rows, names)).all())
        return len(db.execute(statement, rows).all())

    def _touch_devices(self, db: Any, seen: dict[str, float]) -> None:
        """Create unknown devices and move ``last_seen`` forward, in device-id order."""
        table = schema.devices
        order = sorted(seen)
        if not order:  # a batch of enrollment requests only: they make no device rows
            return
        now = time.time()
        rows = [{"device_id": d, "groups": "[]", "first_seen": now, "last_seen": seen[d]} for d in order]
        if self._postgres:
            db.execute(self._device_touch, bulk.arrays(rows, _TOUCH_COLUMNS))  # locks them in this order
            return
        db.execute(self._device_insert, rows)
        newer = sa.bindparam("seen_ts", type_=sa.Float)
        db.execute(
            table.update()
            .where((table.c.device_id == sa.bindparam("device")) & (table.c.last_seen < newer))
            .values(last_seen=newer),
            [{"device": d, "seen_ts": seen[d]} for d in order],
        )

    def _apply_presence(self, db: Any, presence: Presence) -> None:
        table = schema.devices
        if not presence.online:
            # Offline always applies, whatever its ts: a Last Will is built when the device's link
            # starts, so it is *older* than the online presence it follows. Presence comes on one
            # plain subscription, in the order the broker published it.
            db.execute(table.update().where(table.c.device_id == presence.device_id).values(online=False))
            return
        ts = presence.ts.timestamp()
        values: dict[str, Any] = {
            "online": presence.online,
            "groups": json.dumps(sorted(presence.groups)),
            "presence_ts": ts,
        }
        for name in ("profile", "agent_version", "public_key"):
            if getattr(presence, name) is not None:
                values[name] = getattr(presence, name)
        if presence.model is not None:
            values.update(_model_columns(presence.model))
        newer = table.c.presence_ts.is_(None) | (table.c.presence_ts <= ts)  # an older online arriving late: no
        db.execute(table.update().where((table.c.device_id == presence.device_id) & newer).values(**values))

    def _apply_telemetry(self, db: Any, telemetry: list[Telemetry]) -> None:
        newest: dict[str, Telemetry] = {}
        for report in telemetry:
            if report.device_id not in newest or report.seq > newest[report.device_id].seq:
                newest[report.device_id] = report
        if not newest:
            return
        table = schema.devices
        with_model = [r for r in newest.values() if r.model is not None]
        without_model = [r for r in newest.values() if r.model is None]
        if self._postgres:
            self._apply_telemetry_arrays(db, with_model, without_model)
            return
        seq = sa.bindparam("report_seq", type_=sa.BigInteger)
        match = (table.c.device_id == sa.bindparam("device")) & (
            table.c.telemetry_seq.is_(None) | (table.c.telemetry_seq <= seq)
        )
        if with_model:
            columns = _model_columns(with_model[0].model)
            db.execute(
                table.update()
                .where(match)
                .values(telemetry_seq=seq, **{name: sa.bindparam(f"m_{name}") for name in columns}),
                [
                    {"device": r.device_id, "report_seq": r.seq}
                    | {f"m_{k}": v for k, v in _model_columns(r.model).items()}
                    for r in sorted(with_model, key=lambda r: r.device_id)
                ],
            )
        if without_model:
            db.execute(
                table.update().where(match).values(telemetry_seq=seq),
                [
                    {"device": r.device_id, "report_seq": r.seq}
                    for r in sorted(without_model, key=lambda r: r.device_id)
                ],
            )

    def _apply_telemetry_arrays(self, db: Any, with_model: list[Telemetry], without_model: list[Telemetry]) -> None:
        """PostgreSQL: each device's newest report in one UPDATE per kind (rows already locked by
        ``_touch_devices``, in device-id order)."""
        for reports, names in ((with_model, _TELEMETRY_MODEL_COLUMNS), (without_model, ())):
            if not reports:
                continue
            rows = [
                {"device_id": r.device_id, "telemetry_seq": r.seq} | (_model_columns(r.model) if names else {})
                for r in sorted(reports, key=lambda r: r.device_id)
            ]
            columns = ("device_id", "telemetry_seq", *names)
            statement = bulk.update_from(
                schema.devices,
                columns,
                "device_id",
                {name: name for name in columns[1:]},
                where=lambda table, batch: (
                    table.c.telemetry_seq.is_(None) | (table.c.telemetry_seq <= batch.c.telemetry_seq)
                ),
            )
            db.execute(statement, bulk.arrays(rows, columns))

    def _apply_ota_states(self, db: Any, statuses: list[OtaStatus]) -> None:
        newest: dict[str, OtaStatus] = {}
        for status in statuses:
            if status.command_sha256 is not None:
                continue  # a refused command leaves the device's update where it was
            if status.device_id not in newest or status.ts >= newest[status.device_id].ts:
                newest[status.device_id] = status
        table = schema.devices
        for device_id in sorted(newest):
            status = newest[device_id]
            db.execute(
                table.update()
                .where(table.c.device_id == device_id)
                .values(ota_state=status.state, ota_deployment_id=status.deployment_id)
            )

    def _enroll_all(self, db: Any, requests: list[EnrollRequest]) -> int:
        """Store ``requests``; returns how many were refused because ``max_pending_enrollments``
        requests are waiting already (a request for an id that has a row is never refused)."""
        if not requests:
            return 0
        table = schema.enrollment_requests
        pending = db.execute(sa.select(sa.func.count()).select_from(table).where(table.c.status == "pending")).scalar()
        refused = 0
        for request in requests:
            if pending >= self._max_pending:
                known = db.execute(sa.select(table.c.device_id).where(table.c.device_id == request.device_id)).first()
                if known is None:
                    refused += 1
                    continue
            if self._enroll(db, request):
                pending += 1
        if refused:
            log.warning(
                "refused %d enrollment request(s) for new device ids: %d are pending already (the limit); "
                "approve or revoke them, or raise --max-pending-enrollments",
                refused,
                pending,
            )
        return refused

    def _enroll(self, db: Any, request: EnrollRequest) -> bool:
        """Store one request; True when it made a new (pending) row."""
        table = schema.enrollment_requests
        values = {
            "public_key": request.public_key,
            "key_id": request.key_id,
            "profile": request.profile,
            "agent_version": request.agent_version,
            "hostname": request.hostname,
            "requested": request.ts.timestamp(),
        }
        statement = self._enroll_insert.values(device_id=request.device_id, status="pending", **values)
        if inserted_new_row(db, statement, table.c.device_id):
            return True
        # Known device, another key: never written over the key on record (nor its status). The
        # shared bootstrap account may write any device's enroll topic, so a second announcement
        # can be an attacker's, sent between the operator's out-of-band check and the approval.
        # It is kept beside the first as the offered key (the latest one); approving it needs
        # its own full key id, and ``replace`` for an approved device. The same key changes nothing.
        offered = db.execute(
            table.update()
            .where(
                (table.c.device_id == request.device_id)
                & (table.c.key_id != request.key_id)
                & (table.c.offered_key_id.is_(None) | (table.c.offered_key_id != request.key_id))
            )
            .values(
                offered_public_key=request.public_key,
                offered_key_id=request.key_id,
                offered_at=request.ts.timestamp(),
            )
        )
        if offered.rowcount == 1:
            log.warning(
                "device %s announced another key (key id %s) beside the one it requested with; kept as an "
                "offered key, approved only by its full key id",
                request.device_id,
                request.key_id,
            )
        return False

    def _flush_counters(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._counters_at < _COUNTERS_EVERY_S:
            return
        self._counters_at = now
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


#: Columns of the rows built below (``_telemetry_row`` and friends), for the array statements.
_TELEMETRY_COLUMNS = (
    "device_id", "msg_id", "seq", "ts", "model_version", "precision", "requests", "p50_ms", "p95_ms", "p99_ms",
    "throughput_rps", "errors", "temperature_c", "cpu_percent", "rss_mb", "queue_depth", "outbox_depth",
    "dropped_messages", "governor_state", "power_source",
)  # fmt: skip
_EVENT_COLUMNS = ("device_id", "msg_id", "seq", "ts", "event", "detail")
_HISTORY_COLUMNS = ("device_id", "deployment_id", "msg_id", "ts", "state", "reason", "progress", "model_release")
_TOUCH_COLUMNS = ("device_id", "groups", "first_seen", "last_seen")
_TELEMETRY_MODEL_COLUMNS = (
    "model_name", "model_version", "model_release", "variant", "model_sha256", "precision", "runtime",
)  # fmt: skip


def _transient(exc: BaseException) -> bool:
    """A lost connection or a deadlock (worth retrying), not data the database refuses."""
    cause = exc.__cause__
    if isinstance(cause, OperationalError):
        return True
    return isinstance(cause, DBAPIError) and bool(cause.connection_invalidated)


def add_counters(engine: Any, where: str, deltas: dict[str, int]) -> None:
    """Add ``deltas`` to the persisted counters of the same names (safe from several workers:
    rows are created with ``ON CONFLICT DO NOTHING`` and incremented in name order)."""
    table = schema.service_counters
    names = sorted(deltas)
    with Transaction(engine, where) as db:
        db.execute(insert_ignoring_duplicates(engine, table), [{"name": n, "value": 0} for n in names])
        db.execute(
            table.update()
            .where(table.c.name == sa.bindparam("counter"))
            .values(value=table.c.value + sa.bindparam("by")),
            [{"counter": n, "by": deltas[n]} for n in names],
        )


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


def _event_row(message: Event) -> dict[str, Any]:
    return {
        "device_id": message.device_id,
        "msg_id": message.msg_id,
        "seq": message.seq,
        "ts": message.ts.timestamp(),
        "event": message.event,
        "detail": json.dumps(message.detail),
    }


def _history_row(status: OtaStatus) -> dict[str, Any]:
    return {
        "device_id": status.device_id,
        "deployment_id": status.deployment_id,
        "msg_id": status.msg_id,
        "ts": status.ts.timestamp(),
        "state": status.state,
        "reason": status.reason,
        "progress": status.progress,
        "model_release": status.model.release if status.model else None,
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
