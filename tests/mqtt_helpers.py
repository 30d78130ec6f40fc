"""Helpers for MQTT tests: a stand-in agent for AgentLink and a collecting subscriber."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgesdk.agent.events import EventBus

from edgesdk.schemas.agent_config import AgentConfig


class FakeMetrics:
    """Returns the Telemetry fields like ``Metrics.snapshot()``; the model can be changed."""

    def __init__(self) -> None:
        self.model: dict[str, Any] | None = {
            "name": "digits",
            "version": "1.0.0",
            "release": 1,
            "variant": "onnx-fp32",
            "sha256": "a" * 64,
        }
        self.queue_depth: Callable[[], int] = lambda: 0

    def running_model(self) -> dict[str, Any] | None:
        return self.model

    def quality_reports(self) -> dict[str, Any]:
        return {}  # no drift windows: the link sends telemetry without model_quality

    def snapshot(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "latency": {"onnx-fp32": {"count": 10, "p50_ms": 1.0, "p95_ms": 2.0, "p99_ms": 3.0}},
            "throughput_rps": 5.0,
            "errors": {},
            "queue_depth": self.queue_depth(),
            "cpu_percent": 1.0,
            "rss_mb": 50.0,
            "temperatures_c": {"soc": 55.0},
            "power_source": "ac",
            "governor_state": "normal",
            "switch_count": 0,
            "dropped_messages": 0,
        }


class FakeAgent:
    """The part of ``edgesdk.agent.daemon.Agent`` the link uses."""

    def __init__(self, data_dir: Path, broker_url: str, device_id: str = "dev-1", **mqtt: Any) -> None:
        settings = {"enabled": True, "broker": broker_url, "telemetry_interval_s": 3600.0, **mqtt}
        self.config = AgentConfig(device_id=device_id, profile="rpi5-8gb", data_dir=data_dir, mqtt=settings)
        self.metrics = FakeMetrics()
        self.events = EventBus()
        self.device_key = None

    def device_public_key(self) -> bytes | None:
        return None  # presence without a key, as an agent that has none


class Collector:
    """Subscribes with a real client and keeps every message (topic, JSON-decoded or raw)."""

    def __init__(self, broker_url: str, topic_filter: str, client_id: str = "fleet-observer") -> None:
        from edgesdk.mqtt.client import ClientOptions, MqttClient

        self.messages: list[tuple[str, bytes]] = []
        self._lock = threading.Lock()
        self.client = MqttClient(ClientOptions(client_id=client_id, broker_url=broker_url))
        self.client.on_message = self._on_message
        self.client.subscribe(topic_filter, qos=1)
        self.client.start()
        if not self.client.wait_connected(60):
            raise RuntimeError(f"collector could not connect: {self.client.stats.last_error}")
        time.sleep(0.2)  # let the SUBACK arrive before the test publishes

    def _on_message(self, topic: str, payload: bytes) -> None:
        with self._lock:
            self.messages.append((topic, payload))

    def json(self, suffix: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            items = list(self.messages)
        out = []
        for topic, payload in items:
            if suffix is None or topic.endswith("/" + suffix):
                try:
                    out.append(json.loads(payload))
                except ValueError:
                    continue
        return out

    def clear(self) -> None:
        """Forget what was received (a test that restarts the agent waits for the new presence)."""
        with self._lock:
            self.messages.clear()

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 60.0) -> bool:
        # Long: it waits for real processes (agents, brokers) on a machine that may be loaded far
        # beyond its cores, and costs nothing when what it waits for comes.
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(0.05)
        return predicate()

    def stop(self) -> None:
        self.client.stop()


def unique_in_order(items: list[dict[str, Any]], key: str = "msg_id") -> list[dict[str, Any]]:
    """De-duplicate by ``key`` keeping first arrival (what the fleet side does)."""
    seen: set[Any] = set()
    out = []
    for item in items:
        if item[key] not in seen:
            seen.add(item[key])
            out.append(item)
    return out


def wait_acked(client: Any, count: int = 1, timeout: float = 60) -> None:
    """Until the broker has acknowledged ``count`` QoS 1 publishes of ``client`` (its PUBACKs):
    a disconnect then loses none of them, however slowly a loaded machine runs the client."""
    deadline = time.monotonic() + timeout
    while client.stats.acked + client.stats.rejected < count:
        assert time.monotonic() < deadline, f"{client.stats.acked} of {count} publishes acknowledged in {timeout} s"
        time.sleep(0.02)
