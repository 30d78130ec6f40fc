"""The agent's MQTT link: presence, telemetry and events out; deployments and chunks in.

The daemon builds it when ``mqtt.enabled`` with the ports it needs (:mod:`edgesdk.agent.ports`):
a ``TelemetrySource`` (the metrics), a ``RunningModelSource`` (for presence), an
``EventSource`` (the event bus) and a ``Keyring`` (the device's public key in presence). So it
can be tested with small stand-ins (``tests/agent_wiring_helpers.py`` wires one from an
agent-shaped object).

* Presence: retained on ``devices/{id}/presence``; ``online`` on every connect, the Last Will
  publishes ``online=False`` if the device vanishes, a clean stop publishes it explicitly.
* Telemetry every ``telemetry_interval_s`` and events from the agent's event bus go through
  the SQLite store-and-forward queue (``edgesdk.mqtt.queue``) at QoS 1 — nothing is lost
  while the broker is unreachable, up to the disk quota (oldest dropped, counted in
  ``dropped_messages``). Telemetry carries the outbox's depth as ``outbox_depth``; the
  agent's ``queue_depth`` (requests in the local API) is the metrics' and left alone.
* Inbound messages (``subscribe(suffix, handler)``: the device's own topic and its groups')
  run on one worker thread, never on the network thread. Oversized messages are ignored; a
  handler that raises (a malformed payload) is counted and logged; the link keeps running.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from edgesdk.agent.keyring import public_key_text
from edgesdk.agent.ports import EventSource, Keyring, RunningModelSource, RunningModelsSource, TelemetrySource
from pydantic import ValidationError

from edgesdk._version import __version__
from edgesdk.errors import EdgeSDKError, LinkError
from edgesdk.mqtt.client import ClientOptions, MqttClient, NetworkLoop, TlsSettings, WillMessage
from edgesdk.mqtt.forwarder import QueueForwarder
from edgesdk.mqtt.queue import MessageQueue
from edgesdk.protocol import topics
from edgesdk.schemas.agent_config import AgentConfig
from edgesdk.schemas.base import Schema
from edgesdk.schemas.messages import Event, ModelQuality, Presence, RunningModel, Telemetry

log = logging.getLogger("edgesdk.agent.link")

InboundHandler = Callable[[bytes], None]

_INBOX_SIZE = 1000
_EVENT_DETAIL_TYPES = (str, int, float, bool, type(None))


@dataclass
class InboundStats:
    """What arrived on the device's topics and what was refused."""

    received: int = 0
    handled: int = 0
    oversized: int = 0
    malformed: int = 0
    handler_errors: int = 0
    overflow: int = 0
    unrouted: int = 0


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _scalar_detail(detail: dict[str, Any]) -> dict[str, str | int | float | bool | None]:
    """Event details travel as flat scalars; anything else becomes its JSON text."""
    flat: dict[str, str | int | float | bool | None] = {}
    for key, value in detail.items():
        if isinstance(value, _EVENT_DETAIL_TYPES):
            flat[str(key)] = value
        else:
            flat[str(key)] = json.dumps(value, default=str, sort_keys=True)
    return flat


class AgentLink:
    """The running link of one agent: construct with its ports, then :meth:`start`."""

    def __init__(
        self,
        config: AgentConfig,
        *,
        telemetry: TelemetrySource,
        running_model: RunningModelSource | None = None,
        events: EventSource | None = None,
        keyring: Keyring | None = None,
        running_models: RunningModelsSource | None = None,
        loop: NetworkLoop | None = None,  # share one network thread (the fleet simulator); None: its own
    ) -> None:
        self.config = config
        self.telemetry = telemetry
        self.running_model_source = running_model
        self.running_models_source = running_models  # every model of the device (agent/device_models.py)
        self.keyring = keyring
        self._public_key: str | None = None
        self.mqtt = config.mqtt
        self.device_id: str = config.device_id
        self.namespace: str = self.mqtt.namespace
        self.groups: list[str] = list(self.mqtt.groups)
        self.inbound = InboundStats()
        self.events_suppressed = 0
        self._handlers: dict[str, list[InboundHandler]] = {}
        self._fleet_handlers: dict[str, list[InboundHandler]] = {}  # {namespace}/fleet/{suffix}
        self._handlers_lock = threading.Lock()
        self._inbox: queue.Queue[tuple[str, bytes] | None] = queue.Queue(_INBOX_SIZE)
        self._stopping = threading.Event()
        self._event_times: list[float] = []
        self._event_lock = threading.Lock()
        self._last_presence_model: RunningModel | None = None
        self._last_presence_models: list[RunningModel] = []

        self.queue = MessageQueue(
            config.data_dir / "mqtt" / "outbox.sqlite3",
            max_bytes=int(self.mqtt.queue_max_mb * 1024 * 1024),
        )
        self.client = MqttClient(self._client_options(config), loop=loop)
        self.client.on_connected = self._on_connected
        self.client.on_message = self._on_message
        self.forwarder = QueueForwarder(self.queue, self.client)
        self._threads = [
            threading.Thread(target=self._telemetry_loop, name="mqtt-telemetry", daemon=True),
            threading.Thread(target=self._inbox_loop, name="mqtt-inbox", daemon=True),
        ]
        self._unsubscribe_events = events.subscribe(self._on_agent_event) if events is not None else None

    # -- setup ----------------------------------------------------------------------------------
    def _client_options(self, config: AgentConfig) -> ClientOptions:
        mqtt = config.mqtt
        password = None
        if mqtt.password_file is not None:
            try:
                password = mqtt.password_file.read_text().strip()
            except OSError as exc:
                raise LinkError(f"cannot read MQTT password file {mqtt.password_file}: {exc}") from exc
        tls = None
        if mqtt.tls is not None:
            tls = TlsSettings(
                ca_file=str(mqtt.tls.ca_file) if mqtt.tls.ca_file else None,
                cert_file=str(mqtt.tls.cert_file) if mqtt.tls.cert_file else None,
                key_file=str(mqtt.tls.key_file) if mqtt.tls.key_file else None,
                insecure_skip_verify=mqtt.tls.insecure_skip_verify,
            )
        will = WillMessage(
            topic=topics.device_topic(self.namespace, self.device_id, topics.PRESENCE),
            payload=self._presence(online=False).model_dump_json().encode(),
            qos=1,
            retain=True,
        )
        return ClientOptions(
            client_id=self.device_id,
            broker_url=mqtt.broker,
            username=mqtt.username,
            password=password,
            tls=tls,
            keepalive_s=mqtt.keepalive_s,
            protocol=mqtt.protocol,
            will=will,
        )

    def start(self) -> AgentLink:
        for thread in self._threads:
            thread.start()
        self.client.start()
        return self

    # -- contract API ---------------------------------------------------------------------------
    def subscribe(self, suffix: str, handler: InboundHandler) -> None:
        """Call ``handler(payload)`` for ``suffix`` on the device's topic and each of its groups'."""
        filters = [topics.device_topic(self.namespace, self.device_id, suffix)]
        filters += [topics.group_topic(self.namespace, group, suffix) for group in self.groups]
        with self._handlers_lock:
            self._handlers.setdefault(suffix, []).append(handler)
        for topic_filter in filters:
            self.client.subscribe(topic_filter, qos=1)

    def subscribe_fleet(self, suffix: str, handler: InboundHandler) -> None:
        """Call ``handler(payload)`` for ``suffix`` on the fleet-wide topic (the trust document)."""
        with self._handlers_lock:
            self._fleet_handlers.setdefault(suffix, []).append(handler)
        self.client.subscribe(topics.fleet_topic(self.namespace, suffix), qos=1)

    def publish_reliable(self, suffix: str, model: Schema) -> int:
        """Queue ``model`` (JSON) for ``devices/{id}/{suffix}`` at QoS 1 through store-and-forward."""
        topic = topics.device_topic(self.namespace, self.device_id, suffix)
        row_id = self.queue.enqueue(topic, model.model_dump_json().encode(), qos=1)
        self.forwarder.pump()
        return row_id

    def publish_now(self, suffix: str, payload: bytes | Schema, qos: int = 0) -> bool:
        """Publish directly (no queue) to ``devices/{id}/{suffix}``; False when not connected."""
        data = payload.model_dump_json().encode() if isinstance(payload, Schema) else bytes(payload)
        topic = topics.device_topic(self.namespace, self.device_id, suffix)
        if not self.client.connected:
            return False
        try:
            self.client.publish(topic, data, qos=qos)
        except LinkError as exc:
            log.warning("publish to %s failed: %s", topic, exc)
            return False
        return True

    def stop(self, timeout: float = 3.0) -> None:
        """Say goodbye (offline presence), flush acknowledgements, disconnect, close the queue."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        if self._unsubscribe_events is not None:
            self._unsubscribe_events()
        if self.client.connected:
            try:
                self.client.publish(
                    topics.device_topic(self.namespace, self.device_id, topics.PRESENCE),
                    self._presence(online=False, model=self._last_presence_model).model_dump_json().encode(),
                    qos=1,
                    retain=True,
                )
            except LinkError as exc:
                log.warning("could not publish offline presence: %s", exc)
            # Give in-flight messages (and the goodbye) a moment to be acknowledged.
            deadline = time.monotonic() + timeout
            while self.forwarder.inflight and time.monotonic() < deadline:
                time.sleep(0.02)
        self.client.stop(graceful=True)
        self.forwarder.flush()
        self._inbox.put(None)
        for thread in self._threads:
            if thread.is_alive() and thread is not threading.current_thread():
                thread.join(timeout)
        self.queue.close()

    # -- presence and telemetry -----------------------------------------------------------------
    def _running_model(self) -> RunningModel | None:
        source = self.running_model_source
        return source.running_model() if source is not None else None

    def _running_models(self) -> list[RunningModel]:
        source = self.running_models_source
        return source.running_models() if source is not None else []

    def _device_public_key(self) -> str | None:
        """The device key's public half for presence (enrollment), once read; None without one."""
        if self._public_key is not None or self.keyring is None:
            return self._public_key
        try:
            # The public key file, never the private key: the daemon does not hold it.
            raw = self.keyring.device_public_key()
            if raw is not None:
                self._public_key = public_key_text(raw)
        except (EdgeSDKError, ValueError, TypeError) as exc:
            # Presence still goes out (the fleet sees the device online), just without the key.
            log.warning("presence is sent without the device public key: cannot read it: %s", exc)
        return self._public_key

    def _presence(self, *, online: bool, model: RunningModel | None = None) -> Presence:
        return Presence(
            device_id=self.device_id,
            online=online,
            ts=_now(),
            agent_version=__version__,
            profile=self.config.profile,
            groups=self.groups,
            model=model,
            models=self._last_presence_models if online else [],
            public_key=self._device_public_key(),
        )

    def _publish_presence(self) -> None:
        model = self._running_model()
        self._last_presence_model = model
        self._last_presence_models = self._running_models()
        payload = self._presence(online=True, model=model).model_dump_json().encode()
        try:
            self.client.publish(
                topics.device_topic(self.namespace, self.device_id, topics.PRESENCE), payload, qos=1, retain=True
            )
        except LinkError as exc:
            log.warning("could not publish presence: %s", exc)

    def _on_connected(self, session_present: bool) -> None:
        log.info("MQTT connected to %s (MQTT %s)", self.mqtt.broker, self.client.protocol)
        self._publish_presence()

    def telemetry_payload(self, seq: int) -> bytes:
        """Build one Telemetry message (sequence ``seq``): the telemetry source's snapshot plus
        the link's own fields, the outbox's depth and what its quota dropped."""
        snapshot = dict(self.telemetry.snapshot())
        snapshot["outbox_depth"] = self.queue.depth
        snapshot["dropped_messages"] = self.queue.dropped
        errors = dict(snapshot.get("errors") or {})
        for kind, count in (
            ("mqtt_malformed", self.inbound.malformed),
            ("mqtt_oversized", self.inbound.oversized),
            ("mqtt_events_suppressed", self.events_suppressed),
        ):
            if count:
                errors[kind] = count
        snapshot["errors"] = errors
        _add_quality(snapshot, self.telemetry.quality_reports())
        telemetry = Telemetry(device_id=self.device_id, msg_id=uuid.uuid4().hex, seq=seq, ts=_now(), **snapshot)
        return telemetry.model_dump_json().encode()

    def send_telemetry(self) -> int:
        """Queue one telemetry message now; returns its sequence number."""
        topic = topics.device_topic(self.namespace, self.device_id, topics.TELEMETRY)
        # Retained: the broker keeps each device's latest report, so `edgesdk fleet devices`
        # shows the whole fleet at once instead of waiting a telemetry interval.
        _, seq = self.queue.enqueue_built(topic, self.telemetry_payload, qos=1, retain=True, counter="telemetry_seq")
        self.forwarder.pump()
        model = self._running_model()
        if self.client.connected and (
            model != self._last_presence_model or self._running_models() != self._last_presence_models
        ):
            self._publish_presence()  # a serving model changed: presence says so
        return seq

    def _telemetry_loop(self) -> None:
        interval = self.mqtt.telemetry_interval_s
        next_at = time.monotonic()
        while not self._stopping.wait(max(0.0, next_at - time.monotonic())):
            next_at += interval
            try:
                self.send_telemetry()
            except Exception:  # noqa: BLE001 - one bad snapshot must not end telemetry for good
                log.exception("telemetry failed")
            if next_at < time.monotonic():
                next_at = time.monotonic() + interval  # after a stall, do not fire a burst

    # -- events ---------------------------------------------------------------------------------
    def _on_agent_event(self, name: str, detail: dict[str, Any]) -> None:
        now = time.monotonic()
        with self._event_lock:
            self._event_times = [t for t in self._event_times if now - t < 60.0]
            if len(self._event_times) >= self.mqtt.events_per_minute:
                # An error storm must not fill the disk quota and push out telemetry.
                self.events_suppressed += 1
                return
            self._event_times.append(now)
        topic = topics.device_topic(self.namespace, self.device_id, topics.EVENTS)

        def build(seq: int) -> bytes:
            event = Event(
                device_id=self.device_id,
                msg_id=uuid.uuid4().hex,
                seq=seq,
                ts=_now(),
                event=name,
                detail=_scalar_detail(detail),
            )
            return event.model_dump_json().encode()

        try:
            self.queue.enqueue_built(topic, build, qos=1, counter="event_seq")
        except (EdgeSDKError, ValidationError) as exc:
            log.warning("event %s not queued: %s", name, exc)
            return
        self.forwarder.pump()

    # -- inbound --------------------------------------------------------------------------------
    def _on_message(self, topic: str, payload: bytes) -> None:
        # Network thread: only size check and hand-over; handlers run on the inbox thread.
        self.inbound.received += 1
        if len(payload) > self.mqtt.max_inbound_bytes:
            self.inbound.oversized += 1
            log.warning("ignored %d-byte message on %s (limit %d)", len(payload), topic, self.mqtt.max_inbound_bytes)
            return
        try:
            self._inbox.put_nowait((topic, payload))
        except queue.Full:
            self.inbound.overflow += 1

    def _inbox_loop(self) -> None:
        while True:
            item = self._inbox.get()
            if item is None:
                return
            topic, payload = item
            parsed = topics.parse_topic(self.namespace, topic)
            mine = parsed is not None and (
                (parsed.scope == "devices" and parsed.name == self.device_id)
                or (parsed.scope == "groups" and parsed.name in self.groups)
            )
            with self._handlers_lock:
                if parsed is not None and parsed.scope == "fleet":
                    handlers = list(self._fleet_handlers.get(parsed.suffix, []))
                else:
                    handlers = list(self._handlers.get(parsed.suffix, [])) if parsed is not None and mine else []
            if not handlers:
                self.inbound.unrouted += 1
                continue
            for handler in handlers:
                try:
                    handler(payload)
                    self.inbound.handled += 1
                except (EdgeSDKError, ValueError, ValidationError) as exc:
                    self.inbound.malformed += 1
                    log.warning("ignored malformed message on %s: %s", topic, exc)
                except Exception:  # noqa: BLE001 - a handler bug must not stop the link
                    self.inbound.handler_errors += 1
                    log.exception("handler for %s failed", topic)


def _add_quality(snapshot: dict[str, Any], reports: dict[str, ModelQuality]) -> None:
    """Each model's drift and data-quality figures into its entry, the default's at the top level."""
    if not reports:
        return
    for entry in snapshot.get("models") or []:
        entry["quality"] = reports.get(entry["model"].name)
    default = snapshot.get("model")
    snapshot["quality"] = reports.get(default.name) if default is not None else None
