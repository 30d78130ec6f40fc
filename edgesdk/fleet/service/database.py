"""Opening the service's database: the URL, the engine, the migrations run at start-up.

``sqlite:///path`` (the default, embedded) and ``postgresql+psycopg://…`` (production) go
through the same SQLAlchemy Core code; the only dialect-specific piece is SQLite's locking,
set up here: every transaction takes the write lock at BEGIN (``BEGIN IMMEDIATE``), so two
threads that read then write cannot deadlock, and WAL lets readers run beside the writer.
Errors of SQLAlchemy and the drivers become :class:`~edgesdk.errors.FleetServiceError`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from edgesdk.errors import FleetServiceError, UsageError

_MIGRATIONS = Path(__file__).parent / "migrations"


def default_db_url(data_dir: Path) -> str:
    """``sqlite:///DATA_DIR/fleet-service.sqlite3``."""
    return f"sqlite:///{(data_dir / 'fleet-service.sqlite3').resolve()}"


def open_engine(url: str) -> Any:
    """An engine for ``url`` (UsageError naming it when it is not one we support)."""
    import sqlalchemy as sa
    from sqlalchemy import event
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise UsageError(f"bad --db {url!r}: expected sqlite:///PATH or postgresql+psycopg://USER@HOST/DB") from exc
    backend = parsed.get_backend_name()
    if backend == "postgresql" and parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")  # psycopg 3, not the psycopg2 default
    if backend not in ("sqlite", "postgresql"):
        raise UsageError(f"bad --db {url!r}: the fleet service stores its data in SQLite or PostgreSQL")
    try:
        if backend == "sqlite":
            database = parsed.database or ""
            if database and database != ":memory:":
                Path(database).parent.mkdir(parents=True, exist_ok=True)
            engine = sa.create_engine(parsed, connect_args={"timeout": 30, "check_same_thread": False})

            @event.listens_for(engine, "connect")
            def _sqlite_connect(dbapi_connection: Any, _record: Any) -> None:
                dbapi_connection.isolation_level = None  # we emit BEGIN ourselves (below)
                cursor = dbapi_connection.cursor()
                cursor.execute("PRAGMA journal_mode=WAL")
                cursor.execute("PRAGMA synchronous=NORMAL")
                cursor.execute("PRAGMA foreign_keys=ON")
                cursor.close()

            @event.listens_for(engine, "begin")
            def _sqlite_begin(connection: Any) -> None:
                connection.exec_driver_sql("BEGIN IMMEDIATE")

        else:
            engine = sa.create_engine(parsed, pool_size=8, max_overflow=8, pool_pre_ping=True)
    except (NoSuchModuleError, ImportError) as exc:
        raise UsageError(f"--db {url!r} needs its driver: pip install 'edgesdk[fleet-service]' ({exc})") from exc
    return engine


def migrate(engine: Any) -> str:
    """Bring the database to the newest schema (Alembic ``upgrade head``); returns the revision."""
    from alembic import command
    from alembic.config import Config
    from alembic.runtime.migration import MigrationContext
    from sqlalchemy.exc import SQLAlchemyError

    config = Config()
    config.set_main_option("script_location", str(_MIGRATIONS))
    try:
        with engine.begin() as connection:
            config.attributes["connection"] = connection
            command.upgrade(config, "head")
        with engine.connect() as connection:
            return str(MigrationContext.configure(connection).get_current_revision())
    except SQLAlchemyError as exc:
        raise FleetServiceError(
            f"cannot migrate the fleet database {safe_url(engine)}: {exc.__class__.__name__}: {exc}"
        ) from exc


def safe_url(engine: Any) -> str:
    """The engine's URL without its password (for messages and logs)."""
    return str(engine.url.render_as_string(hide_password=True))


def insert_ignoring_duplicates(engine: Any, table: Any) -> Any:
    """``INSERT … ON CONFLICT DO NOTHING`` for this engine's dialect (QoS 1 redelivers)."""
    if engine.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(table).on_conflict_do_nothing()
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    return sqlite_insert(table).on_conflict_do_nothing()


def inserted_new_row(db: Any, statement: Any, key: Any) -> bool:
    """Run ``statement`` (from ``insert_ignoring_duplicates(...).values(...)``); True when it wrote
    a row. Read with RETURNING ``key``, not rowcount: psycopg reports -1 for an INSERT … ON
    CONFLICT DO NOTHING, so a rowcount test never sees a new row on PostgreSQL."""
    return db.execute(statement.returning(key)).first() is not None


def upsert(engine: Any, table: Any, keys: list[str]) -> Any:
    """``INSERT … ON CONFLICT (keys) DO UPDATE SET`` every other column to the new value.

    Used with executemany: the statement takes its values per row."""
    if engine.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        statement: Any = pg_insert(table)
    else:
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        statement = sqlite_insert(table)
    updates = {c.name: statement.excluded[c.name] for c in table.columns if c.name not in keys}
    return statement.on_conflict_do_update(index_elements=keys, set_=updates)


class Transaction:
    """``engine.begin()`` whose database errors become FleetServiceError (integrity errors
    pass through: callers turn a duplicate key into their own message)."""

    def __init__(self, engine: Any, where: str | None = None) -> None:
        from sqlalchemy.exc import IntegrityError, SQLAlchemyError

        self._errors = (IntegrityError, SQLAlchemyError)
        self._context = engine.begin()
        self._where = where or safe_url(engine)

    def __enter__(self) -> Any:
        try:
            return self._context.__enter__()
        except self._errors[1] as exc:
            raise FleetServiceError(f"fleet database {self._where}: {exc.__class__.__name__}: {exc}") from exc

    def __exit__(self, *exc_info: Any) -> Literal[False]:
        integrity, database = self._errors
        error = exc_info[1]
        try:
            self._context.__exit__(*exc_info)  # commits, or rolls back when the body raised
        except integrity:
            raise
        except database as exc:
            raise FleetServiceError(f"fleet database {self._where}: {exc.__class__.__name__}: {exc}") from exc
        if isinstance(error, database) and not isinstance(error, integrity):
            raise FleetServiceError(f"fleet database {self._where}: {error.__class__.__name__}: {error}") from error
        return False
