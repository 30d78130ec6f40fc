"""Who drives rollouts: exactly one fleet service process at a time.

Several ``edgesdk fleet serve`` processes may run against one PostgreSQL database (for
availability, or beside ingest workers); each serves the API and ingests, but only the
*leader* drives deployments, answers chunk requests, delivers owed commands and runs the
maintenance pass. Leadership is a PostgreSQL session-level advisory lock
(``pg_try_advisory_lock``) held on one dedicated connection: the server releases it the
moment that connection ends — the process died, was killed, or lost the database — and the
next process that asks gets it. A leader that finds its connection gone has lost the lock
and must stop acting at once (the service exits; its supervisor restarts it as a follower).

SQLite is one process by construction (one file, one writer): the service is always the
leader there, and a second service on the same file is not supported.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

log = logging.getLogger(__name__)


def lock_key(namespace: str) -> int:
    """The advisory lock's 64-bit key for ``namespace`` (stable across processes and versions)."""
    digest = hashlib.sha256(f"edgesdk-fleet-leader:{namespace}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


class Leadership:
    """``acquire()`` tries to become the leader (never blocks); ``still_held()`` checks the
    lock's connection; ``release()`` gives it up."""

    def __init__(self, engine: Any, namespace: str) -> None:
        self.engine = engine
        self.key = lock_key(namespace)
        self.shared_database = engine.dialect.name == "postgresql"
        self._connection: Any = None

    @property
    def held(self) -> bool:
        return self._connection is not None or not self.shared_database

    def acquire(self) -> bool:
        """True when this process is (now) the leader."""
        if self.held:
            return True
        import sqlalchemy as sa
        from sqlalchemy.exc import SQLAlchemyError

        connection = None
        try:
            connection = self.engine.connect()
            got = bool(connection.execute(sa.text("SELECT pg_try_advisory_lock(:k)"), {"k": self.key}).scalar())
            connection.commit()  # the lock is the session's, not the transaction's
        except SQLAlchemyError as exc:
            log.warning("cannot ask the database for leadership: %s", exc)
            if connection is not None:
                connection.close()
            return False
        if not got:
            connection.close()
            return False
        self._connection = connection
        return True

    def still_held(self) -> bool:
        """False when the lock's connection is gone (the lock with it)."""
        if not self.shared_database:
            return True
        if self._connection is None:
            return False
        import sqlalchemy as sa
        from sqlalchemy.exc import SQLAlchemyError

        try:
            self._connection.execute(sa.text("SELECT 1")).scalar()
            self._connection.commit()
        except SQLAlchemyError as exc:
            log.error("lost the leader lock's database connection: %s", exc)
            self._drop()
            return False
        return True

    def release(self) -> None:
        if self._connection is None:
            return
        import sqlalchemy as sa
        from sqlalchemy.exc import SQLAlchemyError

        try:
            self._connection.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": self.key})
            self._connection.commit()
        except SQLAlchemyError:
            pass  # closing the connection below releases it anyway
        self._drop()

    def _drop(self) -> None:
        connection, self._connection = self._connection, None
        try:
            connection.invalidate()  # never back to the pool: the session (and its lock) must end
            connection.close()
        except Exception as exc:  # noqa: BLE001 - a broken connection may fail to close; it is gone either way
            log.debug("closing the leader's connection failed (%s); it is dropped either way", exc)
