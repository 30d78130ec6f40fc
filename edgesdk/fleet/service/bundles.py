"""Bundles uploaded to the service: stored once by content hash, read for display only.

The service never decrypts or trusts a bundle: devices verify it. The manifest is read
(unverified, ``inspect_bundle``) only to show the model name, version and release; a file
that is not a bundle is refused with the reason before it is kept.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from edgesdk.errors import BundleError, UsageError
from edgesdk.fleet.service import schema
from edgesdk.fleet.service.database import Transaction


def store_bundle(engine: Any, directory: Path, filename: str, upload: Path, *, uploaded_by: str) -> dict[str, Any]:
    """Keep ``upload`` (a complete, fsynced temp file in ``directory``) under its hash and
    record it; a file that is not a bundle is refused (UsageError) and removed."""
    from edgesdk.bundle import inspect_bundle

    try:
        size = upload.stat().st_size
        if size == 0:
            raise UsageError("empty upload: send the .edgepkg file as the request body")
        try:
            model = inspect_bundle(upload).manifest.model
        except BundleError as exc:  # its message may name the temp file: the client sees its own name
            reason = str(exc).replace(str(upload), filename)
            raise UsageError(f"upload {filename!r} is not a readable bundle: {reason}") from exc
        digest = hashlib.sha256()
        with open(upload, "rb") as handle:
            while block := handle.read(1 << 20):
                digest.update(block)
        sha = digest.hexdigest()
        final = directory / f"{sha}.edgepkg"
        os.replace(upload, final)
    finally:
        upload.unlink(missing_ok=True)
    row = {
        "id": sha[:16],
        "sha256": sha,
        "filename": Path(filename).name[:255] or "bundle.edgepkg",
        "path": str(final),
        "size": size,
        "model_name": model.name,
        "model_version": model.version,
        "model_release": model.release,
        "uploaded": time.time(),
        "uploaded_by": uploaded_by,
    }
    with Transaction(engine) as db:
        if db.execute(sa.select(schema.bundles.c.id).where(schema.bundles.c.sha256 == sha)).first() is None:
            db.execute(schema.bundles.insert().values(**row))
    return get_bundle(engine, sha[:16])


def new_upload(directory: Path) -> tuple[Any, Path]:
    """An open temp file in ``directory`` for an upload in progress, and its path."""
    directory.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(dir=directory, suffix=".upload")
    return os.fdopen(handle, "wb"), Path(name)


def find_bundle(engine: Any, bundle_id: str) -> dict[str, Any] | None:
    table = schema.bundles
    with Transaction(engine) as db:
        row = db.execute(sa.select(table).where(table.c.id == bundle_id)).first()
    return None if row is None else dict(row._mapping)


def get_bundle(engine: Any, bundle_id: str) -> dict[str, Any]:
    found = find_bundle(engine, bundle_id)
    if found is None:
        raise UsageError(f"bundle {bundle_id!r} not found; upload it first (POST /api/v1/bundles)")
    return found


def list_bundles(engine: Any) -> list[dict[str, Any]]:
    table = schema.bundles
    with Transaction(engine) as db:
        return [dict(r._mapping) for r in db.execute(sa.select(table).order_by(table.c.uploaded.desc()))]


def public(engine: Any, store: Any, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` as the API shows them: without the server's file path, with the deployments
    that roll each out (``in_use_by``)."""
    users: dict[str, list[str]] = {}
    for deployment in store.all():
        users.setdefault(Path(deployment.bundle_path).name, []).append(deployment.id)
    return [
        {**{k: v for k, v in row.items() if k != "path"}, "in_use_by": users.get(f"{row['sha256']}.edgepkg", [])}
        for row in rows
    ]


def running_deployments(store: Any, sha256: str) -> list[str]:
    """Deployments of the bundle ``sha256`` that have not ended (it must not be deleted)."""
    from edgesdk.fleet.deployments import FINISHED_ROLLOUT_STATES

    name = f"{sha256}.edgepkg"
    return [d.id for d in store.all() if Path(d.bundle_path).name == name and d.state not in FINISHED_ROLLOUT_STATES]


def delete_bundle(engine: Any, bundle_id: str) -> None:
    """Forget a bundle and remove its file."""
    found = get_bundle(engine, bundle_id)
    with Transaction(engine) as db:
        db.execute(schema.bundles.delete().where(schema.bundles.c.id == bundle_id))
    Path(found["path"]).unlink(missing_ok=True)
