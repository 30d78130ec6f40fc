"""The REST API's devices: list (filters, a page, each with its newest telemetry row), one,
its history and its models' drift and data-quality reports, decommission; the groups they
announced and the fleet's current alerts."""

from __future__ import annotations

import json
import time
from typing import Any, Literal

import sqlalchemy as sa
from fastapi import Depends, Query, Response
from pydantic import BaseModel, Field

from edgesdk.fleet.service import alerts, captures, quality, schema, tokens
from edgesdk.fleet.service.database import Transaction
from edgesdk.fleet.service.metrics import latest_telemetry
from edgesdk.fleet.service.rest.context import ApiContext, api_context, signed_in
from edgesdk.fleet.service.rest.routing import (
    ONE_ERRORS,
    READ_ERRORS,
    WRITE_ERRORS,
    Paging,
    Route,
    RouteTable,
    audited_call,
    documented,
    found_or_404,
    paging,
    row_or_404,
)
from edgesdk.fleet.service.rest.schemas import (
    Alert,
    Decommissioned,
    Device,
    DeviceHistory,
    DeviceState,
    Group,
    Page,
)


def list_devices(
    group: str | None = Query(None, max_length=128),
    model: str | None = Query(None, max_length=128),
    version: str | None = Query(None, max_length=64),
    state: DeviceState | None = Query(None, description="online, offline, or the OTA state last reported"),
    page: Paging = Depends(paging),
    context: ApiContext = Depends(api_context),
) -> dict[str, Any]:
    rows = _devices(context.engine, group=group, model=model, version=version, state=state)
    shown = rows[page.offset : page.offset + page.limit]
    latest = _latest_telemetry(context.engine, [r.device_id for r in shown])
    broker = _broker(context)
    return page.page([_device(r, latest.get(r.device_id), broker) for r in shown], len(rows), sliced=True)


def get_device(device_id: str, context: ApiContext = Depends(api_context)) -> Device:
    row = _known_device(context.engine, device_id)
    return _device(row, _latest_telemetry(context.engine, [device_id]).get(device_id), _broker(context))


def decommission_device(
    device_id: str,
    operator: tokens.Operator = Depends(signed_in),
    context: ApiContext = Depends(api_context),
) -> dict[str, Any]:
    """Decommission: the device's broker password is removed (the broker refuses it from its
    next reload), its enrollment revoked (no key slot in bundles packaged from now on), and
    it leaves the device list (its history stays until retention removes it)."""
    _known_device(context.engine, device_id)
    return audited_call(
        context.engine, operator, "device.decommission", device_id, lambda: _decommission(context, device_id)
    )


def device_history(
    device_id: str,
    hours: float = Query(24.0, gt=0, le=24 * 366),
    resolution: Literal["auto", "raw", "minute"] = "auto",
    context: ApiContext = Depends(api_context),
) -> dict[str, Any]:
    _known_device(context.engine, device_id)
    return _history(context.engine, device_id, hours, resolution)


def device_quality(
    device_id: str,
    model: str | None = Query(None, max_length=128, description="one model's reports (default: every model)"),
    since: float | None = Query(None, ge=0, le=1e10, description="Unix time (default: the last 24 h)"),
    context: ApiContext = Depends(api_context),
) -> dict[str, Any]:
    """The drift scores and data-quality counts in the device's telemetry, per model and
    report, oldest first (at most the newest 5,000): PSI, Jensen-Shannon and KS distance per input
    and output tensor against the bundle's reference profile, requests refused for NaN/Inf,
    out of the reference's range, constant; during probation, the shadow agreement per output."""
    _known_device(context.engine, device_id)
    start = since if since is not None else time.time() - 86400
    rows = quality.device_quality(context.engine, device_id, since=start, model=model)
    return {"device_id": device_id, "reports": [_quality_report(r) for r in rows]}


def device_captures(device_id: str, context: ApiContext = Depends(api_context)) -> dict[str, Any]:
    """The capture files the device uploaded, newest first (at most 1,000), without their bytes:
    each is sealed to the operator's capture key, which the service does not hold."""
    _known_device(context.engine, device_id)
    return {"device_id": device_id, "captures": captures.list_captures(context.engine, device_id)}


def download_capture(capture_id: int, context: ApiContext = Depends(api_context)) -> Response:
    """One capture file as the device sealed it (``edgesdk capture decrypt`` opens it)."""
    name, data = found_or_404(captures.read_capture(context.engine, capture_id), f"no capture {capture_id}")
    disposition = f'attachment; filename="{name}"'
    return Response(data, media_type="application/octet-stream", headers={"Content-Disposition": disposition})


def list_groups(page: Paging = Depends(paging), context: ApiContext = Depends(api_context)) -> dict[str, Any]:
    """Every group a device announced, with how many devices are in it and online."""
    counts: dict[str, list[int]] = {}
    for row in _devices(context.engine):
        for group in json.loads(row.groups or "[]"):
            count = counts.setdefault(group, [0, 0])
            count[0] += 1
            count[1] += 1 if row.online else 0
    groups = [{"group": g, "devices": n, "online": on} for g, (n, on) in sorted(counts.items())]
    return page.page(groups)


def list_alerts(page: Paging = Depends(paging), context: ApiContext = Depends(api_context)) -> dict[str, Any]:
    """The alerts the dashboard shows now (offline, heat, aborted rollouts, refused messages)."""
    broker = context.broker_status() if context.broker_status is not None else None
    return page.page(alerts.current_alerts(context.engine, context.store, broker))


class DriftFigures(BaseModel):
    psi: float
    js: float
    ks: float | None = Field(None, description="Kolmogorov-Smirnov on the binned CDFs; null: not sent (class shares)")


class AgreementFigure(BaseModel):
    kind: str = Field(description="top1, ctc, abs, max_abs (shares of samples that agree), cosine, iou (tails)")
    value: float
    lower_bound: float = Field(description="the one-sided 95 % bound probation holds against the minimum")
    samples: int
    minimum: float | None = Field(None, description="the deployment's min_agreement; null: reported only")


class QualityReport(BaseModel):
    """One telemetry report's figures for one model (``edgesdk.schemas.messages.ModelQuality``)."""

    model: str
    release: int | None = None
    ts: float = Field(description="Unix time of the report")
    samples: int
    window_s: float
    reference: bool = Field(description="false: the bundle carries no reference profile (no scores)")
    inputs: dict[str, DriftFigures]
    outputs: dict[str, DriftFigures]
    nonfinite: int
    out_of_range: int
    constant: int
    agreement: dict[str, AgreementFigure] | None = Field(
        None, description="shadow agreement per output while a probation's shadow ran (else null)"
    )


class DeviceQuality(BaseModel):
    device_id: str
    reports: list[QualityReport]


#: The download's answer in the OpenAPI document: the sealed file's bytes.
SEALED_FILE: dict[str, Any] = {
    "description": "the capture file, sealed to the operator's capture key",
    "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
}


class CaptureEntry(BaseModel):
    id: int = Field(description="the capture id of GET /api/v1/captures/{id}")
    device_id: str
    model: str
    name: str = Field(description="the file's name on the device (its UTC time first)")
    size: int
    sha256: str = Field(description="of the sealed bytes, checked on arrival")
    received: float = Field(description="Unix time the service stored it")


class DeviceCaptures(BaseModel):
    device_id: str
    captures: list[CaptureEntry]


_DEVICE = "/api/v1/devices/{device_id}"

ROUTES = RouteTable(
    "devices",
    Route("GET", "/api/v1/devices", list_devices, "viewer", "devices.read", Page[Device], READ_ERRORS),
    Route("GET", _DEVICE, get_device, "viewer", "devices.read", Device, ONE_ERRORS),
    Route("DELETE", _DEVICE, decommission_device, "admin", "device.decommission", Decommissioned, WRITE_ERRORS),
    Route("GET", _DEVICE + "/history", device_history, "viewer", "devices.read", DeviceHistory, ONE_ERRORS),
    Route("GET", _DEVICE + "/quality", device_quality, "viewer", "devices.read", DeviceQuality, ONE_ERRORS),
    Route("GET", _DEVICE + "/captures", device_captures, "viewer", "devices.read", DeviceCaptures, ONE_ERRORS),
    Route(
        "GET",
        "/api/v1/captures/{capture_id}",
        download_capture,
        "operator",
        "captures.read",
        responses={200: SEALED_FILE, **documented(*ONE_ERRORS)},
        options={"response_class": Response},
    ),
    Route("GET", "/api/v1/groups", list_groups, "viewer", "devices.read", Page[Group], READ_ERRORS),
    Route("GET", "/api/v1/alerts", list_alerts, "viewer", "alerts.read", Page[Alert], READ_ERRORS),
)


def _quality_report(row: quality.QualityRow) -> dict[str, Any]:
    fields = vars(row).copy()
    del fields["device_id"]
    return fields


def _devices(
    engine: Any,
    *,
    group: str | None = None,
    model: str | None = None,
    version: str | None = None,
    state: str | None = None,
) -> list[Any]:
    table = schema.devices
    query = sa.select(table)
    if model is not None:
        query = query.where(table.c.model_name == model)
    if version is not None:
        query = query.where(table.c.model_version == version)
    if state in ("online", "offline"):
        query = query.where(table.c.online.is_(state == "online"))
    elif state is not None:
        query = query.where(table.c.ota_state == state)
    if group is not None:
        query = query.where(table.c.groups.contains(json.dumps(group)))  # JSON text: a quoted name
    with Transaction(engine) as db:
        rows = db.execute(query.order_by(table.c.device_id)).all()
    return [r for r in rows if group is None or group in json.loads(r.groups)]


def _known_device(engine: Any, device_id: str) -> Any:
    table = schema.devices
    return row_or_404(
        engine, table, table.c.device_id, device_id, f"device {device_id!r} not known to the fleet service"
    )


def _latest_telemetry(engine: Any, device_ids: list[str]) -> dict[str, dict[str, Any]]:
    """The newest telemetry row of each of ``device_ids`` (one index seek each)."""
    if not device_ids:
        return {}
    with Transaction(engine) as db:
        rows = db.execute(latest_telemetry().where(schema.devices.c.device_id.in_(device_ids))).all()
    return {r.device_id: dict(r._mapping) for r in rows}


def _history(engine: Any, device_id: str, hours: float, resolution: str) -> dict[str, Any]:
    since = time.time() - hours * 3600
    minute = resolution == "minute" or (resolution == "auto" and hours > 6)
    with Transaction(engine) as db:
        if minute:
            m = schema.telemetry_minutely
            series = db.execute(
                sa.select(m).where((m.c.device_id == device_id) & (m.c.minute >= since)).order_by(m.c.minute)
            ).all()
        else:
            t = schema.telemetry
            series = db.execute(
                sa.select(t).where((t.c.device_id == device_id) & (t.c.ts >= since)).order_by(t.c.ts)
            ).all()
        e = schema.events
        events = db.execute(
            sa.select(e).where((e.c.device_id == device_id) & (e.c.ts >= since)).order_by(e.c.ts.desc()).limit(500)
        ).all()
        h = schema.ota_history
        ota = db.execute(
            sa.select(h).where((h.c.device_id == device_id) & (h.c.ts >= since)).order_by(h.c.ts.desc()).limit(500)
        ).all()
    return {
        "device_id": device_id,
        "resolution": "minute" if minute else "raw",
        "telemetry": [dict(r._mapping) for r in series],
        "events": [{**dict(r._mapping), "detail": json.loads(r.detail)} for r in events],
        "ota": [dict(r._mapping) for r in ota],
    }


def _decommission(context: ApiContext, device_id: str) -> dict[str, Any]:
    from edgesdk.fleet.broker_credentials import DevicePasswordFile
    from edgesdk.fleet.enrollment import RegistryFile

    removed = False
    if context.device_passwords is not None:
        removed = DevicePasswordFile(context.device_passwords).remove(device_id)
    revoked = False
    if context.registry_path is not None and context.registry_path.is_file():
        registry = RegistryFile(context.registry_path)
        if device_id in registry.load().devices:
            registry.revoke(device_id, reason="decommissioned")
            revoked = True
    requests = schema.enrollment_requests
    with Transaction(context.engine) as db:
        revoked = (
            bool(
                db.execute(requests.update().where(requests.c.device_id == device_id).values(status="revoked")).rowcount
            )
            or revoked
        )
        db.execute(schema.devices.delete().where(schema.devices.c.device_id == device_id))
    return {"device_id": device_id, "broker_credentials_removed": removed, "enrollment_revoked": revoked}


def _broker(context: Any) -> Any:
    return context.broker_status() if context.broker_status is not None else None


def _device(row: Any, latest: dict[str, Any] | None = None, broker: Any = None) -> Device:
    """The API's device. ``online`` is what the dashboard says (``presence_label``): null, not
    false, while the service cannot see its broker or re-learns presence after it."""
    from edgesdk.fleet.service.broker_watch import presence_label

    data = dict(row._mapping)
    label = presence_label(row.online, broker)
    data["online"] = True if label == "online" else False if label == "offline" else None
    data["groups"] = json.loads(data.get("groups") or "[]")
    for name in ("presence_ts", "telemetry_seq", "public_key"):
        data.pop(name, None)
    return Device(**data, latest=latest)
