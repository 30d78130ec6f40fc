"""The fleet service process: one MQTT client, the ingest, the rollout controller, maintenance.

Start-up order matters for resuming: migrate the database, then connect with the service's
*fixed* client id and a persistent session (QoS 1 statuses published while the service was
down are waiting at the broker). Then, once this process is the leader (``leader.py``: always
on SQLite; the holder of a PostgreSQL advisory lock otherwise), deliver any commands a
decision owed when the previous leader died (``deliver_follow_ups``) and drive every deployment
that is PENDING or IN_PROGRESS in its own thread (``RolloutController.run`` resumes at the
stored wave). New deployments are rows in the database (``submit``); the leader picks them up
at its next poll. A leader that loses its lock stops at once (``lost_leadership``).

The service watches its own broker connection (``broker_watch``): ``broker_status()`` feeds
``/healthz``, ``/metrics``, the dashboard's banner and its "unknown since" presence. At start it
waits for the broker up to ``broker_wait_s`` (0: for ever), one log line per backoff step.

The ingest runs in this process (``workers=0``) or in N worker processes (``workers.py``)
that share the busy subscriptions; presence is always ingested here (it is retained).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgesdk.errors import EdgeSDKError, LinkError, UsageError
from edgesdk.fleet.deployments import IN_PROGRESS, PENDING
from edgesdk.fleet.rollout import RolloutController
from edgesdk.fleet.service.broker_watch import DEFAULT_RELEARN_S, BrokerStatus, BrokerWatch
from edgesdk.fleet.service.database import migrate, open_engine, safe_url
from edgesdk.fleet.service.ingest import Ingest
from edgesdk.fleet.service.leader import Leadership
from edgesdk.fleet.service.retention import Retention, downsample, prune
from edgesdk.fleet.service.store import SqlRolloutStore
from edgesdk.fleet.service.workers import (
    DEFAULT_SHARE_GROUP,
    SHARED_SUFFIXES,
    WorkerPool,
    WorkerSettings,
    attach,
    ingest_client_options,
)
from edgesdk.protocol import topics

log = logging.getLogger(__name__)

ProgressFn = Callable[[str, dict[str, Any]], None]


@dataclass(frozen=True)
class ServiceSettings:
    """What ``edgesdk fleet serve`` is started with."""

    db_url: str
    namespace: str = "edgesdk"
    retention: Retention = field(default_factory=Retention)
    maintenance_interval_s: float = 60.0
    poll_s: float = 0.2
    retry_s: float = 5.0  # wait before driving a deployment again after its run raised
    connect_timeout_s: float = 10.0  # the ingest workers' first connect
    # How long a start waits for the broker (``--broker-wait``; 0: for ever), then exits.
    broker_wait_s: float = 60.0
    # After the broker is back, devices still marked offline are "unknown" this long (re-learning).
    presence_relearn_s: float = DEFAULT_RELEARN_S
    data_dir: Path = Path(".")  # uploaded bundles live in DATA_DIR/bundles
    api_bind: str | None = None  # HOST:PORT of the REST API and dashboard; None: no HTTP
    registry_path: Path | None = None  # the enrollment registry approvals are written to
    device_passwords: Path | None = None  # the broker's device password file (decommission removes a line)
    # Base URL devices fetch bundles from (the API's /artifacts, or a proxy/CDN in front of it);
    # None: http://HOST:PORT/artifacts of the API. Only with the API on.
    artifact_url: str | None = None
    workers: int = 0  # ingest worker processes; 0: ingest in this process
    share_group: str | None = DEFAULT_SHARE_GROUP  # None: plain subscriptions (one ingest only)
    instance: str | None = None  # names this process when several serve one fleet
    # HOST:PORT of a listener serving /metrics alone, without a token (None: /metrics on the API
    # only, with a viewer token).
    metrics_bind: str | None = None
    public_url: str | None = None  # where operators reach the dashboard; https: Secure cookies
    # Pending enrollment requests kept at most; more new ids are refused (and counted).
    max_pending_enrollments: int = 1000


def _reachable(host: str) -> str:
    """A host name devices can use for a listening address (a wildcard bind is not one)."""
    import socket

    return socket.getfqdn() if host in ("", "0.0.0.0", "::") else host  # noqa: S104 - compared, not bound


def service_client_id(namespace: str, instance: str | None = None) -> str:
    """The service's MQTT client id: fixed per namespace (and ``instance``, when several
    processes serve one fleet), so its persistent session (and the statuses queued in it while
    the service was down) survives a restart."""
    return f"edgesdk-fleet-service-{namespace.replace('/', '-')}" + (f"-{instance}" if instance else "")


def check_scaling(settings: ServiceSettings, db_url: str) -> None:
    """Refuse, in one line, a worker count the database or the broker setting cannot carry."""
    if settings.workers < 0:
        raise UsageError(f"bad --workers {settings.workers}: 0 (ingest in the service) or more worker processes")
    if settings.workers > 0 and not db_url.startswith("postgresql"):
        raise UsageError(
            f"--workers {settings.workers} needs a PostgreSQL --db: SQLite is one process (got {db_url.split(':')[0]})"
        )
    if settings.workers > 0 and settings.share_group is None:
        raise UsageError(
            f"--workers {settings.workers} needs shared subscriptions: drop --no-shared-subscriptions "
            "(a broker without them, e.g. RabbitMQ 3.x, carries one ingest)"
        )


class FleetService:
    """``edgesdk fleet serve``; ``on_progress`` sees every rollout event (the CLI logs them; a
    test passes a hook that kills the process at a chosen step)."""

    def __init__(
        self,
        settings: ServiceSettings,
        client_options: Any,
        operator_key: Any,
        *,
        on_progress: ProgressFn | None = None,
    ) -> None:
        self.settings = settings
        self.client_options = client_options
        self.operator_key = operator_key
        self.on_progress = on_progress or (lambda _event, _info: None)
        self.engine: Any = None
        self.store: SqlRolloutStore | None = None
        self.ingest: Ingest | None = None
        self.controller: RolloutController | None = None
        self.client: Any = None
        self.api: Any = None
        self.metrics_server: Any = None
        self._runners: dict[str, threading.Thread] = {}
        self._retry_after: dict[str, float] = {}
        self.leadership: Leadership | None = None
        self.leading = False
        self.lost_leadership = False
        self.pool: WorkerPool | None = None
        self._checked_lead = 0.0
        self._stop = threading.Event()
        # Off when the broker turns out to speak MQTT 3.1.1 only (no $share/...), see start().
        self._shared_subscriptions = settings.share_group is not None
        self.broker = BrokerWatch(client_options.broker_url, relearn_s=settings.presence_relearn_s)

    def broker_status(self) -> BrokerStatus:
        """The service's broker connection now (read-only; any thread)."""
        return self.broker.status()

    # -- life cycle -------------------------------------------------------------------------

    def start(self) -> FleetService:
        from edgesdk.mqtt.client import MqttClient

        check_scaling(self.settings, self.settings.db_url)
        self.engine = open_engine(self.settings.db_url)
        revision = migrate(self.engine)
        log.info("fleet database %s at schema revision %s", safe_url(self.engine), revision)
        self.store = SqlRolloutStore(self.engine)
        self.leadership = Leadership(self.engine, self.settings.namespace)
        self.client = MqttClient(ingest_client_options(self.client_options))
        self.ingest = Ingest(
            self.engine,
            self.settings.namespace,
            self.store,
            acknowledge=self.client.acknowledge,
            publish=self.client.publish,  # capture acknowledgements to devices (issue 41)
            max_pending_enrollments=self.settings.max_pending_enrollments,
        )
        self.ingest.start()
        self.controller = RolloutController(
            self.store,
            self.client,
            self.settings.namespace,
            self.operator_key,
            on_progress=self._progress,
            poll_s=self.settings.poll_s,
        )
        # The service owns the client: the ingest first, then the controller (chunk requests).
        attach(self.client, self.ingest, self._ingest_filters(), fallback=self.controller.handle_message)
        self.broker.attach(self.client)
        self.client.start()
        self._wait_for_broker()
        if self.settings.share_group is not None and self.client.protocol == "3.1.1":
            self._plain_subscriptions_on_mqtt_311()
        elif self.settings.share_group is not None:
            for suffix in SHARED_SUFFIXES:  # a session from before shared subscriptions still has these
                self.client.unsubscribe(topics.all_devices_filter(self.settings.namespace, suffix))
        if self.settings.workers > 0:
            worker = WorkerSettings(
                db_url=self.settings.db_url,
                worker_id=f"{self.settings.instance}-" if self.settings.instance else "w",
                namespace=self.settings.namespace,
                share_group=self.settings.share_group or DEFAULT_SHARE_GROUP,
                connect_timeout_s=self.settings.connect_timeout_s,
                max_pending_enrollments=self.settings.max_pending_enrollments,
            )
            self.pool = WorkerPool(self.settings.workers, worker, self.client_options).start()
        self._lead()
        if self.settings.api_bind is not None:
            from edgesdk.fleet.service.rest.app import ApiContext, create_app
            from edgesdk.fleet.service.rest.server import ApiServer

            context = ApiContext(
                engine=self.engine,
                store=self.store,
                commands=self.controller,
                data_dir=self.settings.data_dir,
                registry_path=self.settings.registry_path,
                device_passwords=self.settings.device_passwords,
                artifacts=self.controller.chunks.path_of,
                public_url=self.settings.public_url,
                broker_status=self.broker_status,
            )
            self.api = ApiServer(create_app(context), self.settings.api_bind).start()
            self.controller.artifact_base_url = (
                self.settings.artifact_url or f"http://{_reachable(self.api.host)}:{self.api.port}/artifacts"
            )
        if self.settings.metrics_bind is not None:
            from edgesdk.fleet.service.rest.app import create_metrics_app
            from edgesdk.fleet.service.rest.server import ApiServer

            self.metrics_server = ApiServer(
                create_metrics_app(self.engine, self.broker_status),
                self.settings.metrics_bind,
                option="--metrics-listen",
            ).start()
        return self

    def _wait_for_broker(self) -> None:
        """Block until the client is connected: up to ``broker_wait_s`` (0: for ever), one
        WARNING per backoff step (the client retries on its own meanwhile); then LinkError."""
        assert self.client is not None and self.ingest is not None
        url, limit = self.client_options.broker_url, self.settings.broker_wait_s
        deadline = None if limit == 0 else time.monotonic() + limit
        step = 1.0
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if self.client.wait_connected(step if left is None else max(0.0, min(step, left))):
                return
            reason = self.client.stats.last_error or "no answer yet"
            if deadline is not None and time.monotonic() >= deadline:
                self.client.stop(graceful=False)
                self.ingest.stop()
                raise LinkError(
                    f"cannot connect to broker {url} within {limit:g} s: {reason} "
                    "(start the broker, or wait longer with --broker-wait, 0 for ever)"
                )
            until = "for ever" if deadline is None else f"for {deadline - time.monotonic():.0f} s more"
            log.warning("broker %s not reachable yet (%s); still trying %s", url, reason, until)
            step = min(step * 2, 30.0)

    def serve_forever(self) -> None:
        """Drive deployments and run maintenance until :meth:`stop` (or a signal handler) asks."""
        next_maintenance = time.monotonic()
        while not self._stop.is_set():
            if self.pool is not None:
                self.pool.check()
            self._lead()
            if self.lost_leadership:
                break
            if self.leading:
                self._drive_deployments()
                if time.monotonic() >= next_maintenance:
                    self.maintenance()
                    next_maintenance = time.monotonic() + self.settings.maintenance_interval_s
            self._stop.wait(self.settings.poll_s)
        self._shutdown()

    def _plain_subscriptions_on_mqtt_311(self) -> None:
        """The broker speaks MQTT 3.1.1 only (the client fell back): it has no shared
        subscriptions, so ``$share/...`` would match nothing. One ingest (this process) takes the
        device messages on plain subscriptions; worker processes cannot share them."""
        assert self.client is not None and self.ingest is not None
        url = self.client_options.broker_url
        if self.settings.workers > 0:
            self.client.stop(graceful=False)
            self.ingest.stop()
            raise UsageError(
                f"--workers {self.settings.workers} needs MQTT 5 shared subscriptions, but the broker {url} "
                "speaks MQTT 3.1.1 only: use --workers 0 (one ingest process) or a broker with MQTT 5 (mosquitto 2)"
            )
        shared = set(self._ingest_filters())
        self._shared_subscriptions = False
        plain = self._ingest_filters()
        for topic_filter in sorted(shared - set(plain)):
            self.client.unsubscribe(topic_filter)
        for topic_filter in plain:
            self.client.subscribe(topic_filter, qos=1)
        log.info("broker %s speaks MQTT 3.1.1 only: plain subscriptions, one ingest process (this one)", url)

    def _ingest_filters(self) -> list[str]:
        assert self.ingest is not None
        group = self.settings.share_group if self._shared_subscriptions else None
        if group is None:
            return self.ingest.filters()
        presence = self.ingest.filters((topics.PRESENCE,))  # retained: never through a shared subscription
        if self.settings.workers > 0:
            return presence
        return presence + self.ingest.filters(SHARED_SUFFIXES, share_group=group)

    def _lead(self) -> None:
        """Become the leader when the lock is free; notice at once when a held lock is gone."""
        if self.leadership is None or self.controller is None or self.client is None:
            return
        if self.leading:
            now = time.monotonic()
            if now - self._checked_lead >= 1.0:
                self._checked_lead = now
                if not self.leadership.still_held():
                    log.error("no longer the leader (the lock's database connection is gone); stopping")
                    self.lost_leadership = True
            return
        if not self.leadership.acquire():
            return
        self.leading = True
        log.info("leader of namespace %s: driving rollouts", self.settings.namespace)
        self.client.subscribe(self.controller.chunks.request_filter, qos=0)  # only the leader has bundles
        owed = self.controller.deliver_follow_ups()
        if owed:
            log.info("delivered %d command(s) owed by decisions of the previous leader", owed)

    def stop(self) -> None:
        """Ask ``serve_forever`` to return; running deployments stay IN_PROGRESS (resumable)."""
        self._stop.set()

    def _shutdown(self) -> None:
        if self.api is not None:
            self.api.stop()
        if self.metrics_server is not None:
            self.metrics_server.stop()
        if self.controller is not None:
            self.controller.stop()
        for runner in self._runners.values():
            runner.join(30)
        if self.pool is not None:
            self.pool.stop()
        if self.ingest is not None:
            self.ingest.stop()
        if self.client is not None:
            self.client.stop()
        if self.leadership is not None:
            self.leadership.release()
        if self.engine is not None:
            self.engine.dispose()

    # -- work -------------------------------------------------------------------------------

    def _progress(self, event: str, info: dict[str, Any]) -> None:
        log.info("rollout %s %s", event, json.dumps(info, default=str))
        self.on_progress(event, info)

    def _drive_deployments(self) -> None:
        if self.store is None:
            return
        try:
            active = self.store.in_states({PENDING, IN_PROGRESS})
        except EdgeSDKError as exc:
            log.error("cannot list deployments: %s", exc)
            return
        now = time.monotonic()
        for deployment_id in active:
            runner = self._runners.get(deployment_id)
            if runner is not None and runner.is_alive():
                continue
            if self._retry_after.get(deployment_id, 0.0) > now:
                continue
            runner = threading.Thread(
                target=self._run, args=(deployment_id,), name=f"rollout-{deployment_id}", daemon=True
            )
            self._runners[deployment_id] = runner
            runner.start()

    def _run(self, deployment_id: str) -> None:
        if self.controller is None:
            return
        try:
            state = self.controller.run(deployment_id)
            log.info("deployment %s: %s", deployment_id, state)
        except EdgeSDKError as exc:
            log.error("deployment %s not driven now (retry in %g s): %s", deployment_id, self.settings.retry_s, exc)
            self._retry_after[deployment_id] = time.monotonic() + self.settings.retry_s

    def maintenance(self) -> None:
        """Downsample telemetry and apply retention (also run at start-up)."""
        if self.engine is None:
            return
        try:
            minutes = downsample(self.engine)
            deleted = prune(self.engine, self.settings.retention, time.time())
            if minutes or any(deleted.values()):
                log.debug("telemetry: %d minute aggregates written, deleted %s", minutes, deleted)
        except EdgeSDKError as exc:
            log.error("telemetry maintenance failed (retried next interval): %s", exc)
