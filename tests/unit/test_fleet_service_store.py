"""The fleet service's database parts without a broker: migrations, the rollout store (opened as
``fleet push`` opens its file and as the service opens its database), the ingest's refusals,
downsampling."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

pytest.importorskip("sqlalchemy", reason="the fleet service needs the fleet-service extra (sqlalchemy, alembic)")
pytest.importorskip("alembic", reason="the fleet service needs the fleet-service extra (sqlalchemy, alembic)")

from edgesdk.errors import UsageError  # noqa: E402
from edgesdk.fleet.deployments import ABORTED, FollowUp  # noqa: E402
from edgesdk.fleet.service import schema  # noqa: E402
from edgesdk.fleet.service.database import migrate, open_engine  # noqa: E402
from edgesdk.fleet.service.ingest import Ingest, read_counters  # noqa: E402
from edgesdk.fleet.service.operator_db import open_rollout_store  # noqa: E402
from edgesdk.fleet.service.retention import Retention, downsample, prune  # noqa: E402
from edgesdk.fleet.service.store import SqlRolloutStore  # noqa: E402
from edgesdk.schemas.messages import Deployment, HealthCriteria, OtaStatus  # noqa: E402

NOW = datetime.now(timezone.utc)


def _template(deployment_id: str = "dep-1") -> Deployment:
    return Deployment(
        deployment_id=deployment_id,
        issued_at=NOW,
        expires_at=NOW + timedelta(hours=1),
        sequence=0,
        targets=["a", "b", "c"],
        model_name="digits",
        model_version="1.1.0",
        release=2,
        bundle_sha256="0" * 64,
        bundle_size=10,
        chunk_sha256=["0" * 64],
        health=HealthCriteria(probation_s=1),
    )


@pytest.fixture(params=["operator-file", "service-db"])
def store(request, tmp_path: Path):
    """The one store, opened as ``fleet push`` opens its file and as the service opens its database."""
    if request.param == "operator-file":
        opened = open_rollout_store(tmp_path / "fleet.sqlite3")
        yield opened
        opened.engine.dispose()
        return
    engine = open_engine(f"sqlite:///{tmp_path / 'service.sqlite3'}")
    migrate(engine)
    yield SqlRolloutStore(engine)
    engine.dispose()


def test_both_stores_keep_deployments_statuses_sequences_and_follow_ups(store, tmp_path: Path) -> None:
    bundle = tmp_path / "b.edgepkg"
    bundle.write_bytes(b"x")
    store.create(_template(), bundle, {"canary": 0.3}, [["a"], ["b", "c"]])
    with pytest.raises(UsageError, match="already exists"):
        store.create(_template(), bundle, {}, [["a"]])
    assert store.wave_count("dep-1") == 2
    assert [d.device_id for d in store.devices("dep-1", 1)] == ["b", "c"]
    store.mark_sent("dep-1", ["a"])
    assert store.devices("dep-1", 0)[0].state == "SENT"

    def status(state: str, seconds: float, progress: float | None = None) -> OtaStatus:
        return OtaStatus(
            device_id="a",
            deployment_id="dep-1",
            msg_id=f"m-{state}-{seconds}",
            ts=NOW + timedelta(seconds=seconds),
            state=state,
            progress=progress,
        )

    assert store.record_status(status("PROBATION", 2))
    assert not store.record_status(status("DOWNLOADING", 1))  # older: refused
    assert not store.record_status(status("DOWNLOADING", 3, progress=0.5))  # a late tick hides nothing
    assert store.devices("dep-1", 0)[0].state == "PROBATION"
    first = store.next_sequence("key")
    assert store.next_sequence("key") > first  # strictly above, and never below the clock in ms
    follow_up = FollowUp.owed("dep-1", "rollback", ["a"], wave=0, ttl_s=60)
    store.set_state("dep-1", ABORTED, reason="canary failed", follow_up=follow_up)
    [pending] = store.pending_follow_ups("dep-1")
    assert (pending.action, pending.devices, pending.wave) == ("rollback", ("a",), 0)
    store.follow_up_delivered(pending.follow_up_id)
    assert store.pending_follow_ups() == []
    summary = store.summary("dep-1")
    assert summary["state"] == ABORTED and summary["by_state"] == {"PROBATION": 1, "PENDING": 2}
    with pytest.raises(UsageError, match="'nope' not found"):
        store.get("nope")


def test_migrated_database_matches_the_schema_module(tmp_path: Path) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    engine = open_engine(f"sqlite:///{tmp_path / 's.sqlite3'}")
    assert migrate(engine) == migrate(engine)  # a second start migrates nothing
    with engine.connect() as connection:
        diff = compare_metadata(MigrationContext.configure(connection), schema.metadata)
    assert diff == [], diff
    engine.dispose()


def test_bad_database_urls_are_usage_errors() -> None:
    from edgesdk.errors import UsageError

    with pytest.raises(UsageError, match="'mysql://x/y'"):
        open_engine("mysql://x/y")
    with pytest.raises(UsageError, match="'not a url'"):
        open_engine("not a url")


def _telemetry(device: str, seq: int, ts: datetime, p95: float, claimed: str | None = None) -> bytes:
    return json.dumps(
        {
            "device_id": claimed or device,
            "msg_id": f"{device}-{seq}",
            "seq": seq,
            "ts": ts.isoformat(),
            "model": {"name": "digits", "version": "1.0.0", "release": 1, "variant": "onnx-fp32", "sha256": "a" * 64},
            "latency": {"onnx-fp32": {"count": 10, "p50_ms": p95 / 2, "p95_ms": p95, "p99_ms": p95 * 2}},
            "temperatures_c": {"soc": 50.0 + seq},
        }
    ).encode()


def test_ingest_counts_malformed_impersonating_and_duplicates_and_downsamples(tmp_path: Path) -> None:
    engine = open_engine(f"sqlite:///{tmp_path / 'i.sqlite3'}")
    migrate(engine)
    store = SqlRolloutStore(engine)
    ingest = Ingest(engine, "edgesdk", store).start()
    topic = "edgesdk/devices/dev-1/telemetry"
    base = datetime(2026, 1, 1, 12, 0, 5, tzinfo=timezone.utc)
    for seq in range(4):  # two minutes, two reports each
        assert ingest.handle(topic, _telemetry("dev-1", seq, base + timedelta(seconds=30 * seq), 1.0 + seq))
    ingest.handle(topic, _telemetry("dev-1", 1, base, 9.0))  # the same msg_id again
    ingest.handle(topic, b"{not json")
    ingest.handle(topic, b'{"device_id": "dev-1"}')
    ingest.handle(topic, _telemetry("dev-2", 7, base, 5.0, claimed="dev-2").replace(b'"dev-2-7"', b'"x"'))
    ingest.handle("edgesdk/devices/dev-1/telemetry", _telemetry("dev-9", 8, base, 5.0))  # speaks for dev-9
    ingest.handle("edgesdk/devices/dev-1/presence", b'{"device_id": "dev-1", "online": "maybe"}')
    assert not ingest.handle("other/devices/dev-1/telemetry", b"{}")
    assert ingest.drain(10)
    ingest.stop()
    counters = read_counters(engine, store.where)
    assert counters["malformed"] == 3 and counters["duplicates"] == 1
    assert counters["impersonating"] == 2 and counters["telemetry"] == 4
    with engine.connect() as db:
        rows = db.execute(schema.telemetry.select()).all()
        assert {r.device_id for r in rows} == {"dev-1"} and len(rows) == 4
        assert db.execute(schema.devices.select()).one().telemetry_seq == 3
    assert downsample(engine) == 2
    with engine.connect() as db:
        minutes = db.execute(schema.telemetry_minutely.select().order_by("minute")).all()
    assert [(m.samples, m.p95_ms, m.temperature_c) for m in minutes] == [(2, 2.0, 51.0), (2, 4.0, 53.0)]
    assert downsample(engine) == 0  # nothing new
    far_future = base.timestamp() + 8 * 86400
    deleted = prune(engine, Retention(raw_retention_s=7 * 86400, minutely_retention_s=180 * 86400), far_future)
    assert deleted["telemetry"] == 4 and deleted["telemetry_minutely"] == 0
    engine.dispose()
