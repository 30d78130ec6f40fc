"""Ingest that scales out: worker processes sharing the device subscriptions.

Each worker is one process with its own MQTT connection and database pool. The busy suffixes
(telemetry, events, OTA statuses, enrollment requests) are subscribed as MQTT 5 *shared
subscriptions* (``$share/GROUP/{ns}/devices/+/telemetry``): the broker hands each message to one
member of the group, so N workers share the load and any of them may get any device's
messages (the database de-duplicates, see ``ingest.py``). Presence stays with the service
processes on a plain subscription: it is retained, and brokers never send retained messages
to a shared subscription, so a shared-only service would not learn of devices that announced
themselves before it started.

A worker acknowledges a message only after its batch committed and keeps a persistent session
under a fixed client id (``edgesdk-fleet-ingest-{ns}-{worker_id}``): a worker killed mid-batch
loses nothing, the broker redelivers what it had not acknowledged when the worker returns with
the same id. ``WorkerPool`` (``edgesdk fleet serve --workers N``) restarts a dead worker under
its id at once; a worker started on its own (``edgesdk fleet ingest --worker-id ID``) needs a
supervisor that does the same (systemd ``Restart=always``, a Kubernetes StatefulSet).

A worker stopped cleanly (SIGTERM) first unsubscribes, so the broker stops routing to it,
then writes and acknowledges what it holds, then disconnects.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import re
import signal
import threading
import time
from dataclasses import dataclass, replace
from typing import Any

from edgesdk.errors import LinkError, UsageError
from edgesdk.fleet.service.database import migrate, open_engine
from edgesdk.fleet.service.ingest import DEFAULT_MAX_PENDING_ENROLLMENTS, Ingest
from edgesdk.fleet.service.store import SqlRolloutStore
from edgesdk.protocol import topics

log = logging.getLogger(__name__)

#: The suffixes ingest workers share; presence is the service's (see the module docstring).
SHARED_SUFFIXES = (topics.TELEMETRY, topics.EVENTS, topics.OTA_STATUS, topics.ENROLL, topics.CAPTURE)
DEFAULT_SHARE_GROUP = "edgesdk-fleet"
#: Unacknowledged messages the broker may have in flight to one ingest client: a few batches.
RECEIVE_MAXIMUM = 4000
_RESTART_BACKOFF_S = (0.0, 1.0, 5.0)


_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,47}$")


def check_name(value: str, option: str) -> str:
    """A share group, instance or worker id: it becomes a topic level or part of a client id."""
    if not _NAME.match(value):
        raise UsageError(f"bad {option} {value!r}: letters, digits, '_' and '-' (at most 48, no '/', '+', '#')")
    return value


def worker_client_id(namespace: str, worker_id: str) -> str:
    """A worker's fixed MQTT client id: its persistent session (and what it had not
    acknowledged) waits for it under this id."""
    return f"edgesdk-fleet-ingest-{namespace.replace('/', '-')}-{worker_id}"


def ingest_client_options(options: Any) -> Any:
    """``options`` for a consumer that acknowledges after commit, from a persistent session."""
    return replace(
        options,
        manual_ack=True,
        receive_maximum=RECEIVE_MAXIMUM,
        clean_start=False,
        session_expiry_s=max(options.session_expiry_s, 7 * 24 * 3600),
    )


def attach(client: Any, ingest: Ingest, filters: list[str], fallback: Any = None) -> None:
    """Route ``client``'s messages to ``ingest`` (acknowledged after commit) and subscribe;
    messages the ingest does not take go to ``fallback(topic, payload)`` and are acked at once."""

    def deliver(topic: str, payload: bytes, receipt: Any) -> None:
        if ingest.handle(topic, payload, receipt):
            return
        if fallback is not None:
            fallback(topic, payload)
        client.acknowledge([receipt])

    client.on_delivery = deliver
    for topic_filter in filters:
        client.subscribe(topic_filter, qos=1)


@dataclass(frozen=True)
class WorkerSettings:
    """One ingest worker: where it writes and which shared-subscription group it joins."""

    db_url: str
    worker_id: str
    namespace: str = "edgesdk"
    share_group: str = DEFAULT_SHARE_GROUP
    connect_timeout_s: float = 10.0
    parent_pid: int | None = None  # stop when this process is gone (a worker of ``fleet serve``)
    # Enrollment requests are a shared suffix: the workers, not the service, store them, so
    # they enforce ``--max-pending-enrollments``.
    max_pending_enrollments: int = DEFAULT_MAX_PENDING_ENROLLMENTS


class IngestWorker:
    """One worker process's body: ``start()``, ``run_until_stopped()``; ``stop()`` from a signal."""

    def __init__(self, settings: WorkerSettings, client_options: Any) -> None:
        self.settings = settings
        self.client_options = ingest_client_options(
            replace(client_options, client_id=worker_client_id(settings.namespace, settings.worker_id))
        )
        self.engine: Any = None
        self.ingest: Ingest | None = None
        self.client: Any = None
        self._stop = threading.Event()

    def start(self) -> IngestWorker:
        from edgesdk.mqtt.client import MqttClient

        self.engine = open_engine(self.settings.db_url)
        migrate(self.engine)  # a no-op when the service already did; a worker may start first
        self.client = MqttClient(self.client_options)
        self.ingest = Ingest(
            self.engine,
            self.settings.namespace,
            SqlRolloutStore(self.engine),
            acknowledge=self.client.acknowledge,
            publish=self.client.publish,  # capture acknowledgements to devices (issue 41)
            max_pending_enrollments=self.settings.max_pending_enrollments,
        ).start()
        attach(self.client, self.ingest, self.filters())
        self.client.start()
        if not self.client.wait_connected(self.settings.connect_timeout_s):
            reason = self.client.stats.last_error or f"no answer in {self.settings.connect_timeout_s:g} s"
            self.client.stop(graceful=False)
            self.ingest.stop()
            raise LinkError(f"cannot connect to broker {self.client_options.broker_url}: {reason}")
        if self.client.protocol == "3.1.1":  # the client fell back: $share/... would match nothing
            self.client.stop(graceful=False)
            self.ingest.stop()
            raise UsageError(
                f"an ingest worker needs MQTT 5 shared subscriptions, but the broker {self.client_options.broker_url} "
                "speaks MQTT 3.1.1 only: ingest in the service (fleet serve --workers 0) or use a broker with MQTT 5"
            )
        return self

    def filters(self) -> list[str]:
        assert self.ingest is not None
        return self.ingest.filters(SHARED_SUFFIXES, share_group=self.settings.share_group)

    def run_until_stopped(self) -> None:
        parent = self.settings.parent_pid
        while not self._stop.wait(1.0):
            if parent is not None and os.getppid() != parent:
                log.warning("ingest worker %s: its service is gone; stopping", self.settings.worker_id)
                break
        self.shutdown()

    def stop(self) -> None:
        self._stop.set()

    def shutdown(self) -> None:
        if self.client is not None and self.ingest is not None:
            for topic_filter in self.filters():
                self.client.unsubscribe(topic_filter)  # the broker stops routing to us first
            time.sleep(0.2)  # messages already on their way arrive and are stored below
            self.ingest.stop()  # writes and acknowledges what it holds
            self.client.stop()
            log.info(
                "ingest worker %s stopped after %d message(s)", self.settings.worker_id, self.ingest.counters.messages
            )
        if self.engine is not None:
            self.engine.dispose()


def run_worker(settings: WorkerSettings, client_options: Any) -> None:
    """The entry point of a worker process (``fleet ingest`` and ``WorkerPool``)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("alembic").setLevel(logging.WARNING)
    worker = IngestWorker(settings, client_options).start()
    signal.signal(signal.SIGTERM, lambda *_: worker.stop())
    signal.signal(signal.SIGINT, lambda *_: worker.stop())
    log.info(
        "ingest worker %s (pid %d) on %s, group %s",
        settings.worker_id,
        os.getpid(),
        client_options.broker_url,
        settings.share_group,
    )
    worker.run_until_stopped()


class WorkerPool:
    """``edgesdk fleet serve --workers N``: N worker processes, each restarted under its own id
    when it dies (so the broker redelivers what it had not acknowledged)."""

    def __init__(self, count: int, settings: WorkerSettings, client_options: Any) -> None:
        self.count = count
        self.settings = settings
        self.client_options = client_options
        self._context = multiprocessing.get_context("spawn")  # no inherited threads or sockets
        self._processes: dict[str, Any] = {}
        self._restarts: dict[str, int] = {}
        self._next_start: dict[str, float] = {}

    def ids(self) -> list[str]:
        return [f"{self.settings.worker_id}{index}" for index in range(self.count)]

    def start(self) -> WorkerPool:
        for worker_id in self.ids():
            self._spawn(worker_id)
        return self

    def pids(self) -> dict[str, int]:
        return {w: p.pid for w, p in self._processes.items() if p.is_alive()}

    def check(self) -> None:
        """Restart every worker that died (at once the first time, then with a short backoff)."""
        now = time.monotonic()
        for worker_id, process in list(self._processes.items()):
            if process.is_alive():
                continue
            if worker_id not in self._next_start:
                restarts = self._restarts.get(worker_id, 0)
                log.error(
                    "ingest worker %s (pid %s) exited with %s; restarting it", worker_id, process.pid, process.exitcode
                )
                self._next_start[worker_id] = now + _RESTART_BACKOFF_S[min(restarts, len(_RESTART_BACKOFF_S) - 1)]
            if now >= self._next_start[worker_id]:
                del self._next_start[worker_id]
                self._restarts[worker_id] = self._restarts.get(worker_id, 0) + 1
                self._spawn(worker_id)

    def stop(self, timeout: float = 15.0) -> None:
        for process in self._processes.values():
            if process.is_alive():
                process.terminate()  # SIGTERM: unsubscribe, store, acknowledge, disconnect
        deadline = time.monotonic() + timeout
        for process in self._processes.values():
            process.join(max(0.1, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join(5)

    def _spawn(self, worker_id: str) -> None:
        settings = replace(self.settings, worker_id=worker_id, parent_pid=os.getpid())
        process = self._context.Process(
            target=run_worker, args=(settings, self.client_options), name=f"fleet-ingest-{worker_id}", daemon=False
        )
        process.start()
        self._processes[worker_id] = process
        log.info("ingest worker %s started (pid %d)", worker_id, process.pid)
