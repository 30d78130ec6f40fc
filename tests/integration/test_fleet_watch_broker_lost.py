"""``edgesdk fleet watch`` says when it has lost the broker (issue 40): a real mosquitto, a
retained presence, the real CLI; the broker stops while it watches, and its table says the
device is "unknown since HH:MM" and the broker was lost, instead of the last thing it heard."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
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


def _wait_for_log(broker: MosquittoBroker, text: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while text not in broker.log_file.read_text(errors="replace"):
        assert time.monotonic() < deadline, f"{text!r} not in the broker's log after {timeout} s"
        time.sleep(0.1)


def test_fleet_watch_shows_presence_unknown_once_it_lost_the_broker(
    mqtt_broker: MosquittoBroker, tmp_path: Path
) -> None:
    _publish_retained_presence(mqtt_broker.url, "cam-9")
    argv = [sys.executable, "-m", "edgesdk.cli.main", "fleet", "watch", "--broker", mqtt_broker.url]
    env = {**os.environ, "COLUMNS": "200"}
    # It runs until Ctrl-C (exit 0, the last table printed), so however slowly a loaded machine
    # starts it, the broker stops after it connected, and it still runs when the broker is gone.
    watch = subprocess.Popen(
        [*argv, "--interval", "0.5"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=_ctrl_c_heard,
    )
    try:
        _wait_for_log(mqtt_broker, " as edgesdk-fleet-")  # the watch's client is in
        # What the watch has seen shows only in the table it prints at its end: these waits are for
        # its own steps (ms each), long enough for a watch starved by a loaded machine for seconds.
        time.sleep(5)  # its subscription answered with the retained presence
        mqtt_broker.stop()
        time.sleep(8)  # the loss seen (the socket closes) and drawn (every 0.5 s)
        watch.send_signal(signal.SIGINT)
        out, err = watch.communicate(timeout=60)
    finally:
        if watch.poll() is None:
            watch.kill()
    assert watch.returncode == 0, err
    last = out[out.rfind("cam-9") - 2000 :]  # the final table
    assert re.search(r"lost since \d\d:\d\d:\d\d", last), out[-3000:]
    assert re.search(r"cam-9\W+unknown since \d\d:\d\d", last), out[-3000:]
