"""``edgesdk fleet watch`` says when it has lost the broker (issue 40): a real mosquitto, a
retained presence, the real CLI; the broker stops while it watches, and its table says the
device is "unknown since HH:MM" and the broker was lost, instead of the last thing it heard.
Piped, the watch prints a table each time the fleet changed, as it happens (a redrawn table
would reach a pipe only at its end): the test reads them while it runs."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from edgesdk.mqtt.broker import MosquittoBroker
from tests.mqtt_helpers import Collector

pytest.importorskip("paho.mqtt", reason="paho-mqtt is part of the agent extra")


def _publish_retained_presence(broker_url: str, device_id: str) -> None:
    from edgesdk.mqtt.client import ClientOptions, MqttClient

    client = MqttClient(ClientOptions(client_id="presence-writer", broker_url=broker_url))
    client.start()
    assert client.wait_connected(60), client.stats.last_error
    presence = {"device_id": device_id, "online": True, "ts": datetime.now(timezone.utc).isoformat(), "groups": []}
    topic = f"edgesdk/devices/{device_id}/presence"
    client.publish(topic, json.dumps(presence).encode(), qos=1, retain=True)
    retained = Collector(broker_url, topic, client_id="presence-reader")  # a new subscriber gets it: it is stored
    try:
        assert retained.wait_for(lambda: bool(retained.json()), timeout=60), "the retained presence was not stored"
    finally:
        retained.stop()
        client.stop()


def _ctrl_c_heard() -> None:
    """SIGINT back to its default in the child: a test run as a background job ignores it, and
    Python turns it into KeyboardInterrupt only when it is not ignored at its start."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _wait_for_output(lines: list[str], pattern: str, watch: subprocess.Popen[str], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not re.search(pattern, "".join(lines)):
        assert watch.poll() is None, f"the watch ended ({watch.returncode}):\n{''.join(lines)[-3000:]}"
        assert time.monotonic() < deadline, f"no {pattern!r} printed after {timeout} s:\n{''.join(lines)[-3000:]}"
        time.sleep(0.1)


def test_fleet_watch_shows_presence_unknown_once_it_lost_the_broker(
    mqtt_broker: MosquittoBroker, tmp_path: Path
) -> None:
    _publish_retained_presence(mqtt_broker.url, "cam-9")
    argv = [sys.executable, "-m", "edgesdk.cli.main", "fleet", "watch", "--broker", mqtt_broker.url]
    env = {**os.environ, "COLUMNS": "200"}
    # It runs until Ctrl-C (exit 0), so however slowly a loaded machine runs it, each step below
    # waits for what it printed.
    watch = subprocess.Popen(
        [*argv, "--interval", "0.5"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=_ctrl_c_heard,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(watch.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        _wait_for_output(lines, r"cam-9\W+yes\W", watch)  # the retained presence, printed while it runs
        mqtt_broker.stop()
        _wait_for_output(lines, r"lost since \d\d:\d\d:\d\d", watch)
        _wait_for_output(lines, r"cam-9\W+unknown since \d\d:\d\d", watch)
        watch.send_signal(signal.SIGINT)
        watch.wait(60)
        reader.join(10)
    finally:
        if watch.poll() is None:
            watch.kill()
    assert watch.returncode == 0, watch.stderr.read()  # type: ignore[union-attr]
    printed = "".join(lines)
    # A table per change, not one per refresh: the "seen" ages alone print nothing.
    assert 2 <= printed.count("cam-9") <= 4, printed
