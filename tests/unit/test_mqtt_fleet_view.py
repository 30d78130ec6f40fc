"""FleetView: folding presence/telemetry/events into device rows, without a broker."""

from __future__ import annotations

import json
from datetime import datetime, timezone

from edgesdk.fleet.monitor import FleetView
from edgesdk.schemas.messages import Presence, Telemetry

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
MODEL = {"name": "digits", "version": "1.0.0", "release": 1, "variant": "onnx-int8", "sha256": "c" * 64}


def _telemetry(seq: int, msg_id: str, temp: float, device: str = "d1") -> bytes:
    return (
        Telemetry(
            device_id=device,
            msg_id=msg_id,
            seq=seq,
            ts=NOW,
            model=MODEL,
            latency={"onnx-int8": {"count": 5, "p95_ms": 4.5}, "onnx-fp32": {"count": 1, "p95_ms": 9.0}},
            temperatures_c={"cpu": temp, "gpu": temp - 5},
            errors={"bad_input": 2, "timeout": 1},
        )
        .model_dump_json()
        .encode()
    )


def test_presence_and_telemetry_make_one_row_per_device() -> None:
    view = FleetView("edgesdk")
    presence = Presence(device_id="d1", online=True, ts=NOW, profile="rpi5-8gb", agent_version="0.1.0", model=MODEL)
    view.handle("edgesdk/devices/d1/presence", presence.model_dump_json().encode())
    view.handle("edgesdk/devices/d1/telemetry", _telemetry(3, "m3", 61.0))
    (row,) = view.snapshot()
    assert (row.device_id, row.online, row.profile, row.model_version, row.variant) == (
        "d1",
        True,
        "rpi5-8gb",
        "1.0.0",
        "onnx-int8",
    )
    assert row.temperature_c == 61.0 and row.p95_ms == 4.5 and row.errors == 3  # p95 of the serving variant


def test_duplicates_and_replayed_older_reports_do_not_win() -> None:
    view = FleetView("edgesdk")
    view.handle("edgesdk/devices/d1/telemetry", _telemetry(5, "m5", 70.0))
    view.handle("edgesdk/devices/d1/telemetry", _telemetry(5, "m5", 70.0))
    view.handle("edgesdk/devices/d1/telemetry", _telemetry(4, "m4", 40.0))  # drained late after an outage
    assert view.stats.duplicates == 1
    assert view.snapshot()[0].temperature_c == 70.0 and view.snapshot()[0].telemetry_seq == 5


def test_malformed_and_foreign_messages_are_counted_or_ignored_never_fatal() -> None:
    view = FleetView("edgesdk")
    view.handle("edgesdk/devices/d1/telemetry", b"{broken")
    view.handle("edgesdk/devices/d1/presence", json.dumps({"kind": "presence"}).encode())
    view.handle("edgesdk/devices/d1/presence", b"\xff\xfe")
    # A device cannot speak for another through the payload.
    spoof = Presence(device_id="d2", online=True, ts=NOW).model_dump_json().encode()
    view.handle("edgesdk/devices/d1/presence", spoof)
    view.handle("other/devices/d1/presence", spoof)
    assert view.stats.malformed == 4 and view.snapshot() == []
