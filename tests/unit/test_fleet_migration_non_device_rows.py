"""Migration 0006 on a database from before issue 37's enrollment fix: the device rows that
enrollment requests and the reserved broker accounts made are removed, real devices stay."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

pytest.importorskip("sqlalchemy", reason="needs the fleet-service extra")
pytest.importorskip("alembic", reason="needs the fleet-service extra")

import sqlalchemy as sa  # noqa: E402

from edgesdk.fleet.service import schema  # noqa: E402
from edgesdk.fleet.service.database import _MIGRATIONS, migrate, open_engine  # noqa: E402


def _upgrade_to(engine: sa.Engine, revision: str) -> None:
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(_MIGRATIONS))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, revision)


def _old_rows(engine: sa.Engine) -> None:
    """What the ingest before 7857e52 left: rows for a flood of enrollment ids and for the
    bootstrap account beside a real device that spoke and an approved one that only enrolled."""
    now = time.time()

    def device(device_id: str, **values: object) -> dict[str, object]:
        return {"device_id": device_id, "groups": "[]", "first_seen": now, "last_seen": now, **values}

    def request(device_id: str, status: str) -> dict[str, object]:
        return {"device_id": device_id, "status": status, "public_key": "k" * 43, "key_id": "id", "requested": now}

    with engine.begin() as db:
        rows = [device("flood-1"), device("flood-2"), device("fleet-operator"), device("cam-events-only")]
        rows += [device("edgesdk-enroll", presence_ts=now, groups='["cams"]'), device("cam-real", presence_ts=now)]
        for row in rows:  # one by one: an executemany takes its columns from the first row
            db.execute(schema.devices.insert().values(**row))
        db.execute(
            schema.enrollment_requests.insert(),
            [request("flood-1", "pending"), request("flood-2", "approved"), request("cam-real", "approved")]
            + [request("cam-events-only", "approved"), request("edgesdk-enroll", "pending")],
        )
        event = {"ts": now, "msg_id": "m1", "seq": 1, "event": "ota_refused", "detail": "{}"}
        db.execute(schema.events.insert(), [{**event, "device_id": "cam-events-only"}])
        db.execute(schema.events.insert(), [{**event, "device_id": "edgesdk-enroll"}])


def test_migration_0006_removes_rows_enrollment_and_reserved_accounts_made(tmp_path: Path) -> None:
    engine = open_engine(f"sqlite:///{tmp_path / 'old.db'}")
    try:
        _upgrade_to(engine, "0005")
        _old_rows(engine)
        assert migrate(engine) >= "0006"  # the head: later revisions leave these rows be
        with engine.connect() as db:
            devices = sorted(db.execute(sa.select(schema.devices.c.device_id)).scalars())
            requests = sorted(db.execute(sa.select(schema.enrollment_requests.c.device_id)).scalars())
            event_devices = sorted(db.execute(sa.select(schema.events.c.device_id)).scalars())
        assert devices == ["cam-events-only", "cam-real"]
        assert requests == ["cam-events-only", "cam-real", "flood-1", "flood-2"]  # decisions stay
        assert event_devices == ["cam-events-only"]
    finally:
        engine.dispose()
