"""``GET /metrics``: the fleet in the Prometheus text format (0.0.4), computed from the database.

Written by hand like the agent's ``/metrics`` (no client library: a scrape is one read of a
few tables). What is exported, and what the alert rules in ``deploy/prometheus/`` use:

* the service's broker connection: ``edgesdk_fleet_broker_connected`` (1/0) and
  ``edgesdk_fleet_broker_disconnects_total``; while the broker is lost (and while presence is
  re-learned after it is back) devices whose stored presence may be stale are counted as
  ``unknown`` and get no ``edgesdk_fleet_device_up`` sample (``broker_watch``);
* devices by state (``online``/``offline``/``unknown``), by model version, by OTA state; per
  device ``edgesdk_fleet_device_up`` and its last-seen time;
* per device, from its newest telemetry: latency p50/p95/p99 (seconds, ``percentile`` label),
  max temperature, whether the governor stepped down for heat (``throttled``), outbox depth
  and messages dropped;
* ``edgesdk_fleet_reported_p95_latency_seconds``: a histogram per model version of the p95
  values the devices reported over the last five minutes (reports carry percentiles, not raw samples,
  so this is the distribution of device p95s, not a fleet-wide percentile);
* rollouts: per deployment updated in the last day, its state (1) and its devices by state;
* model quality (issue 41), from each device's newest report of each model: the drift scores
  ``edgesdk_fleet_model_drift_psi``, ``_js`` and ``_ks`` (agents since 8e13df7; none over class
  shares) per tensor (``direction``: input or output), each from the newest report that scored
  the tensor within ``quality.HOLD_S`` (a report with too few values to score it keeps the series
  and its value: it neither ends nor starts the drift alert's run), and
  ``edgesdk_fleet_model_requests_total`` by ``kind`` (sampled, nonfinite, out_of_range, constant)
  added up over every report stored (``edgesdk.fleet.service.quality``), and while a probation's
  shadow runs ``edgesdk_fleet_model_shadow_agreement`` per output (``bound``: value, lower, minimum);
* the ingest's counters (messages, malformed, impersonating, duplicates, enrollment requests
  stored and refused, messages of accounts that are not devices) since the database was created.

The page is cached for ``cache_s`` so many scrapers do not multiply the reads.
"""

from __future__ import annotations

import math
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from edgesdk.fleet.service import schema
from edgesdk.fleet.service.broker_watch import BrokerStatus, presence_label
from edgesdk.fleet.service.database import Transaction
from edgesdk.fleet.service.ingest import read_counters
from edgesdk.fleet.service.quality import COUNTS, QualityRow, held_quality, quality_totals

#: Governor states that mean "stepped down for heat" (``agent/governor/machine.py`` names them).
THERMAL_STATES = frozenset({"STEPPED_DOWN", "SAVE_STEPPED_DOWN"})
LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_WINDOW_S = 300.0
_ROLLOUT_WINDOW_S = 86400.0


def _escape(value: Any) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class _Page:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str, samples: list[tuple[dict[str, Any], float]]) -> None:
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            self.sample(name, labels, value)

    def sample(self, name: str, labels: dict[str, Any], value: float) -> None:
        text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
        number = "NaN" if isinstance(value, float) and math.isnan(value) else repr(float(value))
        self.lines.append(f"{name}{{{text}}} {number}" if text else f"{name} {number}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def latest_telemetry() -> Any:
    """Each known device's newest telemetry row: one index seek per device on (device_id, ts)
    (a GROUP BY over the whole table read every raw row: 0.25–0.85 s for a day of 1,000 devices)."""
    t, d = schema.telemetry, schema.devices
    newest = (
        sa.select(t.c.id)
        .where(t.c.device_id == d.c.device_id)
        .order_by(t.c.ts.desc())
        .limit(1)
        .correlate(d)
        .scalar_subquery()
    )
    return sa.select(t).join(d, t.c.id == newest)


class FleetMetrics:
    """Renders the page for one database; ``broker_status``: the service's broker connection
    (None: not known here, its families have no samples)."""

    def __init__(
        self, engine: Any, *, cache_s: float = 2.0, broker_status: Callable[[], BrokerStatus] | None = None
    ) -> None:
        self.engine = engine
        self.cache_s = cache_s
        self.broker_status = broker_status
        self._lock = threading.Lock()
        self._cached: tuple[float, str] | None = None

    def render(self, now: float | None = None) -> str:
        with self._lock:
            if self._cached is not None and time.monotonic() - self._cached[0] < self.cache_s and now is None:
                return self._cached[1]
            text = self._render(time.time() if now is None else now)
            self._cached = (time.monotonic(), text)
            return text

    def _render(self, now: float) -> str:
        page = _Page()
        with Transaction(self.engine) as db:
            devices = db.execute(sa.select(schema.devices).order_by(schema.devices.c.device_id)).all()
            t = schema.telemetry
            latest = {r.device_id: r for r in db.execute(latest_telemetry()).all()}
            recent = db.execute(
                sa.select(t.c.device_id, t.c.model_version, t.c.p95_ms).where(
                    (t.c.ts >= now - _WINDOW_S) & t.c.p95_ms.is_not(None)
                )
            ).all()
            d = schema.deployments
            rollouts = db.execute(sa.select(d.c.id, d.c.state).where(d.c.updated >= now - _ROLLOUT_WINDOW_S)).all()
            dd = schema.deployment_devices
            rollout_states = db.execute(
                sa.select(dd.c.deployment_id, dd.c.state, sa.func.count())
                .where(dd.c.deployment_id.in_([r.id for r in rollouts]))
                .group_by(dd.c.deployment_id, dd.c.state)
            ).all()
            quality, totals = held_quality(db), quality_totals(db)
        counters = read_counters(self.engine, "metrics")

        broker = self.broker_status() if self.broker_status is not None else None
        self._broker_families(page, broker)
        presence = {r.device_id: presence_label(r.online, broker).split(" ")[0] for r in devices}
        page.family(
            "edgesdk_fleet_devices",
            "gauge",
            "devices known to the service, by presence (unknown: the service cannot see the broker)",
            [({"state": s}, sum(1 for p in presence.values() if p == s)) for s in ("online", "offline", "unknown")],
        )
        by_model: dict[tuple[str, str], int] = defaultdict(int)
        by_ota: dict[str, int] = defaultdict(int)
        for r in devices:
            by_model[(r.model_name or "none", r.model_version or "none")] += 1
            by_ota[r.ota_state or "NONE"] += 1
        page.family(
            "edgesdk_fleet_devices_by_model",
            "gauge",
            "devices by the model version they run",
            [({"model": m, "version": v}, n) for (m, v), n in sorted(by_model.items())],
        )
        page.family(
            "edgesdk_fleet_devices_by_ota_state",
            "gauge",
            "devices by their last OTA state",
            [({"state": s}, n) for s, n in sorted(by_ota.items())],
        )
        page.family(
            "edgesdk_fleet_device_up",
            "gauge",
            "1 when the device's presence says online (no sample while it is unknown)",
            [({"device": r.device_id}, 1 if r.online else 0) for r in devices if presence[r.device_id] != "unknown"],
        )
        page.family(
            "edgesdk_fleet_device_last_seen_timestamp_seconds",
            "gauge",
            "when the device was last heard from (Unix time)",
            [({"device": r.device_id}, r.last_seen) for r in devices],
        )
        models = {r.device_id: (r.model_name or "none", r.model_version or "none") for r in devices}
        samples: list[tuple[dict[str, Any], float]] = []
        for device_id, row in sorted(latest.items()):
            model, version = models.get(device_id, ("none", "none"))
            for percentile, value in (("p50", row.p50_ms), ("p95", row.p95_ms), ("p99", row.p99_ms)):
                if value is not None:
                    labels = {"device": device_id, "model": model, "version": version, "percentile": percentile}
                    samples.append((labels, value / 1000.0))
        page.family(
            "edgesdk_fleet_device_latency_seconds",
            "gauge",
            "latency percentiles of the device's newest telemetry report",
            samples,
        )

        def per_device(name: str, help_text: str, column: str) -> None:
            values = [
                ({"device": k}, getattr(v, column)) for k, v in sorted(latest.items()) if getattr(v, column) is not None
            ]
            page.family(name, "gauge", help_text, values)

        per_device("edgesdk_fleet_device_temperature_celsius", "hottest sensor of the newest report", "temperature_c")
        per_device("edgesdk_fleet_device_outbox_depth", "messages waiting in the device's MQTT outbox", "outbox_depth")
        page.family(
            "edgesdk_fleet_device_throttled",
            "gauge",
            "1 when the device's governor stepped down for heat",
            [({"device": k}, 1 if v.governor_state in THERMAL_STATES else 0) for k, v in sorted(latest.items())],
        )
        page.family(
            "edgesdk_fleet_device_dropped_messages_total",
            "counter",
            "telemetry messages the device's outbox dropped (as it reports)",
            [({"device": k}, v.dropped_messages) for k, v in sorted(latest.items()) if v.dropped_messages is not None],
        )

        name = "edgesdk_fleet_reported_p95_latency_seconds"
        page.lines.append(f"# HELP {name} p95 latencies the devices reported over the last 5 minutes, by model version")
        page.lines.append(f"# TYPE {name} histogram")
        by_version: dict[str, list[float]] = defaultdict(list)
        for r in recent:
            by_version[r.model_version or "none"].append(r.p95_ms / 1000.0)
        for version, values in sorted(by_version.items()):
            for bound in LATENCY_BUCKETS_S:
                page.sample(f"{name}_bucket", {"version": version, "le": bound}, sum(v <= bound for v in values))
            page.sample(f"{name}_bucket", {"version": version, "le": "+Inf"}, len(values))
            page.sample(f"{name}_sum", {"version": version}, sum(values))
            page.sample(f"{name}_count", {"version": version}, len(values))

        page.family(
            "edgesdk_fleet_rollout_info",
            "gauge",
            "1 per deployment updated in the last day, labelled with its state",
            [({"deployment": r.id, "state": r.state}, 1) for r in rollouts],
        )
        page.family(
            "edgesdk_fleet_rollout_devices",
            "gauge",
            "devices of a recent deployment by their state in it",
            [({"deployment": dep, "state": state}, count) for dep, state, count in rollout_states],
        )
        self._quality_families(page, quality, totals)
        kinds = (
            "messages",
            "malformed",
            "impersonating",
            "duplicates",
            "unstorable",
            "telemetry",
            "events",
            "presence",
            "ota_status",
            "enroll_requests",
            "enroll_refused",  # new ids beyond --max-pending-enrollments
            "not_a_device",  # on the topic of the bootstrap or operator account
            "capture_stored",  # capture files uploaded (edgesdk/fleet/service/captures.py)
            "capture_refused",  # over the size cap of one capture file
            "capture_evicted",  # deleted for a device's capture quota
            "capture_corrupt",  # files in chunks whose bytes did not make their SHA-256
            "capture_expired",  # uploads in chunks idle past their timeout
        )
        page.family(
            "edgesdk_fleet_ingest_total",
            "counter",
            "device messages the ingest handled, by outcome or kind",
            [({"kind": k}, counters.get(k, 0)) for k in kinds],
        )
        return page.text()

    @staticmethod
    def _quality_families(page: _Page, quality: list[QualityRow], totals: list[Any]) -> None:
        for score, help_text in (
            ("psi", "population stability index of the tensor's live values against the bundle's reference profile"),
            ("js", "Jensen-Shannon distance (base 2) of the tensor's live values from the reference profile"),
            ("ks", "Kolmogorov-Smirnov distance of the tensor's live values from the reference profile (binned CDFs)"),
        ):
            samples = [
                ({"device": row.device_id, "model": row.model, "tensor": name, "direction": direction}, value)
                for row in quality
                for (direction, name), value in sorted(row.tensors(score).items())
            ]
            page.family(
                f"edgesdk_fleet_model_drift_{score}", "gauge", f"{help_text}, newest report scoring it", samples
            )
        page.family(
            "edgesdk_fleet_model_shadow_agreement",
            "gauge",
            "shadow agreement of the output with the previous release in probation, newest report: bound=value "
            "(the figure), lower (its 95 % lower bound, what probation judges), minimum (the deployment's)",
            _agreement_samples(quality),
        )
        page.family(
            "edgesdk_fleet_model_requests_total",
            "counter",
            "requests the device's model saw, by kind: sampled (sketched), nonfinite (refused for NaN/Inf), "
            "out_of_range (outside the reference's range), constant (every value the same)",
            [
                ({"device": t.device_id, "model": t.model_name, "kind": kind}, getattr(t, column))
                for t in totals
                for kind, column in (("sampled", "samples"), *((c, c) for c in COUNTS))
            ],
        )

    @staticmethod
    def _broker_families(page: _Page, broker: BrokerStatus | None) -> None:
        page.family(
            "edgesdk_fleet_broker_connected",
            "gauge",
            "1 while the fleet service is connected to its MQTT broker",
            [] if broker is None else [({}, 1 if broker.connected else 0)],
        )
        page.family(
            "edgesdk_fleet_broker_disconnects_total",
            "counter",
            "times the fleet service lost its MQTT broker since it started",
            [] if broker is None else [({}, broker.disconnects)],
        )


def _agreement_samples(quality: list[QualityRow]) -> list[tuple[dict[str, Any], float]]:
    samples: list[tuple[dict[str, Any], float]] = []
    for row in quality:
        for output, figure in sorted((row.agreement or {}).items()):
            labels = {"device": row.device_id, "model": row.model, "output": output}
            for bound, key in (("value", "value"), ("lower", "lower_bound"), ("minimum", "minimum")):
                if figure.get(key) is not None:
                    samples.append((labels | {"bound": bound}, float(figure[key])))
    return samples
