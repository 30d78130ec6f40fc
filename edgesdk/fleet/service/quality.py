"""Model quality in the fleet service (issue 41): the drift scores and data-quality counts the
devices put in telemetry (``ModelQuality``), stored per (device, model, release, time), read
back for the REST API, the dashboard, ``/metrics`` and the alerts.

A report names its quality per model (``models[i].quality``) and, for the default model, at the
top level (``quality``): the two are the same figures, so the default's is stored once. Each
report's figures are one ``model_quality`` row, de-duplicated with the telemetry's ``msg_id``
(QoS 1 redelivers), and kept as long as raw telemetry (``retention.prune``). Their counts are
added to ``model_quality_totals`` once per new row: the Prometheus counters, which never go back.

A report made while a probation's shadow runs also carries the shadow agreement per output
(``ModelQuality.agreement``: the figure, its lower bound, the samples, the deployment's minimum),
kept in the row's ``scores`` JSON beside the drift scores (null when no shadow ran).

A report may leave a tensor out: the device scores a tensor only once its window counted 5
values a bin (``agent/drift/window.py``), so sparse traffic sends reports with some or no scores.
Such a report is no evidence either way: the tensor's score stands through the reports that do
not score it for up to ``HOLD_S``, so it neither ends a drifted run nor starts one, on
``/metrics`` (the series keeps its value: ``held_quality``) and in the dashboard's alerts alike.
The ingest stores what a report carries over in its ``scores`` JSON (``held``: figures and when
they were scored), worked out from the model's previous report, so a read stays one row per
model; a report that arrives after a newer one (a replayed outbox) does not change the newer one's.

The alert thresholds live here, once: the shipped Prometheus rules
(``deploy/prometheus/fleet-alerts.yml``) use the same numbers, and a test compares them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import sqlalchemy as sa

from edgesdk.fleet.service import schema
from edgesdk.fleet.service.database import Transaction, insert_ignoring_duplicates
from edgesdk.schemas.messages import ModelQuality, Telemetry

#: PSI over this is "act" by convention; the drift alert fires after ``DRIFT_FOR_S`` above it.
DRIFT_PSI = 0.25
DRIFT_FOR_S = 600.0
#: Share of the requests seen over ``QUALITY_WINDOW_S`` refused for NaN/Inf, or out of the
#: reference's range, above which the data-quality alerts fire. Requests seen: the sketched ones
#: plus the refused ones (a refused request is never sketched).
NONFINITE_SHARE = 0.01
OUT_OF_RANGE_SHARE = 0.05
QUALITY_WINDOW_S = 600.0
#: How long a tensor's score stands through later reports of its model that do not score it;
#: past it the score is stale (its series leaves /metrics, a drifted run ends). As long as the
#: drift alert's own wait: a run is never carried by older evidence than the alert judges.
HOLD_S = DRIFT_FOR_S
#: Rows one read returns at most (the newest of them).
MAX_REPORTS = 5000
COUNTS = ("nonfinite", "out_of_range", "constant")
T = TypeVar("T")


@dataclass(frozen=True)
class QualityRow:
    """One stored report of one model."""

    device_id: str
    model: str
    release: int | None
    ts: float
    samples: int
    window_s: float
    reference: bool
    inputs: dict[str, dict[str, float]]
    outputs: dict[str, dict[str, float]]
    nonfinite: int
    out_of_range: int
    constant: int
    agreement: dict[str, dict[str, Any]] | None = None  # per output, while a shadow ran
    held: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)  # carried over, with "ts"
    drifting: dict[str, dict[str, float]] = field(default_factory=dict)  # when each run over DRIFT_PSI began

    def tensors(self, score: str = "psi") -> dict[tuple[str, str], float]:
        """``score`` (psi, js or ks) by (direction, tensor), of the tensors that carry it."""
        return {key: figures[score] for key, figures in self.scores().items() if score in figures}

    def scores(self) -> dict[tuple[str, str], dict[str, float]]:
        """The scored tensors' figures by (direction, tensor)."""
        return _by_tensor(self.inputs, self.outputs)

    def standing(self) -> Standing:
        """Every score that stands at this report: its own and those it holds."""
        return _standing(self.ts, {"inputs": self.inputs, "outputs": self.outputs, "held": self.held})


#: (direction, tensor) -> (when it was scored, its figures)
Standing = dict[tuple[str, str], tuple[float, dict[str, float]]]


def _standing(ts: float, scores: dict[str, Any]) -> Standing:
    held = scores.get("held", {})
    found = {
        key: (f["ts"], {k: v for k, v in f.items() if k != "ts"})
        for key, f in _by_tensor(held.get("inputs", {}), held.get("outputs", {})).items()
    }
    return found | {key: (ts, f) for key, f in _by_tensor(scores.get("inputs", {}), scores.get("outputs", {})).items()}


def _by_tensor(inputs: dict[str, T], outputs: dict[str, T]) -> dict[tuple[str, str], T]:
    return {("input", n): s for n, s in inputs.items()} | {("output", n): s for n, s in outputs.items()}


def quality_rows(message: Telemetry) -> list[dict[str, Any]]:
    """The ``model_quality`` rows of one telemetry report: one per model that carries figures."""
    found: dict[str, tuple[Any, ModelQuality]] = {}
    for entry in message.models:
        if entry.quality is not None:
            found.setdefault(entry.model.name, (entry.model, entry.quality))
    if message.quality is not None and message.model is not None:
        found.setdefault(message.model.name, (message.model, message.quality))
    return [_row(message, model, quality) for model, quality in found.values()]


def _row(message: Telemetry, model: Any, quality: ModelQuality) -> dict[str, Any]:
    scores = {  # a score the device did not give (ks: no ordered bins, or an older agent) stays absent
        "inputs": {k: v.model_dump(exclude_none=True) for k, v in quality.inputs.items()},
        "outputs": {k: v.model_dump(exclude_none=True) for k, v in quality.outputs.items()},
    }
    if quality.agreement is not None:
        scores["agreement"] = {k: v.model_dump() for k, v in quality.agreement.items()}
    psis = [s.psi for s in (*quality.inputs.values(), *quality.outputs.values())]
    return {
        "device_id": message.device_id,
        "msg_id": message.msg_id,
        "model_name": model.name,
        "model_release": model.release,
        "ts": message.ts.timestamp(),
        "samples": quality.samples,
        "window_s": quality.window_s,
        "reference": quality.reference,
        "scores": json.dumps(scores, sort_keys=True),
        "worst_psi": max(psis, default=None),
        "nonfinite": quality.nonfinite,
        "out_of_range": quality.out_of_range,
        "constant": quality.constant,
    }


class QualityWriter:
    """Stores quality rows inside the ingest's transaction (``Ingest._write_batch``)."""

    def __init__(self, engine: Any) -> None:
        table = schema.model_quality
        self._insert = insert_ignoring_duplicates(engine, table).returning(
            table.c.device_id, table.c.msg_id, table.c.model_name
        )
        self._totals = _add_totals_statement(engine)

    def write(self, db: Any, telemetry: list[Telemetry]) -> int:
        """Insert the rows of ``telemetry``; the new ones (not redeliveries) count in the totals."""
        unique = {_key(row): row for message in telemetry for row in quality_rows(message)}  # a batch may repeat one
        rows = sorted(unique.values(), key=lambda row: row["ts"])  # oldest first: each holds from the one before
        if not rows:
            return 0
        _hold(db, rows)
        new = {tuple(r) for r in db.execute(self._insert, rows).all()}
        totals: dict[tuple[str, str], dict[str, Any]] = {}
        for row in rows:
            if _key(row) not in new:
                continue
            key = (row["device_id"], row["model_name"])
            total = totals.setdefault(
                key, {"device_id": key[0], "model_name": key[1], "samples": 0} | dict.fromkeys(COUNTS, 0)
            )
            for name in ("samples", *COUNTS):
                total[name] += row[name]
        if totals:
            db.execute(self._totals, [totals[k] for k in sorted(totals)])  # key order: no deadlock
        return len(new)


def _hold(db: Any, rows: list[dict[str, Any]]) -> None:
    """Add to each row (oldest first) the scores it holds: those standing at its model's previous
    report (in this batch, else the newest stored before it) that it does not score itself,
    scored within ``HOLD_S`` before it; and when each standing score over ``DRIFT_PSI`` began its
    run (``drifting``: the previous report's start if one stood over it there, else this score's)."""
    q = schema.model_quality
    previous: dict[tuple[str, str], tuple[Standing, dict[tuple[str, str], float]]] = {}
    for row in rows:
        pair = (row["device_id"], row["model_name"])
        if pair not in previous:
            prior = db.execute(
                sa.select(q.c.ts, q.c.scores)
                .where((q.c.device_id == pair[0]) & (q.c.model_name == pair[1]) & (q.c.ts <= row["ts"]))
                .order_by(q.c.ts.desc(), q.c.id.desc())
                .limit(1)
            ).first()
            previous[pair] = _carried(prior.ts, json.loads(prior.scores)) if prior is not None else ({}, {})
        standing, runs = previous[pair]
        scores = json.loads(row["scores"])
        own = _standing(row["ts"], scores)
        held = {k: v for k, v in standing.items() if k not in own and v[0] >= row["ts"] - HOLD_S}
        drifting = {k: runs.get(k, ts) for k, (ts, figures) in (held | own).items() if figures["psi"] > DRIFT_PSI}
        if held:
            scores["held"] = _nested({k: figures | {"ts": ts} for k, (ts, figures) in held.items()})
        if drifting:
            scores["drifting"] = _nested(drifting)
        row["scores"] = json.dumps(scores, sort_keys=True)
        previous[pair] = (held | own, drifting)


def _carried(ts: float, scores: dict[str, Any]) -> tuple[Standing, dict[tuple[str, str], float]]:
    """What a stored report passes on: the scores standing at it, and their drifted runs' starts."""
    runs = scores.get("drifting", {})
    return _standing(ts, scores), _by_tensor(runs.get("inputs", {}), runs.get("outputs", {}))


def _nested(by_tensor: dict[tuple[str, str], Any]) -> dict[str, dict[str, Any]]:
    """{"inputs": {name: value}, "outputs": {…}}, as the scores JSON keeps tensors."""
    return {
        f"{direction}s": {name: value for (d, name), value in by_tensor.items() if d == direction}
        for direction in ("input", "output")
    }


def _key(row: dict[str, Any]) -> tuple[str, str, str]:
    return (row["device_id"], row["msg_id"], row["model_name"])


def _add_totals_statement(engine: Any) -> Any:
    """``INSERT … ON CONFLICT (device_id, model_name) DO UPDATE`` adding the new counts."""
    table = schema.model_quality_totals
    if engine.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert  # type: ignore[assignment]
    statement = insert(table)
    added = {name: table.c[name] + statement.excluded[name] for name in ("samples", *COUNTS)}
    return statement.on_conflict_do_update(index_elements=["device_id", "model_name"], set_=added)


def _quality(row: Any) -> QualityRow:
    scores = json.loads(row.scores)
    return QualityRow(
        device_id=row.device_id,
        model=row.model_name,
        release=row.model_release,
        ts=row.ts,
        samples=row.samples,
        window_s=row.window_s,
        reference=bool(row.reference),
        inputs=scores.get("inputs", {}),
        outputs=scores.get("outputs", {}),
        nonfinite=row.nonfinite,
        out_of_range=row.out_of_range,
        constant=row.constant,
        agreement=scores.get("agreement"),
        held=scores.get("held", {}),
        drifting=scores.get("drifting", {}),
    )


def device_quality(engine: Any, device_id: str, *, since: float, model: str | None = None) -> list[QualityRow]:
    """The device's reports from ``since`` (Unix time), oldest first (the newest ``MAX_REPORTS``)."""
    table = schema.model_quality
    query = sa.select(table).where((table.c.device_id == device_id) & (table.c.ts >= since))
    if model is not None:
        query = query.where(table.c.model_name == model)
    with Transaction(engine) as db:
        rows = db.execute(query.order_by(table.c.ts.desc(), table.c.model_name).limit(MAX_REPORTS)).all()
    return [_quality(r) for r in reversed(rows)]


def probation_agreement(db: Any, device_ids: list[str], model: str) -> dict[str, dict[str, dict[str, Any]]]:
    """Each device's newest report of ``model``, its shadow agreement per output (devices whose
    newest report carries none are left out): the rollout page's probation rows."""
    q = schema.model_quality
    found: dict[str, dict[str, dict[str, Any]]] = {}
    for device_id in device_ids:  # the devices in probation: a handful, one index seek each
        newest = db.execute(
            sa.select(q.c.scores)
            .where((q.c.device_id == device_id) & (q.c.model_name == model))
            .order_by(q.c.ts.desc())
            .limit(1)
        ).scalar()
        agreement = json.loads(newest).get("agreement") if newest is not None else None
        if agreement:
            found[device_id] = agreement
    return found


def latest_quality(db: Any) -> list[QualityRow]:
    """Each known device's newest report of each model it reported (one index seek per pair)."""
    q, totals, d = schema.model_quality, schema.model_quality_totals, schema.devices
    newest = (
        sa.select(q.c.id)
        .where((q.c.device_id == totals.c.device_id) & (q.c.model_name == totals.c.model_name))
        .order_by(q.c.ts.desc())
        .limit(1)
        .correlate(totals)
        .scalar_subquery()
    )
    query = (
        sa.select(q)
        .select_from(totals)
        .join(d, d.c.device_id == totals.c.device_id)
        .join(q, q.c.id == newest)
        .order_by(q.c.device_id, q.c.model_name)
    )
    return [_quality(r) for r in db.execute(query).all()]


def held_quality(db: Any) -> list[QualityRow]:
    """``latest_quality`` with each tensor's newest score: its own, or one it holds (scored within
    ``HOLD_S`` before it by an earlier report). What ``/metrics`` exports."""
    rows = []
    for row in latest_quality(db):
        standing = {key: figures for key, (_, figures) in row.standing().items()}
        inputs = {name: figures for (direction, name), figures in standing.items() if direction == "input"}
        outputs = {name: figures for (direction, name), figures in standing.items() if direction == "output"}
        rows.append(replace(row, inputs=inputs, outputs=outputs, held={}, drifting={}))
    return rows


def quality_totals(db: Any) -> list[Any]:
    """The running totals of each known device's models."""
    totals, d = schema.model_quality_totals, schema.devices
    query = sa.select(totals).join(d, d.c.device_id == totals.c.device_id)
    return list(db.execute(query.order_by(totals.c.device_id, totals.c.model_name)).all())


def prune_quality(db: Any, cutoff: float) -> int:
    """Delete the reports older than ``cutoff`` (the totals stay); how many went."""
    table = schema.model_quality
    return int(db.execute(table.delete().where(table.c.ts < cutoff)).rowcount)


@dataclass(frozen=True)
class QualityAlert:
    """A model whose inputs drift, or whose requests are bad too often, on one device."""

    kind: str  # model_drift | model_nonfinite | model_out_of_range
    device_id: str
    model: str
    figure: float  # the PSI, or the share of requests
    since: float  # the first report of the run that raised it
    tensor: str = ""  # for drift: "input x" / "output y", the worst one


def quality_alerts(db: Any, now: float) -> list[QualityAlert]:
    """The drift and data-quality conditions the shipped Prometheus rules raise, read from the
    stored reports: a tensor's PSI over ``DRIFT_PSI`` in every report that scored it for
    ``DRIFT_FOR_S`` (a report that did not score it skipped, for up to ``HOLD_S``); a share of
    NaN/Inf or out-of-range requests over the last ``QUALITY_WINDOW_S`` above its threshold."""
    latest = latest_quality(db)
    return _drift_alerts(latest, now) + _share_alerts(db, latest, now)


def _drift_alerts(latest: list[QualityRow], now: float) -> list[QualityAlert]:
    """Per model, the worst tensor whose run over ``DRIFT_PSI`` lasted ``DRIFT_FOR_S`` (each
    tensor is its own series on /metrics, so each has its own run)."""
    found: list[QualityAlert] = []
    for row in latest:
        started = _by_tensor(row.drifting.get("inputs", {}), row.drifting.get("outputs", {}))
        runs = [
            (figures["psi"], key, started.get(key, ts))  # a report stored before runs were kept: its score's time
            for key, (ts, figures) in row.standing().items()
            if figures["psi"] > DRIFT_PSI
        ]
        alerting = [run for run in runs if now - run[2] >= DRIFT_FOR_S]
        if alerting:
            psi, (direction, tensor), since = max(alerting, key=lambda run: run[0])
            found.append(QualityAlert("model_drift", row.device_id, row.model, psi, since, f"{direction} {tensor}"))
    return found


def _share_alerts(db: Any, latest: list[QualityRow], now: float) -> list[QualityAlert]:
    q = schema.model_quality
    known = {(r.device_id, r.model): r for r in latest}
    windows = db.execute(
        sa.select(
            q.c.device_id,
            q.c.model_name,
            sa.func.sum(q.c.samples).label("samples"),
            sa.func.sum(q.c.nonfinite).label("nonfinite"),
            sa.func.sum(q.c.out_of_range).label("out_of_range"),
        )
        .where(q.c.ts >= now - QUALITY_WINDOW_S)
        .group_by(q.c.device_id, q.c.model_name)
    ).all()
    found: list[QualityAlert] = []
    for w in windows:
        seen = int(w.samples or 0) + int(w.nonfinite or 0)  # a refused request is not sketched
        newest = known.get((w.device_id, w.model_name))
        if newest is None or seen == 0:
            continue
        for kind, column, threshold in (
            ("model_nonfinite", q.c.nonfinite, NONFINITE_SHARE),
            ("model_out_of_range", q.c.out_of_range, OUT_OF_RANGE_SHARE),
        ):
            share = int(getattr(w, column.name) or 0) / seen
            if share > threshold:
                found.append(QualityAlert(kind, w.device_id, w.model_name, share, _run_start(db, newest, column == 0)))
    return found


def _run_start(db: Any, row: QualityRow, fine: Any) -> float:
    """When the run of reports that are not ``fine``, up to ``row``, began (``row.ts`` at most)."""
    q = schema.model_quality
    pair = (q.c.device_id == row.device_id) & (q.c.model_name == row.model) & (q.c.ts <= row.ts)
    last_fine = db.execute(sa.select(sa.func.max(q.c.ts)).where(pair & fine)).scalar()
    after = pair if last_fine is None else pair & (q.c.ts > last_fine)
    first = db.execute(sa.select(sa.func.min(q.c.ts)).where(after)).scalar()
    return float(first if first is not None else row.ts)
