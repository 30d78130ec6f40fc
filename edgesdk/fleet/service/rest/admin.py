"""The REST API's bundles (upload, list, one, delete when unused), enrollment (list, approve
bound to a key id, revoke) and operators (tokens, their revocation, the audit log, stats)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from fastapi import Depends, FastAPI, HTTPException, Query, Request

from edgesdk.errors import EnrollmentError, UsageError
from edgesdk.fleet.service import audit, bundles, schema, tokens
from edgesdk.fleet.service.database import Transaction
from edgesdk.fleet.service.ingest import read_counters
from edgesdk.fleet.service.rest.routing import (
    ONE_ERRORS,
    READ_ERRORS,
    WRITE_ERRORS,
    Paging,
    audited_call,
    documented,
    paging,
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

if TYPE_CHECKING:
    from edgesdk.fleet.service.rest.app import ApiContext

log = logging.getLogger(__name__)


def add_bundle_routes(app: FastAPI, context: ApiContext, who: Any) -> None:
    engine = context.engine

    @app.get("/api/v1/bundles", response_model=Page[Bundle], tags=["bundles"], responses=documented(*READ_ERRORS))
    def list_bundles(
        page: Paging = Depends(paging), _op: tokens.Operator = Depends(who("viewer", "bundles.read"))
    ) -> dict[str, Any]:
        """Newest first."""
        return page.page(bundles.public(engine, context.store, bundles.list_bundles(engine)))

    @app.get("/api/v1/bundles/{bundle_id}", response_model=Bundle, tags=["bundles"], responses=documented(*ONE_ERRORS))
    def get_bundle(bundle_id: str, _op: tokens.Operator = Depends(who("viewer", "bundles.read"))) -> dict[str, Any]:
        return bundles.public(engine, context.store, [_known_bundle(engine, bundle_id)])[0]

    @app.delete(
        "/api/v1/bundles/{bundle_id}", response_model=Bundle, tags=["bundles"], responses=documented(*WRITE_ERRORS)
    )
    def delete_bundle(
        bundle_id: str, operator: tokens.Operator = Depends(who("operator", "bundle.delete"))
    ) -> dict[str, Any]:
        """The bundle and its file; 409 while a deployment that has not ended rolls it out."""
        (shown,) = bundles.public(engine, context.store, [_known_bundle(engine, bundle_id)])
        running = bundles.running_deployments(context.store, shown["sha256"])
        if running:
            raise HTTPException(409, f"bundle {bundle_id!r} is rolled out by {', '.join(running)}: abort them first")
        audited_call(engine, operator, "bundle.delete", bundle_id, lambda: bundles.delete_bundle(engine, bundle_id))
        return shown

    @app.post(
        "/api/v1/bundles",
        status_code=201,
        response_model=Bundle,
        tags=["bundles"],
        responses=documented(400, 401, 403, 413, 422),
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
            }
        },
    )
    async def upload_bundle(
        request: Request,
        filename: str = Query("bundle.edgepkg", max_length=255),
        operator: tokens.Operator = Depends(who("operator", "bundle.upload")),
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
            stored = bundles.store_bundle(engine, directory, filename, path, uploaded_by=operator.actor)
            return bundles.public(engine, context.store, [stored])[0]

        return await run_in_threadpool(audited_call, engine, operator, "bundle.upload", filename, work, size=size)


def _known_bundle(engine: Any, bundle_id: str) -> dict[str, Any]:
    found = bundles.find_bundle(engine, bundle_id)
    if found is None:
        raise HTTPException(404, f"bundle {bundle_id!r} not found (GET /api/v1/bundles lists them)")
    return found


def add_enrollment_routes(app: FastAPI, context: ApiContext, who: Any) -> None:
    engine = context.engine
    table = schema.enrollment_requests

    @app.get(
        "/api/v1/enrollment",
        response_model=Page[EnrollmentRequest],
        tags=["enrollment"],
        responses=documented(*READ_ERRORS),
    )
    def list_enrollment(
        status: EnrollmentStatus | None = None,
        page: Paging = Depends(paging),
        _op: tokens.Operator = Depends(who("viewer", "enrollment.read")),
    ) -> dict[str, Any]:
        query = sa.select(table).order_by(table.c.device_id)
        if status is not None:
            query = query.where(table.c.status == status)
        with Transaction(engine) as db:
            return page.page([dict(r._mapping) for r in db.execute(query)])

    def decide(
        device_id: str, approve: bool, body: EnrollmentDecision | None, operator: tokens.Operator
    ) -> dict[str, Any]:
        with Transaction(engine) as db:
            row = db.execute(sa.select(table).where(table.c.device_id == device_id)).first()
        if row is None:
            raise HTTPException(404, f"no enrollment request from device {device_id!r}")
        options = body or EnrollmentDecision()
        action = "enrollment.approve" if approve else "enrollment.revoke"
        answer: dict[str, Any] = {}

        def work() -> Any:
            if approve:
                answer.update(_approve(context, row, options))
                return
            if context.registry_path is not None:
                from edgesdk.fleet.enrollment import RegistryFile

                registry = RegistryFile(context.registry_path)
                if context.registry_path.is_file() and device_id in registry.load().devices:
                    registry.revoke(device_id, reason=options.reason)
            with Transaction(engine) as db:
                db.execute(table.update().where(table.c.device_id == device_id).values(status="revoked"))

        key = (options.key_id or "").lower() or row.key_id
        audited_call(engine, operator, action, device_id, work, key_id=key, reason=options.reason)
        with Transaction(engine) as db:
            current = dict(db.execute(sa.select(table).where(table.c.device_id == device_id)).one()._mapping)
        return {**current, **answer}

    @app.post(
        "/api/v1/enrollment/{device_id}/approve",
        response_model=EnrollmentRequest,
        tags=["enrollment"],
        responses=documented(400, *WRITE_ERRORS),
    )
    def approve_enrollment(
        device_id: str,
        body: EnrollmentDecision | None = None,
        operator: tokens.Operator = Depends(who("operator", "enrollment.approve")),
    ) -> dict[str, Any]:
        """409 when ``key_id`` names neither key the device offered, or the key is another device's."""
        return decide(device_id, True, body, operator)

    @app.post(
        "/api/v1/enrollment/{device_id}/revoke",
        response_model=EnrollmentRequest,
        tags=["enrollment"],
        responses=documented(*WRITE_ERRORS),
    )
    def revoke_enrollment(
        device_id: str,
        body: EnrollmentDecision | None = None,
        operator: tokens.Operator = Depends(who("admin", "enrollment.revoke")),
    ) -> dict[str, Any]:
        return decide(device_id, False, body, operator)


def add_operator_routes(app: FastAPI, context: ApiContext, who: Any) -> None:
    engine = context.engine

    @app.get("/api/v1/tokens", response_model=Page[Token], tags=["operators"], responses=documented(*READ_ERRORS))
    def list_tokens(
        page: Paging = Depends(paging), _op: tokens.Operator = Depends(who("admin", "tokens.read"))
    ) -> dict[str, Any]:
        return page.page(tokens.list_tokens(engine))

    @app.post(
        "/api/v1/tokens",
        status_code=201,
        response_model=NewToken,
        tags=["operators"],
        responses=documented(*WRITE_ERRORS),
    )
    def create_token(
        body: TokenCreate, operator: tokens.Operator = Depends(who("admin", "token.create"))
    ) -> dict[str, Any]:
        token_id, token = audited_call(
            engine,
            operator,
            "token.create",
            body.name,
            lambda: tokens.create_token(engine, name=body.name, role=body.role, created_by=operator.actor),
            role=body.role,
        )
        return {"id": token_id, "token": token, "role": body.role, "name": body.name}

    @app.delete(
        "/api/v1/tokens/{token_id}", response_model=Token, tags=["operators"], responses=documented(*WRITE_ERRORS)
    )
    def revoke_token(
        token_id: str, operator: tokens.Operator = Depends(who("admin", "token.revoke"))
    ) -> dict[str, Any]:
        """Revoke a token: every request with it, and every dashboard session it opened, is
        refused from now on. 409 when it is already revoked."""
        found = tokens.find_token(engine, token_id)
        if found is None:
            raise HTTPException(404, f"token {token_id!r} not found (GET /api/v1/tokens lists them)")
        if found["revoked"] is not None:
            raise HTTPException(409, f"token {token_id!r} is already revoked")
        audited_call(engine, operator, "token.revoke", token_id, lambda: tokens.revoke_token(engine, token_id))
        return tokens.find_token(engine, token_id) or found

    @app.get("/api/v1/audit", response_model=Page[AuditEntry], tags=["operators"], responses=documented(*READ_ERRORS))
    def audit_log(
        page: Paging = Depends(paging), _op: tokens.Operator = Depends(who("admin", "audit.read"))
    ) -> dict[str, Any]:
        """Newest first."""
        entries = audit.entries(engine, limit=page.limit, offset=page.offset)
        return page.page(entries, audit.count(engine), sliced=True)

    @app.get("/api/v1/stats", response_model=Stats, tags=["operators"], responses=documented(*READ_ERRORS))
    def stats(_op: tokens.Operator = Depends(who("viewer", "stats.read"))) -> dict[str, Any]:
        return {"ingest": read_counters(engine, context.store.where)}


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
