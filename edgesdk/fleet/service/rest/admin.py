"""The REST API's bundles (upload, list, one, delete when unused), enrollment (list, approve
bound to a key id, revoke) and operators (tokens, their revocation, the audit log, stats)."""

from __future__ import annotations

import logging
from typing import Any

import sqlalchemy as sa
from fastapi import Depends, HTTPException, Query, Request

from edgesdk.errors import EnrollmentError, UsageError
from edgesdk.fleet.service import audit, bundles, schema, tokens
from edgesdk.fleet.service.database import Transaction
from edgesdk.fleet.service.ingest import read_counters
from edgesdk.fleet.service.rest.context import ApiContext, api_context, signed_in
from edgesdk.fleet.service.rest.routing import (
    ONE_ERRORS,
    READ_ERRORS,
    WRITE_ERRORS,
    Paging,
    Route,
    RouteTable,
    audited_call,
    found_or_404,
    paging,
    row_or_404,
)
from edgesdk.fleet.service.rest.schemas import (
    AuditEntry,
    Bundle,
    EnrollmentDecision,
    EnrollmentRequest,
    EnrollmentStatus,
    NewToken,
    Page,
    Stats,
    Token,
    TokenCreate,
)

log = logging.getLogger(__name__)


def list_bundles(page: Paging = Depends(paging), context: ApiContext = Depends(api_context)) -> dict[str, Any]:
    """Newest first."""
    return page.page(bundles.public(context.engine, context.store, bundles.list_bundles(context.engine)))


def get_bundle(bundle_id: str, context: ApiContext = Depends(api_context)) -> dict[str, Any]:
    return bundles.public(context.engine, context.store, [_known_bundle(context.engine, bundle_id)])[0]


def delete_bundle(
    bundle_id: str,
    operator: tokens.Operator = Depends(signed_in),
    context: ApiContext = Depends(api_context),
) -> dict[str, Any]:
    """The bundle and its file; 409 while a deployment that has not ended rolls it out."""
    engine = context.engine
    (shown,) = bundles.public(engine, context.store, [_known_bundle(engine, bundle_id)])
    running = bundles.running_deployments(context.store, shown["sha256"])
    if running:
        raise HTTPException(409, f"bundle {bundle_id!r} is rolled out by {', '.join(running)}: abort them first")
    audited_call(engine, operator, "bundle.delete", bundle_id, lambda: bundles.delete_bundle(engine, bundle_id))
    return shown


async def upload_bundle(
    request: Request,
    filename: str = Query("bundle.edgepkg", max_length=255),
    operator: tokens.Operator = Depends(signed_in),
    context: ApiContext = Depends(api_context),
) -> dict[str, Any]:
    from starlette.concurrency import run_in_threadpool

    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > context.max_bundle_bytes:
        raise HTTPException(413, f"bundle of {declared} bytes is over the limit of {context.max_bundle_bytes}")
    directory = context.data_dir / "bundles"
    handle, path = bundles.new_upload(directory)
    size = 0
    try:
        with handle:
            async for chunk in request.stream():
                size += len(chunk)
                if size > context.max_bundle_bytes:
                    raise HTTPException(413, f"bundle is over the limit of {context.max_bundle_bytes} bytes")
                handle.write(chunk)
            handle.flush()
    except BaseException:
        path.unlink(missing_ok=True)
        raise

    def work() -> Any:
        stored = bundles.store_bundle(context.engine, directory, filename, path, uploaded_by=operator.actor)
        return bundles.public(context.engine, context.store, [stored])[0]

    return await run_in_threadpool(audited_call, context.engine, operator, "bundle.upload", filename, work, size=size)


#: The upload's body in the OpenAPI document: the bundle file's bytes.
_BUNDLE_BODY = {
    "requestBody": {
        "required": True,
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    }
}
_BUNDLE = "/api/v1/bundles/{bundle_id}"

BUNDLE_ROUTES = RouteTable(
    "bundles",
    Route("GET", "/api/v1/bundles", list_bundles, "viewer", "bundles.read", Page[Bundle], READ_ERRORS),
    Route("GET", _BUNDLE, get_bundle, "viewer", "bundles.read", Bundle, ONE_ERRORS),
    Route("DELETE", _BUNDLE, delete_bundle, "operator", "bundle.delete", Bundle, WRITE_ERRORS),
    Route(
        "POST",
        "/api/v1/bundles",
        upload_bundle,
        "operator",
        "bundle.upload",
        Bundle,
        (400, 401, 403, 413, 422),
        status=201,
        options={"openapi_extra": _BUNDLE_BODY},
    ),
)


def _known_bundle(engine: Any, bundle_id: str) -> dict[str, Any]:
    missing = f"bundle {bundle_id!r} not found (GET /api/v1/bundles lists them)"
    return found_or_404(bundles.find_bundle(engine, bundle_id), missing)


def list_enrollment(
    status: EnrollmentStatus | None = None,
    page: Paging = Depends(paging),
    context: ApiContext = Depends(api_context),
) -> dict[str, Any]:
    table = schema.enrollment_requests
    query = sa.select(table).order_by(table.c.device_id)
    if status is not None:
        query = query.where(table.c.status == status)
    with Transaction(context.engine) as db:
        return page.page([dict(r._mapping) for r in db.execute(query)])


def approve_enrollment(
    device_id: str,
    body: EnrollmentDecision | None = None,
    operator: tokens.Operator = Depends(signed_in),
    context: ApiContext = Depends(api_context),
) -> dict[str, Any]:
    """409 when ``key_id`` names neither key the device offered, or the key is another device's."""
    return _decide(context, device_id, True, body, operator)


def revoke_enrollment(
    device_id: str,
    body: EnrollmentDecision | None = None,
    operator: tokens.Operator = Depends(signed_in),
    context: ApiContext = Depends(api_context),
) -> dict[str, Any]:
    return _decide(context, device_id, False, body, operator)


_REQUEST = "/api/v1/enrollment/{device_id}"

ENROLLMENT_ROUTES = RouteTable(
    "enrollment",
    Route(
        "GET", "/api/v1/enrollment", list_enrollment, "viewer", "enrollment.read", Page[EnrollmentRequest], READ_ERRORS
    ),
    Route(
        "POST",
        _REQUEST + "/approve",
        approve_enrollment,
        "operator",
        "enrollment.approve",
        EnrollmentRequest,
        (400, *WRITE_ERRORS),
    ),
    Route(
        "POST", _REQUEST + "/revoke", revoke_enrollment, "admin", "enrollment.revoke", EnrollmentRequest, WRITE_ERRORS
    ),
)


def _decide(
    context: ApiContext, device_id: str, approve: bool, body: EnrollmentDecision | None, operator: tokens.Operator
) -> dict[str, Any]:
    """Approve (bound to a key id) or revoke ``device_id``'s enrollment request; the request as
    it is now, with the approval's warnings."""
    engine, table = context.engine, schema.enrollment_requests
    row = row_or_404(engine, table, table.c.device_id, device_id, f"no enrollment request from device {device_id!r}")
    options = body or EnrollmentDecision()
    action = "enrollment.approve" if approve else "enrollment.revoke"
    answer: dict[str, Any] = {}

    def work() -> Any:
        if approve:
            answer.update(_approve(context, row, options))
            return
        _revoke(context, device_id, options.reason)

    key = (options.key_id or "").lower() or row.key_id
    audited_call(engine, operator, action, device_id, work, key_id=key, reason=options.reason)
    with Transaction(engine) as db:
        current = dict(db.execute(sa.select(table).where(table.c.device_id == device_id)).one()._mapping)
    return {**current, **answer}


def _revoke(context: ApiContext, device_id: str, reason: str) -> None:
    """The device's key out of the enrollment registry (when there) and its request revoked."""
    if context.registry_path is not None:
        from edgesdk.fleet.enrollment import RegistryFile

        registry = RegistryFile(context.registry_path)
        if context.registry_path.is_file() and device_id in registry.load().devices:
            registry.revoke(device_id, reason=reason)
    table = schema.enrollment_requests
    with Transaction(context.engine) as db:
        db.execute(table.update().where(table.c.device_id == device_id).values(status="revoked"))


def list_tokens(page: Paging = Depends(paging), context: ApiContext = Depends(api_context)) -> dict[str, Any]:
    return page.page(tokens.list_tokens(context.engine))


def create_token(
    body: TokenCreate,
    operator: tokens.Operator = Depends(signed_in),
    context: ApiContext = Depends(api_context),
) -> dict[str, Any]:
    engine = context.engine
    token_id, token = audited_call(
        engine,
        operator,
        "token.create",
        body.name,
        lambda: tokens.create_token(engine, name=body.name, role=body.role, created_by=operator.actor),
        role=body.role,
    )
    return {"id": token_id, "token": token, "role": body.role, "name": body.name}


def revoke_token(
    token_id: str,
    operator: tokens.Operator = Depends(signed_in),
    context: ApiContext = Depends(api_context),
) -> dict[str, Any]:
    """Revoke a token: every request with it, and every dashboard session it opened, is
    refused from now on. 409 when it is already revoked."""
    engine = context.engine
    missing = f"token {token_id!r} not found (GET /api/v1/tokens lists them)"
    found = found_or_404(tokens.find_token(engine, token_id), missing)
    if found["revoked"] is not None:
        raise HTTPException(409, f"token {token_id!r} is already revoked")
    audited_call(engine, operator, "token.revoke", token_id, lambda: tokens.revoke_token(engine, token_id))
    return tokens.find_token(engine, token_id) or found


def audit_log(page: Paging = Depends(paging), context: ApiContext = Depends(api_context)) -> dict[str, Any]:
    """Newest first."""
    entries = audit.entries(context.engine, limit=page.limit, offset=page.offset)
    return page.page(entries, audit.count(context.engine), sliced=True)


def stats(context: ApiContext = Depends(api_context)) -> dict[str, Any]:
    return {"ingest": read_counters(context.engine, context.store.where)}


OPERATOR_ROUTES = RouteTable(
    "operators",
    Route("GET", "/api/v1/tokens", list_tokens, "admin", "tokens.read", Page[Token], READ_ERRORS),
    Route("POST", "/api/v1/tokens", create_token, "admin", "token.create", NewToken, WRITE_ERRORS, status=201),
    Route("DELETE", "/api/v1/tokens/{token_id}", revoke_token, "admin", "token.revoke", Token, WRITE_ERRORS),
    Route("GET", "/api/v1/audit", audit_log, "admin", "audit.read", Page[AuditEntry], READ_ERRORS),
    Route("GET", "/api/v1/stats", stats, "viewer", "stats.read", Stats, READ_ERRORS),
)


def _approve(context: ApiContext, row: Any, options: EnrollmentDecision) -> dict[str, Any]:
    """Approve the key of ``row`` (an enrollment request) that ``options.key_id`` names in full:
    the key the device requested with, or the other key it offered since. Refused when the id is
    missing or names neither (an approval is bound to the key the operator checked on the device,
    never to whatever key was announced last). Returns what the REST answer adds (warnings)."""
    from edgesdk.fleet.enrollment import RegistryFile, decode_public_key, shared_key_devices

    device_id = row.device_id
    if options.key_id is None:
        raise UsageError(
            f"approving device {device_id!r} needs key_id: the full key id (32 hex digits) the device shows "
            "locally (edge-agent key), checked out of band"
        )
    wanted = options.key_id.lower()
    if wanted == row.key_id:
        public_key, offered = row.public_key, False
    elif row.offered_key_id is not None and wanted == row.offered_key_id:
        public_key, offered = row.offered_public_key, True
    else:
        also = f" (and later offered {row.offered_key_id})" if row.offered_key_id else ""
        raise EnrollmentError(
            f"device {device_id!r} requested enrollment with key id {row.key_id}{also}, not {wanted}: "
            "nothing approved; check the key id the device shows (edge-agent key)"
        )
    shared: list[str] = []
    if context.registry_path is not None:
        registry = RegistryFile(context.registry_path)
        registry.approve(
            device_id,
            decode_public_key(public_key),
            profile=row.profile,
            expect_key_id=wanted,
            replace=options.replace,
            allow_shared_key=options.allow_shared_key,
        )
        shared = shared_key_devices(registry.load(), device_id, wanted)
    table = schema.enrollment_requests
    values: dict[str, Any] = {"status": "approved"}
    if offered:  # the offered key is now the device's key; the one it replaces is forgotten here
        values.update(
            public_key=public_key,
            key_id=wanted,
            offered_public_key=None,
            offered_key_id=None,
            offered_at=None,
        )
    with Transaction(context.engine) as db:
        db.execute(table.update().where(table.c.device_id == device_id).values(**values))
    if not shared:
        return {}
    warning = (
        f"key {wanted} of device {device_id!r} is also approved for {', '.join(shared)} (allowed: allow_shared_key)"
    )
    log.warning("enrollment: %s", warning)
    return {"warnings": [warning]}
