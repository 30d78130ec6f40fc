"""The MQTT link inside a real ``edge-agent run`` process: presence, telemetry from the real
metrics, a broker outage followed by SIGKILL of the agent with a full queue, and the Last Will."""

from __future__ import annotations

import contextlib
import signal
import sqlite3
import time
from pathlib import Path

import pytest

from edgesdk.mqtt.broker import MosquittoBroker
from edgesdk.mqtt.queue import MessageQueue
from edgesdk.schemas.messages import Presence, Telemetry
from tests.agent_helpers import AgentProcess, make_device
from tests.mqtt_helpers import Collector, unique_in_order

pytest.importorskip("paho.mqtt", reason="paho-mqtt is part of the agent extra")


def _queued(outbox: Path) -> int:
    """Messages in a running agent's outbox, read beside it (read-only: the agent owns the file)."""
    if not outbox.exists():
        return 0
    with contextlib.closing(sqlite3.connect(f"file:{outbox}?mode=ro", uri=True, timeout=30)) as db:
        return int(db.execute("SELECT COUNT(*) FROM outbox").fetchone()[0])


def _until(condition, timeout: float = 60) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.mark.slow
def test_agent_process_loses_no_telemetry_across_outage_and_sigkill(
    mqtt_broker: MosquittoBroker, tmp_path: Path
) -> None:
    device = make_device(tmp_path / "device")
    device.write_config(mqtt={"enabled": True, "broker": mqtt_broker.url, "telemetry_interval_s": 0.25})
    observer = Collector(mqtt_broker.url, "edgesdk/devices/dev-1/#")
    first = AgentProcess(device).start()
    second: AgentProcess | None = None
    try:
        assert observer.wait_for(lambda: any(p["online"] for p in observer.json("presence")), 60), first.log()
        presence = Presence.model_validate(observer.json("presence")[-1])
        assert presence.profile == "rpi5-8gb" and presence.agent_version and presence.public_key
        assert observer.wait_for(lambda: len(observer.json("telemetry")) >= 3, 60)
        report = Telemetry.model_validate(observer.json("telemetry")[-1])
        assert report.device_id == "dev-1" and report.rss_mb and report.rss_mb > 0

        # Broker gone: the agent keeps measuring into its queue; then it is killed outright, once
        # the queue holds 4 reports (a fixed 2 s could hold fewer on a loaded machine).
        mqtt_broker.stop()
        outbox = device.data_dir / "mqtt" / "outbox.sqlite3"
        assert _until(lambda: _queued(outbox) >= 4), (_queued(outbox), first.log())
        first.stop(signal.SIGKILL)
        queue = MessageQueue(outbox)
        pending = queue.depth
        queue.close()
        assert pending >= 4, pending

        mqtt_broker.start()
        second = AgentProcess(device).start()
        assert observer.wait_for(lambda: len(observer.json("telemetry")) > 0, 60)

        def complete() -> bool:
            seqs = [t["seq"] for t in unique_in_order(observer.json("telemetry"))]
            return len(seqs) > pending + 5 and seqs == list(range(seqs[-1] + 1))

        assert observer.wait_for(complete, 60), [t["seq"] for t in unique_in_order(observer.json("telemetry"))]

        # Killed again while connected: the broker publishes the Last Will (offline, retained).
        second.stop(signal.SIGKILL)
        assert observer.wait_for(lambda: observer.json("presence")[-1]["online"] is False, 60)
    finally:
        first.stop()
        if second is not None:
            second.stop()
        observer.stop()


def test_agent_stopping_cleanly_says_it_is_offline(mqtt_broker: MosquittoBroker, tmp_path: Path) -> None:
    device = make_device(tmp_path / "device")
    device.write_config(mqtt={"enabled": True, "broker": mqtt_broker.url, "telemetry_interval_s": 3600})
    observer = Collector(mqtt_broker.url, "edgesdk/devices/dev-1/presence")
    agent = AgentProcess(device).start()
    try:
        assert observer.wait_for(lambda: any(p["online"] for p in observer.json("presence")), 60), agent.log()
        assert agent.stop(signal.SIGTERM) == 0, agent.log()
        assert observer.wait_for(lambda: observer.json("presence")[-1]["online"] is False, 60)
    finally:
        agent.stop()
        observer.stop()
