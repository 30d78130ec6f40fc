"""Refusals, without a broker: which of a device's refusals count toward a rollout (both rollout
stores, the same cases), the fleet service's ingest turning the others into security events,
and the device side: an unverified command gets no status, only a rate-limited event."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from edgesdk.agent.ota.freshness import ReportBudget

from edgesdk.fleet.deployments import (
    REFUSAL_OF_SUPERSEDED,
    REFUSAL_OF_UNISSUED,
    IssuedCommand,
    judge_refusal,
)
from edgesdk.protocol.signing import command_digest, command_payload
from edgesdk.schemas.messages import CommandRefusal, Deployment, HealthCriteria, OtaStatus

NOW = datetime.now(timezone.utc)


def _command(action: str = "install", targets: tuple[str, ...] = ("a",), sequence: int = 5) -> Deployment:
    return Deployment(
        deployment_id="dep-1",
        issued_at=NOW,
        expires_at=NOW + timedelta(hours=1),
        sequence=sequence,
        targets=list(targets),
        model_name="digits",
        model_version="1.1.0",
        release=2,
        bundle_sha256="0" * 64,
        bundle_size=10,
        chunk_sha256=["0" * 64],
        health=HealthCriteria(probation_s=1),
        action=action,  # type: ignore[arg-type]
        signature=f"ed25519:k:{action}{sequence}",
    )


INSTALL = IssuedCommand("d" * 64, "dep-1", "install", ("a",))
ROLLBACK = IssuedCommand("e" * 64, "dep-1", "rollback", ("a",))
TS = "2026-12-05T16:00:00+00:00"


@pytest.mark.parametrize(
    ("issued", "device", "row", "counted", "kind"),
    [
        (None, "a", ("SENT", None), False, REFUSAL_OF_UNISSUED),  # not a command issued here
        (INSTALL, "b", ("SENT", None), False, REFUSAL_OF_UNISSUED),  # issued, to another device
        (INSTALL, "a", None, False, REFUSAL_OF_UNISSUED),  # the device is no target of the deployment
        (INSTALL, "a", ("SENT", None), True, None),  # sent, not answered: the refusal is the answer
        (INSTALL, "a", ("PENDING", None), True, None),
        (INSTALL, "a", ("PROBATION", "x"), False, REFUSAL_OF_SUPERSEDED),  # already working on it: a replay
        (INSTALL, "a", ("FAILED", TS), True, None),  # the same refusal redelivered
        (ROLLBACK, "a", ("COMMITTED", "x"), True, None),  # the operator waits for this answer
    ],
)
def test_judge_refusal(issued, device, row, counted, kind) -> None:
    verdict = judge_refusal(issued, device, row, TS)
    assert (verdict.counted, verdict.security_event) == (counted, kind)


@pytest.fixture(params=["operator-file", "service-db"])
def store(request, tmp_path: Path) -> Any:
    """The one store, opened as ``fleet push`` opens its file and as the service opens its database."""
    pytest.importorskip("sqlalchemy", reason="the deployment store needs the fleet extra (sqlalchemy, alembic)")
    from edgesdk.fleet.service.database import migrate, open_engine
    from edgesdk.fleet.service.operator_db import open_rollout_store
    from edgesdk.fleet.service.store import SqlRolloutStore

    if request.param == "operator-file":
        opened = open_rollout_store(tmp_path / "fleet.sqlite3")
        yield opened
        opened.engine.dispose()
        return
    engine = open_engine(f"sqlite:///{tmp_path / 'service.sqlite3'}")
    migrate(engine)
    yield SqlRolloutStore(engine)
    engine.dispose()


def _refusal_status(digest: str | None, seconds: float, device: str = "a") -> OtaStatus:
    return OtaStatus(
        device_id=device,
        deployment_id="dep-1",
        msg_id=f"r-{device}-{seconds}",
        ts=NOW + timedelta(seconds=seconds),
        state="FAILED",
        reason="refused: device is busy with deployment 'other'",
        command_sha256=digest,
    )


def test_both_stores_count_only_refusals_of_commands_they_issued_to_the_device(store, tmp_path: Path) -> None:
    bundle = tmp_path / "b.edgepkg"
    bundle.write_bytes(b"x")
    store.create(_command(sequence=0), bundle, {}, [["a", "b"]])
    store.mark_sent("dep-1", ["a", "b"])
    issued = _command(targets=("a",))  # a's command; b gets its own
    digest = command_digest(command_payload(issued))
    store.record_issued(digest, issued)
    store.record_issued(digest, issued)  # the same bytes again: nothing new
    forged = command_digest(command_payload(issued.model_copy(update={"signature": "ed25519:k:junk"})))

    assert not store.record_status(_refusal_status(forged, 1))  # a copy someone else made
    assert not store.record_status(_refusal_status(digest, 1, device="b"))  # a's command shown to b
    assert {d.device_id: d.state for d in store.devices("dep-1")} == {"a": "SENT", "b": "SENT"}
    assert store.record_refusal("a", forged, "refused: bad", NOW).security_event == REFUSAL_OF_UNISSUED

    verdict = store.record_refusal("a", digest, "refused: deployment 'dep-1' signed by unknown key k", NOW)
    assert verdict.counted and verdict.deployment_id == "dep-1"
    row = store.devices("dep-1")[0]
    assert row.state == "FAILED" and row.reason == "refused by a: deployment 'dep-1' signed by unknown key k"
    assert store.record_refusal("a", digest, "refused: deployment 'dep-1' signed by unknown key k", NOW).counted

    # Once a device reports work on the deployment, a refusal of a copy of its install command is a replay.
    store.record_status(
        OtaStatus(device_id="b", deployment_id="dep-1", msg_id="p", ts=NOW, state="PROBATION", reason="")
    )
    for_b = _command(targets=("b",), sequence=6)
    store.record_issued(command_digest(command_payload(for_b)), for_b)
    replay = store.record_refusal("b", command_digest(command_payload(for_b)), "refused: replay", NOW)
    assert not replay.counted and replay.security_event == REFUSAL_OF_SUPERSEDED
    assert store.devices("dep-1")[1].state == "PROBATION"


def test_the_service_ingest_records_uncounted_refusals_as_security_events(tmp_path: Path) -> None:
    pytest.importorskip("sqlalchemy", reason="the fleet service needs the fleet-service extra")
    from edgesdk.fleet.service import schema
    from edgesdk.fleet.service.database import migrate, open_engine
    from edgesdk.fleet.service.ingest import Ingest, read_counters
    from edgesdk.fleet.service.store import SqlRolloutStore

    engine = open_engine(f"sqlite:///{tmp_path / 'i.sqlite3'}")
    migrate(engine)
    store = SqlRolloutStore(engine)
    bundle = tmp_path / "b.edgepkg"
    bundle.write_bytes(b"x")
    store.create(_command(sequence=0), bundle, {}, [["a"]])
    store.mark_sent("dep-1", ["a"])
    issued = _command()
    digest = command_digest(command_payload(issued))
    store.record_issued(digest, issued)
    ingest = Ingest(engine, "edgesdk", store).start()

    def event(msg_id: str, refusal: CommandRefusal) -> bytes:
        return json.dumps(
            {"device_id": "a", "msg_id": msg_id, "seq": 1, "ts": NOW.isoformat(), "event": "ota_refused",
             "detail": refusal.model_dump()}
        ).encode()  # fmt: skip

    junk = CommandRefusal(command_sha256="f" * 64, why="bad_signature", reason="tampered", deployment_id="dep-1")
    ingest.handle("edgesdk/devices/a/events", event("e1", junk))
    ingest.handle("edgesdk/devices/a/events", event("e1", junk))  # QoS 1 redelivers: one security event
    ingest.handle("edgesdk/devices/a/ota/status", _refusal_status("9" * 64, 2).model_dump_json().encode())
    assert ingest.drain(10)
    assert store.devices("dep-1")[0].state == "SENT"  # the rollout saw nothing
    with engine.connect() as db:
        events = db.execute(schema.security_events.select().order_by(schema.security_events.c.ts)).all()
        device = db.execute(schema.devices.select()).one()
    assert [(e.command_sha256, e.why, e.deployment_id) for e in events] == [
        ("f" * 64, "bad_signature", "dep-1"),
        ("9" * 64, None, "dep-1"),
    ]
    assert device.ota_state is None  # a refusal leaves the device's update where it was

    unknown_key = CommandRefusal(command_sha256=digest, why="unknown_key", reason="signed by unknown key k")
    ingest.handle("edgesdk/devices/a/events", event("e2", unknown_key))
    assert ingest.drain(10)
    row = store.devices("dep-1")[0]
    assert row.state == "FAILED" and row.reason == "refused by a: signed by unknown key k"
    ingest.stop()
    counters = read_counters(engine, "db")
    assert counters["security_events"] == 2 and counters["refusals_counted"] == 1
    engine.dispose()


def test_report_budget_lets_a_burst_through_then_a_trickle() -> None:
    now = [0.0]
    budget = ReportBudget(burst=3, per_minute=6, clock=lambda: now[0])
    assert [budget.take() for _ in range(5)] == [True, True, True, False, False]
    now[0] = 10.0  # one token back every 10 s
    assert [budget.take(), budget.take()] == [True, False]
    assert budget.suppressed == 3


class _Events:
    def __init__(self) -> None:
        self.emitted: list[tuple[str, dict[str, Any]]] = []

    def emit(self, name: str, detail: dict[str, Any] | None = None) -> None:
        self.emitted.append((name, dict(detail or {})))


class _Link:
    def __init__(self) -> None:
        self.published: list[OtaStatus] = []

    def subscribe(self, suffix: str, handler: Any) -> None:
        pass

    def publish_reliable(self, suffix: str, model: Any) -> int:
        self.published.append(model)
        return len(self.published)


class _Keyring:
    trusted_operators: list[Any] = []


def test_an_unverified_command_gets_no_status_and_a_rate_limited_event(tmp_path: Path) -> None:
    """Junk, unsigned and badly signed messages naming a real deployment id: no FAILED status for
    that id (which would fail a live rollout), at most ten events with each message's digest."""
    from edgesdk.agent.ota.manager import UpdateManager

    link, events = _Link(), _Events()
    manager = UpdateManager(
        tmp_path / "ota", device_id="a", serving=None, slots=None, keyring=_Keyring(), profile_name=None,  # type: ignore[arg-type]
        link=link, events=events,  # type: ignore[arg-type]
    )  # fmt: skip
    unsigned = _command().model_copy(update={"signature": None})
    payloads = [b"{not json", unsigned.model_dump_json().encode()]
    payloads += [_command(sequence=s).model_dump_json().encode() for s in range(20)]  # unknown key "k"
    for payload in payloads:
        manager.handle_deployment(payload)
    assert link.published == []
    refusals = [CommandRefusal.model_validate(detail) for name, detail in events.emitted if name == "ota_refused"]
    assert len(refusals) == 10  # the burst; the rest are counted, not sent
    assert [r.why for r in refusals[:3]] == ["malformed", "unsigned", "unknown_key"]
    assert [r.command_sha256 for r in refusals] == [command_digest(p) for p in payloads[:10]]
    assert refusals[1].deployment_id == "dep-1"
