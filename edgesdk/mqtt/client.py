"""The MQTT adapter: the only module in edgesdk that imports paho-mqtt.

``MqttClient`` wraps one paho client (callback API version 2) and adds what a device needs
and paho leaves to the application:

* MQTT 5 first, falling back to 3.1.1 when the broker refuses version 5 (CONNACK "unsupported
  protocol version", a connection closed before any CONNACK twice in a row, or no CONNACK at
  all within ``V5_CONNACK_WAIT_S``);
* reconnects forever with *full-jitter* exponential backoff, so a fleet that lost its broker
  does not reconnect in lock-step when it comes back;
* a persistent session (clean start off, session expiry) so QoS 1 messages sent to a device
  while it was offline are delivered when it returns; subscriptions are re-made on every
  connect in case the broker lost the session;
* errors of the layer below (socket, TLS, paho return codes) become ``LinkError`` or a
  ``last_error`` string, never a paho exception in the caller.

Networking runs in a ``NetworkLoop``: one thread that services the sockets of any number of
clients with a selector. A device agent has one client in its own loop; the benchmark runs a
thousand simulated devices in one loop with the same code.
"""

from __future__ import annotations

import heapq
import logging
import random
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edgesdk.errors import LinkError, UsageError

log = logging.getLogger(__name__)

Protocol = Literal["auto", "5", "3.1.1"]

#: Reason code a v5 client gets when the broker answers a 3.1.1 "unacceptable protocol version".
_UNSUPPORTED_PROTOCOL_VERSION = 132
#: paho's housekeeping (keepalive PINGREQ, its timeouts) runs per client at most this far apart,
#: and at least four times per keepalive interval.
_MISC_INTERVAL_S = 1.0
#: How often the loop wakes when nothing happens, and how late a requested tick may run.
_TICK_INTERVAL_S = 0.1
#: In "auto" mode, how long a v5 CONNECT may go unanswered before the connection is closed and
#: 3.1.1 tried. Some 3.1.1-only brokers (amqtt) neither answer a v5 CONNECT nor close the socket.
#: A broker that speaks v5 answers in milliseconds on a LAN and in well under a second across
#: the world, so 2 s does not give up on a slow v5 broker; checked at each housekeeping turn
#: (``_MISC_INTERVAL_S``), the 3.1.1 CONNACK arrives 2.5-3.5 s after the first CONNECT: inside
#: the 5 s a caller such as ``edgesdk fleet serve --connect-timeout`` waits by default.
V5_CONNACK_WAIT_S = 2.0


def drop_connection(client: paho.Client) -> None:
    """Close ``client``'s socket at once, without sending DISCONNECT.

    The one use of paho's private API, kept here on purpose: paho 2.x has no public call that
    ends a connection without a DISCONNECT packet (``disconnect()`` always sends one, and a
    DISCONNECT tells the broker not to publish the Last Will, which an ungraceful stop must
    trigger), and closing ``client.socket()`` ourselves would leave paho holding a dead socket
    and skip the socket-close callback the ``NetworkLoop`` unregisters it in.
    ``Client._sock_close`` is what paho itself calls when a connection breaks: it forgets the
    socket, fires ``on_socket_unregister_write`` and ``on_socket_close``, and closes it.
    tests/unit/test_mqtt_paho_private_api.py fails if a paho release changes that.
    """
    client._sock_close()


@dataclass(frozen=True)
class BrokerAddress:
    """Where the broker listens; ``tls`` is true for ``mqtts://``."""

    host: str
    port: int
    tls: bool


def parse_broker_url(url: str) -> BrokerAddress:
    """Parse ``mqtt://host[:1883]`` or ``mqtts://host[:8883]``; raise UsageError naming the bad URL."""
    parts = urlsplit(url)
    if parts.scheme not in ("mqtt", "mqtts", "tcp", "ssl") or not parts.hostname:
        raise UsageError(f"bad broker URL {url!r}: expected mqtt://HOST[:PORT] or mqtts://HOST[:PORT]")
    tls = parts.scheme in ("mqtts", "ssl")
    try:
        port = parts.port or (8883 if tls else 1883)
    except ValueError as exc:
        raise UsageError(f"bad broker URL {url!r}: {exc}") from exc
    return BrokerAddress(host=parts.hostname, port=port, tls=tls)


@dataclass(frozen=True)
class TlsSettings:
    """TLS for the client: CA to verify the broker, optional client certificate (mTLS)."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    insecure_skip_verify: bool = False


@dataclass(frozen=True)
class WillMessage:
    """What the broker publishes for us when we vanish without a DISCONNECT."""

    topic: str
    payload: bytes
    qos: int = 1
    retain: bool = True


@dataclass(frozen=True)
class ClientOptions:
    """Everything needed to connect one client."""

    client_id: str
    broker_url: str
    username: str | None = None
    password: str | None = None
    tls: TlsSettings | None = None
    keepalive_s: int = 30
    protocol: Protocol = "auto"
    will: WillMessage | None = None
    clean_start: bool = False
    session_expiry_s: int = 7 * 24 * 3600
    backoff_min_s: float = 0.5
    backoff_max_s: float = 30.0
    max_inflight: int = 100
    connect_timeout_s: float = 5.0
    #: Acknowledge inbound QoS 1 messages only when the application says so (``on_delivery``
    #: and :meth:`MqttClient.acknowledge`): a consumer that acks after its database commit
    #: loses nothing when it is killed, the broker redelivers what was not acknowledged.
    manual_ack: bool = False
    #: MQTT 5 Receive Maximum: how many unacknowledged QoS 1 messages the broker may have in
    #: flight to us (None: the protocol's default, 65,535). A consumer that acks in batches
    #: needs at least a batch's worth.
    receive_maximum: int | None = None


@dataclass
class ClientStats:
    """Counters for diagnostics and tests."""

    connects: int = 0
    connect_failures: int = 0
    disconnects: int = 0
    messages_in: int = 0
    published: int = 0
    acked: int = 0
    rejected: int = 0
    last_error: str | None = None
    reason_history: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Receipt:
    """What acknowledging one inbound message takes: its packet id and QoS on the connection
    (``generation``) it arrived on. A receipt from an earlier connection is not sent: the broker
    redelivers that message on the new connection (a fresh receipt), and the old packet id may
    by then name another message."""

    mid: int
    qos: int
    generation: int


MessageHandler = Callable[[str, bytes], None]
DeliveryHandler = Callable[[str, bytes, Receipt], None]
AckHandler = Callable[[int, bool], None]
ConnectHandler = Callable[[bool], None]
DisconnectHandler = Callable[[str], None]


def backoff_delay(attempt: int, minimum: float, maximum: float, rng: random.Random | None = None) -> float:
    """Full-jitter exponential backoff: uniform in [minimum, min(maximum, minimum * 2**attempt)]."""
    ceiling = min(maximum, minimum * (2 ** min(attempt, 30)))
    return (rng or random).uniform(minimum, max(minimum, ceiling))


class MqttClient:
    """One MQTT connection with reconnect, MQTT 5 → 3.1.1 fallback and resubscribe.

    Callbacks (``on_message``, ``on_published``, ``on_connected``, ``on_disconnected``) run on
    the network loop's thread: keep them short and hand real work to another thread.
    """

    def __init__(self, options: ClientOptions, *, loop: NetworkLoop | None = None) -> None:
        self.options = options
        self.address = parse_broker_url(options.broker_url)
        if options.protocol not in ("auto", "5", "3.1.1"):
            raise UsageError(f"bad MQTT protocol {options.protocol!r}: use auto, 5 or 3.1.1")
        self.protocol: Literal["5", "3.1.1"] = "3.1.1" if options.protocol == "3.1.1" else "5"
        self.stats = ClientStats()
        self.on_message: MessageHandler | None = None
        self.on_delivery: DeliveryHandler | None = None  # with manual_ack: the handler acks later
        self.on_published: AckHandler | None = None
        self.on_connected: ConnectHandler | None = None
        self.on_disconnected: DisconnectHandler | None = None
        self.on_tick: Callable[[], None] | None = None
        self._subscriptions: dict[str, int] = {}
        self._lock = threading.RLock()
        self._connected = threading.Event()
        self._wanted = False
        self._attempt = 0
        self._next_attempt = 0.0
        self._connack_seen = False
        self._connack_deadline: float | None = None  # auto mode, v5 CONNECT sent: fall back after this
        self._generation = 0  # connections made so far (receipts name theirs)
        self._v5_silent_closes = 0
        self._rng = random.Random()
        self._own_loop = loop is None
        self._loop = loop if loop is not None else NetworkLoop(name=f"mqtt-{options.client_id}")
        self._paho_protocol: Literal["5", "3.1.1"] = self.protocol
        self._paho = self._make_paho()

    # -- public API -----------------------------------------------------------------------------
    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def start(self) -> MqttClient:
        """Begin connecting (in the background; failures are retried with backoff)."""
        self._wanted = True
        self._next_attempt = 0.0
        self._loop.add(self)
        if self._own_loop:
            self._loop.start()
        return self

    def wait_connected(self, timeout: float) -> bool:
        """Block until connected (CONNACK accepted) or ``timeout`` seconds pass."""
        return self._connected.wait(timeout)

    def stop(self, *, graceful: bool = True, timeout: float = 2.0) -> None:
        """Disconnect. ``graceful`` sends DISCONNECT (no Last Will); otherwise the socket just closes."""
        self._wanted = False
        if graceful and self.connected:
            done = threading.Event()
            self._loop.call(lambda: self._paho.disconnect())
            deadline = time.monotonic() + timeout
            while self._paho.socket() is not None and time.monotonic() < deadline:
                done.wait(0.02)
        self._loop.call(self._close_socket)
        self._loop.remove(self, wait=True)
        self._connected.clear()
        if self._own_loop:
            self._loop.stop()

    def call_soon(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` on this client's network-loop thread (at once when already on it)."""
        self._loop.call(fn)

    def subscribe(self, topic_filter: str, qos: int = 1) -> None:
        """Subscribe now if connected, and again after every reconnect."""
        with self._lock:
            self._subscriptions[topic_filter] = qos
        if self.connected:
            self._loop.call(lambda: self._paho.subscribe(topic_filter, qos))

    def unsubscribe(self, topic_filter: str) -> None:
        with self._lock:
            self._subscriptions.pop(topic_filter, None)
        if self.connected:
            self._loop.call(lambda: self._paho.unsubscribe(topic_filter))

    def publish(self, topic: str, payload: bytes, *, qos: int = 0, retain: bool = False) -> int:
        """Hand a message to the connection; returns its message id (0 for QoS 0).

        QoS 1 messages accepted while disconnected stay with the session and are sent after
        the reconnect; ``on_published(mid, ok)`` fires on PUBACK. Raises LinkError for a QoS 0
        message when not connected (it would be dropped silently otherwise) and for bad input.
        """
        if qos == 0 and not self.connected:
            raise LinkError(f"not connected to {self.options.broker_url}; QoS 0 message for {topic!r} not sent")
        try:
            info = self._paho.publish(topic, payload, qos=qos, retain=retain)
        except ValueError as exc:
            raise LinkError(f"cannot publish to {topic!r}: {exc}") from exc
        if info.rc not in (MQTTErrorCode.MQTT_ERR_SUCCESS, MQTTErrorCode.MQTT_ERR_NO_CONN):
            raise LinkError(f"publish to {topic!r} failed: {paho.error_string(info.rc)}")
        self.stats.published += 1
        return int(info.mid)

    def acknowledge(self, receipts: list[Receipt]) -> None:
        """Send the PUBACKs of ``receipts`` (in their order; any thread). Receipts of an earlier
        connection are skipped (see :class:`Receipt`)."""
        wanted = [r for r in receipts if r.qos > 0]
        if not wanted:
            return

        def send() -> None:
            for receipt in wanted:
                if receipt.generation == self._generation and self._connected.is_set():
                    self._paho.ack(receipt.mid, receipt.qos)

        self._loop.call(send)

    # -- paho plumbing --------------------------------------------------------------------------
    def _make_paho(self) -> paho.Client:
        opts = self.options
        v5 = self.protocol == "5"
        self._paho_protocol = self.protocol
        client = paho.Client(
            callback_api_version=CallbackAPIVersion.VERSION2,
            client_id=opts.client_id,
            protocol=MQTTProtocolVersion.MQTTv5 if v5 else MQTTProtocolVersion.MQTTv311,
            clean_session=None if v5 else opts.clean_start,
            reconnect_on_failure=False,
        )
        client.max_inflight_messages_set(opts.max_inflight)
        client.manual_ack_set(opts.manual_ack)
        client.max_queued_messages_set(0)
        client.connect_timeout = opts.connect_timeout_s
        if opts.username is not None:
            client.username_pw_set(opts.username, opts.password)
        if opts.will is not None:
            client.will_set(opts.will.topic, opts.will.payload, qos=opts.will.qos, retain=opts.will.retain)
        if self.address.tls or opts.tls is not None:
            self._configure_tls(client)
        client.on_connect = self._handle_connect
        client.on_disconnect = self._handle_disconnect
        client.on_message = self._handle_message
        client.on_publish = self._handle_publish
        client.on_socket_open = lambda _c, _u, sock: self._loop.socket_opened(self, sock)
        client.on_socket_close = lambda _c, _u, sock: self._loop.socket_closed(self, sock)
        client.on_socket_register_write = lambda _c, _u, sock: self._loop.want_write(self, sock, True)
        client.on_socket_unregister_write = lambda _c, _u, sock: self._loop.want_write(self, sock, False)
        return client

    def _configure_tls(self, client: paho.Client) -> None:
        tls = self.options.tls or TlsSettings()
        try:
            context = ssl.create_default_context(cafile=tls.ca_file)
            if tls.cert_file:
                context.load_cert_chain(tls.cert_file, tls.key_file)
            if tls.insecure_skip_verify:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
        except (OSError, ssl.SSLError) as exc:
            raise LinkError(f"cannot load TLS files (ca {tls.ca_file!r}, cert {tls.cert_file!r}): {exc}") from exc
        client.tls_set_context(context)
        if tls.insecure_skip_verify:
            client.tls_insecure_set(True)

    def _connect_now(self) -> None:
        """Called on the loop thread when a (re)connect is due."""
        if self._paho_protocol != self.protocol:  # fell back to 3.1.1: paho fixes the version at creation
            self._paho = self._make_paho()
        self._connack_seen = False
        try:
            if self.protocol == "5":
                props = Properties(PacketTypes.CONNECT)
                props.SessionExpiryInterval = self.options.session_expiry_s
                if self.options.receive_maximum is not None:
                    props.ReceiveMaximum = self.options.receive_maximum
                self._paho.connect(
                    self.address.host,
                    self.address.port,
                    keepalive=self.options.keepalive_s,
                    clean_start=self.options.clean_start,
                    properties=props,
                )
            else:
                self._paho.connect(self.address.host, self.address.port, keepalive=self.options.keepalive_s)
        except (OSError, ValueError) as exc:
            self._failed(f"connect to {self.options.broker_url} failed: {exc}")
            return
        if self.options.protocol == "auto" and self.protocol == "5":
            self._connack_deadline = time.monotonic() + V5_CONNACK_WAIT_S

    def _check_connack_wait(self, now: float) -> None:
        """A v5 CONNECT unanswered for ``V5_CONNACK_WAIT_S`` counts as a 3.1.1-only broker that
        will never answer it: close the socket and let the retry connect with 3.1.1."""
        deadline = self._connack_deadline
        if deadline is None or now < deadline:
            return
        self._connack_deadline = None
        if self._paho.socket() is not None and not self._connack_seen:
            # A CONNACK already waiting in the socket (a loop busy with a thousand connects has
            # not read it yet) is an answer, not silence.
            self._service_read()
        if self._connack_seen or self._paho.socket() is None or self.protocol != "5":
            return
        log.info(
            "%s: no CONNACK to an MQTT 5 CONNECT within %g s; trying MQTT 3.1.1",
            self.options.client_id,
            V5_CONNACK_WAIT_S,
        )
        self.protocol = "3.1.1"
        self.stats.last_error = f"no CONNACK to an MQTT 5 CONNECT within {V5_CONNACK_WAIT_S:g} s"
        self.stats.reason_history.append("no CONNACK to MQTT 5")
        drop_connection(self._paho)  # its socket-close callback arms the retry

    def _failed(self, reason: str) -> None:
        self.stats.connect_failures += 1
        self.stats.last_error = reason
        self._schedule_retry()
        log.debug("%s: %s", self.options.client_id, reason)

    def _schedule_retry(self) -> None:
        delay = backoff_delay(self._attempt, self.options.backoff_min_s, self.options.backoff_max_s, self._rng)
        self._attempt += 1
        self._next_attempt = time.monotonic() + delay

    def _handle_connect(self, _client: Any, _userdata: Any, flags: Any, reason_code: Any, _props: Any) -> None:
        self._connack_seen = True
        self._connack_deadline = None
        if reason_code.is_failure:
            reason = str(reason_code)
            self.stats.last_error = f"broker refused connection: {reason}"
            self.stats.reason_history.append(reason)
            if self.options.protocol == "auto" and self.protocol == "5":
                if int(reason_code.value) == _UNSUPPORTED_PROTOCOL_VERSION:
                    log.info("%s: broker refuses MQTT 5; falling back to 3.1.1", self.options.client_id)
                    self.protocol = "3.1.1"
            return
        self._attempt = 0
        self._v5_silent_closes = 0
        self._generation += 1
        self.stats.connects += 1
        with self._lock:
            subscriptions = list(self._subscriptions.items())
        if subscriptions:
            self._paho.subscribe(subscriptions)
        self._connected.set()
        if self.on_connected is not None:
            self._guard(self.on_connected, bool(flags.session_present))

    def _handle_disconnect(self, _client: Any, _userdata: Any, _flags: Any, reason_code: Any, _props: Any) -> None:
        was_connected = self._connected.is_set()
        self._connected.clear()
        reason = str(reason_code)
        if not self._connack_seen and self.options.protocol == "auto" and self.protocol == "5":
            # Some 3.1.1-only brokers just close on a v5 CONNECT instead of answering it.
            self._v5_silent_closes += 1
            if self._v5_silent_closes >= 2:
                log.info("%s: connection closed before CONNACK twice; trying MQTT 3.1.1", self.options.client_id)
                self.protocol = "3.1.1"
        if was_connected:
            self.stats.disconnects += 1
            if self.on_disconnected is not None:
                self._guard(self.on_disconnected, reason)
        elif self.stats.last_error is None or not self._connack_seen:
            self.stats.last_error = f"connection closed: {reason}"

    def _handle_message(self, _client: Any, _userdata: Any, message: Any) -> None:
        self.stats.messages_in += 1
        receipt = Receipt(int(message.mid), int(message.qos), self._generation)
        if self.options.manual_ack and self.on_delivery is not None:
            try:
                self.on_delivery(str(message.topic), bytes(message.payload), receipt)
            except Exception:  # noqa: BLE001 - a handler bug must not stop the loop; not acked: redelivered
                log.exception("%s: MQTT delivery handler failed", self.options.client_id)
            return
        if self.on_message is not None:
            self._guard(self.on_message, str(message.topic), bytes(message.payload))
        if self.options.manual_ack:
            self.acknowledge([receipt])

    def _handle_publish(self, _client: Any, _userdata: Any, mid: int, reason_code: Any, _props: Any) -> None:
        ok = not reason_code.is_failure
        if ok:
            self.stats.acked += 1
        else:
            self.stats.rejected += 1
            self.stats.last_error = f"broker rejected message {mid}: {reason_code}"
        if self.on_published is not None:
            self._guard(self.on_published, mid, ok)

    def _guard(self, fn: Callable[..., None], *args: Any) -> None:
        # A bug in a handler must not take the network loop (and every other client) down.
        try:
            fn(*args)
        except Exception:  # noqa: BLE001 - see above: the handler is not ours to trust
            log.exception("%s: MQTT callback %r failed", self.options.client_id, fn)

    def _close_socket(self) -> None:
        sock = self._paho.socket()
        if sock is not None:
            drop_connection(self._paho)

    # -- called by NetworkLoop ------------------------------------------------------------------
    def _service_connect(self, now: float) -> None:
        if self._wanted and self._paho.socket() is None and now >= self._next_attempt:
            self._next_attempt = now + 3600  # re-armed by _failed or _socket_gone
            self._connect_now()

    def _socket_gone(self) -> None:
        # Every way a connection ends (broker closed it, keepalive timeout, our own close)
        # passes through paho's socket-close callback; that is where the retry is armed.
        if self._wanted:
            self._schedule_retry()

    @property
    def misc_interval_s(self) -> float:
        """How often the loop runs this client's housekeeping (paho's keepalive, ``on_tick``)."""
        return min(_MISC_INTERVAL_S, self.options.keepalive_s / 4)

    def request_tick(self) -> None:
        """Have ``on_tick`` called within ``_TICK_INTERVAL_S`` (once), besides the housekeeping's."""
        self._loop.want_tick(self)

    def _service_misc(self) -> None:
        if self._connack_deadline is not None:
            self._check_connack_wait(time.monotonic())
        if self._paho.socket() is not None:
            self._paho.loop_misc()
        if self.on_tick is not None:
            self._guard(self.on_tick)

    def _service_read(self) -> None:
        self._paho.loop_read()
        sock = self._paho.socket()
        # TLS may hold decrypted bytes the selector cannot see.
        while isinstance(sock, ssl.SSLSocket) and sock.pending() > 0 and self._paho.socket() is sock:
            self._paho.loop_read()

    def _service_write(self) -> None:
        self._paho.loop_write()


class NetworkLoop:
    """One thread that runs the sockets of many ``MqttClient`` objects with a selector.

    Work that is not a socket event costs nothing per idle client: each client's housekeeping
    (paho's keepalive, its ``on_tick``) comes due on a heap at its own interval, and an extra
    tick runs only for the clients that asked for one (``MqttClient.request_tick``). A loop
    that walked every client ten times a second spent 3 % of a core on a thousand idle ones.
    """

    def __init__(self, name: str = "mqtt-loop") -> None:
        self.name = name
        self._selector = selectors.DefaultSelector()
        self._clients: set[MqttClient] = set()
        # Clients without a socket: the only ones that need a (re)connect check each turn,
        # so a loop with a thousand connected clients does not scan all of them per event.
        self._unconnected: set[MqttClient] = set()
        self._lock = threading.Lock()
        self._pending: list[Callable[[], object]] = []
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._thread: threading.Thread | None = None
        self._running = False
        # Heap of (due, token, client), loop thread only; a client's live entry is the one whose
        # token _misc_token holds (a client removed and added again leaves a stale one behind).
        self._misc_due: list[tuple[float, int, MqttClient]] = []
        self._misc_token: dict[MqttClient, int] = {}
        self._misc_order = 0
        self._tick_wanted: set[MqttClient] = set()  # loop thread only

    def start(self) -> NetworkLoop:
        if self._thread is None:
            self._running = True
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._running = False
        self._wake()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)
        self._thread = None

    def add(self, client: MqttClient) -> None:
        def register() -> None:
            if client not in self._clients:
                self._clients.add(client)
                self._schedule_misc(client, time.monotonic())
            if client._paho.socket() is None:
                self._unconnected.add(client)

        self.call(register)

    def remove(self, client: MqttClient, *, wait: bool = False) -> None:
        done = threading.Event()

        def drop() -> None:
            self._clients.discard(client)
            self._misc_token.pop(client, None)  # its heap entry is dropped when it comes due
            self._unconnected.discard(client)
            self._tick_wanted.discard(client)
            done.set()

        self.call(drop)
        if wait and self._thread is not None and self._thread is not threading.current_thread():
            done.wait(5)

    def call(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` on the loop thread (paho is not safe to drive from two threads at once)."""
        if self._thread is None or threading.current_thread() is self._thread:
            fn()
            return
        with self._lock:
            self._pending.append(fn)
        self._wake()

    # socket callbacks from paho (any thread)
    def socket_opened(self, client: MqttClient, sock: Any) -> None:
        self._unconnected.discard(client)
        try:
            # Small packets (PUBLISH, PUBACK) must not wait for Nagle + delayed ACK (~40 ms each).
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except (OSError, AttributeError):
            pass
        self.call(lambda: self._register(client, sock, write=True))

    def socket_closed(self, client: MqttClient, sock: Any) -> None:
        try:
            self._selector.unregister(sock)
        except (KeyError, ValueError):
            pass
        if client in self._clients:
            self._unconnected.add(client)
        client._socket_gone()

    def want_write(self, client: MqttClient, sock: Any, wanted: bool) -> None:
        self.call(lambda: self._register(client, sock, write=wanted))

    def want_tick(self, client: MqttClient) -> None:
        self.call(lambda: self._tick_wanted.add(client))

    def _schedule_misc(self, client: MqttClient, now: float) -> None:
        self._misc_order += 1
        self._misc_token[client] = self._misc_order
        heapq.heappush(self._misc_due, (now + client.misc_interval_s, self._misc_order, client))

    def _housekeeping(self, now: float) -> None:
        """The clients whose housekeeping is due, then the ticks asked for."""
        due = self._misc_due
        while due and due[0][0] <= now:
            _, token, client = heapq.heappop(due)
            if self._misc_token.get(client) != token:
                continue  # removed (and maybe added again under a newer token)
            self._tick_wanted.discard(client)  # its housekeeping calls on_tick too
            client._service_misc()
            self._schedule_misc(client, now)
        if self._tick_wanted:
            wanted, self._tick_wanted = self._tick_wanted, set()
            for client in wanted:
                if client in self._clients and client.on_tick is not None:
                    client._guard(client.on_tick)

    def _register(self, client: MqttClient, sock: socket.socket, *, write: bool) -> None:
        current: object = client._paho.socket()
        if current is not sock:
            return  # already closed or replaced
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if write else 0)
        try:
            self._selector.modify(sock, events, client)
        except KeyError:
            self._selector.register(sock, events, client)
        except ValueError:
            pass  # closed socket

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except (BlockingIOError, OSError):
            pass

    def _run(self) -> None:
        last_tick = 0.0
        while self._running:
            with self._lock:
                pending, self._pending = self._pending, []
            for fn in pending:
                try:
                    fn()
                except Exception:  # noqa: BLE001 - one bad call must not stop the loop every client shares
                    log.exception("%s: loop call failed", self.name)
            now = time.monotonic()
            for client in list(self._unconnected):
                client._service_connect(now)
            try:
                events = self._selector.select(timeout=_TICK_INTERVAL_S)
            except OSError:
                events = []
            for key, mask in events:
                if key.fileobj is self._wake_r:
                    try:
                        while self._wake_r.recv(4096):
                            pass
                    except (BlockingIOError, OSError):
                        pass
                    continue
                client = key.data
                try:
                    if mask & selectors.EVENT_READ:
                        client._service_read()
                    if mask & selectors.EVENT_WRITE and client._paho.socket() is key.fileobj:
                        client._service_write()
                except Exception:  # noqa: BLE001 - one bad call must not stop the loop every client shares
                    log.exception("%s: network error on %s", self.name, client.options.client_id)
            now = time.monotonic()
            if now - last_tick >= _TICK_INTERVAL_S:
                last_tick = now
                self._housekeeping(now)
        for client in list(self._clients):
            client._close_socket()
