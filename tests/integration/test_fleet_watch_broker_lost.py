"""``edgesdk fleet watch`` says when it has lost the broker (issue 40): a real mosquitto, a
retained presence, the real CLI; the broker stops while it watches, and its table says the
device is "unknown since HH:MM" and the broker was lost, instead of the last thing it heard."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from edgesdk.mqtt.broker import MosquittoBroker

pytest.importorskip("paho.mqtt", reason="paho-mqtt is part of the agent extra")


def _publish_retained_presence(broker_url: str, device_id: str) -> None:
    from edgesdk.mqtt.client import ClientOptions, MqttClient

    client = MqttClient(ClientOptions(client_id="presence-writer", broker_url=broker_url))
    client.start()
    assert client.wait_connected(10), client.stats.last_error
    presence = {"device_id": device_id, "online": True, "ts": datetime.now(timezone.utc).isoformat(), "groups": []}
    client.publish(f"edgesdk/devices/{device_id}/presence", json.dumps(presence).encode(), qos=1, retain=True)
    time.sleep(0.3)  # the PUBACK
    client.stop()


def test_fleet_watch_shows_presence_unknown_once_it_lost_the_broker(
    mqtt_broker: MosquittoBroker, tmp_path: Path
) -> None:
    _publish_retained_presence(mqtt_broker.url, "cam-9")
    argv = [sys.executable, "-m", "edgesdk.cli.main", "fleet", "watch", "--broker", mqtt_broker.url]
    env = {**os.environ, "COLUMNS": "200"}
    watch = subprocess.Popen(
        [*argv, "--duration", "8", "--interval", "0.5"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    time.sleep(4)  # connected, the retained presence seen
    mqtt_broker.stop()
    out, err = watch.communicate(timeout=60)
    assert watch.returncode == 0, err
    last = out[out.rfind("cam-9") - 2000 :]  # the final table
    assert re.search(r"lost since \d\d:\d\d:\d\d", last), out[-3000:]
    assert re.search(r"cam-9\W+unknown since \d\d:\d\d", last), out[-3000:]
