"""The standalone ``edgesdk fleet push`` database: the service's store code on one SQLite file.

``fleet push|status|abort|rollback`` without ``--server`` keep their deployments in a SQLite
file (``--db``, default :func:`~edgesdk.fleet.deployments.default_db_path`), migrated to the
fleet service's schema like the service's own database, and read and written through the same
:class:`~edgesdk.fleet.service.store.SqlRolloutStore`.

A file written by the sqlite3 store of edgesdk before this one (tables ``deployments`` and
``devices``, no ``alembic_version``) is upgraded on first open: its rows are copied into a
freshly migrated file beside it, which then takes its place; the old file is kept as
``NAME.v1`` (nothing is deleted). The column names of the two stores were the same; the old
``devices`` table of per-deployment results is the service's ``deployment_devices``.
"""

from __future__ import annotations

import logging
import os
import re
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from edgesdk.errors import UsageError
from edgesdk.fleet.service import database
from edgesdk.fleet.service.database import migrate, open_engine
from edgesdk.fleet.service.store import SqlRolloutStore

log = logging.getLogger(__name__)

_REVISION = re.compile(r'^revision\s*(?::\s*str\s*)?=\s*"([^"]+)"', re.MULTILINE)
_DOWN_REVISION = re.compile(r'^down_revision\s*(?::[^=]*)?=\s*"([^"]+)"', re.MULTILINE)

#: (table in the old file, table in the service schema), parents before children.
_LEGACY_TABLES = (
    ("deployments", "deployments"),
    ("issuers", "issuers"),
    ("follow_ups", "follow_ups"),
    ("issued_commands", "issued_commands"),
    ("devices", "deployment_devices"),
)


def open_rollout_store(path: Path) -> SqlRolloutStore:
    """The deployment store in the SQLite file ``path`` (created, upgraded and migrated as needed)."""
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"bad --db {str(path)!r}: a directory; give a file path, e.g. {path / 'fleet.sqlite3'}")
    if is_legacy_file(path):
        upgrade_legacy_file(path)
    engine = open_engine(f"sqlite:///{path.resolve()}")
    if not _at_head(engine):
        migrate(engine)
    return SqlRolloutStore(engine)


def _at_head(engine: Any) -> bool:
    """Whether the file is at the newest schema revision already: every ``fleet`` command opens
    it, and Alembic's upgrade (or loading its scripts) costs a third of a second when there is
    nothing to do. The head is read from the scripts' text; anything unexpected means "migrate"."""
    revisions, parents = set(), set()
    for script in (Path(database.__file__).parent / "migrations" / "versions").glob("*.py"):
        text = script.read_text(encoding="utf-8")
        revisions.update(_REVISION.findall(text))
        parents.update(_DOWN_REVISION.findall(text))
    heads = revisions - parents
    with engine.connect() as connection:
        if not sa.inspect(connection).has_table("alembic_version"):
            return False
        current = connection.execute(sa.text("SELECT version_num FROM alembic_version")).scalars().all()
    return len(heads) == 1 and current == list(heads)


def is_legacy_file(path: Path) -> bool:
    """Whether ``path`` is a database of the old sqlite3 deployment store."""
    if not path.is_file() or path.stat().st_size == 0:
        return False
    try:
        with _connect(path) as db:
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.DatabaseError as exc:
        raise UsageError(f"bad --db {str(path)!r}: not a SQLite database ({exc}); give another file") from exc
    return "alembic_version" not in tables and {"deployments", "devices"} <= tables


def upgrade_legacy_file(path: Path) -> Path:
    """Copy an old-format file's rows into a migrated file that replaces it; returns the kept old file."""
    fresh = path.with_name(path.name + ".upgrading")
    for leftover in (fresh, fresh.with_name(fresh.name + "-wal"), fresh.with_name(fresh.name + "-shm")):
        leftover.unlink(missing_ok=True)  # an upgrade that was interrupted starts over
    engine = open_engine(f"sqlite:///{fresh.resolve()}")
    migrate(engine)
    engine.dispose()
    with _connect(fresh) as db:
        db.execute("ATTACH DATABASE ? AS old", (str(path),))
        db.execute("BEGIN IMMEDIATE")
        for old, new in _LEGACY_TABLES:
            columns = ", ".join(_shared_columns(db, old, new))
            db.execute(f"INSERT INTO main.{new} ({columns}) SELECT {columns} FROM old.{old}")  # noqa: S608 - fixed names
        db.execute("COMMIT")
        db.execute("DETACH DATABASE old")
    kept = path.with_name(path.name + ".v1")
    os.replace(path, kept)
    os.replace(fresh, path)
    log.warning("upgraded the deployment database %s to the fleet service's schema; the old file is %s", path, kept)
    return kept


def _shared_columns(db: sqlite3.Connection, old: str, new: str) -> list[str]:
    have = {r[1] for r in db.execute(f"PRAGMA old.table_info({old})")}
    return [r[1] for r in db.execute(f"PRAGMA main.table_info({new})") if r[1] in have]


def _connect(path: Path) -> closing[sqlite3.Connection]:
    """Autocommit, closed on leaving (sqlite3's own context manager only commits), so the old
    file's WAL is checkpointed before the file is moved."""
    return closing(sqlite3.connect(path, timeout=30, isolation_level=None))
