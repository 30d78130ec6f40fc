"""The standalone ``fleet push`` database: the service's store on a SQLite file, and the upgrade of
a file the old sqlite3 store wrote (its rows carried over, the old file kept beside it)."""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

pytest.importorskip("sqlalchemy", reason="the deployment store needs the fleet extra (sqlalchemy, alembic)")

from edgesdk.fleet.service.operator_db import open_rollout_store  # noqa: E402
from edgesdk.schemas.messages import Deployment, HealthCriteria  # noqa: E402

#: The tables of the old sqlite3 store (edgesdk/fleet/deployments.py before the one store), as
#: its users' files have them.
OLD_SCHEMA = """
CREATE TABLE deployments (id TEXT PRIMARY KEY, created REAL NOT NULL, updated REAL NOT NULL,
    bundle_path TEXT NOT NULL, message TEXT NOT NULL, plan TEXT NOT NULL, state TEXT NOT NULL,
    wave INTEGER NOT NULL DEFAULT -1, reason TEXT NOT NULL DEFAULT '');
CREATE TABLE issuers (key_id TEXT PRIMARY KEY, sequence INTEGER NOT NULL);
CREATE TABLE follow_ups (id INTEGER PRIMARY KEY AUTOINCREMENT, deployment_id TEXT NOT NULL REFERENCES deployments(id),
    action TEXT NOT NULL, wave INTEGER, devices TEXT NOT NULL, ttl_s REAL NOT NULL, created REAL NOT NULL, delivered REAL);
CREATE TABLE issued_commands (digest TEXT PRIMARY KEY, deployment_id TEXT NOT NULL REFERENCES deployments(id),
    action TEXT NOT NULL, targets TEXT NOT NULL, sequence INTEGER NOT NULL, issued REAL NOT NULL);
CREATE TABLE devices (deployment_id TEXT NOT NULL REFERENCES deployments(id), device_id TEXT NOT NULL,
    wave INTEGER NOT NULL, state TEXT NOT NULL DEFAULT 'PENDING', reason TEXT NOT NULL DEFAULT '', progress REAL,
    model_release INTEGER, sent REAL, updated REAL, status_ts TEXT, PRIMARY KEY (deployment_id, device_id));
"""


def _template() -> Deployment:
    now = datetime.now(timezone.utc)
    return Deployment(
        deployment_id="dep-1",
        issued_at=now,
        expires_at=now + timedelta(hours=1),
        sequence=0,
        targets=["a", "b"],
        model_name="digits",
        model_version="1.1.0",
        release=2,
        bundle_sha256="0" * 64,
        bundle_size=10,
        chunk_sha256=["0" * 64],
        health=HealthCriteria(probation_s=1),
    )


def _old_file(path: Path, template: Deployment) -> None:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")  # as the old store kept it
    db.executescript(OLD_SCHEMA)
    db.execute(
        "INSERT INTO deployments VALUES (?,?,?,?,?,?,?,?,?)",
        (
            "dep-1",
            1.0,
            2.0,
            "/b.edgepkg",
            template.model_dump_json(),
            json.dumps({"canary": 0.3}),
            "ABORTED",
            1,
            "2 of 3",
        ),
    )
    db.execute("INSERT INTO issuers VALUES ('key-1', 99999999999999)")
    db.execute("INSERT INTO follow_ups VALUES (1, 'dep-1', 'rollback', 1, '[\"b\"]', 60.0, 3.0, NULL)")
    db.execute("INSERT INTO issued_commands VALUES (?, 'dep-1', 'install', '[\"a\"]', 7, 1.5)", ("d" * 64,))
    db.executemany(
        "INSERT INTO devices VALUES ('dep-1', ?, ?, ?, ?, NULL, 2, 1.6, 2.5, ?)",
        [("a", 0, "COMMITTED", "", "t1"), ("b", 1, "FAILED", "smoke test failed", "t2")],
    )
    db.close()


def test_a_file_of_the_old_sqlite3_store_is_upgraded_with_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "fleet.sqlite3"
    _old_file(path, _template())
    store = open_rollout_store(path)
    row = store.get("dep-1")
    assert (row.state, row.wave, row.reason, row.plan) == ("ABORTED", 1, "2 of 3", {"canary": 0.3})
    assert [(d.device_id, d.state, d.reason) for d in store.devices("dep-1")] == [
        ("a", "COMMITTED", ""),
        ("b", "FAILED", "smoke test failed"),
    ]
    assert store.next_sequence("key-1") == 100000000000000  # above what the old file issued
    assert [(f.action, f.devices) for f in store.pending_follow_ups()] == [("rollback", ("b",))]
    # The old file is kept beside the new one; opening again changes nothing.
    assert (tmp_path / "fleet.sqlite3.v1").is_file()
    store.engine.dispose()
    assert open_rollout_store(path).get("dep-1").state == "ABORTED"


def test_fleet_status_on_a_file_that_is_not_a_database_is_one_error_line(tmp_path: Path, edgesdk_cli) -> None:
    junk = tmp_path / "fleet.sqlite3"
    junk.write_bytes(b"not a database, just some bytes of another file" * 50)
    proc = edgesdk_cli("fleet", "status", "--db", str(junk))
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert f"bad --db '{junk}': not a SQLite database" in proc.stderr
