"""Alembic environment of the fleet service: run with the connection the service hands over
(``config.attributes["connection"]``), never from an alembic.ini, so the migrations ship in the
package and run at start-up (edgesdk.fleet.service.database.migrate). Importing this module
outside an Alembic run does nothing (tests import every module of the package)."""

from __future__ import annotations

from typing import Any

from alembic import context

from edgesdk.fleet.service.schema import metadata


def run_migrations(connection: Any) -> None:
    # render_as_batch: SQLite cannot ALTER most things; batch mode rebuilds the table instead.
    context.configure(connection=connection, target_metadata=metadata, render_as_batch=True, compare_type=True)
    with context.begin_transaction():
        context.run_migrations()


_config = getattr(context, "config", None)  # only set while Alembic runs this script
if _config is not None:
    run_migrations(_config.attributes["connection"])
