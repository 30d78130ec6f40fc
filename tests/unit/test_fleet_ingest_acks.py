"""Ingest that scales out, without processes: receipts are acknowledged only after their batch
committed, two ingests on one database store a message once and count the other copy as a
duplicate, a receipt of an earlier connection is never sent, the leader lock is trivially
held on SQLite, and the scaling flags refuse what cannot work in one line."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sqlalchemy", reason="needs the fleet-service extra")
pytest.importorskip("paho.mqtt", reason="paho-mqtt is part of the agent extra")

import sqlalchemy as sa  # noqa: E402

from edgesdk.fleet.service import schema  # noqa: E402
from edgesdk.fleet.service.database import migrate, open_engine  # noqa: E402
from edgesdk.fleet.service.ingest import Ingest, read_counters  # noqa: E402
from edgesdk.fleet.service.leader import Leadership, lock_key  # noqa: E402
from edgesdk.fleet.service.store import SqlRolloutStore  # noqa: E402
from edgesdk.mqtt.client import ClientOptions, MqttClient, Receipt  # noqa: E402


def _telemetry(device: str, seq: int) -> bytes:
    ts = datetime(2026, 1, 1, 12, 0, seq % 60, tzinfo=timezone.utc).isoformat()
    return json.dumps({"device_id": device, "msg_id": f"{device}-{seq}", "seq": seq, "ts": ts}).encode()


def _rows(engine: Any) -> int:
    with engine.connect() as db:
        return int(db.execute(sa.select(sa.func.count()).select_from(schema.telemetry)).scalar() or 0)


def test_receipts_are_acknowledged_only_after_their_batch_committed(tmp_path: Path) -> None:
    engine = open_engine(f"sqlite:///{tmp_path / 'a.sqlite3'}")
    migrate(engine)
    seen_at_ack: list[tuple[list[Any], int]] = []
    ingest = Ingest(
        engine, "edgesdk", SqlRolloutStore(engine), acknowledge=lambda rs: seen_at_ack.append((rs, _rows(engine)))
    ).start()
    for seq in range(5):
        ingest.handle("edgesdk/devices/d1/telemetry", _telemetry("d1", seq), Receipt(seq + 1, 1, 1))
    ingest.handle("edgesdk/devices/d1/telemetry", b"{broken", Receipt(99, 1, 1))  # dropped: acked at once
    assert ingest.drain(10)
    ingest.stop()
    acked = [r.mid for receipts, _ in seen_at_ack for r in receipts]
    assert sorted(acked) == [1, 2, 3, 4, 5, 99]
    for receipts, rows in seen_at_ack:
        stored = [r for r in receipts if r.mid != 99]
        assert rows >= max((r.mid for r in stored), default=0)  # committed before the ack went out
    engine.dispose()


def test_two_ingests_on_one_database_store_a_message_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'b.sqlite3'}"
    engines = [open_engine(url), open_engine(url)]
    migrate(engines[0])
    ingests = [Ingest(e, "edgesdk", SqlRolloutStore(e)).start() for e in engines]
    for seq in range(20):  # every message reaches both "workers" (a redelivery, a replay)
        for ingest in ingests:
            ingest.handle("edgesdk/devices/d1/telemetry", _telemetry("d1", seq))
    for ingest in ingests:
        assert ingest.drain(10)
        ingest.stop()
    counters = read_counters(engines[0], "test")
    assert _rows(engines[0]) == 20 and counters["telemetry"] == 20 and counters["duplicates"] == 20
    with engines[0].connect() as db:
        assert db.execute(sa.select(schema.devices.c.telemetry_seq)).scalar() == 19
    for engine in engines:
        engine.dispose()


def test_a_last_will_marks_the_device_offline_though_its_ts_is_older(tmp_path: Path) -> None:
    engine = open_engine(f"sqlite:///{tmp_path / 'w.sqlite3'}")
    migrate(engine)
    ingest = Ingest(engine, "edgesdk", SqlRolloutStore(engine)).start()

    def presence(online: bool, second: int) -> bytes:
        ts = datetime(2026, 1, 1, 12, 0, second, tzinfo=timezone.utc).isoformat()
        return json.dumps({"device_id": "d1", "online": online, "ts": ts, "groups": ["g"]}).encode()

    def online() -> bool:
        assert ingest.drain(10)
        with engine.connect() as db:
            return bool(db.execute(sa.select(schema.devices.c.online)).scalar())

    ingest.handle("edgesdk/devices/d1/presence", presence(True, 10))  # connected at :10
    assert online()
    ingest.handle("edgesdk/devices/d1/presence", presence(False, 5))  # its Will, built at :05 when the link started
    assert not online()
    ingest.handle("edgesdk/devices/d1/presence", presence(True, 8))  # a stale online arriving late
    assert not online()
    ingest.handle("edgesdk/devices/d1/presence", presence(True, 20))  # back
    assert online()
    ingest.stop()
    engine.dispose()


def test_a_receipt_of_an_earlier_connection_is_never_sent() -> None:
    client = MqttClient(ClientOptions(client_id="t", broker_url="mqtt://127.0.0.1:1", manual_ack=True))
    sent: list[int] = []
    client._paho.ack = lambda mid, qos: sent.append(mid)  # type: ignore[method-assign]
    client._generation = 2
    client._connected.set()
    client.acknowledge([Receipt(1, 1, 1), Receipt(2, 1, 2), Receipt(3, 0, 2), Receipt(4, 1, 2)])
    assert sent == [2, 4]  # mid 1 came on connection 1 (the broker redelivers it); QoS 0 needs none
    client._connected.clear()
    client.acknowledge([Receipt(5, 1, 2)])  # between connections: nothing on the wire
    assert sent == [2, 4]


def test_sqlite_is_always_its_own_leader_and_keys_are_stable(tmp_path: Path) -> None:
    engine = open_engine(f"sqlite:///{tmp_path / 'c.sqlite3'}")
    leadership = Leadership(engine, "edgesdk")
    assert leadership.acquire() and leadership.still_held()
    assert lock_key("edgesdk") == lock_key("edgesdk") != lock_key("other")
    engine.dispose()


def test_scaling_flags_refuse_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from edgesdk.cli.main import cli, run_cli

    base = ["fleet", "serve", "--broker", "mqtt://127.0.0.1:1", "--data-dir", str(tmp_path)]
    ingest = ["fleet", "ingest", "--broker", "mqtt://127.0.0.1:1", "--worker-id", "w0"]
    cases = [
        ([*base, "--workers", "2"], "--workers 2 needs a PostgreSQL --db"),
        ([*base, "--workers", "-1"], "bad --workers -1"),
        ([*base, "--share-group", "a/b"], "bad --share-group 'a/b'"),
        ([*base, "--instance", "x y"], "bad --instance 'x y'"),
        ([*ingest, "--db", "sqlite:///x"], "ingest workers need PostgreSQL"),
        ([*ingest, "--db", "postgresql://x/y", "--share-group", "#"], "bad --share-group '#'"),
    ]
    for argv, message in cases:
        assert run_cli(cli, argv) != 0, argv
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], (argv, lines)
