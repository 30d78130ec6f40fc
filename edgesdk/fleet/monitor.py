"""The fleet-side listener: a live view of every device from presence, telemetry and events.

Presence and the latest telemetry are retained by the broker, so a monitor that connects
sees every known device at once; afterwards it follows the live messages. Messages are
de-duplicated by ``msg_id`` (store-and-forward is at-least-once); anything that does not
parse as the schema it claims is ignored and counted, never fatal.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections import deque
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from edgesdk.errors import LinkError
from edgesdk.protocol import topics
from edgesdk.schemas.messages import Event, OtaStatus, Presence, Telemetry

log = logging.getLogger(__name__)

_DEDUP_WINDOW = 4096


@dataclass
class DeviceView:
    """What the fleet knows about one device (one row of ``edgesdk fleet devices``)."""

    device_id: str
    online: bool | None = None
    profile: str | None = None
    agent_version: str | None = None
    groups: list[str] = field(default_factory=list)
    model: str | None = None
    model_version: str | None = None
    variant: str | None = None
    model_sha256: str | None = None
    temperature_c: float | None = None
    p95_ms: float | None = None
    throughput_rps: float | None = None
    errors: int = 0
    queue_depth: int | None = None  # inference requests running or waiting in the device's API
    outbox_depth: int | None = None  # messages waiting in the device's MQTT outbox
    dropped_messages: int = 0
    governor_state: str | None = None
    ota_state: str | None = None
    last_event: str | None = None
    last_seen: datetime | None = None
    telemetry_seq: int | None = None

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["last_seen"] = self.last_seen.isoformat() if self.last_seen else None
        return data


@dataclass
class MonitorStats:
    messages: int = 0
    duplicates: int = 0
    malformed: int = 0


class FleetView:
    """Folds MQTT messages into per-device views; pure (no network), so it is easy to test."""

    def __init__(self, namespace: str = "edgesdk") -> None:
        self.namespace = namespace
        self.devices: dict[str, DeviceView] = {}
        self.stats = MonitorStats()
        self._seen: deque[str] = deque(maxlen=_DEDUP_WINDOW)
        self._seen_set: set[str] = set()
        self._lock = threading.Lock()

    def handle(self, topic: str, payload: bytes) -> None:
        """Apply one message; unknown topics are ignored, bad payloads counted."""
        parsed = topics.parse_topic(self.namespace, topic)
        if parsed is None or parsed.scope != "devices":
            return
        self.stats.messages += 1
        try:
            data = json.loads(payload)
            with self._lock:
                self._apply(parsed.name, parsed.suffix, data)
        except (ValueError, ValidationError, TypeError, KeyError) as exc:
            self.stats.malformed += 1
            log.debug("ignored malformed message on %s: %s", topic, exc)

    def _duplicate(self, msg_id: str) -> bool:
        if msg_id in self._seen_set:
            self.stats.duplicates += 1
            return True
        if len(self._seen) == self._seen.maxlen:
            self._seen_set.discard(self._seen[0])
        self._seen.append(msg_id)
        self._seen_set.add(msg_id)
        return False

    def _view(self, device_id: str) -> DeviceView:
        return self.devices.setdefault(device_id, DeviceView(device_id=device_id))

    def _apply(self, device_id: str, suffix: str, data: Any) -> None:
        if suffix == topics.PRESENCE:
            presence = Presence.model_validate(data)
            if presence.device_id != device_id:
                raise ValueError(f"presence for {presence.device_id!r} on the topic of {device_id!r}")
            view = self._view(device_id)
            view.online = presence.online
            view.profile = presence.profile or view.profile
            view.agent_version = presence.agent_version or view.agent_version
            view.groups = list(presence.groups)
            if presence.model is not None:
                view.model, view.model_version = presence.model.name, presence.model.version
                view.variant, view.model_sha256 = presence.model.variant, presence.model.sha256
            view.last_seen = max(filter(None, (view.last_seen, presence.ts)))
        elif suffix == topics.TELEMETRY:
            telemetry = Telemetry.model_validate(data)
            if telemetry.device_id != device_id or self._duplicate(telemetry.msg_id):
                return
            view = self._view(device_id)
            if view.telemetry_seq is not None and telemetry.seq < view.telemetry_seq:
                return  # an older report replayed after an outage: keep the newest
            view.telemetry_seq = telemetry.seq
            if telemetry.model is not None:
                view.model, view.model_version = telemetry.model.name, telemetry.model.version
                view.variant, view.model_sha256 = telemetry.model.variant, telemetry.model.sha256
            stats = telemetry.latency.get(view.variant or "")
            p95s = [s.p95_ms for s in telemetry.latency.values() if s.p95_ms is not None]
            view.p95_ms = stats.p95_ms if stats is not None and stats.p95_ms is not None else max(p95s, default=None)
            view.temperature_c = max(telemetry.temperatures_c.values(), default=None)
            view.throughput_rps = telemetry.throughput_rps
            view.errors = sum(telemetry.errors.values())
            view.queue_depth = telemetry.queue_depth
            view.outbox_depth = telemetry.outbox_depth
            view.dropped_messages = telemetry.dropped_messages
            view.governor_state = telemetry.governor_state
            view.last_seen = max(filter(None, (view.last_seen, telemetry.ts)))
        elif suffix == topics.EVENTS:
            event = Event.model_validate(data)
            if event.device_id == device_id and not self._duplicate(event.msg_id):
                self._view(device_id).last_event = event.event
        elif suffix == topics.OTA_STATUS:
            status = OtaStatus.model_validate(data)
            if status.device_id == device_id and not self._duplicate(status.msg_id):
                view = self._view(device_id)
                if status.command_sha256 is None:
                    view.ota_state = status.state
                else:  # a refused command leaves the device's update where it was
                    view.last_event = "ota_refused"

    def snapshot(self) -> list[DeviceView]:
        """Every device, sorted by id."""
        with self._lock:
            return [self.devices[k] for k in sorted(self.devices)]


class FleetMonitor:
    """Connects to the broker and keeps a :class:`FleetView` up to date. ``lost_since``: when
    its connection was lost (Unix time; None while connected): the view is then what was seen
    before, and presence is unknown (``fleet watch`` says so)."""

    SUFFIXES = (topics.PRESENCE, topics.TELEMETRY, topics.EVENTS, topics.OTA_STATUS)

    def __init__(self, options: Any, namespace: str = "edgesdk") -> None:
        try:
            from edgesdk.mqtt.client import MqttClient
        except ImportError as exc:
            raise LinkError("paho-mqtt is not installed; install it with: pip install 'edgesdk[fleet]'") from exc
        self.view = FleetView(namespace)
        self.client = MqttClient(options)
        self.client.on_message = self.view.handle
        self.lost_since: float | None = None
        self.client.on_connected = self._connected
        self.client.on_disconnected = self._lost
        for suffix in self.SUFFIXES:
            self.client.subscribe(topics.all_devices_filter(namespace, suffix), qos=1)

    def start(self, timeout: float) -> FleetMonitor:
        """Connect; raise LinkError naming the broker and the reason if it does not work in time."""
        self.client.start()
        if not self.client.wait_connected(timeout):
            reason = self.client.stats.last_error or "no answer"
            self.client.stop()
            raise LinkError(f"cannot connect to {self.client.options.broker_url} within {timeout:g} s: {reason}")
        return self

    def settle(self, seconds: float) -> None:
        """Wait for retained messages (and whatever is live) to arrive."""
        deadline = time.monotonic() + seconds
        last = -1
        while time.monotonic() < deadline:
            time.sleep(0.1)
            count = self.view.stats.messages
            if count == last and count > 0 and time.monotonic() > deadline - seconds / 2:
                break  # nothing new for a moment after the first half: retained burst is done
            last = count

    def stop(self) -> None:
        self.client.stop()

    def _connected(self, _session_present: bool) -> None:
        self.lost_since = None

    def _lost(self, _reason: str) -> None:
        self.lost_since = time.time()


def monitor_client_id() -> str:
    """A unique client id for an observer, so two operators never kick each other off."""
    return f"edgesdk-fleet-{uuid.uuid4().hex[:10]}"
