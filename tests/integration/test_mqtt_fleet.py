"""``edgesdk fleet devices`` and ``fleet watch`` against a real broker and real AgentLinks."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from edgesdk.mqtt.broker import MosquittoBroker
from tests.agent_wiring_helpers import start_link
from tests.conftest import assert_one_line_error
from tests.mqtt_helpers import FakeAgent

pytest.importorskip("paho.mqtt", reason="paho-mqtt is part of the agent extra")

WIDE = {**os.environ, "COLUMNS": "200"}  # so rich does not fold device ids across lines


def _wait(predicate, timeout: float = 60.0) -> bool:  # real broker and clients: long, free when it comes
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not predicate():
        time.sleep(0.05)
    return predicate()


def test_fleet_devices_lists_presence_and_latest_telemetry(
    mqtt_broker: MosquittoBroker, tmp_path: Path, edgesdk_cli
) -> None:
    first = FakeAgent(tmp_path / "a", mqtt_broker.url, device_id="rpi-001")
    second = FakeAgent(tmp_path / "b", mqtt_broker.url, device_id="jetson-7")
    second.metrics.model = {**second.metrics.model, "version": "1.1.0", "variant": "onnx-int8"}
    links = [start_link(first), start_link(second)]
    try:
        for link in links:
            assert link.client.wait_connected(60)
        assert _wait(lambda: all(link.queue.depth == 0 and link.forwarder.sent > 0 for link in links))

        proc = edgesdk_cli("fleet", "devices", "--broker", mqtt_broker.url, "--json", "--wait", "1")
        assert proc.returncode == 0, proc.stderr
        devices = {d["device_id"]: d for d in json.loads(proc.stdout)["devices"]}
        assert set(devices) == {"rpi-001", "jetson-7"}
        assert devices["rpi-001"]["online"] is True and devices["rpi-001"]["profile"] == "rpi5-8gb"
        assert devices["jetson-7"]["model_version"] == "1.1.0" and devices["jetson-7"]["variant"] == "onnx-int8"
        assert devices["rpi-001"]["temperature_c"] == 55.0 and devices["rpi-001"]["p95_ms"] == 2.0

        table = edgesdk_cli("fleet", "devices", "--broker", mqtt_broker.url, "--wait", "1", env=WIDE)
        assert table.returncode == 0 and "rpi-001" in table.stdout and "2 online" in table.stdout

        links[0].stop()
        proc = edgesdk_cli("fleet", "devices", "--broker", mqtt_broker.url, "--json", "--wait", "1")
        devices = {d["device_id"]: d for d in json.loads(proc.stdout)["devices"]}
        assert devices["rpi-001"]["online"] is False and devices["jetson-7"]["online"] is True

        watch = edgesdk_cli(
            "fleet", "watch", "--broker", mqtt_broker.url, "--duration", "1.5", "--interval", "0.5", env=WIDE
        )
        assert watch.returncode == 0, watch.stderr
        assert "jetson-7" in watch.stdout and "1 online" in watch.stdout
    finally:
        for link in links:
            link.stop()


def test_fleet_commands_fail_with_one_clear_line(edgesdk_cli) -> None:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    proc = edgesdk_cli("fleet", "devices", "--broker", f"mqtt://127.0.0.1:{closed_port}", "--connect-timeout", "1")
    assert_one_line_error(proc, "cannot connect", str(closed_port))
    assert_one_line_error(edgesdk_cli("fleet", "devices", "--broker", "http://x"), "bad broker URL", "http://x")
    proc = edgesdk_cli("fleet", "devices", "--broker", "mqtt://127.0.0.1:1", "--ca-file", "/nonexistent/ca.pem")
    assert_one_line_error(proc, "/nonexistent/ca.pem")
    assert_one_line_error(edgesdk_cli("fleet", "nope"), "unknown command 'nope'")
