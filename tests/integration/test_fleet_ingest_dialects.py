"""The ingest writes a batch as arrays on PostgreSQL (``bulk.py``) and with executemany on SQLite:
the same device messages — duplicates, reports out of order, with and without a model, events,
OTA statuses, devices seen for the first time and again — leave the same rows in both, and
the same counters. Compared row by row, so a column the array statements forget shows."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sqlalchemy", reason="needs the fleet-service extra")

import sqlalchemy as sa  # noqa: E402

from edgesdk.fleet.service import schema  # noqa: E402
from edgesdk.fleet.service.database import migrate, open_engine  # noqa: E402
from edgesdk.fleet.service.ingest import _EVENT_COLUMNS, _HISTORY_COLUMNS, _TELEMETRY_COLUMNS, Ingest, read_counters  # noqa: E402
from edgesdk.fleet.service.store import SqlRolloutStore  # noqa: E402
from tests.pg_helpers import throwaway_cluster  # noqa: E402

pytestmark = pytest.mark.integration

BASE = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc)
MODEL = {"name": "digits", "version": "1.0.0", "release": 1, "variant": "onnx-fp32", "sha256": "a" * 64}


def _telemetry(device: str, seq: int, *, model: bool = True, msg: str | None = None) -> bytes:
    body: dict[str, Any] = {
        "device_id": device,
        "msg_id": msg or f"{device}-t{seq}",
        "seq": seq,
        "ts": (BASE + timedelta(seconds=10 * seq)).isoformat(),
        "latency": {"onnx-fp32": {"count": 5 + seq, "p50_ms": 1.0, "p95_ms": 2.0 + seq, "p99_ms": 3.0}},
        "temperatures_c": {"soc": 40.0 + seq},
        "outbox_depth": seq % 3,
    }
    if model:
        body["model"] = MODEL | {"release": 1 + seq // 4, "version": f"1.{seq // 4}.0"}
    return json.dumps(body).encode()


def _messages() -> list[tuple[str, bytes]]:
    out: list[tuple[str, bytes]] = []
    for device in ("dev-b", "dev-a", "dev-c"):
        for seq in (0, 2, 1, 5, 3):  # out of order: the device row keeps the newest seq
            out.append((f"edgesdk/devices/{device}/telemetry", _telemetry(device, seq, model=device != "dev-c")))
    out.append(("edgesdk/devices/dev-a/telemetry", _telemetry("dev-a", 2)))  # a redelivery
    event = {"device_id": "dev-b", "msg_id": "dev-b-e1", "seq": 1, "ts": BASE.isoformat(), "event": "governor"}
    out.append(("edgesdk/devices/dev-b/events", json.dumps(event | {"detail": {"to": "int8"}}).encode()))
    out.append(("edgesdk/devices/dev-b/events", json.dumps(event).encode()))  # same msg_id again
    # A refusal of a command this service never issued: one security event, however often
    # QoS 1 redelivers it (the count read RETURNING, not psycopg's rowcount of -1).
    refusal = {"command_sha256": "f" * 64, "why": "bad_signature", "reason": "tampered", "deployment_id": "d9"}
    forged = {"device_id": "dev-a", "msg_id": "dev-a-r1", "seq": 9, "ts": BASE.isoformat(), "event": "ota_refused"}
    out.append(("edgesdk/devices/dev-a/events", json.dumps(forged | {"detail": refusal}).encode()))
    out.append(("edgesdk/devices/dev-a/events", json.dumps(forged | {"detail": refusal}).encode()))
    status = {"device_id": "dev-c", "msg_id": "dev-c-s1", "ts": BASE.isoformat(), "deployment_id": "d1"}
    out.append(("edgesdk/devices/dev-c/ota/status", json.dumps(status | {"state": "DOWNLOADING"}).encode()))
    return out


def _ingest(url: str) -> tuple[dict[str, list[tuple[Any, ...]]], dict[str, int]]:
    engine = open_engine(url)
    migrate(engine)
    ingest = Ingest(engine, "edgesdk", SqlRolloutStore(engine), batch_max=7).start()  # several batches
    for topic, payload in _messages():
        assert ingest.handle(topic, payload), topic
    assert ingest.drain(30)
    ingest.stop()
    tables: dict[str, list[tuple[Any, ...]]] = {}
    with engine.connect() as db:
        for table, columns in (
            (schema.telemetry, _TELEMETRY_COLUMNS),
            (schema.events, _EVENT_COLUMNS),
            (schema.ota_history, _HISTORY_COLUMNS),
        ):
            rows = db.execute(sa.select(*[table.c[c] for c in columns]).order_by(table.c.msg_id)).all()
            tables[table.name] = [tuple(r) for r in rows]
        devices = db.execute(sa.select(schema.devices).order_by(schema.devices.c.device_id)).all()
        # first_seen is the wall clock of the batch: equal within a run, not across two runs.
        tables["devices"] = [tuple(v for k, v in r._mapping.items() if k != "first_seen") for r in devices]
    counters = read_counters(engine, SqlRolloutStore(engine).where)
    engine.dispose()
    return tables, counters


@pytest.fixture(scope="module")
def postgres() -> Any:
    with throwaway_cluster() as cluster:
        yield cluster


def test_postgresql_arrays_store_what_sqlite_executemany_stores(postgres: Any, tmp_path: Path) -> None:
    sqlite_rows, sqlite_counters = _ingest(f"sqlite:///{tmp_path / 'fleet.sqlite3'}")
    pg_rows, pg_counters = _ingest(postgres.create_database("fleet_dialects"))
    assert len(sqlite_rows["telemetry"]) == 15 and len(sqlite_rows["events"]) == 2
    assert sqlite_counters["duplicates"] == 3 and sqlite_counters["telemetry"] == 15
    assert sqlite_counters["security_events"] == 1
    by_device = {r[0]: r for r in sqlite_rows["devices"]}
    names = [c.name for c in schema.devices.columns if c.name != "first_seen"]
    a = dict(zip(names, by_device["dev-a"], strict=True))
    assert a["telemetry_seq"] == 5 and a["model_release"] == 2 and a["model_version"] == "1.1.0", a
    assert a["last_seen"] == (BASE + timedelta(seconds=50)).timestamp()
    assert dict(zip(names, by_device["dev-c"], strict=True))["model_name"] is None  # never sent a model
    assert dict(zip(names, by_device["dev-c"], strict=True))["ota_state"] == "DOWNLOADING"
    for table in sqlite_rows:
        assert pg_rows[table] == sqlite_rows[table], table
    assert pg_counters == sqlite_counters
