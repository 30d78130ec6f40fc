"""The fleet's current alerts, as data (``GET /api/v1/alerts``): the same conditions the
dashboard's Alerts box shows — a device offline, a device stepped down for heat, a rollout
aborted, device messages refused, a model's inputs drifting or its requests bad too often
(``quality.quality_alerts``, the conditions of the shipped Prometheus rules). Nothing is stored: each is read from the state it describes,
so an alert ends when its condition does."""

from __future__ import annotations

import time
from typing import Any

import sqlalchemy as sa

from edgesdk.fleet.service import schema
from edgesdk.fleet.service.database import Transaction
from edgesdk.fleet.service.ingest import read_counters
from edgesdk.fleet.service.metrics import THERMAL_STATES, latest_telemetry
from edgesdk.fleet.service.quality import DRIFT_FOR_S, DRIFT_PSI, QUALITY_WINDOW_S, QualityAlert, quality_alerts

#: How many recent rollouts are looked at for aborts (the dashboard shows the last 20).
RECENT_ROLLOUTS = 20


def current_alerts(engine: Any, store: Any, broker: Any = None) -> list[dict[str, Any]]:
    """Every alert now, critical first, then by target. ``broker``: the service's
    ``BrokerStatus``; while it says presence is unknown (broker lost, or re-learning after)
    no device is alerted as offline (``broker_watch``)."""
    with Transaction(engine) as db:
        offline = db.execute(
            sa.select(schema.devices.c.device_id, schema.devices.c.last_seen).where(schema.devices.c.online.is_(False))
        ).all()
        hot = [r for r in db.execute(latest_telemetry()).all() if r.governor_state in THERMAL_STATES]
        quality = quality_alerts(db, time.time())
    if broker is not None and not broker.presence_known():
        offline = []
    found = [_alert("offline", "critical", r.device_id, f"{r.device_id} is offline", r.last_seen) for r in offline]
    found += [
        _alert(
            "thermal",
            "warning",
            r.device_id,
            f"{r.device_id} stepped down for heat ({r.governor_state}, {r.temperature_c or 0:.0f} °C)",
            None,
        )
        for r in hot
    ]
    found += [
        _alert("rollout_aborted", "critical", row.id, f"rollout {row.id} aborted: {row.reason}", row.updated)
        for row in store.all()[-RECENT_ROLLOUTS:]
        if row.state == "ABORTED"
    ]
    found += [_quality_alert(q) for q in quality]
    counters = read_counters(engine, "alerts")
    refused = counters.get("malformed", 0) + counters.get("impersonating", 0)
    if refused:
        found.append(_alert("refused_messages", "warning", "ingest", f"{refused} device messages refused", None))
    return sorted(found, key=lambda a: (a["severity"] != "critical", a["kind"], a["target"]))


def _quality_alert(q: QualityAlert) -> dict[str, Any]:
    if q.kind == "model_drift":
        text = (
            f"{q.model} on {q.device_id} drifts: PSI {q.figure:.2f} on {q.tensor} "
            f"(over {DRIFT_PSI} for {DRIFT_FOR_S / 60:.0f} min)"
        )
    else:
        what = "refused for NaN/Inf" if q.kind == "model_nonfinite" else "out of the reference's range"
        text = (
            f"{q.model} on {q.device_id}: {q.figure:.1%} of requests {what} in the last {QUALITY_WINDOW_S / 60:.0f} min"
        )
    return _alert(q.kind, "warning", q.device_id, text, q.since)


def _alert(kind: str, severity: str, target: str, message: str, since: float | None) -> dict[str, Any]:
    return {"kind": kind, "severity": severity, "target": target, "message": message, "since": since}
