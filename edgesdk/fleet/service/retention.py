"""Telemetry retention: per-minute aggregates from the raw rows, then old rows deleted.

Raw telemetry is kept ``raw_retention_s`` (days); its per-minute aggregates
(``telemetry_minutely``) ``minutely_retention_s`` (months). Each pass aggregates the minutes
touched by rows inserted since the last pass (a watermark on the row id, persisted), *from all
raw rows of those minutes*, so a report that arrives late (a device's outbox replayed after
an outage) re-computes its minute exactly. Grouping is done in Python: minute arithmetic on
floats is not portable SQL, and a pass only reads the rows of the minutes it touches.
Raw rows are only deleted once aggregated. Events and OTA history follow the long retention.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from edgesdk.fleet.service import schema
from edgesdk.fleet.service.database import Transaction, upsert
from edgesdk.fleet.service.quality import prune_quality

_WATERMARK = "downsample_watermark_id"
_PASS_ROWS = 200_000


@dataclass(frozen=True)
class Retention:
    """How long each kind of row is kept (seconds)."""

    raw_retention_s: float = 7 * 86400.0
    minutely_retention_s: float = 180 * 86400.0


def minute_of(ts: float) -> float:
    return float(int(ts // 60) * 60)


def downsample(engine: Any) -> int:
    """Aggregate the minutes touched since the last pass; returns how many minute rows were written."""
    telemetry = schema.telemetry
    written = 0
    while True:
        with Transaction(engine) as db:
            watermark = _read_counter(db, _WATERMARK)
            new = db.execute(
                sa.select(telemetry.c.id, telemetry.c.device_id, telemetry.c.ts)
                .where(telemetry.c.id > watermark)
                .order_by(telemetry.c.id)
                .limit(_PASS_ROWS)
            ).all()
            if not new:
                return written
            dirty: dict[str, set[float]] = defaultdict(set)
            for row in new:
                dirty[row.device_id].add(minute_of(row.ts))
            aggregates: list[dict[str, Any]] = []
            for device_id, minutes in dirty.items():
                rows = db.execute(
                    sa.select(telemetry).where(
                        (telemetry.c.device_id == device_id)
                        & (telemetry.c.ts >= min(minutes))
                        & (telemetry.c.ts < max(minutes) + 60)
                    )
                ).all()
                by_minute: dict[float, list[Any]] = defaultdict(list)
                for row in rows:
                    minute = minute_of(row.ts)
                    if minute in minutes:
                        by_minute[minute].append(row)
                aggregates += [_aggregate(device_id, minute, samples) for minute, samples in by_minute.items()]
            if aggregates:
                db.execute(upsert(engine, schema.telemetry_minutely, ["device_id", "minute"]), aggregates)
            _write_counter(db, _WATERMARK, new[-1].id)
            written += len(aggregates)
        if len(new) < _PASS_ROWS:
            return written


def prune(engine: Any, retention: Retention, now: float) -> dict[str, int]:
    """Delete rows past their retention (raw telemetry only once aggregated); returns counts."""
    raw_cutoff = now - retention.raw_retention_s
    long_cutoff = now - retention.minutely_retention_s
    deleted: dict[str, int] = {}
    with Transaction(engine) as db:
        watermark = _read_counter(db, _WATERMARK)
        t = schema.telemetry
        deleted["telemetry"] = db.execute(t.delete().where((t.c.ts < raw_cutoff) & (t.c.id <= watermark))).rowcount
        deleted["model_quality"] = prune_quality(db, raw_cutoff)  # kept like raw telemetry (issue 41)
        m = schema.telemetry_minutely
        deleted["telemetry_minutely"] = db.execute(m.delete().where(m.c.minute < long_cutoff)).rowcount
        e = schema.events
        deleted["events"] = db.execute(e.delete().where(e.c.ts < long_cutoff)).rowcount
        h = schema.ota_history
        deleted["ota_history"] = db.execute(h.delete().where(h.c.ts < long_cutoff)).rowcount
    return deleted


def _aggregate(device_id: str, minute: float, rows: list[Any]) -> dict[str, Any]:
    def values(name: str) -> list[float]:
        return [getattr(r, name) for r in rows if getattr(r, name) is not None]

    p50 = values("p50_ms")
    throughput = values("throughput_rps")
    return {
        "device_id": device_id,
        "minute": minute,
        "samples": len(rows),
        "requests": sum(r.requests or 0 for r in rows),
        "p50_ms": sum(p50) / len(p50) if p50 else None,
        "p95_ms": max(values("p95_ms"), default=None),
        "p99_ms": max(values("p99_ms"), default=None),
        "throughput_rps": sum(throughput) / len(throughput) if throughput else None,
        "errors": max(values("errors"), default=None),
        "temperature_c": max(values("temperature_c"), default=None),
        "dropped_messages": max(values("dropped_messages"), default=None),
    }


def _read_counter(db: Any, name: str) -> int:
    table = schema.service_counters
    value = db.execute(sa.select(table.c.value).where(table.c.name == name)).scalar()
    return int(value or 0)


def _write_counter(db: Any, name: str, value: int) -> None:
    table = schema.service_counters
    if db.execute(sa.select(table.c.name).where(table.c.name == name)).first() is None:
        db.execute(table.insert().values(name=name, value=value))
    else:
        db.execute(table.update().where(table.c.name == name).values(value=value))
